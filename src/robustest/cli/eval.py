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

from robustest.cli.args import (
    add_data_args,
    add_model_args,
    add_option_args,
    add_run_args,
    batch_size_arg,
    int_list,
    list_arg,
    name_list,
    options_from_args,
    radius,
    share_arg,
)
from robustest.cli.loading import check_fits, load_data, load_model, resolve_batch_size
from robustest.cli.output import log, out_dir, write_run, written
from robustest.cli.settings import data_settings, model_settings
from robustest.core.errors import EXIT_GATE, ConfigError
from robustest.core.validation import check_eps
from robustest.evaluate.ensemble import EVALUATE_OPTIONS, evaluate

ORDER = 35
EVALUATE = (evaluate, EVALUATE_OPTIONS)  # the options of the evaluation, flags included


parse_accuracy = share_arg("an accuracy", "0.85 or 85%")  # --fail-under: "0.85" or "85%"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate robustness (AutoAttack ensemble, corruptions); gate CI with "
                                    "--fail-under", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_data_args(p, split="test")
    p.add_argument("--eps", type=list_arg(radius, what="eps"), required=True, metavar="E",
                   help="radius of the threat model in pixel scale, e.g. 0.3 or 8/255 (L-inf: in (0, 1]); a list "
                        "(0.1,0.2,0.3) measures a robustness curve, each radius on the survivors of the smaller")
    add_option_args(p, EVALUATE, ("norm", "version"))
    p.add_argument("--attacks", type=name_list("attack"), default=None, metavar="LIST",
                   help="with --version custom: comma-separated attacks in order, e.g. apgd-ce,apgd-dlr,square")
    add_option_args(p, EVALUATE, ("n_targets", "corruptions"))
    p.add_argument("--severities", type=int_list(what="severity", lo=1, hi=5, sort=True), default=[1, 2, 3, 4, 5],
                   metavar="LIST", help="corruption severities: 1-5, 1,3,5 or 1-2,5 (default: 1-5)")
    p.add_argument("--baseline", default=None, metavar="FILE",
                   help="checkpoint of a baseline model whose corruption errors normalise the mCE")
    p.add_argument("--fail-under", type=parse_accuracy, default=None, metavar="ACC",
                   help="exit with status 1 when the robust accuracy is below ACC (0.85 or 85%%) or a flag says the "
                        "evaluation is unreliable")
    p.add_argument("--accept-flag", type=name_list("flag"), default=None, metavar="LIST",
                   help="unreliable flags the gate accepts, by name (recorded in results.json), e.g. zero-gradient")
    add_option_args(p, EVALUATE, ("bpda",))
    p.add_argument("--surrogate", default=None, metavar="FILE",
                   help="checkpoint of a surrogate model: its APGD-CE points are transferred and judged on the model")
    add_option_args(p, EVALUATE, ("forwards",))
    p.add_argument("--batch-size", type=batch_size_arg, default=256, metavar="B",
                   help="images per attack batch, or 'auto': the largest that fits the GPU with the attacks' "
                        "gradients (the default 256 on the CPU)")
    add_option_args(p, EVALUATE, ("amp", "block_size"))
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

    from robustest.core.devices import model_device
    from robustest.evaluate.eval_pipeline import eval_pipeline
    from robustest.evaluate.eval_report import eval_report
    from robustest.evaluate.flags import flag_lines
    from robustest.models.checkpoints import source_of

    t0 = time.perf_counter()
    attacks, severities = _check_args(args)
    if Path(args.out).exists():
        out_dir(args)
    model = load_model(args)
    baseline = surrogate = None
    if args.baseline is not None or args.surrogate is not None:
        from robustest.models.checkpoints import load_model as load_file

        baseline, surrogate = (None if f is None else load_file(f, torchscript=args.torchscript,
                                                                map_location=model_device(model))
                               for f in (args.baseline, args.surrogate))
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
    spec = getattr(model, "robustest_spec", None)
    describe = {"dataset": args.dataset, "name": Path(args.checkpoint).stem if args.checkpoint else
                str(args.model_factory), "architecture": spec.get("name") if isinstance(spec, dict) else None,
                "model": {**model_settings(args), "spec": source_of(model)}, "data": data_settings(args),
                "baseline_source": args.baseline}
    ev = eval_pipeline(model, ds, args.eps, out=args.out, certify=args.certify, fail_under=args.fail_under,
                       accept_flags=args.accept_flag, save_adv=args.save_adv, describe=describe, attacks=attacks,
                       **options_from_args(EVALUATE, args), seed=args.seed, batch_size=args.batch_size,
                       severities=severities or (1, 2, 3, 4, 5), baseline=baseline, surrogate=surrogate,
                       progress=not args.no_progress or args.progress_lines)
    result, brk, out = ev.result, ev.bracket, Path(args.out)  # made and proved writable by the pipeline
    timings = {**result.timings, "load_s": t_load, **ev.timings}  # the order of the report's timings table
    settings = {**model_settings(args), **data_settings(args), **ev.settings(
        batch_size_auto=args.batch_size_auto, baseline=args.baseline, surrogate=args.surrogate)}
    write_run(out, "eval", t0, settings, ev.to_results(), timings, lambda doc: eval_report(result, doc, brk, ds))
    before, after = ev.summary_lines()
    for line in before:
        log.info(line)
    for line in flag_lines(result.flags, "robustest eval"):
        print(line, file=sys.stderr)
    for line in after:
        log.info(line)
    written(out, ev.files, t0)
    for line in ev.gate_lines():
        print(f"robustest eval: {line}", file=sys.stderr)
    return EXIT_GATE if ev.failed else 0
