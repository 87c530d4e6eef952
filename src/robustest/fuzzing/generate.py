"""Test generation: what ``robustest generate`` runs. Tests are made by an attack of the registry (its successful
adversarial examples, or all of them with ``keep_all``) or by a fuzzer (FOL-guided or coverage-guided), then the FOL
of every test is measured against its seed, and the tests' counts, perturbation sizes and FOL quantiles are summed
up; :func:`save_examples` draws seeds over tests, :func:`generate_report` the run's report.

Example::

    opts = GenerateOptions(method="pgd", norm="linf")
    t = generate_tests(opts, model, data, len(data), eps=0.1, fol_norm="linf", progress=False)
    fol_eps, fol = measure_fol(opts, model, t, 0.1, "linf")
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from robustest import attacks, metrics
from robustest.core.batching import take
from robustest.core.errors import ConfigError
from robustest.core.modelcall import predict
from robustest.core.options import option
from robustest.core.stats import describe
from robustest.core.validation import check_eps
from robustest.metrics.coverage import CoverageProfile
from robustest.report import HtmlReport, format_value, save_histogram, save_image_grid

__all__ = ["ATTACK_OPTIONS", "FUZZERS", "FUZZ_STEPS", "QUANTILES", "GenerateOptions", "GeneratedTests", "attack_kwargs",
           "default_eps", "generate_report", "generate_tests", "measure_fol", "quantiles", "save_examples",
           "figures_of", "threat_norm"]

FUZZERS = ("fol-fuzz", "cov-fuzz")
FUZZ_STEPS = 40  # fol-fuzz's default steps; an attack's come from its registry record
#: the attack options generation passes to an attack whose function takes them
ATTACK_OPTIONS = ("alpha", "random_start", "steps", "norm", "restarts", "decay", "c", "kappa", "binary_steps", "lr")
#: the statistics of a generated set's perturbation sizes and FOL (robustest.core.stats.describe)
QUANTILES = ("min", "q05", "q25", "q50", "q75", "q95", "max", "mean")


@dataclass(frozen=True)
class GenerateOptions:
    """How tests are generated (the flags of ``robustest generate``; None: the method's default).

    ``method``: an attack's name or a fuzzer of :data:`FUZZERS`; ``norm``: its threat model (resolved); ``eps``:
    the radius as given (None: the default for the image's channels; C&W's optional bound); attack options
    ``alpha`` .. ``lr`` (:data:`ATTACK_OPTIONS`); ``keep_all``: keep every adversarial example, not only the
    successful ones; fol-fuzz's ``max_rel_l2``, ``fuzz_eps``, ``max_tests_per_seed``; cov-fuzz's ``coverage``,
    ``k``, ``iterations``, ``profile_limit`` (the training images its profile was built on, as recorded); both
    fuzzers' ``time_budget``; ``fol_eps``: the radius of the FOL measured (None: eps).
    The options carry their flags (:func:`robustest.core.options.option`)."""

    method: str
    norm: str = option("linf", "choice", "threat model, for an attack that runs in several", choices=("linf", "l2"),
                       shown="the attack's first: linf; cw l2")
    eps: float | None = option(None, "radius", "perturbation budget in pixel scale, a number or a fraction like "
                               "8/255; L-inf: in (0, 1]", shown="0.3 for 1-channel data, 8/255 for colour; cw: "
                               "optional L2 bound")
    alpha: float | None = option(None, "positive", "step size of pgd/bim/rfgsm/mifgsm", shown="the attack's own rule")
    random_start: bool | None = option(None, "switch", "start fgsm/pgd from a random point of the eps-ball",
                                       shown="pgd yes, fgsm no")
    steps: int | None = option(None, "positive-int", "iterations", shown="the attack's own: pgd/bim/mifgsm 10, rfgsm "
                               f"1, cw 100 per search step, apgd 100; fol-fuzz {FUZZ_STEPS}")
    restarts: int = option(1, "positive-int", "restarts of pgd/apgd")
    decay: float = option(1.0, "non-negative", "mifgsm momentum decay")
    c: float = option(1.0, "positive", "cw: initial constant c")
    kappa: float = option(0.0, "non-negative", "cw: confidence margin")
    binary_steps: int = option(5, "positive-int", "cw: binary search steps over c")
    lr: float | None = option(None, "rate", "fol-fuzz step size; cw Adam learning rate", shown="0.1 for both")
    keep_all: bool = option(False, "flag", "keep unsuccessful adversarial images too")
    max_rel_l2: float = option(0.5, "positive", "fol-fuzz: bound on ||x - x0||_2 / ||x0||_2")
    fuzz_eps: float | None = option(None, "linf-eps", "fol-fuzz: optional L-inf bound around each seed",
                                    shown="none")
    max_tests_per_seed: int | None = option(None, "positive-int", "fol-fuzz: tests per seed cap")
    time_budget: float | None = option(None, "positive", "fuzzers: budget in seconds", metavar="S")
    coverage: str = option("kmnc", "choice", "cov-fuzz: coverage metric of the feedback",
                           choices=lambda: metrics.names("coverage"))
    k: int | None = option(None, "positive-int", "cov-fuzz: KMNC sections", shown="the metric's")
    iterations: int = option(100, "positive-int", "cov-fuzz: iterations")
    profile_limit: int | None = option(None, "positive-int", "cov-fuzz: build the coverage profile on the first N "
                                       "training images", metavar="N", shown="all")
    fol_eps: float | None = option(None, "radius", "eps of the FOL", shown="--eps")
    batch_size: int = 256
    seed: int = 0

    def check_radii(self, fol_norm: str | None = None) -> None:
        """Refuse ``eps`` and ``fol_eps`` outside the range of the norm each is measured in (an L-inf radius in
        (0, 1]; ``fol_norm``: the FOL's, default ``norm``, and ``gradnorm`` has no radius): a one-line ConfigError,
        before any work."""
        check_eps("eps", self.eps, self.norm, allow_none=True)
        if (fol_norm or self.norm) != "gradnorm":
            check_eps("fol_eps", self.fol_eps, fol_norm or self.norm, allow_none=True)


def threat_norm(method: str, norm: str | None = None) -> str:
    """The threat model tests of ``method`` are generated in: ``norm`` when given, else the attack's first (its
    registry record's), else L-inf (the fuzzers)."""
    if norm is not None:
        return str(norm)
    return "linf" if method in FUZZERS else attacks.get(method).norms[0]


def default_eps(channels: int) -> float:
    """The radius of a generation given none: 0.3 for 1-channel images (MNIST's), 8/255 for colour (CIFAR's)."""
    return 0.3 if channels == 1 else 8 / 255


def attack_kwargs(opts: GenerateOptions, eps: float) -> dict[str, Any]:
    """The keyword arguments of the attack ``--method``: ``eps`` (the flag's radius for an attack inside an
    eps-ball, else --eps as given: C&W's optional bound) and each of :data:`ATTACK_OPTIONS` its function takes
    (a flag not given: the attack's default; steps: its record's). A flag given to an attack that does not take
    it, or a --norm it does not run in, is a ConfigError."""
    m = opts.method
    record = attacks.get(m)
    sig = inspect.signature(record.fn).parameters
    norm = opts.norm
    if norm not in record.norms:
        raise ConfigError(f"--norm {norm} is not a threat model of {m} (it runs in {', '.join(record.norms)}): "
                          "drop --norm or pick another method")
    given = {"alpha": opts.alpha, "random_start": opts.random_start, "steps": opts.steps,
             "restarts": opts.restarts if opts.restarts > 1 else None}
    for param, value in given.items():
        if value is not None and param not in sig:
            flag = "--random-start/--no-random-start" if param == "random_start" else f"--{param}"
            raise ConfigError(f"{flag} does not apply to {m}")
    values = {"alpha": opts.alpha, "random_start": opts.random_start, "steps": opts.steps or record.default_steps,
              "norm": norm, "restarts": opts.restarts, "decay": opts.decay, "c": opts.c, "kappa": opts.kappa,
              "binary_steps": opts.binary_steps, "lr": opts.lr}
    kw: dict[str, Any] = {"eps": eps if record.norm_bounded else opts.eps}
    for name in ATTACK_OPTIONS:
        if name in sig:
            kw[name] = values[name] if values[name] is not None else sig[name].default
    return kw


def quantiles(v: torch.Tensor) -> dict[str, float] | None:
    """min, the :data:`QUANTILES` and max, and the mean of the finite values of ``v`` [N]; None when none is."""
    return describe(v, QUANTILES, finite=True) if bool(torch.isfinite(v).any()) else None


def _fol(model, x, y, x0, eps: float, norm: str, batch_size: int) -> torch.Tensor:
    if x.shape[0] == 0:
        return torch.empty(0)
    if norm == "gradnorm":
        return metrics.fol_gradnorm(model, x, y, batch_size=batch_size)
    return metrics.fol(model, x, y, x0=x0, eps=eps, norm=norm, batch_size=batch_size)


def _predicted(model, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """The predicted classes (int64 [T]) of the tests ``x`` (none: an empty tensor)."""
    return predict(model, x, batch_size).argmax(1) if x.shape[0] else torch.empty(0, dtype=torch.long)


@dataclass
class GeneratedTests:
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


def _attack_tests(opts: GenerateOptions, model, ds, n_seeds: int, eps: float, progress: bool) -> GeneratedTests:
    """Attack every seed (streamed batch by batch, and shared out over torchrun's ranks); keep the successful
    adversarial examples (all of them with --keep-all), their seeds read back from the data set."""
    method = opts.method
    kw = attack_kwargs(opts, eps)
    res = attacks.attack(method, model, ds, batch_size=opts.batch_size, seed=opts.seed, progress=progress, **kw)
    keep = torch.ones(n_seeds, dtype=torch.bool) if opts.keep_all else res.success
    idx = torch.nonzero(keep).flatten()
    tx, ty, tpred = res.adv[idx], res.y[idx], res.adv_pred[idx]
    x0 = take(ds, res.index[idx])[0] if len(idx) else tx.clone()
    summary = {
        "params": {k: v for k, v in kw.items()}, "clean_accuracy": res.clean_accuracy,
        "robust_accuracy": res.robust_accuracy, "success_rate": res.success_rate,
        "success_rate_on_correct": res.to_dict()["success_rate_on_correct"],
        "kept": "all" if opts.keep_all else "successful",
    }
    return GeneratedTests(tx, ty, tpred, idx, x0, summary, {"pred": tpred, "success": res.success[idx]})


def _fol_fuzz_tests(opts: GenerateOptions, model, x: torch.Tensor, y: torch.Tensor, n_seeds: int, eps: float,
                    fol_norm: str, progress: bool) -> GeneratedTests:
    """FOL-guided fuzzing of the seeds ``x`` (N x C x H x W, labels ``y``)."""
    from robustest import fuzzing  # late: it loads kornia, and every verb's module is imported at start-up

    fuzz_fol = fol_norm if fol_norm in fuzzing.FOL_VARIANTS else "gradnorm"
    fr = fuzzing.fol_fuzz(model, x, y, steps=opts.steps or FUZZ_STEPS,
                          lr=opts.lr if opts.lr is not None else 0.1, max_rel_l2=opts.max_rel_l2,
                          eps=opts.fuzz_eps, max_tests_per_seed=opts.max_tests_per_seed,
                          time_budget=opts.time_budget, seed=opts.seed, batch_size=opts.batch_size,
                          fol_variant=fuzz_fol, fol_eps=opts.fol_eps or eps, show_progress=progress)
    idx = fr.seed_index.cpu().long()
    tx, ty = fr.x.cpu(), fr.y.cpu().long()
    tpred = fr.pred.cpu() if fr.pred is not None else _predicted(model, tx, opts.batch_size)
    per_seed = fr.tests_per_seed(n_seeds)
    summary = {"params": {"steps": opts.steps or FUZZ_STEPS, "lr": opts.lr or 0.1,
                          "max_rel_l2": opts.max_rel_l2, "eps": opts.fuzz_eps,
                          "max_tests_per_seed": opts.max_tests_per_seed, "time_budget": opts.time_budget},
               "fuzz_stats": fr.stats,
               "seeds_with_tests": int((per_seed > 0).sum()),
               "tests_per_seed": quantiles(per_seed.float())}
    return GeneratedTests(tx, ty, tpred, idx, x[idx], summary, {"pred": tpred, "step": fr.step.cpu()},
                  fol=fr.fol.cpu() if fuzz_fol == fol_norm else None)


def _cov_fuzz_tests(opts: GenerateOptions, model, x: torch.Tensor, y: torch.Tensor, progress: bool,
                    train: Any) -> GeneratedTests:
    """Coverage-guided fuzzing of the seeds ``x`` (N x C x H x W, labels ``y``), with a coverage profile
    built on the train split."""
    from robustest import fuzzing  # late: it loads kornia, and every verb's module is imported at start-up

    profile = CoverageProfile.build(model, train, batch_size=opts.batch_size)
    metric_opts = {"k": opts.k} if (opts.k is not None and opts.coverage == "kmnc") else {}
    cr = fuzzing.coverage_fuzz(model, x, y, profile, metric=opts.coverage, iterations=opts.iterations,
                               time_budget=opts.time_budget, seed=opts.seed, metric_opts=metric_opts,
                               show_progress=progress)
    idx = cr.seed_index.cpu().long()
    tx, ty = cr.x.cpu(), cr.y.cpu().long()
    tpred = cr.pred.cpu() if cr.pred is not None else _predicted(model, tx, opts.batch_size)
    summary = {"params": {"coverage": opts.coverage, "metric_opts": metric_opts, "iterations": opts.iterations,
                          "time_budget": opts.time_budget, "profile_images": len(train)},
               "fuzz_stats": cr.stats,
               "coverage_history": [list(h) for h in cr.coverage_history]}
    return GeneratedTests(tx, ty, tpred, idx, x[idx], summary, {"pred": tpred})


def generate_tests(opts: GenerateOptions, model, ds, n_seeds: int, eps: float, fol_norm: str, progress: bool,
                   profile_data: Any = None) -> GeneratedTests:
    """The tests of ``opts.method`` from the first ``n_seeds`` seeds of ``ds`` (images N x C x H x W in [0, 1],
    labels [N]) at radius ``eps``; cov-fuzz builds its coverage profile on ``profile_data`` (labelled images)."""
    if opts.method not in FUZZERS:
        return _attack_tests(opts, model, ds, n_seeds, eps, progress)
    # the fuzzers work on the whole seed set at once (their randomness is per run, not per sample)
    x, y = take(ds, torch.arange(n_seeds))
    y = y.long()
    if opts.method == "fol-fuzz":
        return _fol_fuzz_tests(opts, model, x, y, n_seeds, eps, fol_norm, progress)
    return _cov_fuzz_tests(opts, model, x, y, progress, profile_data)


def measure_fol(opts: GenerateOptions, model, t: GeneratedTests, eps: float, fol_norm: str
                 ) -> tuple[float, torch.Tensor]:
    """(eps of the FOL, FOL [T] of every test measured against its seed): cw without --fol-eps measures
    within its largest L2 perturbation; fol-fuzz's own FOL is kept when it is the one asked for."""
    fol_eps = opts.fol_eps or eps
    if opts.method not in FUZZERS and not attacks.get(opts.method).norm_bounded and opts.fol_eps is None:
        fol_eps = float((t.x - t.x0).flatten(1).norm(dim=1).max()) if t.x.shape[0] else eps
        fol_eps = max(fol_eps, 1e-6)
    if t.fol is not None:
        return fol_eps, t.fol
    return fol_eps, _fol(model, t.x, t.y, t.x0, fol_eps, fol_norm, opts.batch_size).cpu()


def figures_of(t: GeneratedTests, fol_values: torch.Tensor, fol_norm: str, fol_eps: float) -> dict[str, Any]:
    """Counts, perturbation sizes and FOL quantiles of the tests, for summary.json."""
    delta = (t.x - t.x0).flatten(1)
    n_tests = int(t.x.shape[0])
    return {
        "tests": n_tests,
        "tests_changed_prediction": int((t.pred != t.y).sum()) if n_tests else 0,
        "perturbation": {"linf": quantiles(delta.abs().amax(1)) if n_tests else None,
                         "l2": quantiles(delta.norm(dim=1)) if n_tests else None},
        "fol": {"norm": fol_norm, "eps": fol_eps, "quantiles": quantiles(fol_values) if n_tests else None},
    }


def save_examples(out: Path, grid_size: int, method: str, t: GeneratedTests, fol_values: torch.Tensor, fol_norm: str
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


def generate_report(doc: dict[str, Any], method: str, grid: bytes | None, fol_values: torch.Tensor) -> HtmlReport:
    """report.html of a generation run: summary, perturbation and FOL quantiles, examples, FOL histogram."""
    s = doc["settings"]
    rep = HtmlReport.from_results(doc, f"robustest generate: {method} on {s['dataset']} ({s['split']})")
    keys = ("seeds", "tests", "tests_changed_prediction", "clean_accuracy", "robust_accuracy", "success_rate",
            "success_rate_on_correct", "kept", "seeds_with_tests")
    rep.key_values({k: doc[k] for k in keys if k in doc})
    rows = [{"measure": f"perturbation {norm}", **(q or {})} for norm, q in doc["perturbation"].items()]
    rows.append({"measure": f"FOL ({doc['fol']['norm']}, eps {format_value(doc['fol']['eps'])})",
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
