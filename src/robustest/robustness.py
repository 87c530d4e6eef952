"""Robustness measurement: clean accuracy, accuracy on a fixed adversarial test set, white-box robust
accuracy of the current model, and accuracy under common corruptions.

Every function takes a model and data in the robustest contract (images in [0, 1], int64 labels), runs
batched on the model's device and returns plain numbers or dataclasses that serialise to JSON.
"""

from __future__ import annotations

# ===================================================================== corruption accuracy (common corruptions)
# Accuracy under the 19 common corruptions (robustest.corruptions) at severities 1-5.
# Section owned by the corruptions module; keep other measurements outside these delimiters.
from dataclasses import dataclass as _c_dataclass
from dataclasses import field as _c_field
from typing import Any as _CAny


@_c_dataclass
class CorruptionResult:
    """Accuracy of a model under common corruptions.

    ``accuracy[name][severity]`` is top-1 accuracy in [0, 1] on the corrupted data; ``error`` is
    ``1 - accuracy``. ``mean_error[name]`` averages a corruption's errors over the severities;
    ``mce`` (mean corruption error, unnormalised) averages ``mean_error`` over corruptions.
    ``clean_accuracy`` is the accuracy on the uncorrupted data.
    """

    accuracy: dict[str, dict[int, float]]
    clean_accuracy: float
    num_samples: int
    severities: tuple[int, ...]
    seed: int
    error: dict[str, dict[int, float]] = _c_field(default_factory=dict)
    mean_accuracy: dict[str, float] = _c_field(default_factory=dict)
    mean_error: dict[str, float] = _c_field(default_factory=dict)
    mce: float = float("nan")
    mean_corruption_accuracy: float = float("nan")
    table: str | None = None

    def __post_init__(self) -> None:
        self.error = {c: {s: 1.0 - a for s, a in per.items()} for c, per in self.accuracy.items()}
        self.mean_accuracy = {c: sum(per.values()) / len(per) for c, per in self.accuracy.items() if per}
        self.mean_error = {c: 1.0 - a for c, a in self.mean_accuracy.items()}
        if self.mean_error:
            self.mce = sum(self.mean_error.values()) / len(self.mean_error)
            self.mean_corruption_accuracy = 1.0 - self.mce

    def __repr__(self) -> str:
        from robustest.core.reprs import Raw, one_line

        return one_line(self, clean_accuracy=self.clean_accuracy, mce=self.mce, corruptions=len(self.accuracy),
                        severities=Raw(str(tuple(self.severities))), num_samples=self.num_samples, table=self.table)

    def to_dict(self) -> dict[str, _CAny]:
        """Plain JSON-ready dict (severity keys as strings)."""
        return {
            "clean_accuracy": self.clean_accuracy,
            "num_samples": self.num_samples,
            "severities": list(self.severities),
            "seed": self.seed,
            "table": self.table,
            "accuracy": {c: {str(s): a for s, a in per.items()} for c, per in self.accuracy.items()},
            "error": {c: {str(s): e for s, e in per.items()} for c, per in self.error.items()},
            "mean_accuracy": dict(self.mean_accuracy),
            "mean_error": dict(self.mean_error),
            "mce": self.mce,
            "mean_corruption_accuracy": self.mean_corruption_accuracy,
        }


def corruption_accuracy(model: _CAny, data: _CAny, corruptions: str | list[str] | tuple[str, ...] = "all",
                        severities: tuple[int, ...] | list[int] = (1, 2, 3, 4, 5), seed: int = 0,
                        batch_size: int = 256, *, table: str | None = None,
                        device: _CAny = None) -> CorruptionResult:
    """Top-1 accuracy of ``model`` on ``data`` under each corruption and severity.

    ``data``: anything :func:`robustest.core.batching.iter_batches` takes with labels (images N x C x H x W in
    [0, 1], int64 labels [N]). Each batch is corrupted on the model's device with
    ``robustest.corruptions.corrupt(x, name, severity, seed=seed + batch_start)``, the batching of the
    ``robustest corrupt`` verb: the same ``seed`` and ``batch_size`` give the same result (another
    batch size draws other, equally distributed noise).
    ``corruptions`` is ``"all"`` (the 19 of :func:`robustest.corruptions.names`), one name or a list.
    ``table`` forces the parameter table (``"cifar"`` / ``"imagenet"``; default chosen by image size).
    """
    import torch

    from robustest import corruptions as _corr
    from robustest.core.batching import iter_batches
    from robustest.core.devices import resolve_device
    from robustest.core.errors import ConfigError as _CfgErr
    from robustest.core.errors import DataError as _DataErr
    from robustest.core.inputs import check_images, check_labels
    from robustest.core.modelcall import eval_mode, forward

    names = _corr.resolve_names(corruptions)
    sevs = tuple(int(s) for s in severities)
    if not sevs:
        raise _CfgErr("severities is empty: give at least one of 1-5")
    for s in sevs:
        if s not in (1, 2, 3, 4, 5):
            raise _CfgErr(f"severity {s} is outside 1-5")
    if batch_size < 1:
        raise _CfgErr(f"batch_size must be >= 1, got {batch_size}")
    dev = resolve_device(model, device)
    correct = {c: dict.fromkeys(sevs, 0) for c in names}
    clean_correct = 0
    n = 0
    with eval_mode(model), torch.no_grad():
        for idx, xb, yb in iter_batches(data, batch_size, dev, with_index=True):
            if yb is None:
                raise _DataErr("corruption_accuracy needs labels: pass (x, y) or a labelled data set")
            check_images(xb)
            check_labels(yb, xb.shape[0])
            start = int(idx[0]) if len(idx) else 0
            xb = xb.float()
            clean_correct += int((forward(model, xb).argmax(1) == yb).sum())
            for c in names:
                for s in sevs:
                    xc = _corr.corrupt(xb, c, s, seed=seed + start, table=table)
                    correct[c][s] += int((forward(model, xc).argmax(1) == yb).sum())
            n += xb.shape[0]
    if n == 0:
        raise _DataErr("the data set is empty: check the split and the path")
    acc = {c: {s: correct[c][s] / n for s in sevs} for c in names}
    used_table = table
    if used_table is None:
        x0, _ = next(iter(iter_batches(data, 1)))
        used_table = _corr.default_table(x0.shape[-2], x0.shape[-1])
    return CorruptionResult(accuracy=acc, clean_accuracy=clean_correct / n, num_samples=n, severities=sevs,
                            seed=seed, table=used_table)
# ================================================================ end corruption accuracy (common corruptions)


# ============================================================ clean / fixed adversarial set / white-box accuracy
# The RobOT measurements (METHODS.md A4). Section owned by the RobOT loop; keep other measurements outside
# these delimiters.
import time as _r_time  # noqa: E402
from dataclasses import asdict as _r_asdict  # noqa: E402
from dataclasses import dataclass as _r_dataclass  # noqa: E402
from dataclasses import field as _r_field  # noqa: E402
from pathlib import Path as _RPath  # noqa: E402
from typing import Any as _RAny  # noqa: E402

import torch as _rtorch  # noqa: E402

from robustest.core.validation import check_eps  # noqa: E402

FIXED_SET_FORMAT = "robustest-fixed-adversarial-set"


@_r_dataclass
class FixedAdversarialSet:
    """A fixed adversarial test set: the successful FGSM and PGD examples of an evaluation split generated
    against the ORIGINAL model (so that model scores 0 % on it by construction).

    ``x``: N x C x H x W in [0, 1]; ``y``: int64 [N] true labels; ``source_index``: int64 [N] index of each
    example's clean image in the evaluation split; ``method``: list of N attack names ("fgsm"/"pgd").
    ``num_source`` is the size of the split it was built from; ``settings`` the attack parameters.
    """

    x: _rtorch.Tensor
    y: _rtorch.Tensor
    source_index: _rtorch.Tensor
    method: list[str]
    eps: float
    num_source: int
    settings: dict[str, _RAny] = _r_field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def counts(self) -> dict[str, int]:
        """Number of examples per attack."""
        out: dict[str, int] = {}
        for m in self.method:
            out[m] = out.get(m, 0) + 1
        return out

    def __repr__(self) -> str:
        from robustest.core.reprs import counts, one_line, shape

        return one_line(self, n=len(self), by_attack=counts(self.counts()), eps=self.eps,
                        num_source=self.num_source, x=shape(self.x))

    def save(self, path: str | _RPath) -> _RPath:
        """Atomically write the set (``torch.save`` of plain data; loads with ``weights_only=True``)."""
        from robustest.core.atomic import atomic_save

        payload = {"format": FIXED_SET_FORMAT, "version": 1, "x": self.x.detach().float().cpu(),
                   "y": self.y.detach().long().cpu(), "source_index": self.source_index.detach().long().cpu(),
                   "method": list(self.method), "eps": float(self.eps), "num_source": int(self.num_source),
                   "settings": dict(self.settings)}
        return atomic_save(payload, path)

    @classmethod
    def load(cls, path: str | _RPath) -> FixedAdversarialSet:
        """Read a set written by :meth:`save` (refuses anything else with a one-line DataError)."""
        from robustest.core.reading import load_plain

        p = load_plain(path, fmt=FIXED_SET_FORMAT, what="fixed adversarial set", fix="build one with build_fixed_set")
        return cls(x=p["x"], y=p["y"], source_index=p["source_index"], method=list(p["method"]),
                   eps=float(p["eps"]), num_source=int(p["num_source"]), settings=dict(p.get("settings") or {}))


def _r_xy(data: _RAny, name: str = "data") -> tuple[_rtorch.Tensor, _rtorch.Tensor]:
    from robustest.core.batching import as_tensors
    from robustest.core.errors import DataError
    from robustest.core.inputs import check_images, check_labels

    x, y = as_tensors(data)
    if y is None:
        raise DataError(f"{name} needs labels: pass (x, y) or a labelled Dataset")
    check_images(x, name)
    check_labels(y, x.shape[0], name=f"{name} labels")
    return x, y


def adversarial_examples(model: _RAny, data: _RAny, eps: float, *,
                         attacks: tuple[str, ...] | list[str] = ("fgsm", "pgd"), pgd_steps: int = 10,
                         pgd_alpha: float | None = None, seed: int = 0, batch_size: int = 256,
                         successful_only: bool = True
                         ) -> tuple[_rtorch.Tensor, _rtorch.Tensor, _rtorch.Tensor, list[str]]:
    """The paper's adversarial examples of ``data`` against ``model``: FGSM with a uniform random start in
    the L-inf eps-ball and PGD (``pgd_steps`` steps of ``pgd_alpha`` = eps/6 by default, random start).

    Returns ``(x_adv, y, source_index, method)`` on CPU: N x C x H x W images, int64 [N] true labels, int64
    [N] index into ``data`` and a list of N attack names, FGSM examples first. With ``successful_only``
    only examples the model misclassifies are kept. Seeded: same ``seed``, same examples.
    """
    from robustest import attacks as _atk
    from robustest.core.errors import ConfigError

    eps = check_eps("eps", eps)
    x, y = _r_xy(data)
    alpha = eps / 6 if pgd_alpha is None else float(pgd_alpha)
    xs, ys, idx, meth = [], [], [], []
    for k, name in enumerate(attacks):
        if name == "fgsm":
            res = _atk.attack("fgsm", model, (x, y), batch_size=batch_size, eps=eps, random_start=True,
                              seed=seed * 1009 + k)
        elif name == "pgd":
            res = _atk.attack("pgd", model, (x, y), batch_size=batch_size, eps=eps, alpha=alpha, steps=pgd_steps,
                              random_start=True, seed=seed * 1009 + k)
        else:
            raise ConfigError(f"unknown pool attack {name!r}: use 'fgsm' and/or 'pgd'")
        keep = res.success.cpu() if successful_only else _rtorch.ones(x.shape[0], dtype=_rtorch.bool)
        sel = _rtorch.nonzero(keep).flatten()
        xs.append(res.adv.detach().cpu()[sel])
        ys.append(y.cpu()[sel])
        idx.append(sel)
        meth += [name] * int(sel.numel())
    return _rtorch.cat(xs), _rtorch.cat(ys), _rtorch.cat(idx).long(), meth


def build_fixed_set(model: _RAny, data: _RAny, eps: float, *, pgd_steps: int = 10, pgd_alpha: float | None = None,
                    seed: int = 0, batch_size: int = 256) -> FixedAdversarialSet:
    """Build the fixed adversarial test set of the evaluation split ``data`` against ``model`` (the ORIGINAL
    model): its successful FGSM (random start) and PGD (``pgd_steps`` x eps/6, random start) examples.

    Build it once and reuse it for every retrained model (:meth:`FixedAdversarialSet.save` / ``load``).
    """
    x, y, idx, meth = adversarial_examples(model, data, eps, pgd_steps=pgd_steps, pgd_alpha=pgd_alpha, seed=seed,
                                           batch_size=batch_size, successful_only=True)
    n = int(_r_xy(data)[0].shape[0])
    settings = {"attacks": ["fgsm (uniform random start)", "pgd"], "pgd_steps": pgd_steps,
                "pgd_alpha": eps / 6 if pgd_alpha is None else pgd_alpha, "seed": seed}
    return FixedAdversarialSet(x=x, y=y, source_index=idx, method=meth, eps=float(eps), num_source=n,
                               settings=settings)


def clean_accuracy(model: _RAny, data: _RAny, *, batch_size: int = 256) -> float:
    """Top-1 accuracy in [0, 1] of ``model`` on labelled ``data`` (images N x C x H x W in [0, 1])."""
    from robustest.training import accuracy

    x, y = _r_xy(data)
    return float(accuracy(model, (x, y), batch_size=batch_size))


def fixed_set_accuracy(model: _RAny, fixed: FixedAdversarialSet, *, batch_size: int = 256) -> float:
    """Accuracy of ``model`` on a fixed adversarial set (NaN when the set is empty)."""
    from robustest.training import accuracy

    if len(fixed) == 0:
        return float("nan")
    return float(accuracy(model, (fixed.x, fixed.y), batch_size=batch_size))


def whitebox_accuracy(model: _RAny, data: _RAny, eps: float, *, pgd_steps: int = 20, pgd_restarts: int = 2,
                      apgd_steps: int = 50, seed: int = 0, batch_size: int = 256) -> dict[str, float]:
    """White-box robust accuracy of ``model`` itself on ``data`` at L-inf radius ``eps``.

    Returns ``{"pgd": acc, "apgd": acc, "worst": acc}``: accuracy under PGD (``pgd_steps`` steps of
    eps/4 from a random start, best of ``pgd_restarts`` restarts), under APGD-CE (``apgd_steps``), and the per-sample
    worst case (a sample counts only if it is classified correctly clean and under both attacks).
    ``apgd_steps=0`` skips APGD (its entry is then None). Seeded.
    """
    from robustest import attacks as _atk
    from robustest.training import predict

    eps = check_eps("eps", eps)
    x, y = _r_xy(data)
    n = x.shape[0]
    if n == 0:
        return {"pgd": float("nan"), "apgd": None, "worst": float("nan")}
    correct = predict(model, x, batch_size=batch_size).argmax(1) == y.cpu()
    res = _atk.attack("pgd", model, (x, y), batch_size=batch_size, eps=eps, alpha=eps / 4, steps=pgd_steps,
                      random_start=True, restarts=pgd_restarts, seed=seed)
    ok_pgd = ~res.success.cpu()
    out: dict[str, _RAny] = {"pgd": int(ok_pgd.sum()) / n}
    robust = correct & ok_pgd
    if apgd_steps > 0:
        res2 = _atk.attack("apgd", model, (x, y), batch_size=batch_size, eps=eps, steps=apgd_steps, seed=seed + 1)
        ok_apgd = ~res2.success.cpu()
        out["apgd"] = int(ok_apgd.sum()) / n
        robust &= ok_apgd
    else:
        out["apgd"] = None
    out["worst"] = int(robust.sum()) / n
    return out


@_r_dataclass
class RobustnessReport:
    """Robustness of one model. Accuracies are in [0, 1] (None when not measured).

    * ``clean_accuracy``: on the clean evaluation split (``num_eval`` images).
    * ``fixed_set_accuracy``: on the fixed adversarial set built against the ORIGINAL model
      (``fixed_set_size`` examples; the paper's robustness measure).
    * ``whitebox_pgd_accuracy`` / ``whitebox_apgd_accuracy`` / ``whitebox_accuracy``: white-box attacks on
      THIS model at the same eps over the first ``num_whitebox`` evaluation images; ``whitebox_accuracy`` is
      the per-sample worst case (clean, PGD and APGD-CE all correct).
    * ``corruption_accuracy``: mean accuracy under common corruptions (when measured), details in
      ``corruption``.
    * ``autoattack_accuracy``: robust accuracy under :func:`evaluate`'s ensemble (``measure(autoattack=True)``,
      same images and eps as the white-box attacks), else None.
    * ``seconds``: wall time of the measurement (kept out of reproducibility comparisons).
    """

    clean_accuracy: float
    fixed_set_accuracy: float | None
    fixed_set_size: int
    whitebox_pgd_accuracy: float | None
    whitebox_apgd_accuracy: float | None
    whitebox_accuracy: float | None
    eps: float
    num_eval: int
    num_whitebox: int
    corruption_accuracy: float | None = None
    corruption: dict[str, _RAny] | None = None
    settings: dict[str, _RAny] = _r_field(default_factory=dict)
    seconds: float = 0.0
    autoattack_accuracy: float | None = None

    def to_dict(self) -> dict[str, _RAny]:
        """JSON-ready dict (NaN written as None)."""
        d = _r_asdict(self)
        for k, v in d.items():
            if isinstance(v, float) and v != v:
                d[k] = None
        return d

    def __repr__(self) -> str:
        from robustest.core.reprs import one_line

        return one_line(self, clean_accuracy=self.clean_accuracy, fixed_set_accuracy=self.fixed_set_accuracy,
                        fixed_set_size=self.fixed_set_size, whitebox_accuracy=self.whitebox_accuracy,
                        corruption_accuracy=self.corruption_accuracy, eps=self.eps, num_eval=self.num_eval,
                        num_whitebox=self.num_whitebox, seconds=self.seconds)


def measure(model: _RAny, data: _RAny, *, eps: float, fixed: FixedAdversarialSet | None = None,
            whitebox: bool = True, whitebox_limit: int | None = 1000, pgd_steps: int = 20, pgd_restarts: int = 2,
            apgd_steps: int = 50, corruptions: str | list[str] | None = None,
            corruption_severities: tuple[int, ...] = (1, 3, 5), seed: int = 0,
            batch_size: int = 256, autoattack: bool = False, autoattack_version: str = "standard"
            ) -> RobustnessReport:
    """Measure the robustness of ``model`` on the labelled evaluation split ``data``.

    ``fixed``: the fixed adversarial set built once against the ORIGINAL model (:func:`build_fixed_set`);
    without it ``fixed_set_accuracy`` is None. ``whitebox``: run PGD (``pgd_steps``, ``pgd_restarts``) and
    APGD-CE (``apgd_steps``) against ``model`` itself on the first ``whitebox_limit`` images (None: all).
    ``corruptions``: None (skip), ``"all"`` or a list of names for :func:`corruption_accuracy`.
    ``autoattack``: also run :func:`evaluate` (``autoattack_version``: "standard" = AutoAttack's ensemble, or
    "fast") on the same white-box images (needs ``whitebox``). Seeded.
    """
    t0 = _r_time.perf_counter()
    eps = check_eps("eps", eps)
    x, y = _r_xy(data)
    clean = clean_accuracy(model, (x, y), batch_size=batch_size)
    fx = fixed_set_accuracy(model, fixed, batch_size=batch_size) if fixed is not None else None
    wb: dict[str, _RAny] = {"pgd": None, "apgd": None, "worst": None}
    nwb = 0
    if whitebox:
        m = x.shape[0] if whitebox_limit is None else min(int(whitebox_limit), x.shape[0])
        wb = whitebox_accuracy(model, (x[:m], y[:m]), eps, pgd_steps=pgd_steps, pgd_restarts=pgd_restarts,
                               apgd_steps=apgd_steps, seed=seed, batch_size=batch_size)
        nwb = m
    aa = None
    if whitebox and autoattack:
        aa = evaluate(model, (x[:nwb], y[:nwb]), eps, version=autoattack_version, seed=seed,
                      batch_size=batch_size).robust_accuracy
    corr_mean, corr = None, None
    if corruptions:
        res = corruption_accuracy(model, (x, y), corruptions=corruptions, severities=tuple(corruption_severities),
                                  seed=seed, batch_size=batch_size)
        corr = res.to_dict()
        corr_mean = float(res.mean_corruption_accuracy)
    settings = {"pgd_steps": pgd_steps, "pgd_alpha": eps / 4, "pgd_restarts": pgd_restarts, "apgd_steps": apgd_steps,
                "seed": seed, "whitebox_limit": whitebox_limit, "corruption_severities": list(corruption_severities)}
    if aa is not None:
        settings["autoattack_version"] = autoattack_version
    return RobustnessReport(clean_accuracy=clean, fixed_set_accuracy=fx, fixed_set_size=len(fixed) if fixed else 0,
                            whitebox_pgd_accuracy=wb["pgd"], whitebox_apgd_accuracy=wb["apgd"],
                            whitebox_accuracy=wb["worst"], eps=eps, num_eval=int(x.shape[0]), num_whitebox=nwb,
                            corruption_accuracy=corr_mean, corruption=corr, settings=settings,
                            seconds=_r_time.perf_counter() - t0, autoattack_accuracy=aa)
# ======================================================== end of clean / fixed adversarial set / white-box section



# ================================================================ evaluate: the AutoAttack-style ensemble
# Implemented in robustest.evaluation (its own module: it is a pipeline of its own); re-exported here so that
# every robustness measure is reachable from robustest.robustness.
from robustest.evaluation import EVAL_FORMAT, EvalResult, ensemble_plan, evaluate  # noqa: E402, F401
