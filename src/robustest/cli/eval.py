"""``robustest eval``: a standard robustness evaluation of a model (the AutoAttack ensemble, per sample, only on
the points still robust), optionally with accuracy under common corruptions, and a CI gate.

Writes to --out: ``results.json`` (clean and robust accuracy, accuracy after each attack, settings, timings and
a RobustBench ``model_info`` entry; schema in docs/RESULTS_SCHEMA.md), ``samples.csv`` (one row per sample: label,
predictions, robust, the attack that broke it, perturbation norms) and ``report.html``.

Versions: ``auto`` (default) = ``fast`` plus the checks and a Square probe on a sample of the survivors, escalating
to FAB-T and the full Square run where the probe breaks a sample, a long Square run on samples without a usable
gradient, ``rand`` for a randomised model and gradient-free attacks for a model without gradients; ``standard`` =
APGD-CE -> APGD-T (9 targets) -> FAB-T (9 targets) -> Square (5000 queries), AutoAttack's standard version; ``fast``
= APGD-CE -> APGD-T (3 targets) and the Square probe as a check; ``rand`` = APGD-CE and APGD-DLR with EOT over 20
draws, points judged by the majority of 11 forwards; ``custom`` = the attacks named in --attacks.

--certify ibp|crown also proves a lower bound on the same samples and brackets the truth: each sample is
certified, broken (misclassified, or an attack's point checked again on the model) or undecided, and certified
<= robust <= clean accuracy; a sample both certified and broken is a soundness error (flag unsound-certificate).
Randomised smoothing is refused there: it certifies the smoothed classifier, not the model the attacks ran on
(use robustest certify --method smoothing).

Every version checks the model (randomness, probability outputs, dynamic defences, zero or missing gradients) and
whether a gradient-free attack broke what the gradient attacks left robust; each finding is a flag (one line on
stderr, in results.json and at the top of the report; docs/EVAL.md). A flag of severity ``unreliable`` makes the
--fail-under gate fail unless accepted with --accept-flag NAME.

Exit status: 0 done (and, with --fail-under, robust accuracy >= ACC and no unaccepted unreliable flag), 1 the gate
failed (with --certify also: a soundness error, with or without --fail-under), 2 bad input (one line on stderr,
before any attack runs), 3 internal error.
"""

from __future__ import annotations

import argparse
import sys
import time

from robustest.cli import EXIT_GATE
from robustest.cli.args import (
    add_checkpoint_arg,
    add_data_args,
    add_run_args,
    batch_size_arg,
    int_list,
    list_arg,
    name_list,
    positive_int,
    radius,
    share_arg,
)
from robustest.cli.loading import check_fits, load_data, load_model, resolve_batch_size
from robustest.cli.output import log, out_dir, peak_rss_mib
from robustest.cli.settings import data_settings, model_settings
from robustest.core.errors import ConfigError
from robustest.core.validation import check_eps

ORDER = 35


parse_accuracy = share_arg("an accuracy", "0.85 or 85%")  # --fail-under: "0.85" or "85%"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate robustness (AutoAttack ensemble, corruptions); gate CI with "
                                    "--fail-under", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_arg(p)
    add_data_args(p, split="test")
    p.add_argument("--eps", type=list_arg(radius, what="eps"), required=True, metavar="E",
                   help="radius of the threat model in pixel scale, e.g. 0.3 or 8/255 (L-inf: in (0, 1]); a list "
                        "(0.1,0.2,0.3) measures a robustness curve, each radius on the survivors of the smaller")
    p.add_argument("--norm", choices=("linf", "l2"), default="linf", help="threat model (default: linf)")
    p.add_argument("--version", choices=("auto", "standard", "fast", "rand", "custom"), default="auto",
                   help="attack ensemble (default: auto = fast, checked and escalated where a probe finds masking; "
                        "standard = AutoAttack's)")
    p.add_argument("--attacks", type=name_list("attack"), default=None, metavar="LIST",
                   help="with --version custom: comma-separated attacks in order, e.g. apgd-ce,apgd-dlr,square")
    p.add_argument("--n-targets", type=positive_int, default=None, metavar="K",
                   help="target classes of APGD-T and FAB-T (default: min(9, classes - 1))")
    p.add_argument("--corruptions", default=None, metavar="LIST",
                   help="also measure accuracy under common corruptions: 'all', a group or names")
    p.add_argument("--severities", type=int_list(what="severity", lo=1, hi=5, sort=True), default=[1, 2, 3, 4, 5],
                   metavar="LIST", help="corruption severities: 1-5, 1,3,5 or 1-2,5 (default: 1-5)")
    p.add_argument("--baseline", default=None, metavar="FILE",
                   help="checkpoint of a baseline model whose corruption errors normalise the mCE")
    p.add_argument("--fail-under", type=parse_accuracy, default=None, metavar="ACC",
                   help="exit with status 1 when the robust accuracy is below ACC (0.85 or 85%%) or a flag says the "
                        "evaluation is unreliable")
    p.add_argument("--accept-flag", type=name_list("flag"), default=None, metavar="LIST",
                   help="unreliable flags the gate accepts, by name (recorded in results.json), e.g. zero-gradient")
    p.add_argument("--bpda", default=None, metavar="LIST",
                   help="submodules (dotted names) whose backward pass the attacks replace by the identity (BPDA, "
                        "for non-differentiable preprocessing), e.g. quant or pre.0")
    p.add_argument("--surrogate", default=None, metavar="FILE",
                   help="checkpoint of a surrogate model: its APGD-CE points are transferred and judged on the model")
    p.add_argument("--forwards", type=positive_int, default=None, metavar="R",
                   help="forward passes judging each point, the majority deciding (default: 1, or 11 for a model "
                        "found randomised)")
    p.add_argument("--batch-size", type=batch_size_arg, default=256, metavar="B",
                   help="images per attack batch, or 'auto': the largest that fits the GPU with the attacks' "
                        "gradients (the default 256 on the CPU)")
    p.add_argument("--amp", choices=("bf16", "fp16"), default=None,
                   help="run the clean pass in bf16 (CPU or CUDA) or fp16 (CUDA) autocast; the attacks stay in "
                        "float32 (default: float32)")
    p.add_argument("--block-size", type=positive_int, default=4096, metavar="N",
                   help="images read and attacked per block (memory stays bounded; under torchrun the ranks share "
                        "out whole blocks; default: 4096)")
    p.add_argument("--certify", choices=("ibp", "crown", "smoothing"), default=None,
                   help="also certify the same samples by bound propagation (ibp or crown) and bracket the truth: "
                        "certified <= robust <= clean (smoothing is refused: it certifies another classifier)")
    p.add_argument("--save-adv", action="store_true", help="also write the worst-case images to adv.pt")
    add_run_args(p)
    p.set_defaults(func=run)


def _check_args(args: argparse.Namespace) -> tuple[list[str] | None, list[int] | None]:
    """Every check that needs no model or data: one-line ConfigError before any work."""
    from robustest import corruptions
    from robustest.evaluate.flags import check_accepted

    if args.certify == "smoothing":
        from robustest.evaluate.certification import NOT_COMPARABLE

        raise ConfigError(f"--certify smoothing: {NOT_COMPARABLE}")
    radii = sorted({check_eps("eps", e, args.norm) for e in args.eps})
    args.eps = radii[0] if len(radii) == 1 else radii
    args.accept_flag = list(check_accepted(args.accept_flag))
    attacks = None
    if args.attacks is not None:
        if args.version != "custom":
            raise ConfigError("--attacks needs --version custom (the other versions fix their attacks)")
        attacks = list(args.attacks)
    elif args.version == "custom":
        raise ConfigError("--version custom needs --attacks, e.g. --attacks apgd-ce,square")
    if attacks:
        from robustest.evaluate import ensemble_plan

        ensemble_plan("custom", args.norm, attacks)  # names and norms checked now
    severities = None
    if args.corruptions is not None:
        corruptions.resolve_names(args.corruptions)
        severities = list(args.severities)
    elif args.baseline is not None:
        raise ConfigError("--baseline is used only for the mCE: add --corruptions")
    return attacks, severities


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from robustest.core.atomic import atomic_save
    from robustest.core.devices import model_device
    from robustest.evaluate import evaluate
    from robustest.models.checkpoints import source_of
    from robustest.results import write_results

    t0 = time.perf_counter()
    attacks, severities = _check_args(args)
    if Path(args.out).exists():
        out_dir(args)
    model = load_model(args)
    baseline = None
    if args.baseline is not None:
        from robustest.models.checkpoints import load_model as load_file

        baseline = load_file(args.baseline, torchscript=args.torchscript, map_location=model_device(model))
    surrogate = None
    if args.surrogate is not None:
        from robustest.models.checkpoints import load_model as load_file

        surrogate = load_file(args.surrogate, torchscript=args.torchscript, map_location=model_device(model))
    ds = load_data(args)
    check_fits(model, ds)
    if args.certify is not None:
        from robustest.core.batching import image_shape
        from robustest.evaluate.certification import check_method

        check_method(model, image_shape(ds), args.certify, args.norm)  # an unsupported layer: before any attack
    from robustest.core.amp import check_amp

    check_amp(args.amp, model_device(model))
    resolve_batch_size(args, model, ds, default=256, grad=True)
    t_load = time.perf_counter() - t0
    result = evaluate(model, ds, args.eps, norm=args.norm, version=args.version, attacks=attacks,
                      n_targets=args.n_targets, seed=args.seed, batch_size=args.batch_size,
                      block_size=args.block_size,
                      corruptions=args.corruptions, severities=severities or (1, 2, 3, 4, 5), baseline=baseline,
                      keep_adv=True, progress=not args.no_progress or args.progress_lines, amp=args.amp, bpda=args.bpda,
                      surrogate=surrogate, forwards=args.forwards)
    brk = None
    if args.certify is not None:
        from robustest.evaluate.certification import bracket_eval

        brk = bracket_eval(model, ds, result, args.certify)  # a soundness error joins result.flags
    out = out_dir(args)
    spec = getattr(model, "robustest_spec", None)
    doc = result.to_dict()
    for key in ("format", "version", "world_size"):
        doc.pop(key, None)
    timings = {**doc.pop("timings", {}), "load_s": t_load, **(brk.timings if brk is not None else {})}
    if brk is not None:
        doc["bracket"] = brk.to_dict()
    doc["attack_settings"] = doc.pop("settings", {})  # the ensemble's own parameters, attack by attack
    name = Path(args.checkpoint).stem if args.checkpoint else str(args.model_factory)
    doc["robustbench"] = result.robustbench(dataset=args.dataset, name=name,
                                            architecture=spec.get("name") if isinstance(spec, dict) else None)
    doc["model"] = {**model_settings(args), "spec": source_of(model)}
    doc["data"] = {**data_settings(args), "num_samples": result.num_samples}
    if args.baseline is not None:
        doc["attack_settings"].setdefault("corruptions", {})["baseline_checkpoint"] = str(args.baseline)
    passed = None
    stopping = result.blocking(args.accept_flag)
    if args.fail_under is not None:
        passed = result.robust_accuracy >= args.fail_under and not stopping
        doc["gate"] = {"fail_under": args.fail_under, "passed": passed,
                       "accuracy_passed": result.robust_accuracy >= args.fail_under,
                       "accepted_flags": list(args.accept_flag), "blocking_flags": [f.name for f in stopping]}
    doc["peak_rss_mib"] = peak_rss_mib()
    files = ["results.json", "samples.csv", "report.html"]
    if args.save_adv:
        atomic_save({"format": "robustest-eval-adversarials", "version": 1, "x": result.adv, "y": result.y,
                     "index": result.index, "robust": result.robust}, out / "adv.pt")
        files.append("adv.pt")
    from robustest import report

    report.write_csv(out / "samples.csv", _rows(result, brk))
    timings["total_s"] = time.perf_counter() - t0
    settings = {**model_settings(args), **data_settings(args), "eps": args.eps, "norm": args.norm,
                "version": args.version, "batch_size": args.batch_size, "block_size": args.block_size,
                "seed": args.seed,
                "device": str(model_device(model))}
    if args.batch_size_auto:
        settings["batch_size_auto"] = True
    for key in ("attacks", "n_targets", "fail_under", "baseline", "amp", "bpda", "surrogate", "forwards",
                "certify"):
        if getattr(args, key) is not None:
            settings[key] = attacks if key == "attacks" else getattr(args, key)
    if args.corruptions is not None:
        settings.update(corruptions=args.corruptions, severities=severities)
    if args.save_adv:
        settings["save_adv"] = True
    if args.accept_flag:
        settings["accept_flag"] = list(args.accept_flag)
    doc = write_results(out, "eval", settings, {**doc, "files": files}, timings)
    _html(result, doc, brk, ds).write(out / "report.html")
    per = ", ".join(f"{k} {100 * v:.2f}%" for k, v in result.attacks.items())
    plan = args.version if result.plan == args.version else f"{args.version} -> {result.plan}"
    if result.curve:
        for c in result.curve:
            log.info(f"eps={c['eps']:g}: robust {100 * c['robust_accuracy']:.2f}% ({c['broke']} of {c['attacked']} "
                     f"broken at this radius)")
    log.info(f"{args.dataset} ({result.num_samples} images), {args.norm} eps={result.eps:g}, {plan}: clean "
             f"{100 * result.clean_accuracy:.2f}%, robust {100 * result.robust_accuracy:.2f}% ({per})")
    from robustest.evaluate.flags import flag_lines

    for line in flag_lines(result.flags, "robustest eval"):
        print(line, file=sys.stderr)
    if result.corruption is not None:
        c = result.corruption
        mce = "" if c["mce"] is None else f", mCE {100 * c['mce']:.2f}% of the baseline's"
        log.info(f"corruptions: mean accuracy {100 * c['mean_corruption_accuracy']:.2f}%{mce}")
    if brk is not None:
        log.info(f"bracket ({args.certify}): certified {100 * brk.certified_accuracy:.2f}% <= robust "
                 f"{100 * brk.robust_accuracy:.2f}% <= clean {100 * brk.clean_accuracy:.2f}% "
                 f"({brk.counts()['undecided']} undecided)")
    log.info(f"wrote {', '.join(files)} to {out} in {time.perf_counter() - t0:.1f}s")
    if brk is not None and not brk.sound:
        print(f"robustest eval: SOUNDNESS ERROR: {brk.counts()['unsound']} samples are both certified and broken "
              "(samples.csv: bracket = unsound); the figures cannot be trusted", file=sys.stderr)
        if passed is None:
            return EXIT_GATE
    if passed is False:
        if result.robust_accuracy < args.fail_under:
            print(f"robustest eval: robust accuracy {result.robust_accuracy:.4f} is below --fail-under "
                  f"{args.fail_under:.4f}", file=sys.stderr)
        if stopping:
            print(f"robustest eval: gate failed: the evaluation is flagged unreliable "
                  f"({', '.join(f.name for f in stopping)}); fix the cause, or accept with --accept-flag NAME",
                  file=sys.stderr)
        return EXIT_GATE
    return 0


def _rows(result, brk):
    """samples.csv's rows: the evaluation's, with --certify the bracket label and the certificate's lower margin."""
    rows = result.rows()
    if brk is not None:
        margins = brk.lower_margin.tolist() if brk.lower_margin is not None else [None] * len(rows)
        for row, label, m in zip(rows, brk.labels, margins):
            row.update(bracket=label, lower_margin=m)
    return rows


def _html(result, doc, brk=None, data=None):
    from robustest import report

    radii = f"eps={result.eps:g}" if not result.curve else "eps=" + ",".join(f"{c['eps']:g}" for c in result.curve)
    rep = report.HtmlReport.from_results(doc, f"robustest eval: {doc['data']['dataset']}, {result.norm} {radii}")
    rep.paragraph(f"{result.num_samples} images, version {result.version}: clean accuracy "
                  f"{100 * result.clean_accuracy:.2f}%, robust accuracy {100 * result.robust_accuracy:.2f}%. Each "
                  "attack runs only on the images every earlier attack left correctly classified; the accuracy "
                  "after an attack is cumulative.")
    rep.heading("Verdict")
    gate = doc.get("gate")
    if gate is None and brk is not None and not brk.sound:
        rep.verdict("fail", f"No --fail-under gate, but the exit status is {EXIT_GATE}: a sample both certified and "
                            "broken is a soundness error (see below).")
    elif gate is None:
        rep.verdict("not-gated", "No gate: --fail-under was not given, so the exit status is 0 whatever the robust "
                                 "accuracy.")
    else:
        verb = "passed" if gate["passed"] else "FAILED"
        rel = "at least" if gate["accuracy_passed"] else "below"
        why = ""
        if gate["blocking_flags"]:
            why = f"; the evaluation is flagged unreliable ({', '.join(gate['blocking_flags'])})"
        rep.verdict("pass" if gate["passed"] else "fail",
                    f"The gate {verb}: robust accuracy {result.robust_accuracy:.4f} is {rel} --fail-under "
                    f"{gate['fail_under']:.4f}{why} (exit status {0 if gate['passed'] else EXIT_GATE}).")
    rep.heading("Checks")
    if not result.flags:
        rep.paragraph("No flag: the model is deterministic, returns logits, has usable input gradients, and no "
                      "gradient-free attack broke what the gradient attacks left robust.")
    else:
        rep.paragraph("What the checks found (an unreliable flag means the robust accuracy may be far too high; "
                      "docs/EVAL.md explains each flag):")
        rep.table([{"flag": f.name, "severity": f.severity, "samples": len(f.samples)} for f in result.flags])
        for f in result.flags:
            rep.paragraph(f"{f.severity.upper()} {f.name}: {f.message}. Remedy: {f.remedy}.")
    if brk is not None:
        _bracket_section(rep, result, brk, data)
    if result.curve:
        rep.heading("Robustness curve")
        rep.paragraph("Each radius was attacked only on the images that survived the smaller one; the tables below "
                      f"are those of the largest radius, eps={result.eps:g}.")
        xs = [c["eps"] for c in result.curve]
        rep.image(report.save_lines({"robust accuracy": (xs, [c["robust_accuracy"] for c in result.curve])}, None,
                                    title="robust accuracy against the radius", xlabel=f"{result.norm} eps",
                                    ylabel="robust accuracy"), "robust accuracy against eps")
        rep.table([{"eps": c["eps"], "robust accuracy": c["robust_accuracy"], "attacked": c["attacked"],
                    "broke": c["broke"], "plan": c["plan"], "reliable": c["reliable"],
                    "flags": ", ".join(f"{f['name']} ({f['severity']})" for f in c["flags"]) or "-"}
                   for c in result.curve])
    rows = [{"attack": "clean", "accuracy": result.clean_accuracy, "broke": None, "attacked": None, "seconds":
             result.timings.get("clean_s")}]
    rows += [{"attack": k, "accuracy": v, "broke": result.breaks[k], "attacked": result.attacked[k],
              "share of breaks": doc["share_of_breaks"][k], "seconds": result.timings.get(f"{k}_s")}
             for k, v in result.attacks.items()]
    rep.heading("Accuracy after each attack").table(rows)
    rep.image(report.save_bars({"accuracy": {r["attack"]: r["accuracy"] for r in rows}}, None,
                               title="cumulative accuracy", ylabel="accuracy"), "accuracy after each attack")
    broken = (~result.robust & result.clean_correct).nonzero().flatten()
    if broken.numel() and result.adv is not None:
        norms = (result.linf if result.norm == "linf" else result.l2)[broken]
        rep.heading("Adversarial examples")
        name = {"linf": "L-inf", "l2": "L2"}.get(result.norm, result.norm)
        rep.histogram(norms, f"{name} norms of the perturbations of the {broken.numel()} broken images",
                      title=f"{result.norm} norm of the perturbations", xlabel=result.norm)
        import torch

        pick = broken[:16].tolist()  # result tensors are in data order, aligned with adv
        caps = [f"{int(result.y[i])}->{int(result.adv_pred[i])} ({result.broken_by[i]})" for i in pick]
        grid = torch.stack([result.adv[i] for i in pick])
        rep.image(report.save_image_grid(grid, None, captions=caps, ncols=8),
                  "adversarial images: label->prediction (attack)")
    if result.corruption is not None:
        c = result.corruption
        rep.heading("Common corruptions")
        rep.paragraph(f"mean corruption accuracy {100 * c['mean_corruption_accuracy']:.2f}%, mean corruption error "
                      f"{100 * c['mean_corruption_error']:.2f}%"
                      + ("" if c["mce"] is None else f", mCE {100 * c['mce']:.2f}% and relative mCE "
                         f"{100 * c['relative_mce']:.2f}% of the baseline's"))
        rep.table([{"corruption": name, **per} for name, per in c["accuracy"].items()])
    return rep  # the settings and timings tables follow (HtmlReport.from_results)


#: the bracket's bar: label -> (share key, colour)
_BAR = {"certified": ("certified", "#2da44e"), "undecided": ("undecided", "#bf8700"),
        "broken by an attack": ("broken_by_attack", "#cf222e"), "misclassified clean": ("misclassified", "#6e7781"),
        "UNSOUND (certified and broken)": ("unsound", "#8250df")}


def _bracket_section(rep, result, brk, data) -> None:
    """Certified, robust and clean accuracy as one stacked bar, the counts, and the undecided samples."""
    import torch

    from robustest import report
    from robustest.core.batching import take

    shares, counts = brk.shares(), brk.counts()
    rep.heading("Certified, robust and clean accuracy")
    rep.paragraph(f"{brk.method.upper()} certificate on the same {brk.num_samples} images: certified "
                  f"{brk.certified_accuracy:.3f} <= robust {brk.robust_accuracy:.3f} <= clean "
                  f"{brk.clean_accuracy:.3f}. "
                  "Certified: no point of the ball changes the prediction (proved). Broken: misclassified clean, or "
                  "an attack's point inside the ball and [0, 1] that the model misclassifies (checked again here). "
                  "Undecided: neither; the true robust accuracy lies between the certified share and the robust "
                  "accuracy.")
    if not brk.sound:
        rep.paragraph(f"SOUNDNESS ERROR: {counts['unsound']} samples are both certified and broken "
                      f"({', '.join(str(i) for i in _unsound_indices(brk))}): the certificate or the evaluation is "
                      "wrong, and neither figure can be trusted.")
    if brk.unverified:
        rep.note(f"{brk.unverified} samples the attacks broke did not pass the check (the point left the ball or "
                 "[0, 1], or the model judged it differently again): they count as undecided here.")
    parts = {label: shares[key] for label, (key, _) in _BAR.items() if key != "unsound" or counts["unsound"]}
    colours = [c for label, (_, c) in _BAR.items() if label in parts]
    rep.image(report.save_stacked_bar(parts, None, title="certified | undecided | broken | misclassified",
                                      xlabel="share of the samples", colors=colours),
              "certified accuracy = the green part; robust accuracy = green + amber; clean accuracy = everything but "
              "the grey part")
    rep.table([counts])
    undecided = torch.tensor([lab == "undecided" for lab in brk.labels], dtype=torch.bool)
    pick = torch.nonzero(undecided).flatten()[:16]
    if pick.numel() and data is not None:
        x, _ = take(data, brk.index[pick])
        margins = brk.lower_margin[pick].tolist() if brk.lower_margin is not None else [None] * len(pick)
        caps = [f"{int(result.y[i])} m={m:.2g}" if m is not None else f"{int(result.y[i])}"
                for i, m in zip(pick.tolist(), margins)]
        rep.heading("Undecided samples", level=3)
        rep.image(report.save_image_grid(x, None, captions=caps, ncols=8),
                  "neither certified nor broken: label and the certificate's lower margin bound (m)")


def _unsound_indices(brk, limit: int = 10) -> list[int]:
    """The first ``limit`` data indices of the unsound samples."""
    return [int(i) for i in brk.index[brk.unsound][:limit].tolist()]
