"""``robustest generate``: generate test inputs for a model with an adversarial attack or a fuzzer.

Methods: fgsm, pgd, bim, rfgsm, mifgsm, cw, apgd (white-box attacks, robustest.attacks) and fol-fuzz
(FOL-guided fuzzing, RobOT) or cov-fuzz (coverage-guided, DeepHunter-style; its coverage profile is built on
the train split). Seeds are the --split of --dataset (default: train, as in RobOT's test pool).

Writes to --out:
  tests.pt       the tests (x, label y, index of the seed in the split, method, FOL of each test); readable by
                 'robustest score' / 'robustest select' and by robustest.data.load_tests
  results.json   settings in effect, success rate, perturbation norms, FOL distribution (quantiles), timings
                 (schema: docs/schemas/generate.schema.json)
  report.html    summary, perturbation and FOL tables, example seeds and tests, FOL histogram
  summary.json   the figures of results.json without its header (kept for older scripts)
  examples.png   seeds (top row) and tests (bottom row), captioned "label -> prediction"
  fol_hist.png   histogram of the tests' FOL values
By default attacks keep only successful adversarial examples (prediction != label, RobOT's pool);
--keep-all keeps every attacked image. Fuzzers only ever return failing tests.
FOL is measured with --fol-norm/--fol-eps (default: --norm and --eps; for cw the largest L2 perturbation).
"""

from __future__ import annotations

import argparse
import inspect
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from robustest import attacks, metrics
from robustest import data as datasets
from robustest.cli.args import (
    add_checkpoint_arg,
    add_data_args,
    add_run_args,
    batch_size_arg,
    learning_rate,
    linf_eps,
    non_negative_float,
    positive_float,
    positive_int,
    radius,
)
from robustest.cli.loading import check_fits, load_data, load_model, resolve_batch_size
from robustest.cli.output import fmt, log, out_dir, peak_rss_mib
from robustest.cli.settings import data_settings, model_settings
from robustest.core.atomic import atomic_write_json
from robustest.core.batching import image_shape, take
from robustest.core.devices import model_device, resolve_device
from robustest.core.errors import ConfigError
from robustest.core.modelcall import eval_mode, forward
from robustest.core.validation import check_eps
from robustest.data import save_tests
from robustest.metrics.coverage import CoverageProfile
from robustest.report import HtmlReport, save_histogram, save_image_grid
from robustest.results import write_results

ORDER = 30

FUZZERS = ("fol-fuzz", "cov-fuzz")
FUZZ_STEPS = 40  # fol-fuzz's default steps; an attack's come from its registry record
#: the attack options this verb has flags for, passed to an attack whose function takes them
ATTACK_OPTIONS = ("alpha", "random_start", "steps", "norm", "restarts", "decay", "c", "kappa", "binary_steps", "lr")
QUANTILES = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate tests with an attack or a fuzzer", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_arg(p)
    add_data_args(p, split="train")
    p.add_argument("--method", required=True, type=_method, metavar="METHOD",
                   help=f"an attack ({', '.join(attacks.names())}, or one registered with robustest.attacks."
                        f"register) or a fuzzer ({', '.join(FUZZERS)})")
    g = p.add_argument_group("attack options")
    g.add_argument("--eps", type=radius, default=None,
                   help="perturbation budget in pixel scale, a number or a fraction like 8/255 (L-inf: in (0, 1]; "
                        "default: 0.3 for 1-channel data, 8/255 for colour; cw: optional L2 bound)")
    g.add_argument("--norm", choices=("linf", "l2"), default=None,
                   help="threat model, for an attack that runs in several (default: the attack's first: linf; cw l2)")
    g.add_argument("--steps", type=positive_int, default=None,
                   help="iterations (default: the attack's own: pgd/bim/mifgsm 10, rfgsm 1, cw 100 per search "
                        "step, apgd 100; fol-fuzz 40)")
    g.add_argument("--alpha", type=positive_float, default=None,
                   help="step size of pgd/bim/rfgsm/mifgsm (default: the attack's own rule)")
    g.add_argument("--restarts", type=positive_int, default=1, help="restarts of pgd/apgd (default: 1)")
    rs = g.add_mutually_exclusive_group()
    rs.add_argument("--random-start", dest="random_start", action="store_true", default=None,
                    help="start fgsm/pgd from a random point of the eps-ball (default: pgd yes, fgsm no)")
    rs.add_argument("--no-random-start", dest="random_start", action="store_false")
    g.add_argument("--decay", type=non_negative_float, default=1.0, help="mifgsm momentum decay (default: 1.0)")
    g.add_argument("--c", type=positive_float, default=1.0, help="cw: initial constant c (default: 1.0)")
    g.add_argument("--kappa", type=non_negative_float, default=0.0, help="cw: confidence margin (default: 0)")
    g.add_argument("--binary-steps", type=positive_int, default=5, help="cw: binary search steps over c (default: 5)")
    g.add_argument("--keep-all", action="store_true", help="keep unsuccessful adversarial images too")
    f = p.add_argument_group("fuzzing options")
    f.add_argument("--lr", type=learning_rate, default=None, help="fol-fuzz step size; cw Adam learning rate "
                   "(default: 0.1 for both)")
    f.add_argument("--max-rel-l2", type=positive_float, default=0.5,
                   help="fol-fuzz: bound on ||x - x0||_2 / ||x0||_2 (default: 0.5)")
    f.add_argument("--fuzz-eps", type=linf_eps, default=None,
                   help="fol-fuzz: optional L-inf bound around each seed (default: none)")
    f.add_argument("--max-tests-per-seed", type=positive_int, default=None, help="fol-fuzz: tests per seed cap")
    f.add_argument("--time-budget", type=positive_float, default=None, metavar="S", help="fuzzers: budget in seconds")
    f.add_argument("--iterations", type=positive_int, default=100, help="cov-fuzz: iterations (default: 100)")
    f.add_argument("--coverage", choices=metrics.names("coverage"), default="kmnc",
                   help="cov-fuzz: coverage metric of the feedback (default: kmnc)")
    f.add_argument("--k", type=positive_int, default=None, help="cov-fuzz: KMNC sections (metric default if unset)")
    f.add_argument("--profile-limit", type=positive_int, default=None, metavar="N",
                   help="cov-fuzz: build the coverage profile on the first N training images (default: all)")
    s = p.add_argument_group("FOL of the tests")
    s.add_argument("--fol-norm", choices=("linf", "l2", "l1", "gradnorm"), default=None,
                   help="norm of the FOL stored with each test (default: --norm; gradnorm = ||grad||_2)")
    s.add_argument("--fol-eps", type=radius, default=None, help="eps of the FOL (default: --eps)")
    p.add_argument("--batch-size", type=batch_size_arg, default=256, metavar="B",
                   help="images per batch, or 'auto': the largest that fits the GPU with the gradients (the "
                        "default 256 on the CPU)")
    p.add_argument("--grid", type=positive_int, default=8, help="examples shown in examples.png (default: 8)")
    add_run_args(p)
    p.set_defaults(func=run)


# ---------------------------------------------------------------------------------------------- helpers
def _method(text: str) -> str:
    """--method: a fuzzer or an attack of the registry (any spelling it knows), as written."""
    if text in FUZZERS:
        return text
    try:
        attacks.get(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"unknown method {text!r}: choose an attack ({', '.join(attacks.names())})"
                                         f" or a fuzzer ({', '.join(FUZZERS)})") from None
    return text


def _norm(args: argparse.Namespace) -> str:
    """The threat model: --norm, else the attack's first (its record's), else L-inf (the fuzzers)."""
    if args.norm is not None:
        return str(args.norm)
    return "linf" if args.method in FUZZERS else attacks.get(args.method).norms[0]


def _default_eps(channels: int) -> float:
    return 0.3 if channels == 1 else 8 / 255


def _check_radii(args: argparse.Namespace) -> None:
    """--eps and --fol-eps against the norm they are measured in (L-inf radii in (0, 1]), before any work."""
    check_eps("eps", args.eps, _norm(args), allow_none=True)
    fol_norm = args.fol_norm or _norm(args)
    if fol_norm != "gradnorm":
        check_eps("fol_eps", args.fol_eps, fol_norm, allow_none=True)


def _attack_kwargs(args: argparse.Namespace, eps: float) -> dict[str, Any]:
    """The keyword arguments of the attack ``--method``: ``eps`` (the flag's radius for an attack inside an
    eps-ball, else --eps as given: C&W's optional bound) and each of :data:`ATTACK_OPTIONS` its function takes
    (a flag not given: the attack's default; steps: its record's). A flag given to an attack that does not take
    it, or a --norm it does not run in, is a ConfigError."""
    m = args.method
    record = attacks.get(m)
    sig = inspect.signature(record.fn).parameters
    norm = _norm(args)
    if norm not in record.norms:
        raise ConfigError(f"--norm {norm} is not a threat model of {m} (it runs in {', '.join(record.norms)}): "
                          "drop --norm or pick another method")
    given = {"alpha": args.alpha, "random_start": args.random_start, "steps": args.steps,
             "restarts": args.restarts if args.restarts > 1 else None}
    for param, value in given.items():
        if value is not None and param not in sig:
            flag = "--random-start/--no-random-start" if param == "random_start" else f"--{param}"
            raise ConfigError(f"{flag} does not apply to {m}")
    values = {"alpha": args.alpha, "random_start": args.random_start, "steps": args.steps or record.default_steps,
              "norm": norm, "restarts": args.restarts, "decay": args.decay, "c": args.c, "kappa": args.kappa,
              "binary_steps": args.binary_steps, "lr": args.lr}
    kw: dict[str, Any] = {"eps": eps if record.norm_bounded else args.eps}
    for name in ATTACK_OPTIONS:
        if name in sig:
            kw[name] = values[name] if values[name] is not None else sig[name].default
    return kw


def _quantiles(v: torch.Tensor) -> dict[str, float] | None:
    v = v.detach().double().cpu()
    v = v[torch.isfinite(v)]
    if v.numel() == 0:
        return None
    q = torch.quantile(v, torch.tensor(QUANTILES, dtype=torch.float64))
    out = {("min" if p == 0 else "max" if p == 1 else f"q{int(round(p * 100)):02d}"): float(t)
           for p, t in zip(QUANTILES, q)}
    out["mean"] = float(v.mean())
    return out


def _fol(model, x, y, x0, eps: float, norm: str, batch_size: int) -> torch.Tensor:
    if x.shape[0] == 0:
        return torch.empty(0)
    if norm == "gradnorm":
        return metrics.fol_gradnorm(model, x, y, batch_size=batch_size)
    return metrics.fol(model, x, y, x0=x0, eps=eps, norm=norm, batch_size=batch_size)


def _predict(model, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    dev = resolve_device(model)
    out = []
    with eval_mode(model), torch.no_grad():
        for s in range(0, x.shape[0], batch_size):
            out.append(forward(model, x[s:s + batch_size].to(dev)).argmax(1).cpu())
    return torch.cat(out) if out else torch.empty(0, dtype=torch.long)


@dataclass
class _Tests:
    """The tests one method produced, on the CPU: x T x C x H x W, y and pred int64 [T], index int64 [T] (the
    seed's position in the split), x0 T x C x H x W (each test's seed); summary: the method's figures for
    summary.json; extra: what tests.pt stores besides; fol: [T] the fuzzer's own FOL when it is the one asked
    for (else None: measured afterwards)."""

    x: torch.Tensor
    y: torch.Tensor
    pred: torch.Tensor
    index: torch.Tensor
    x0: torch.Tensor
    summary: dict[str, Any]
    extra: dict[str, Any]
    fol: torch.Tensor | None = None


def _attack_tests(args: argparse.Namespace, model, ds, n_seeds: int, eps: float, progress: bool) -> _Tests:
    """Attack every seed (streamed batch by batch, and shared out over torchrun's ranks); keep the successful
    adversarial examples (all of them with --keep-all), their seeds read back from the data set."""
    method = args.method
    kw = _attack_kwargs(args, eps)
    res = attacks.attack(method, model, ds, batch_size=args.batch_size, seed=args.seed, progress=progress, **kw)
    keep = torch.ones(n_seeds, dtype=torch.bool) if args.keep_all else res.success
    idx = torch.nonzero(keep).flatten()
    tx, ty, tpred = res.adv[idx], res.y[idx], res.adv_pred[idx]
    x0 = take(ds, res.index[idx])[0] if len(idx) else tx.clone()
    summary = {
        "params": {k: v for k, v in kw.items()}, "clean_accuracy": res.clean_accuracy,
        "robust_accuracy": res.robust_accuracy, "success_rate": res.success_rate,
        "success_rate_on_correct": res.to_dict()["success_rate_on_correct"],
        "kept": "all" if args.keep_all else "successful",
    }
    return _Tests(tx, ty, tpred, idx, x0, summary, {"pred": tpred, "success": res.success[idx]})


def _fol_fuzz_tests(args: argparse.Namespace, model, x: torch.Tensor, y: torch.Tensor, n_seeds: int, eps: float,
                    fol_norm: str, progress: bool) -> _Tests:
    """FOL-guided fuzzing of the seeds ``x`` (N x C x H x W, labels ``y``)."""
    from robustest import fuzzing  # late: it loads kornia, and every verb's module is imported at start-up

    fuzz_fol = fol_norm if fol_norm in fuzzing.FOL_VARIANTS else "gradnorm"
    fr = fuzzing.fol_fuzz(model, x, y, steps=args.steps or FUZZ_STEPS,
                          lr=args.lr if args.lr is not None else 0.1, max_rel_l2=args.max_rel_l2,
                          eps=args.fuzz_eps, max_tests_per_seed=args.max_tests_per_seed,
                          time_budget=args.time_budget, seed=args.seed, batch_size=args.batch_size,
                          fol_variant=fuzz_fol, fol_eps=args.fol_eps or eps, show_progress=progress)
    idx = fr.seed_index.cpu().long()
    tx, ty = fr.x.cpu(), fr.y.cpu().long()
    tpred = fr.pred.cpu() if fr.pred is not None else _predict(model, tx, args.batch_size)
    per_seed = fr.tests_per_seed(n_seeds)
    summary = {"params": {"steps": args.steps or FUZZ_STEPS, "lr": args.lr or 0.1,
                          "max_rel_l2": args.max_rel_l2, "eps": args.fuzz_eps,
                          "max_tests_per_seed": args.max_tests_per_seed, "time_budget": args.time_budget},
               "fuzz_stats": fr.stats,
               "seeds_with_tests": int((per_seed > 0).sum()),
               "tests_per_seed": _quantiles(per_seed.float())}
    return _Tests(tx, ty, tpred, idx, x[idx], summary, {"pred": tpred, "step": fr.step.cpu()},
                  fol=fr.fol.cpu() if fuzz_fol == fol_norm else None)


def _cov_fuzz_tests(args: argparse.Namespace, model, x: torch.Tensor, y: torch.Tensor, progress: bool) -> _Tests:
    """Coverage-guided fuzzing of the seeds ``x`` (N x C x H x W, labels ``y``), with a coverage profile
    built on the train split."""
    from robustest import fuzzing  # late: it loads kornia, and every verb's module is imported at start-up

    train = _train_for_profile(args)
    profile = CoverageProfile.build(model, train, batch_size=args.batch_size)
    opts = {"k": args.k} if (args.k is not None and args.coverage == "kmnc") else {}
    cr = fuzzing.coverage_fuzz(model, x, y, profile, metric=args.coverage, iterations=args.iterations,
                               time_budget=args.time_budget, seed=args.seed, metric_opts=opts,
                               show_progress=progress)
    idx = cr.seed_index.cpu().long()
    tx, ty = cr.x.cpu(), cr.y.cpu().long()
    tpred = cr.pred.cpu() if cr.pred is not None else _predict(model, tx, args.batch_size)
    summary = {"params": {"coverage": args.coverage, "metric_opts": opts, "iterations": args.iterations,
                          "time_budget": args.time_budget, "profile_images": len(train)},
               "fuzz_stats": cr.stats,
               "coverage_history": [list(h) for h in cr.coverage_history]}
    return _Tests(tx, ty, tpred, idx, x[idx], summary, {"pred": tpred})


def _generate(args: argparse.Namespace, model, ds, n_seeds: int, eps: float, fol_norm: str, progress: bool
              ) -> _Tests:
    """The tests of ``args.method``."""
    if args.method not in FUZZERS:
        return _attack_tests(args, model, ds, n_seeds, eps, progress)
    # the fuzzers work on the whole seed set at once (their randomness is per run, not per sample)
    x, y = take(ds, torch.arange(n_seeds))
    y = y.long()
    if args.method == "fol-fuzz":
        return _fol_fuzz_tests(args, model, x, y, n_seeds, eps, fol_norm, progress)
    return _cov_fuzz_tests(args, model, x, y, progress)


def _measure_fol(args: argparse.Namespace, model, t: _Tests, eps: float, fol_norm: str
                 ) -> tuple[float, torch.Tensor]:
    """(eps of the FOL, FOL [T] of every test measured against its seed): cw without --fol-eps measures
    within its largest L2 perturbation; fol-fuzz's own FOL is kept when it is the one asked for."""
    fol_eps = args.fol_eps or eps
    if args.method not in FUZZERS and not attacks.get(args.method).norm_bounded and args.fol_eps is None:
        fol_eps = float((t.x - t.x0).flatten(1).norm(dim=1).max()) if t.x.shape[0] else eps
        fol_eps = max(fol_eps, 1e-6)
    if t.fol is not None:
        return fol_eps, t.fol
    return fol_eps, _fol(model, t.x, t.y, t.x0, fol_eps, fol_norm, args.batch_size).cpu()


def _test_figures(t: _Tests, fol_values: torch.Tensor, fol_norm: str, fol_eps: float) -> dict[str, Any]:
    """Counts, perturbation sizes and FOL quantiles of the tests, for summary.json."""
    delta = (t.x - t.x0).flatten(1)
    n_tests = int(t.x.shape[0])
    return {
        "tests": n_tests,
        "tests_changed_prediction": int((t.pred != t.y).sum()) if n_tests else 0,
        "perturbation": {"linf": _quantiles(delta.abs().amax(1)) if n_tests else None,
                         "l2": _quantiles(delta.norm(dim=1)) if n_tests else None},
        "fol": {"norm": fol_norm, "eps": fol_eps, "quantiles": _quantiles(fol_values) if n_tests else None},
    }


def _save_examples(out: Path, grid_size: int, method: str, t: _Tests, fol_values: torch.Tensor, fol_norm: str
                   ) -> bytes:
    """examples.png (seeds over tests, captioned label -> prediction) and fol_hist.png; returns the grid."""
    n_tests = int(t.x.shape[0])
    k = min(grid_size, n_tests)
    pick = torch.linspace(0, n_tests - 1, k).round().long().unique()
    caps = [f"seed #{int(t.index[i])}: {int(t.y[i])}" for i in pick] + \
        [f"{int(t.y[i])} -> {int(t.pred[i])}" for i in pick]
    grid = save_image_grid(torch.cat([t.x0[pick], t.x[pick]]), out / "examples.png", captions=caps,
                           ncols=len(pick), title=f"{method}: seeds (top) and tests (bottom), label -> pred")
    save_histogram(fol_values.numpy(), out / "fol_hist.png", title=f"FOL ({fol_norm}) of {method} tests")
    return grid


# ------------------------------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    """Generate the tests of ``args.method`` and write tests.pt, summary.json, results.json, report.html."""
    t0 = time.perf_counter()
    _check_radii(args)
    out = out_dir(args)
    model = load_model(args)
    ds = load_data(args)
    check_fits(model, ds)
    resolve_batch_size(args, model, ds, default=256, grad=True)
    n_seeds = len(ds)
    if n_seeds == 0:
        raise ConfigError(f"the {args.split} split of {args.dataset} is empty: check --dataset/--split/--limit")
    if args.keep_all and args.method in FUZZERS:
        raise ConfigError(f"--keep-all applies to attacks; {args.method} only returns failing tests")
    eps = args.eps if args.eps is not None else _default_eps(image_shape(ds)[0])
    fol_norm = args.fol_norm or _norm(args)
    method = args.method
    summary: dict[str, Any] = {"method": method, "dataset": args.dataset, "split": args.split,
                               "checkpoint": str(args.checkpoint or args.model_factory or args.weights),
                               "seeds": n_seeds}
    t_gen = time.perf_counter()
    t = _generate(args, model, ds, n_seeds, eps, fol_norm, not args.no_progress)
    summary.update(t.summary)
    t_gen = time.perf_counter() - t_gen
    t_fol = time.perf_counter()
    fol_eps, fol_values = _measure_fol(args, model, t, eps, fol_norm)
    t_fol = time.perf_counter() - t_fol

    n_tests = int(t.x.shape[0])
    t.extra.update({"dataset": args.dataset, "split": args.split, "fol_norm": fol_norm, "fol_eps": fol_eps,
                    "eps": eps if method != "cw" else args.eps, "params": summary.get("params", {})})
    save_tests(out / "tests.pt", t.x, t.y, t.index, method, fol=fol_values, extra=t.extra)
    summary.update({**_test_figures(t, fol_values, fol_norm, fol_eps), "peak_rss_mib": peak_rss_mib(),
                    "seed": args.seed, "files": ["tests.pt", "summary.json", "results.json", "report.html"]})
    grid = None
    if n_tests:
        grid = _save_examples(out, args.grid, method, t, fol_values, fol_norm)
        summary["files"] += ["examples.png", "fol_hist.png"]
    timings = {"generate_s": t_gen, "fol_s": t_fol, "total_s": time.perf_counter() - t0}
    atomic_write_json(out / "summary.json", {**summary, "timings": timings})
    results = {k: v for k, v in summary.items()
               if k not in ("seed", "method", "dataset", "split", "checkpoint", "params", "files")}
    results["device"] = str(model_device(model))
    results["files"] = {"tests": "tests.pt", "report": "report.html", "summary": "summary.json",
                        **({"examples": "examples.png", "histogram": "fol_hist.png"} if n_tests else {})}
    doc = write_results(out, "generate", _settings(args, method, summary.get("params", {}), fol_norm, fol_eps, eps,
                                                   model), results, timings)
    _report(doc, method, grid, fol_values).write(out / "report.html")
    rate = summary.get("success_rate")
    rate_txt = f", success rate {fmt(rate, 'success_rate')}" if rate is not None else ""
    log.info(f"{method} on {n_seeds} {args.dataset}/{args.split} seeds: {n_tests} tests{rate_txt} "
             f"({fmt(timings['total_s'], 'total_s')} s)")
    log.info(f"wrote {out / 'tests.pt'}, results.json, report.html and summary.json")
    return 0


def _settings(args: argparse.Namespace, method: str, params: dict[str, Any], fol_norm: str, fol_eps: float,
              eps: float, model) -> dict[str, Any]:
    """The options in effect for this method, with the defaults it resolved (steps, eps, FOL norm)."""
    d: dict[str, Any] = {**model_settings(args), **data_settings(args), "method": method}
    d.update({k: v for k, v in params.items() if v is not None and k != "metric_opts"})
    if method == "cov-fuzz":
        d.update(params.get("metric_opts") or {})
        d.pop("profile_images", None)
        if args.profile_limit is not None:
            d["profile_limit"] = args.profile_limit
    if method == "fol-fuzz" and args.fuzz_eps is not None:
        d["fuzz_eps"] = d.pop("eps", args.fuzz_eps)
    if method not in FUZZERS:
        d["keep_all"] = bool(args.keep_all)
    d.update(fol_norm=fol_norm, fol_eps=fol_eps, batch_size=args.batch_size, grid=args.grid, seed=args.seed,
             device=str(model_device(model)))
    if getattr(args, "batch_size_auto", False):
        d["batch_size_auto"] = True
    return d


def _report(doc: dict[str, Any], method: str, grid: bytes | None, fol_values: torch.Tensor):
    """report.html of a generation run: summary, perturbation and FOL quantiles, examples, FOL histogram."""
    s = doc["settings"]
    rep = HtmlReport.from_results(doc, f"robustest generate: {method} on {s['dataset']} ({s['split']})")
    keys = ("seeds", "tests", "tests_changed_prediction", "clean_accuracy", "robust_accuracy", "success_rate",
            "success_rate_on_correct", "kept", "seeds_with_tests")
    rep.key_values({k: doc[k] for k in keys if k in doc})
    rows = [{"measure": f"perturbation {norm}", **(q or {})} for norm, q in doc["perturbation"].items()]
    rows.append({"measure": f"FOL ({doc['fol']['norm']}, eps {fmt(doc['fol']['eps'])})",
                 **(doc["fol"]["quantiles"] or {})})
    rep.heading("Perturbation size and FOL of the tests")
    rep.table(rows, ["measure", "min", "q05", "q25", "q50", "q75", "q95", "max", "mean"])
    if grid is not None:
        rep.heading("Examples")
        rep.image(grid, "Seeds (top row) and the tests generated from them (bottom row), captioned label -> "
                  "prediction.")
    if len(fol_values):
        rep.histogram(fol_values.numpy(), "distribution of the tests' FOL (measured against each test's seed)",
                      title=f"FOL of the {method} tests", xlabel="FOL")
    if doc.get("fuzz_stats"):
        rep.heading("Fuzzer statistics")
        rep.key_values(doc["fuzz_stats"])
    return rep


def _train_for_profile(args: argparse.Namespace):
    ds = datasets.load(args.dataset, root=args.data_dir, split="train")
    if args.profile_limit is not None and args.profile_limit < len(ds):
        ds = TensorDataset(*(t[:args.profile_limit] for t in ds.tensors))
    return ds
