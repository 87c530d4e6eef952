"""``robustest analyze``, ``robustest validate``, ``robustest enhance``: weak-robust validation.

Each verb writes results.json (the results contract; schemas docs/schemas/analyze|validate|enhance.schema.json)
and report.html to --out; their descriptions below are what ``--help`` shows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from robustest.cli._common import (
    add_checkpoint_arg,
    add_data_args,
    add_run_args,
    batch_size_arg,
    check_fits,
    data_settings,
    fmt,
    fraction,
    int_list,
    learning_rate,
    linf_eps,
    linf_eps_list,
    list_arg,
    load_data,
    load_model,
    log,
    model_settings,
    name_list,
    noise_width,
    non_negative_float,
    non_negative_int,
    out_dir,
    peak_rss_mib,
    positive_int,
    print_table,
    resolve_batch_size,
)
from robustest.core import distributed
from robustest.core.atomic import atomic_save
from robustest.core.batching import labels_of, take
from robustest.core.devices import model_device
from robustest.core.errors import ConfigError, DataError
from robustest.core.steps import Steps, data_fingerprint, fingerprint
from robustest.results import write_results
from robustest.selection.strata import ALLOCATIONS

ORDER = 60

ANALYZE_DESCRIPTION = """robustest analyze: local robustness of every sample of a split.

Each sample gets Q noisy neighbours (--neighbors, uniform or Gaussian noise of width --eps, rounded to the 256
uint8 levels); its score is the mean probability the model gives to wrong classes over the neighbours (higher =
weaker). Writes to --out:
  analysis.pt   per-sample score, fraction of neighbours misclassified, top wrong class, clean correctness
  results.json  settings in effect, summary, the 20 weakest samples, timings
  report.html   score histograms, the weakest samples as images, settings and timings
"""

# robustest.weakrobust.weakset's names, repeated so that the CLI does not import the package to build its
# parser (tests/test_cli_weakrobust.py checks that they agree)
STRATEGIES = ("weak", "weak-correct", "stratified", "random")
DEFAULT_SUBSET_SIZE = 1000
DEFAULT_STRATEGY = "stratified"
"""validate's default --strategy: the one that predicted test robustness best in docs/WEAKROBUST.md."""

VALIDATE_DESCRIPTION = f"""robustest validate: a validation set chosen by local robustness and the model's errors on it.

Chooses training samples from an analysis (--analysis FILE from 'robustest analyze', or analysed inline) by
--strategy: 'weak' (the paper's rule: the weakest samples by --k, --fraction or --threshold, default
--threshold 0.5), 'weak-correct' (the same among correctly classified samples), 'stratified' (K samples drawn
across --strata quantile strata of the robustness score, errors weighted by stratum share: unbiased for the
training distribution) or 'random' (K at random); stratified and random take K from --k, --fraction or
--threshold, default {DEFAULT_SUBSET_SIZE}. Default: {DEFAULT_STRATEGY}: in the evidence experiment (docs/WEAKROBUST.md)
it was unbiased with the smallest estimation error and ranked models by test robustness as well as any training
subset, while the paper's weak set did clearly worse. Then measures the model's error on the set
under gradient attacks and common corruptions, next to the same errors on the test split; every perturbation
type is labelled a strength or a weakness (its error on the set above the mean of its family). Writes to --out:
  weakset.pt, weakset.json   the set (indices, labels, scores, rule; weights of a stratified set)
  validation.pt              per-sample outcomes under every perturbation and level
  results.json               settings in effect, errors per type, strengths and weaknesses, timings
  report.html                errors per perturbation type (weak set vs test split), the analysis, settings
"""

ENHANCE_DESCRIPTION = """robustest enhance: targeted enhancement of a checkpoint.

Fine-tunes with AugMix + Jensen-Shannon consistency and an adversarial copy of each batch, the AugMix pool
extended by the weaknesses found by 'robustest validate' (--weaknesses: names, or its results.json). Writes
to --out:
  model.pt      the enhanced checkpoint
  results.json  settings in effect, per-epoch losses, before/after test figures (held-out corruptions,
                white-box attacks), timings
  report.html   the epochs, before/after table and per-perturbation errors, settings and timings
"""


ANALYSIS_STEP = 16384  # samples per saved step of an analysis (a multiple of the noise block)


def _unit(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0 <= v < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {v}")
    return v


def _add_analysis_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("local robustness analysis")
    g.add_argument("--neighbors", type=positive_int, default=50, help="noisy neighbours per sample (default: 50)")
    g.add_argument("--noise-width", "--eps", dest="eps", type=noise_width, default=0.22, metavar="W",
                   help="width of the neighbours' noise, not an attack radius: delta ~ U[-W/2, W/2] per pixel "
                        "(default: 0.22; --eps is the same option, the name of the reference code)")
    g.add_argument("--noise", choices=("uniform", "gaussian"), default="uniform", help="noise law (default: uniform)")
    g.add_argument("--no-quantize", action="store_true", help="do not round neighbours to the 256 uint8 levels")
    g.add_argument("--batch-size", type=batch_size_arg, default=None, metavar="B",
                   help="images per forward pass, or 'auto': the largest that fits the GPU (on the CPU the "
                        "default: about 4 million pixel values' worth: 5349 images of 28x28, 341 of 3x64x64)")
    g.add_argument("--amp", choices=("bf16", "fp16"), default=None,
                   help="run the analysis's forward passes in bf16 (CPU or CUDA) or fp16 (CUDA) autocast: faster on "
                        "GPUs, scores rounded accordingly (default: float32)")
    g.add_argument("--save-every", type=positive_int, default=ANALYSIS_STEP, metavar="N",
                   help=f"save the analysis every N samples per process (under torchrun a step covers N x "
                        f"ranks samples); rerunning the same command after a kill continues from there "
                        f"(default: {ANALYSIS_STEP})")


def add_parser(sub: argparse._SubParsersAction) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("analyze", help="local robustness analysis of every sample (weak-robust scores)",
                       description=ANALYZE_DESCRIPTION, formatter_class=raw)
    add_checkpoint_arg(p)
    add_data_args(p, split="train")
    _add_analysis_args(p)
    p.add_argument("--top", type=positive_int, default=32, help="weakest samples shown in the report (default: 32)")
    p.add_argument("--radius-eps-max", type=linf_eps, default=None, metavar="EPS",
                   help="also compute the smallest PGD L-inf budget that flips each sample (bisection up to EPS) "
                        "and its rank correlation with the score (costly: about 9 x 11 gradient passes)")
    add_run_args(p)
    p.set_defaults(func=run_analyze)

    p = sub.add_parser("validate", help="weak-robust validation set and the model's errors under perturbations",
                       description=VALIDATE_DESCRIPTION, formatter_class=raw)
    add_checkpoint_arg(p)
    add_data_args(p, split="train")
    p.add_argument("--analysis", metavar="FILE", default=None,
                   help="analysis.pt from 'robustest analyze' (default: analyse inline)")
    _add_analysis_args(p)
    g = p.add_argument_group("validation-set selection")
    g.add_argument("--strategy", choices=STRATEGIES, default=None,
                   help=f"weak: the paper's weakest samples; weak-correct: the weakest correctly classified ones; "
                        f"stratified: K drawn across robustness-score strata, errors weighted by stratum share; "
                        f"random: K at random (default: {DEFAULT_STRATEGY}, unbiased with the smallest estimation "
                        f"error in docs/WEAKROBUST.md; weak-correct with --correct-only, weak with --per-class)")
    g.add_argument("--strata", type=positive_int, default=10,
                   help="stratified: quantile strata of the robustness score (default: 10)")
    g.add_argument("--allocation", choices=ALLOCATIONS, default="proportional",
                   help="stratified: samples per stratum proportional to its size, or Neyman (size x pilot "
                        "standard deviation) (default: proportional)")
    sel = g.add_mutually_exclusive_group()
    sel.add_argument("--k", type=positive_int, default=None,
                     help=f"the K weakest samples (weak), or K samples (stratified, random; default: "
                          f"{DEFAULT_SUBSET_SIZE})")
    sel.add_argument("--fraction", type=fraction, default=None,
                     help="the weakest fraction of the samples (weak), or as many samples (stratified, random)")
    sel.add_argument("--threshold", type=_unit, default=None,
                     help="samples with more than this share of neighbours misclassified (weak; paper and default "
                          "there: 0.5), or as many samples (stratified, random)")
    g.add_argument("--per-class", action="store_true", help="weak strategies: balance the set over the classes")
    g.add_argument("--correct-only", action="store_true",
                   help="rank only samples classified correctly (= --strategy weak-correct)")
    g = p.add_argument_group("perturbations")
    g.add_argument("--perturbations", type=name_list("perturbation"), default=["all"], metavar="LIST",
                   help="'all', 'attacks', 'corruptions' or names of attacks/corruptions, comma-separated "
                        "(default: all)")
    g.add_argument("--attack-eps", type=linf_eps_list("attack eps"), default=None, metavar="LIST",
                   help="L-inf budgets of the attacks, comma-separated (default: 0.05,0.1,0.2 for grey, "
                        "2/255,4/255,8/255 for colour)")
    g.add_argument("--severities", type=int_list(what="severity", lo=1, hi=5, sort=True), default=[1, 2, 3, 4, 5],
                   metavar="LIST", help="corruption severities: 1-5, 1,3,5 or 1-2,5 (default: 1-5)")
    g.add_argument("--attack-steps", type=positive_int, default=None,
                   help="steps of the iterative attacks (default: each attack's own)")
    g.add_argument("--test-limit", type=non_negative_int, default=1000, metavar="N",
                   help="test-split samples evaluated for comparison (0: none; default: 1000)")
    add_run_args(p)
    p.set_defaults(func=run_validate)

    p = sub.add_parser("enhance", help="targeted enhancement: AugMix + JSD + adversarial copy + weaknesses",
                       description=ENHANCE_DESCRIPTION, formatter_class=raw)
    add_checkpoint_arg(p)
    add_data_args(p, split=None)
    p.add_argument("--weaknesses", type=list_arg(str, what="weakness"), default=[], metavar="LIST",
                   help="corruption/attack names, or the results.json of 'robustest validate' (its weaknesses), "
                        "comma-separated")
    p.add_argument("--epochs", type=positive_int, required=True, help="training epochs")
    p.add_argument("--no-augmix", action="store_true", help="drop the AugMix + JSD term")
    p.add_argument("--no-adversarial", action="store_true", help="drop the adversarial copy")
    p.add_argument("--jsd-weight", type=non_negative_float, default=6.0, help="weight of the JSD term (default: 6)")
    p.add_argument("--adv-weight", type=non_negative_float, default=0.5, help="weight of CE(x_adv) (default: 0.5)")
    p.add_argument("--adv-eps", type=linf_eps, default=None, help="PGD budget (default: 0.1 grey, 4/255 colour)")
    p.add_argument("--adv-steps", type=positive_int, default=10, help="PGD steps (default: 10)")
    p.add_argument("--adv-source", choices=("offline", "online"), default="offline",
                   help="PGD against the starting model once (offline) or the current model per batch")
    p.add_argument("--lr", type=learning_rate, default=5e-4, help="learning rate (default: 5e-4)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="batch size (default: 64)")
    p.add_argument("--eval-limit", type=non_negative_int, default=1000, metavar="N",
                   help="test samples for the before/after comparison (0: none; default: 1000)")
    add_run_args(p)
    p.set_defaults(func=run_enhance)


# ------------------------------------------------------------------------------------------- helpers


def _analysis_from_args(args: argparse.Namespace, model, ds, out: Path):
    """The local robustness analysis of ``ds``, in saved steps of ``--save-every`` samples per process:
    rerunning the same command after a kill continues from the last finished step.

    Under torchrun a step covers ``save_every x world_size`` samples, so each rank does as much work
    between two saves (one gather, one atomic write) as a single process does; the scores do not depend on
    the step size (neighbour noise is seeded per block of samples), only the resume points do."""
    from robustest import weakrobust as wr
    from robustest.models.checkpoints import state_fingerprint

    if args.batch_size == "auto":
        resolve_batch_size(args, model, ds, default=wr.default_batch_size(ds), grad=False, amp=args.amp)
    every = args.save_every * distributed.world_size()
    settings = {k: getattr(args, k) for k in ("neighbors", "eps", "noise", "no_quantize", "seed", "amp")}
    settings["step"] = every
    steps = Steps(out, fingerprint("analyze", settings, state_fingerprint(model), data_fingerprint(ds)),
                  log=lambda msg: print(f"note: {msg}", file=sys.stderr))
    n, parts = len(ds), []
    for k, lo in enumerate(range(0, n, every)):
        span = (lo, min(lo + every, n))
        d = steps.run(f"analysis_{k:05d}", lambda span=span: wr.analyze(
            model, ds, n_neighbors=args.neighbors, eps=args.eps, noise=args.noise, quantize=not args.no_quantize,
            batch_size=args.batch_size, seed=args.seed, progress=not args.no_progress, span=span,
            amp=args.amp).to_dict())
        parts.append(wr.Analysis.from_dict(d, f"{out}/state/steps/analysis_{k:05d}.pt"))
    if steps.resumed:
        print(f"note: {steps.resumed} finished step(s) of an interrupted run reused", file=sys.stderr)
    return wr.Analysis.concat(parts)


def _weakest_grid(ds, analysis, positions: torch.Tensor, title: str) -> bytes:
    from robustest.report import save_image_grid

    x = take(ds, analysis.index[positions])[0]
    caps = [f"y={int(analysis.label[p])} w={int(analysis.top_wrong[p])} s={float(analysis.score[p]):.2f}"
            for p in positions.tolist()]
    return save_image_grid(x, None, captions=caps, title=title)


def _analysis_report(rep, ds, analysis, top: int) -> None:

    rep.heading("Local robustness")
    rep.key_values({k: v for k, v in analysis.summary().items() if k != "seconds"})
    rep.histogram({"mean misprediction score": analysis.score},
                  "distribution of the per-sample mean misprediction score over the neighbours", title="sample scores",
                  xlabel="mean misprediction score (higher = weaker)", log=True)
    rep.histogram({"fraction of neighbours misclassified": analysis.frac_misclassified},
                  "fraction of neighbours misclassified", title="fraction misclassified", xlabel="fraction", log=True)
    order = analysis.order()[:top]
    if len(order):
        rep.image(_weakest_grid(ds, analysis, order, f"{len(order)} weakest samples"),
                  "Weakest samples: y = label, w = top wrong class (largest mean neighbour probability), s = score.")


def _weakest_rows(analysis, n: int = 20) -> list[dict]:
    order = analysis.order()[:n]
    return [{"index": int(analysis.index[p]), "label": int(analysis.label[p]), "score": float(analysis.score[p]),
             "frac_misclassified": float(analysis.frac_misclassified[p]),
             "clean_correct": bool(analysis.clean_correct[p]), "top_wrong": int(analysis.top_wrong[p])}
            for p in order.tolist()]


# --------------------------------------------------------------------------------------------- verbs
def _analysis_settings(args: argparse.Namespace) -> dict[str, Any]:
    d = {"neighbors": args.neighbors, "eps": args.eps, "noise": args.noise, "quantize": not args.no_quantize}
    if args.batch_size is not None:
        d["batch_size"] = args.batch_size
    if getattr(args, "batch_size_auto", False):
        d["batch_size_auto"] = True
    if args.amp is not None:
        d["amp"] = args.amp
    return d


def run_analyze(args: argparse.Namespace) -> int:
    from robustest.report import HtmlReport

    out = out_dir(args)
    t0 = time.perf_counter()
    model = load_model(args)
    ds = load_data(args)
    check_fits(model, ds)
    analysis = _analysis_from_args(args, model, ds, out)
    analysis.save(out / "analysis.pt")
    results: dict[str, Any] = {"n": len(analysis), "summary": analysis.summary(), "weakest": _weakest_rows(analysis),
                               "files": {"analysis": "analysis.pt", "report": "report.html"}}
    timings = {"analyze_s": analysis.params["seconds"]}
    radius = None
    if args.radius_eps_max:
        from scipy.stats import spearmanr

        from robustest import weakrobust as wr

        tr = time.perf_counter()
        radius = wr.adversarial_radius(model, ds, eps_max=args.radius_eps_max, seed=args.seed)
        timings["radius_s"] = time.perf_counter() - tr
        atomic_save(radius, out / "radius.pt")
        fin = radius[torch.isfinite(radius)]
        rho = spearmanr(analysis.score.numpy(), (-radius.clamp(max=2 * args.radius_eps_max)).numpy()).statistic
        results["radius"] = {"eps_max": args.radius_eps_max, "median": float(fin.median()) if fin.numel() else None,
                             "frac_not_flipped": float((~torch.isfinite(radius)).float().mean()),
                             "spearman_score_vs_minus_radius": None if rho != rho else float(rho)}
        results["files"]["radius"] = "radius.pt"
    timings["total_s"] = time.perf_counter() - t0
    results["peak_rss_mib"] = peak_rss_mib()
    settings = {**model_settings(args), **data_settings(args), **_analysis_settings(args), "top": args.top,
                **({"radius_eps_max": args.radius_eps_max} if args.radius_eps_max else {}), "seed": args.seed,
                "device": str(model_device(model))}
    doc = write_results(out, "analyze", settings, results, timings)
    rep = HtmlReport.from_results(doc, f"robustest analyze: {args.dataset} {args.split}")
    rep.paragraph(f"{len(analysis)} samples, {args.neighbors} neighbours each, eps {fmt(args.eps)} ({args.noise} "
                  f"noise{'' if args.no_quantize else ', quantised'}).")
    _analysis_report(rep, ds, analysis, args.top)
    if radius is not None:
        rep.heading("Adversarial radius")
        rep.key_values(results["radius"])
        rep.histogram({"PGD radius": radius[torch.isfinite(radius)]}, "PGD radius", title="adversarial radius",
                      xlabel="smallest L-inf budget that flips the sample")
    rep.heading("Weakest samples")
    rep.table(results["weakest"])
    rep.write(out / "report.html")
    s = analysis.summary()
    log.info(f"analysed {len(analysis)} samples in {fmt(analysis.params['seconds'], 'analyze_s')} s: clean accuracy "
             f"{fmt(s['clean_accuracy'], 'accuracy')}, mean score {fmt(s['mean_score'])}, "
             f"{fmt(100 * s['frac_most_neighbours_wrong'])} % with most neighbours misclassified")
    log.info(f"wrote {out / 'analysis.pt'}, results.json and report.html")
    return 0


def run_validate(args: argparse.Namespace) -> int:
    from robustest import weakrobust as wr

    _resolve_strategy(args)
    out = out_dir(args)
    t0 = time.perf_counter()
    model = load_model(args)
    ds = load_data(args)
    check_fits(model, ds)
    analysis = _validation_analysis(args, model, ds, out)
    t_analysis = time.perf_counter() - t0
    weak = wr.select_weak(analysis, k=args.k, fraction=args.fraction, threshold=args.threshold,
                          per_class=args.per_class, strategy=args.strategy, strata=args.strata,
                          allocation=args.allocation, seed=args.seed)
    if len(weak) == 0:
        raise DataError("the weak set is empty (no sample has that many neighbours misclassified): "
                        "use --k, --fraction or a lower --threshold")
    weak.save(out / "weakset.pt")
    weak.save(out / "weakset.json")
    kw = {}
    if args.attack_steps:
        kw = {a: {"steps": args.attack_steps} for a in ("pgd", "bim", "mifgsm", "rfgsm")}
    common = dict(perturbations=args.perturbations, eps=args.attack_eps, severities=tuple(args.severities),
                  attack_kwargs=kw, seed=args.seed, progress=not args.no_progress)
    t1 = time.perf_counter()
    res = wr.validate(model, ds, weak, **common)
    res.save(out / "validation.pt")
    t_weak = time.perf_counter() - t1
    test_res = None
    t2 = time.perf_counter()
    if args.test_limit and args.test_limit > 0:
        test = load_data(args, "test")
        test_res = wr.validate(model, take(test, torch.arange(min(args.test_limit, len(test)))), None, **common)
    t_test = time.perf_counter() - t2
    rows = _validation_rows(res, test_res)
    results = _validation_results(args, analysis, weak, res, test_res, rows)
    settings = _validation_settings(args, model, weak, res)
    timings = {"analysis_s": t_analysis, "validate_weak_s": t_weak, "validate_test_s": t_test,
               "total_s": time.perf_counter() - t0}
    doc = write_results(out, "validate", settings, results, timings)
    _validation_report(doc, args, ds, analysis, weak, res, test_res, rows).write(out / "report.html")
    print_table(rows, ["type", "family", "weak_error", "test_error", "label"])
    log.info(f"{weak.rule['strategy']} set: {len(weak)} samples; mean adversarial error "
             f"{fmt(res.mean_adv_error, 'error')}, mCE {fmt(res.mce, 'mce')}; "
             f"weaknesses: {', '.join(res.weaknesses()) or 'none'}")
    log.info(f"wrote {out / 'results.json'} and {out / 'report.html'}")
    return 0


def _resolve_strategy(args: argparse.Namespace) -> None:
    """Set ``args.strategy`` from --strategy and the older flags (--correct-only, --per-class), which keep their
    meaning; a one-line ConfigError when a flag does not apply to the strategy."""
    if args.strategy is None:  # the old flags keep their meaning
        args.strategy = "weak-correct" if args.correct_only else "weak" if args.per_class else DEFAULT_STRATEGY
    if args.strategy in ("stratified", "random") and (args.correct_only or args.per_class):
        flag = "--correct-only" if args.correct_only else "--per-class"
        raise ConfigError(f"{flag} applies to --strategy weak or weak-correct, not {args.strategy}")
    if args.strategy == "weak" and args.correct_only:
        args.strategy = "weak-correct"


def _validation_analysis(args: argparse.Namespace, model, ds, out: Path):
    """validate's analysis: read from --analysis (refused when it analyses other samples than ``ds``), or
    computed in saved steps and written to ``out/analysis.pt``."""
    from robustest import weakrobust as wr

    if not args.analysis:
        analysis = _analysis_from_args(args, model, ds, out)
        analysis.save(out / "analysis.pt")
        return analysis
    analysis = wr.Analysis.load(args.analysis)
    labels = labels_of(ds)
    if len(analysis) != len(ds) or (labels is not None and not torch.equal(analysis.label, labels.long())):
        raise DataError(f"{args.analysis} analyses {len(analysis)} samples but --dataset {args.dataset} "
                        f"--split {args.split} has {len(ds)} (or other labels): use the same data set, split "
                        "and --limit as 'robustest analyze'")
    return analysis


def _validation_rows(res, test_res) -> list[dict[str, Any]]:
    """One row per perturbation type: its family, its error on the set and on the test split, its label."""
    summary = res.summary()
    rows = []
    test_pt = test_res.per_type() if test_res else {}
    for t, d in summary["per_type"].items():
        rows.append({"type": t, "family": d["family"], "weak_error": d["error"],
                     "test_error": test_pt[t][1] if t in test_pt else None, "label": d["label"] or "-"})
    return rows


def _validation_results(args: argparse.Namespace, analysis, weak, res, test_res, rows: list[dict[str, Any]]
                        ) -> dict[str, Any]:
    """validate's results: the set, the validation on it and on the test split, weaknesses and strengths, the
    table, the files written."""
    return {"n_analysed": len(analysis), "weak_set": {"n": len(weak), "strategy": weak.rule["strategy"],
                                                      "rule": weak.rule, "indices": weak.indices.tolist(),
                                                      "weights": None if weak.weights is None
                                                      else weak.weights.tolist()},
            "validation": res.to_dict(), "test": test_res.to_dict() if test_res else None,
            "weaknesses": res.weaknesses(), "strengths": [t for t, v in res.labels().items() if v == "strength"],
            "table": rows, "peak_rss_mib": peak_rss_mib(),
            "files": {"weak_set": "weakset.pt", "weak_set_json": "weakset.json", "validation": "validation.pt",
                      "report": "report.html", **({} if args.analysis else {"analysis": "analysis.pt"})}}


def _validation_settings(args: argparse.Namespace, model, weak, res) -> dict[str, Any]:
    """The settings validate ran with: those of the analysis (or its file), the set's rule, the perturbations
    measured."""
    settings = {**model_settings(args), **data_settings(args)}
    settings.update({"analysis": str(args.analysis)} if args.analysis else _analysis_settings(args))
    settings["strategy"] = weak.rule["strategy"]
    if args.strategy == "stratified":
        settings.update(strata=args.strata, allocation=args.allocation)
    settings.update({key: weak.rule[key] for key in ("k", "fraction", "threshold") if key in weak.rule})
    settings.update(per_class=args.per_class, correct_only=weak.rule["strategy"] == "weak-correct",
                    perturbations=list(res.meta.get("attacks", [])) + list(res.meta.get("corruptions", [])))
    if res.meta.get("attacks"):
        settings["attack_eps"] = list(res.meta.get("eps", []))
        if args.attack_steps:
            settings["attack_steps"] = args.attack_steps
    if res.meta.get("corruptions"):
        settings["severities"] = list(res.meta.get("severities", args.severities))
    settings.update(test_limit=args.test_limit, seed=args.seed, device=str(model_device(model)))
    return settings


def _validation_report(doc: dict[str, Any], args: argparse.Namespace, ds, analysis, weak, res, test_res,
                       rows: list[dict[str, Any]]):
    """validate's HtmlReport (to be written): the set, the errors on it and on the test split per perturbation
    type, strengths and weaknesses, the analysis."""
    from robustest.report import HtmlReport, save_hbars

    rep = HtmlReport.from_results(doc, f"robustest validate: {args.dataset}")
    how = {"weak": "the weakest", "weak-correct": "the weakest correctly classified",
           "stratified": f"stratified over {weak.rule.get('strata')} score strata, errors weighted by stratum share",
           "random": "uniformly at random"}[weak.rule["strategy"]]
    rep.paragraph(f"Validation set ({weak.rule['strategy']}): {len(weak)} of {len(analysis)} {args.split} samples, "
                  f"{how}. A perturbation type is a weakness when its error on the set exceeds the mean error of "
                  "its family (attacks vs attacks, corruptions vs corruptions), else a strength.")
    rep.table([{"set": "weak", "n": len(weak), "clean_error": res.clean_error, "mean_adv_error": res.mean_adv_error,
                "mce": res.mce}] + ([{"set": "test", "n": len(test_res), "clean_error": test_res.clean_error,
                                      "mean_adv_error": test_res.mean_adv_error, "mce": test_res.mce}]
                                    if test_res else []))
    bars = {"weak set": {r["type"]: r["weak_error"] for r in rows}}
    if test_res:
        bars["test split"] = {r["type"]: r["test_error"] for r in rows}
    rep.image(save_hbars(bars, None, title="error per perturbation type", xlabel="top-1 error"),
              "Error per perturbation type (mean over budgets / severities): weak set vs test split.")
    rep.heading("Strengths and weaknesses")
    rep.table(rows, ["type", "family", "weak_error", "test_error", "label"])
    _analysis_report(rep, ds, analysis, 32)
    return rep


def _read_weaknesses(items: list[str]) -> list[str]:
    names: list[str] = []
    for it in items:
        p = Path(it)
        if it.endswith(".json") or p.is_file():
            if not p.is_file():
                raise DataError(f"weaknesses file {it!r} does not exist: pass the results.json of 'robustest validate'")
            try:
                d = json.loads(p.read_text())
            except (OSError, ValueError) as exc:
                raise DataError(f"{it} is not a JSON file: pass the results.json of 'robustest validate'") from exc
            if not isinstance(d, dict) or not isinstance(d.get("weaknesses"), list):
                raise DataError(f"{it} has no 'weaknesses' list: pass the results.json of 'robustest validate'")
            names += [str(w) for w in d["weaknesses"]]
        else:
            names += [w for w in it.split(",") if w]
    return list(dict.fromkeys(names))


def _enhance_state(args: argparse.Namespace, out: Path, model, train, weaknesses: list[str]) -> Path:
    """Where enhance saves its state after every epoch: a file named by the run's fingerprint (settings,
    starting model, data), so rerunning the same command continues and a changed one starts afresh."""
    from robustest.models.checkpoints import state_fingerprint

    keys = ("epochs", "no_augmix", "no_adversarial", "jsd_weight", "adv_weight", "adv_eps", "adv_steps",
            "adv_source", "lr", "batch_size", "seed")
    fp = fingerprint("enhance", {k: getattr(args, k) for k in keys}, sorted(weaknesses), state_fingerprint(model),
                     data_fingerprint(train))[:16]
    path = out / "state" / f"enhance_{fp}.pt"
    stale = [f for f in (out / "state").glob("enhance_*.pt") if f != path] if (out / "state").is_dir() else []
    if stale and distributed.is_main():
        for f in stale:
            f.unlink(missing_ok=True)
        print("note: the enhancement state of an earlier run with other settings was removed: starting afresh",
              file=sys.stderr)
    if path.is_file() and distributed.is_main():
        print(f"note: continuing the interrupted enhancement saved in {path}", file=sys.stderr)
    return path


def run_enhance(args: argparse.Namespace) -> int:
    from robustest import corruptions as corr
    from robustest import weakrobust as wr
    from robustest.evaluate import accuracy
    from robustest.models.checkpoints import save_checkpoint
    from robustest.report import HtmlReport, plural, save_hbars

    out = out_dir(args)
    t0 = time.perf_counter()
    weaknesses = _read_weaknesses(args.weaknesses)
    wr.augmentation_pool(weaknesses)  # unknown names fail before any work
    model = load_model(args)
    train = load_data(args, "train")
    check_fits(model, train)
    test = load_data(args, "test") if args.eval_limit > 0 else None
    if args.no_augmix and args.no_adversarial and weaknesses:
        raise ConfigError("--weaknesses extend the AugMix pool: drop --no-augmix")

    def measure(m, held_out: list[str]) -> dict:
        if test is None:
            return {}
        x, y = take(test, torch.arange(min(args.eval_limit, len(test))))
        r = wr.validate(m, (x, y), None, perturbations=["fgsm", "pgd"] + held_out, severities=(1, 3, 5),
                        seed=args.seed)
        return {"clean_accuracy": accuracy(m, (x, y)), "mean_adv_error": r.mean_adv_error, "mce_held_out": r.mce,
                "per_type": {t: e for t, (_f, e) in r.per_type().items()}}

    # corruptions held out from training (not in the pool) for the before/after comparison
    held_out = [c for c in corr.names() if c not in weaknesses][:6] if test is not None else []
    before = measure(model, held_out)
    res = wr.enhance(model, train, weaknesses, epochs=args.epochs, augmix=not args.no_augmix,
                     adversarial=not args.no_adversarial, jsd_weight=args.jsd_weight, adv_weight=args.adv_weight,
                     adv_eps=args.adv_eps, adv_steps=args.adv_steps, adv_source=args.adv_source, lr=args.lr,
                     batch_size=args.batch_size, seed=args.seed, progress=not args.no_progress,
                     resume_file=_enhance_state(args, out, model, train, weaknesses))
    after = measure(model, held_out)
    meta = dict(getattr(model, "robustest_metadata", {}) or {})
    meta.update({"enhanced": res.config, "weaknesses": weaknesses})
    save_checkpoint(out / "model.pt", model, metadata=meta)
    enh = res.to_dict()
    t_train = float(enh.pop("seconds", 0.0) or 0.0)
    results = {"enhance": enh, "held_out_corruptions": held_out, "before": before, "after": after,
               "peak_rss_mib": peak_rss_mib(), "files": {"model": "model.pt", "report": "report.html"}}
    settings = {**model_settings(args), **data_settings(args), "weaknesses": weaknesses, "epochs": args.epochs,
                "augmix": not args.no_augmix, "adversarial": not args.no_adversarial}
    if not args.no_augmix:
        settings["jsd_weight"] = args.jsd_weight
    if not args.no_adversarial:
        settings.update(adv_weight=args.adv_weight, adv_eps=res.config.get("adv_eps", args.adv_eps),
                        adv_steps=args.adv_steps, adv_source=args.adv_source)
    settings.update(lr=args.lr, batch_size=args.batch_size, eval_limit=args.eval_limit, seed=args.seed,
                    device=str(model_device(model)))
    settings = {k: v for k, v in settings.items() if v is not None}
    timings = {"train_s": t_train, "total_s": time.perf_counter() - t0}
    doc = write_results(out, "enhance", settings, results, timings)
    rep = HtmlReport.from_results(doc, "robustest enhance")
    rep.paragraph(f"{plural(args.epochs, 'epoch')}; pool: {', '.join(res.pool)}; "
                  f"weaknesses: {', '.join(weaknesses) or 'none'}.")
    rep.heading("Epochs")
    rep.table(res.epochs)
    if before and after:
        rep.heading("Before and after, on the test split")
        rep.table([{"model": "before", **{k: v for k, v in before.items() if k != "per_type"}},
                   {"model": "after", **{k: v for k, v in after.items() if k != "per_type"}}])
        rep.image(save_hbars({"before": before["per_type"], "after": after["per_type"]}, None,
                             title="test error per perturbation", xlabel="top-1 error"),
                  "Test error per perturbation type: held-out corruptions (not in the training pool) and white-box "
                  "attacks, before and after enhancement.")
    rep.write(out / "report.html")
    if before and after:
        log.info(f"test accuracy {fmt(before['clean_accuracy'], 'accuracy')} -> "
                 f"{fmt(after['clean_accuracy'], 'accuracy')}; mean adversarial error "
                 f"{fmt(before['mean_adv_error'], 'error')} -> "
                 f"{fmt(after['mean_adv_error'], 'error')}; held-out mCE {fmt(before['mce_held_out'], 'mce')} -> "
                 f"{fmt(after['mce_held_out'], 'mce')}")
    log.info(f"wrote {out / 'model.pt'}, results.json and report.html")
    return 0
