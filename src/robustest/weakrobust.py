"""Weak-robust validation: local robustness analysis of training samples, the weak-robust validation set,
validation under attacks and corruptions, and targeted enhancement (METHODS.md part B).

* :func:`analyze` draws ``Q`` noisy neighbours of every sample and scores how often / how confidently they
  are mispredicted (statistical, black-box). :func:`adversarial_radius` is the white-box counterpart: the
  smallest L-inf PGD budget that flips each sample, found by a batched bisection.
* :func:`select_weak` turns an :class:`Analysis` into a :class:`WeakSet` (top-K, top fraction, the
  "most neighbours misclassified" threshold, optionally class-balanced).
* :func:`validate` measures the error of a model on a set of samples (the weak set, a random subset, a
  test split) under gradient attacks and common corruptions and labels every perturbation type a strength
  or a weakness.
* :func:`enhance` trains with AugMix-style mixing + Jensen-Shannon consistency + an adversarial copy of each
  image, with the augmentation pool extended by the corruptions found to be weaknesses.

Neighbour noise (reproducibility): the data set is cut into fixed blocks of :data:`NOISE_BLOCK` consecutive
samples; block ``b`` draws its noise from a generator seeded with ``SeedSequence([seed, b])``. Results
therefore depend on ``seed`` and the sample's position only, never on ``batch_size`` (up to floating-point
differences of the forward pass itself). CPU and CUDA generators differ, so the noise differs by device.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from robustest.errors import ConfigError, DataError
from robustest.runtime import (
    DataLike,
    as_tensors,
    atomic_save,
    atomic_write_json,
    check_images,
    check_labels,
    eval_mode,
    forward,
    frozen_params,
    iter_batches,
    load_plain,
    make_generator,
    num_samples,
    resolve_device,
    seed_everything,
)
from robustest.runtime import progress as progress_bar

__all__ = [
    "ATTACKS",
    "AUGMIX_OPS",
    "NOISE_BLOCK",
    "Analysis",
    "EnhanceResult",
    "ValidationResult",
    "WeakSet",
    "adversarial_radius",
    "analyze",
    "augmentation_pool",
    "default_eps_grid",
    "enhance",
    "select_weak",
    "validate",
]

NOISE_BLOCK = 16
"""Samples per noise block: the unit whose neighbour noise is drawn from one seeded generator."""

ATTACKS = ("fgsm", "pgd", "bim", "rfgsm", "mifgsm")
"""The gradient attacks :func:`validate` runs by default."""


def _block_seed(seed: int, block: int) -> int:
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(block)]).generate_state(1, dtype=np.uint64)[0]
               & 0x7FFFFFFFFFFFFFFF)


# ================================================================================== local robustness
@dataclass
class Analysis:
    """Per-sample local robustness of a data set (all tensors 1-D of length N, in input order, on CPU).

    ``score``: mean misprediction score over the Q neighbours (higher = weaker); ``frac_misclassified``:
    fraction of neighbours whose prediction is not the label; ``clean_correct``: prediction on the sample
    itself is right; ``clean_score``: misprediction score of the sample itself; ``top_wrong``: the wrong
    class with the largest mean neighbour probability; ``label``; ``index``: position in the data set.
    ``params``: how it was computed (n_neighbors, eps, noise, quantize, seed, seconds).
    """

    score: torch.Tensor
    frac_misclassified: torch.Tensor
    clean_correct: torch.Tensor
    clean_score: torch.Tensor
    top_wrong: torch.Tensor
    label: torch.Tensor
    index: torch.Tensor
    params: dict[str, Any] = field(default_factory=dict)

    _TENSORS = ("score", "frac_misclassified", "clean_correct", "clean_score", "top_wrong", "label", "index")

    def __len__(self) -> int:
        return int(self.score.shape[0])

    def order(self) -> torch.Tensor:
        """Positions (into this analysis) from the weakest sample to the most robust one: score descending,
        ties broken by fraction misclassified descending, then by index ascending."""
        pos = torch.arange(len(self))
        o = torch.sort(-self.frac_misclassified.double(), stable=True).indices
        o = o[torch.sort(-self.score.double()[o], stable=True).indices]
        return pos[o]

    def to_dict(self) -> dict[str, Any]:
        """Plain tensors + params (loads with ``torch.load(weights_only=True)``)."""
        d: dict[str, Any] = {k: getattr(self, k) for k in self._TENSORS}
        d["params"] = dict(self.params)
        d["format"] = "robustest-analysis"
        return d

    def summary(self) -> dict[str, Any]:
        n = max(1, len(self))
        return {
            "n": len(self),
            "mean_score": float(self.score.mean()) if len(self) else None,
            "clean_accuracy": float(self.clean_correct.float().sum() / n),
            "frac_any_neighbour_wrong": float((self.frac_misclassified > 0).float().sum() / n),
            "frac_most_neighbours_wrong": float((self.frac_misclassified > 0.5).float().sum() / n),
            **self.params,
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        return atomic_save(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Analysis:
        d = load_plain(path, fmt="robustest-analysis", what="robustest analysis file",
                       fix="write one with 'robustest analyze'")
        return cls(**{k: d[k] for k in cls._TENSORS}, params=dict(d.get("params") or {}))


def _neighbour_noise(idx: torch.Tensor, q: int, shape: tuple[int, ...], eps: float, noise: str, seed: int,
                     device: torch.device, out: torch.Tensor | None = None) -> torch.Tensor:
    """Noise of shape [len(idx), q, *shape] for the contiguous sample positions ``idx`` (written into ``out``
    when given). Block ``b`` of :data:`NOISE_BLOCK` samples always draws the same numbers, however the
    positions are batched."""
    lo, hi = int(idx[0]), int(idx[-1]) + 1
    if out is None:
        out = torch.empty((hi - lo, q, *shape), device=device)

    def fill(t: torch.Tensor, gen: torch.Generator) -> None:
        if noise == "uniform":
            t.uniform_(-eps / 2, eps / 2, generator=gen)
        else:
            t.normal_(0.0, eps / (2 * math.sqrt(3.0)), generator=gen)

    for b in range(lo // NOISE_BLOCK, (hi - 1) // NOISE_BLOCK + 1):
        gen = make_generator(_block_seed(seed, b), device)
        s = max(lo, b * NOISE_BLOCK) - b * NOISE_BLOCK
        e = min(hi, (b + 1) * NOISE_BLOCK) - b * NOISE_BLOCK
        dst = out[b * NOISE_BLOCK + s - lo: b * NOISE_BLOCK + e - lo]
        if s == 0 and e == NOISE_BLOCK:
            fill(dst, gen)  # whole block: draw in place
        else:
            blk = torch.empty((NOISE_BLOCK, q, *shape), device=device)
            fill(blk, gen)
            dst.copy_(blk[s:e])
    return out


@torch.no_grad()
def analyze(
    model: nn.Module,
    data: DataLike,
    n_neighbors: int = 50,
    eps: float = 0.22,
    noise: str = "uniform",
    quantize: bool = True,
    batch_size: int = 4096,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> Analysis:
    """Local robustness analysis (METHODS B1) of every sample of labelled ``data`` (images N x C x H x W).

    Neighbours ``x_q = clip(x + delta_q, 0, 1)``; ``noise="uniform"``: ``delta_q ~ U[-eps/2, eps/2]^d``;
    ``noise="gaussian"``: ``delta_q ~ N(0, s^2)^d`` with ``s = eps / (2 sqrt 3)``, the standard deviation of
    the uniform noise. With ``quantize`` the neighbours are rounded to the 256 uint8 levels. Misprediction
    score of a neighbour: ``Ms = 0`` if ``argmax p = y`` else ``max_{k != y} p_k``.

    ``batch_size`` is the number of images (neighbours + the clean sample) per forward pass: the data set is
    streamed in chunks of whole noise blocks, so memory is bounded by the chunk, not by N. Results do not
    depend on ``batch_size`` (see the module docstring). Returns an :class:`Analysis` (tensors on CPU).
    """
    if n_neighbors < 1:
        raise ConfigError(f"n_neighbors must be >= 1, got {n_neighbors}")
    if not eps > 0:
        raise ConfigError(f"eps must be positive, got {eps}")
    if noise not in ("uniform", "gaussian"):
        raise ConfigError(f"unknown noise {noise!r}: use 'uniform' or 'gaussian'")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    dev = resolve_device(model, device)
    q = int(n_neighbors)
    chunk = NOISE_BLOCK * max(1, batch_size // (NOISE_BLOCK * (q + 1)))
    # Results go into tensors allocated once up front: small per-chunk tensors kept alive between the large
    # temporary buffers would pin the allocator's heap and make resident memory grow with N.
    n_total = num_samples(data)
    dtypes = {"clean_correct": torch.bool, "top_wrong": torch.long, "label": torch.long, "index": torch.long}
    out = {k: torch.empty(n_total, dtype=dtypes.get(k, torch.float32)) for k in Analysis._TENSORS}
    t0 = time.perf_counter()
    n_seen = 0
    buf: torch.Tensor | None = None
    with eval_mode(model):
        it = iter_batches(data, chunk, dev, with_index=True)
        try:
            total: int | None = -(-num_samples(data) // chunk)
        except Exception:  # noqa: BLE001 - only for the progress bar
            total = None
        for idx, xb, yb in progress_bar(it, enabled=progress, desc="analyze", total=total, unit="chunk"):
            if yb is None:
                raise DataError("analyze needs labels: pass (x, y) or a labelled Dataset")
            check_images(xb, "data images")
            yb = check_labels(yb, xb.shape[0], name="data labels").long()
            s = xb.shape[0]
            n_seen += s
            shape = tuple(xb.shape[1:])
            if buf is None or buf.shape[0] < s * q + s or buf.shape[1:] != shape or buf.dtype != xb.dtype:
                buf = torch.empty((s * q + s, *shape), device=dev, dtype=xb.dtype)  # reused across chunks
            inp = buf[: s * q + s]  # neighbours, then the clean samples
            xn = inp[: s * q].view(s, q, *shape)
            _neighbour_noise(idx, q, shape, eps, noise, seed, dev, out=xn)
            xn.add_(xb.unsqueeze(1)).clamp_(0.0, 1.0)
            if quantize:
                xn.mul_(255.0).round_().div_(255.0)
            inp[s * q:].copy_(xb)
            logits = forward(model, inp).float()
            k = logits.shape[1]
            if int(yb.max()) >= k:
                raise DataError(f"data has label {int(yb.max())} but the model has {k} classes")
            prob = logits.softmax(dim=1)
            pn = prob[: s * q].reshape(s, q, k)
            pc = prob[s * q:]
            wrong_n = pn.argmax(dim=2) != yb[:, None]
            ms_n = torch.where(wrong_n, pn.amax(dim=2), torch.zeros((), device=dev))
            wrong_c = pc.argmax(dim=1) != yb
            ms_c = torch.where(wrong_c, pc.amax(dim=1), torch.zeros((), device=dev))
            mean_p = pn.mean(dim=1)
            mean_p.scatter_(1, yb[:, None], -1.0)
            if n_seen > n_total:
                raise DataError(f"the data set yielded more than the {n_total} samples it reports")
            sl = slice(n_seen - s, n_seen)
            out["score"][sl] = ms_n.mean(dim=1).cpu()
            out["frac_misclassified"][sl] = wrong_n.float().mean(dim=1).cpu()
            out["clean_correct"][sl] = (~wrong_c).cpu()
            out["clean_score"][sl] = ms_c.cpu()
            out["top_wrong"][sl] = mean_p.argmax(dim=1).cpu()
            out["label"][sl] = yb.cpu()
            out["index"][sl] = idx.cpu().long()
    if n_seen == 0:
        raise DataError("analyze got an empty data set: check the split and --limit")
    params = {"n_neighbors": q, "eps": float(eps), "noise": noise, "quantize": bool(quantize), "seed": int(seed),
              "batch_size": int(batch_size), "seconds": time.perf_counter() - t0, "device": str(dev)}
    return Analysis(**{k: v[:n_seen] for k, v in out.items()}, params=params)


def adversarial_radius(
    model: nn.Module,
    data: DataLike,
    eps_max: float = 0.3,
    steps: int = 10,
    bisection_steps: int = 8,
    batch_size: int = 256,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Smallest L-inf budget that flips each sample (white-box counterpart of :func:`analyze`).

    For every sample, a bisection over ``eps in (0, eps_max]`` runs ``steps``-step PGD (step ``2.5 eps /
    steps``, random start from a generator seeded by ``seed`` and the batch) with a per-sample budget, all
    samples of a batch in one attack per bisection step. Returns a float tensor [N] on CPU: 0 for samples
    misclassified clean, ``inf`` when PGD at ``eps_max`` does not flip the sample, else the upper end of the
    final bracket (within ``eps_max / 2**bisection_steps`` of the radius PGD finds).
    """
    if not eps_max > 0:
        raise ConfigError(f"eps_max must be positive, got {eps_max}")
    if steps < 1 or bisection_steps < 0:
        raise ConfigError("steps must be >= 1 and bisection_steps >= 0")
    dev = resolve_device(model, device)
    out = []
    with eval_mode(model), frozen_params(model):
        for idx, xb, yb in iter_batches(data, batch_size, dev, with_index=True):
            if yb is None:
                raise DataError("adversarial_radius needs labels: pass (x, y) or a labelled Dataset")
            check_images(xb, "data images")
            yb = check_labels(yb, xb.shape[0], name="data labels").long()
            gen = make_generator(_block_seed(seed, int(idx[0])), dev)
            n = xb.shape[0]
            with torch.no_grad():
                clean_wrong = forward(model, xb).argmax(1) != yb
            hi = torch.full((n,), float(eps_max), device=dev)
            lo = torch.zeros(n, device=dev)
            flips = _pgd_flips(model, xb, yb, hi, steps, gen) | clean_wrong
            radius = torch.where(flips, hi, torch.full_like(hi, float("inf")))
            active = flips & ~clean_wrong
            for _ in range(bisection_steps):
                if not bool(active.any()):
                    break
                a = active.nonzero().squeeze(1)
                mid = (lo[a] + hi[a]) / 2
                f = _pgd_flips(model, xb[a], yb[a], mid, steps, gen)
                hi[a] = torch.where(f, mid, hi[a])
                lo[a] = torch.where(f, lo[a], mid)
            radius = torch.where(active, hi, radius)
            radius[clean_wrong] = 0.0
            out.append(radius.cpu())
    if not out:
        raise DataError("adversarial_radius got an empty data set")
    return torch.cat(out)


def _pgd_flips(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: torch.Tensor, steps: int,
               gen: torch.Generator) -> torch.Tensor:
    """L-inf PGD with a per-sample budget ``eps`` [N]; True where some iterate is misclassified."""
    e = eps.view(-1, *([1] * (x.dim() - 1)))
    alpha = 2.5 * e / steps
    delta = (torch.rand(x.shape, generator=gen, device=x.device) * 2 - 1) * e
    xa = (x + delta).clamp(0, 1)
    flipped = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    for _ in range(steps):
        xa.requires_grad_(True)
        logits = forward(model, xa)
        flipped |= logits.detach().argmax(1) != y
        grad, = torch.autograd.grad(F.cross_entropy(logits, y, reduction="sum"), xa)
        with torch.no_grad():
            xa = xa.detach() + alpha * grad.sign()
            xa = torch.max(torch.min(xa, x + e), x - e).clamp(0, 1)
    with torch.no_grad():
        flipped |= forward(model, xa).argmax(1) != y
    return flipped


# ================================================================================== weak-robust set
@dataclass
class WeakSet:
    """The selected weak-robust samples, weakest first.

    ``indices``: positions in the analysed data set (int64 [M]); ``scores``, ``frac_misclassified``,
    ``labels``: their analysis values; ``rule``: how they were chosen.
    """

    indices: torch.Tensor
    scores: torch.Tensor
    frac_misclassified: torch.Tensor
    labels: torch.Tensor
    rule: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def take(self, data: DataLike) -> tuple[torch.Tensor, torch.Tensor]:
        """The weak samples of ``data`` (the data set that was analysed) as ``(x, y)`` tensors."""
        x, y = as_tensors(data)
        if y is None:
            raise DataError("the data set needs labels")
        if len(self) and int(self.indices.max()) >= x.shape[0]:
            raise DataError(f"weak set index {int(self.indices.max())} is outside the data set of {x.shape[0]} "
                            "samples: use the same data set (and split) that was analysed")
        return x[self.indices], y[self.indices]

    def to_dict(self) -> dict[str, Any]:
        return {"format": "robustest-weakset", "indices": self.indices, "scores": self.scores,
                "frac_misclassified": self.frac_misclassified, "labels": self.labels, "rule": dict(self.rule)}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save as plain tensors (``.pt``) or as JSON (``.json``)."""
        path = Path(path)
        if path.suffix == ".json":
            return atomic_write_json(path, self.to_dict())
        return atomic_save(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> WeakSet:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"weak set file {str(path)!r} does not exist")
        try:
            if path.suffix == ".json":
                d = json.loads(path.read_text())
            else:
                d = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise DataError(f"{path} is not a robustest weak set file (cannot be read)") from exc
        if not isinstance(d, dict) or d.get("format") != "robustest-weakset":
            raise DataError(f"{path} is not a robustest weak set file")
        return cls(indices=torch.as_tensor(d["indices"], dtype=torch.long),
                   scores=torch.as_tensor(d["scores"], dtype=torch.float32),
                   frac_misclassified=torch.as_tensor(d["frac_misclassified"], dtype=torch.float32),
                   labels=torch.as_tensor(d["labels"], dtype=torch.long), rule=dict(d.get("rule") or {}))


def _balanced_take(order: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """Take ``k`` positions from ``order`` (weakest first) spread as evenly as possible over the classes:
    round-robin over classes by rank within the class; classes with too few samples give their share to
    the others."""
    if k <= 0:
        return order[:0]
    lab = labels[order]
    rank = torch.zeros_like(order)
    for c in torch.unique(lab):
        m = lab == c
        rank[m] = torch.arange(int(m.sum()))
    # sort by (rank within class, global weakness position): classes alternate, weakest first
    key = rank.double() * (len(order) + 1) + torch.arange(len(order)).double()
    chosen = torch.zeros(len(order), dtype=torch.bool)
    chosen[torch.argsort(key)[:k]] = True
    return order[chosen]  # back in global weakness order


def select_weak(
    analysis: Analysis,
    k: int | None = None,
    fraction: float | None = None,
    threshold: float | None = None,
    per_class: bool = False,
    correct_only: bool = False,
) -> WeakSet:
    """Select the weak-robust samples of an :class:`Analysis` (weakest first).

    Give at most one of: ``k`` (the K weakest), ``fraction`` (the weakest ``ceil(fraction N)``),
    ``threshold`` (samples with more than ``threshold`` of their neighbours misclassified; the paper's
    "most neighbours misclassified" is ``threshold=0.5``, the default when none is given).
    ``per_class``: with ``k``, the K samples are spread evenly over the classes (each class gives its
    weakest); with ``fraction``, each class gives its weakest ``ceil(fraction N_c)``; with ``threshold``, the
    same number of samples the threshold selects is drawn class-balanced from the ranking.
    ``correct_only``: rank only the samples the model classifies correctly clean (misclassified training
    samples are wrong under every perturbation, so they carry no robustness signal of their own).
    """
    given = [v is not None for v in (k, fraction, threshold)]
    if sum(given) > 1:
        raise ConfigError("give only one of k, fraction, threshold")
    if not any(given):
        threshold = 0.5
    order = analysis.order()
    if correct_only:
        order = order[analysis.clean_correct[order]]
    n = len(order)
    labels = analysis.label
    if k is not None:
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        k = min(int(k), n)
        sel = _balanced_take(order, labels, k) if per_class else order[:k]
        rule: dict[str, Any] = {"rule": "top_k", "k": k}
    elif fraction is not None:
        if not 0 < fraction <= 1:
            raise ConfigError(f"fraction must lie in (0, 1], got {fraction}")
        if per_class:
            parts = []
            for c in torch.unique(labels):
                oc = order[labels[order] == c]
                parts.append(oc[: math.ceil(fraction * len(oc))])
            sel = order[torch.isin(order, torch.cat(parts))]
        else:
            sel = order[: math.ceil(fraction * n)]
        rule = {"rule": "top_fraction", "fraction": float(fraction)}
    else:
        assert threshold is not None
        if not 0 <= threshold < 1:
            raise ConfigError(f"threshold must lie in [0, 1), got {threshold}")
        over = analysis.frac_misclassified[order] > threshold
        m = int(over.sum())
        sel = _balanced_take(order, labels, m) if per_class else order[over]
        rule = {"rule": "threshold", "threshold": float(threshold)}
    rule["per_class"] = bool(per_class)
    rule["correct_only"] = bool(correct_only)
    rule["n_analysed"] = len(analysis)
    rule["analysis"] = dict(analysis.params)
    return WeakSet(indices=analysis.index[sel].clone(), scores=analysis.score[sel].clone(),
                   frac_misclassified=analysis.frac_misclassified[sel].clone(), labels=labels[sel].clone(),
                   rule=rule)


# ========================================================================================= validation
def default_eps_grid(channels: int) -> tuple[float, ...]:
    """L-inf budgets used by default: (0.05, 0.1, 0.2) for 1-channel images (MNIST-like), else 2/255, 4/255,
    8/255 (colour images, as in the paper)."""
    return (0.05, 0.1, 0.2) if channels == 1 else (2 / 255, 4 / 255, 8 / 255)


@dataclass
class ValidationResult:
    """Per-sample outcome of every perturbation (type, level) on a set of N samples.

    ``keys``: list of ``(family, type, level)`` with family ``"clean"``, ``"attack"`` (level = eps) or
    ``"corruption"`` (level = severity); ``wrong``: BoolTensor [len(keys), N], True where the prediction on
    the perturbed sample is not the label; ``indices``: the samples' positions in the data set.
    Aggregates (:meth:`summary`): top-1 error per (type, level), per type (mean over levels), clean error,
    mean corruption error (mCE, unnormalised mean over corruption types), mean adversarial error (mean over
    attack types), and every type labelled ``weakness`` or ``strength`` by :meth:`labels`.
    """

    keys: list[tuple[str, str, float]]
    wrong: torch.Tensor
    indices: torch.Tensor
    labels_y: torch.Tensor
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.wrong.shape[1])

    def subset(self, positions: torch.Tensor | Sequence[int]) -> ValidationResult:
        """The result restricted to some of its samples (positions 0..N-1 of this result)."""
        p = torch.as_tensor(positions, dtype=torch.long)
        return ValidationResult(self.keys, self.wrong[:, p], self.indices[p], self.labels_y[p], dict(self.meta))

    def errors(self) -> dict[tuple[str, str, float], float]:
        n = max(1, len(self))
        e = self.wrong.float().sum(dim=1) / n
        return {k: float(v) for k, v in zip(self.keys, e.tolist())}

    def per_type(self) -> dict[str, tuple[str, float]]:
        """type -> (family, error averaged over its levels)."""
        acc: dict[str, list] = {}
        for (fam, typ, _lvl), err in self.errors().items():
            acc.setdefault(typ, [fam, []])[1].append(err)
        return {t: (f, float(np.mean(v))) for t, (f, v) in acc.items()}

    def family_mean(self, family: str) -> float | None:
        vals = [e for f, e in self.per_type().values() if f == family]
        return float(np.mean(vals)) if vals else None

    @property
    def clean_error(self) -> float | None:
        return self.family_mean("clean")

    @property
    def mce(self) -> float | None:
        return self.family_mean("corruption")

    @property
    def mean_adv_error(self) -> float | None:
        return self.family_mean("attack")

    def labels(self, reference: ValidationResult | Mapping[str, float] | None = None) -> dict[str, str]:
        """Strength/weakness of every perturbation type.

        Without ``reference``: a type is a ``weakness`` when its error exceeds the mean error of its family
        (attacks are compared with attacks, corruptions with corruptions), else a ``strength``. With a
        ``reference`` (another model's result on the same samples, or type -> error): a weakness when the
        error exceeds the reference's error on that type.
        """
        pt = self.per_type()
        if reference is not None:
            ref = ({t: e for t, (_f, e) in reference.per_type().items()} if isinstance(reference, ValidationResult)
                   else dict(reference))
        out = {}
        for t, (fam, err) in pt.items():
            if fam == "clean":
                continue
            base = ref.get(t) if reference is not None else self.family_mean(fam)
            if base is None:
                continue
            out[t] = "weakness" if err > base else "strength"
        return out

    def weaknesses(self, reference: ValidationResult | Mapping[str, float] | None = None) -> list[str]:
        return [t for t, v in self.labels(reference).items() if v == "weakness"]

    def rows(self) -> list[dict[str, Any]]:
        """One row per (type, level): family, type, level, error."""
        return [{"family": f, "type": t, "level": lvl, "error": e} for (f, t, lvl), e in self.errors().items()]

    def summary(self, reference: ValidationResult | Mapping[str, float] | None = None) -> dict[str, Any]:
        lab = self.labels(reference)
        return {
            "n": len(self),
            "clean_error": self.clean_error,
            "mce": self.mce,
            "mean_adv_error": self.mean_adv_error,
            "per_type": {t: {"family": f, "error": e, "label": lab.get(t)} for t, (f, e) in self.per_type().items()},
            "label_rule": "reference" if reference is not None else "family_mean",
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "rows": self.rows(), "meta": dict(self.meta)}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Per-sample outcomes as plain tensors (``.pt``)."""
        return atomic_save({"format": "robustest-validation", "keys": [list(k) for k in self.keys],
                            "wrong": self.wrong, "indices": self.indices, "labels": self.labels_y,
                            "meta": dict(self.meta)}, path)


def _parse_perturbations(perturbations: str | Sequence[str] | None) -> tuple[list[str], list[str]]:
    """Split a spec ("all", "attacks", "corruptions", or a list of names) into (attacks, corruptions)."""
    from robustest import corruptions as corr

    cnames = list(corr.names())
    if perturbations is None or perturbations == "all":
        return list(ATTACKS), cnames
    items = [perturbations] if isinstance(perturbations, str) else list(perturbations)
    atk, cor = [], []
    for it in items:
        for name in str(it).split(","):
            name = name.strip()
            if not name:
                continue
            if name == "all":
                atk += [a for a in ATTACKS if a not in atk]
                cor += [c for c in cnames if c not in cor]
            elif name == "attacks":
                atk += [a for a in ATTACKS if a not in atk]
            elif name == "corruptions":
                cor += [c for c in cnames if c not in cor]
            elif name in ATTACKS or name in _attack_names():
                if name not in atk:
                    atk.append(name)
            elif name in cnames:
                if name not in cor:
                    cor.append(name)
            else:
                raise ConfigError(f"unknown perturbation {name!r}: use 'all', 'attacks', 'corruptions', an attack "
                                  f"({', '.join(ATTACKS)}) or a corruption ({', '.join(cnames)})")
    return atk, cor


def _attack_names() -> list[str]:
    from robustest import attacks

    return list(attacks.names())


@torch.no_grad()
def _wrong(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int, dev: torch.device) -> torch.Tensor:
    out = []
    for s in range(0, x.shape[0], batch_size):
        xb = x[s:s + batch_size].to(dev)
        out.append((forward(model, xb).argmax(1) != y[s:s + batch_size].to(dev)).cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool)


def validate(
    model: nn.Module,
    data: DataLike,
    weak_set: WeakSet | torch.Tensor | Sequence[int] | None = None,
    perturbations: str | Sequence[str] | None = "all",
    *,
    eps: Sequence[float] | None = None,
    severities: Sequence[int] = (1, 2, 3, 4, 5),
    attack_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    batch_size: int = 256,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> ValidationResult:
    """Error of ``model`` on the samples ``weak_set`` of ``data`` under each perturbation (METHODS B2).

    ``weak_set``: a :class:`WeakSet`, positions into ``data``, or None for every sample (e.g. a test split).
    ``perturbations``: ``"all"`` (default), ``"attacks"``, ``"corruptions"``, or names of attacks
    (:data:`ATTACKS` and any other ``robustest.attacks`` name) and corruptions (``robustest.corruptions``).
    Attacks run white-box at every budget of ``eps`` (default :func:`default_eps_grid`) with the attack's
    defaults (``attack_kwargs[name]`` overrides them); corruptions at every severity. Error = fraction of
    samples whose prediction on the perturbed input is not the label (clean mistakes count as errors).
    Returns a :class:`ValidationResult` holding the per-sample outcomes.
    """
    from robustest import attacks as atk_mod
    from robustest import corruptions as corr

    x_all, y_all = as_tensors(data)
    if y_all is None:
        raise DataError("validate needs labels: pass (x, y) or a labelled Dataset")
    check_images(x_all, "data images")
    check_labels(y_all, x_all.shape[0], name="data labels")
    if weak_set is None:
        idx = torch.arange(x_all.shape[0])
    elif isinstance(weak_set, WeakSet):
        idx = weak_set.indices
    else:
        idx = torch.as_tensor(weak_set, dtype=torch.long).reshape(-1)
    if idx.numel() == 0:
        raise DataError("the weak set is empty: select with a lower threshold or give k / fraction")
    if int(idx.max()) >= x_all.shape[0] or int(idx.min()) < 0:
        raise DataError(f"weak set indices reach {int(idx.max())} but the data set has {x_all.shape[0]} samples: "
                        "validate on the data set that was analysed")
    x, y = x_all[idx], y_all[idx].long()
    attacks_, corrs = _parse_perturbations(perturbations)
    grid = tuple(float(e) for e in (eps if eps is not None else default_eps_grid(x.shape[1])))
    sev = tuple(int(s) for s in severities)
    if any(s < 1 or s > 5 for s in sev):
        raise ConfigError(f"severities must lie in 1..5, got {sev}")
    dev = resolve_device(model, device)
    keys: list[tuple[str, str, float]] = [("clean", "clean", 0.0)]
    rows: list[torch.Tensor] = []
    t0 = time.perf_counter()
    jobs: list[tuple[str, str, float]] = [("attack", a, e) for a in attacks_ for e in grid]
    jobs += [("corruption", c, float(s)) for c in corrs for s in sev]
    with eval_mode(model):
        rows.append(_wrong(model, x, y, batch_size, dev))
        for fam, name, lvl in progress_bar(jobs, enabled=progress, desc="validate", unit="type"):
            if fam == "attack":
                kw = dict((attack_kwargs or {}).get(name, {}))
                res = atk_mod.attack(name, model, (x, y), batch_size=batch_size, eps=lvl, seed=seed, **kw)
                rows.append(res.success.reshape(-1).bool().cpu())
            else:
                parts = []
                for b, s in enumerate(range(0, x.shape[0], batch_size)):
                    xc = corr.corrupt(x[s:s + batch_size].to(dev), name, int(lvl), seed=seed + b)
                    parts.append(_wrong(model, xc, y[s:s + batch_size], batch_size, dev))
                rows.append(torch.cat(parts))
            keys.append((fam, name, lvl))
    meta = {"eps": list(grid), "severities": list(sev), "attacks": attacks_, "corruptions": corrs, "seed": seed,
            "seconds": time.perf_counter() - t0}
    return ValidationResult(keys=keys, wrong=torch.stack(rows), indices=idx.clone(), labels_y=y.clone(), meta=meta)


# ======================================================================================== enhancement
def _affine(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def _lvl(rng: np.random.Generator, n: int, severity: float) -> np.ndarray:
    """AugMix's random level in [0.1, severity] of 10, per sample, with a random sign."""
    return rng.uniform(0.1, severity, n) / 10.0 * rng.choice([-1.0, 1.0], n)


def _op_rotate(x, rng, sev):
    a = torch.as_tensor(_lvl(rng, x.shape[0], sev) * math.radians(30), dtype=x.dtype, device=x.device)
    c, s, z = a.cos(), a.sin(), torch.zeros_like(a)
    return _affine(x, torch.stack([torch.stack([c, -s, z], 1), torch.stack([s, c, z], 1)], 1))


def _shear(x, rng, sev, axis):
    v = torch.as_tensor(_lvl(rng, x.shape[0], sev) * 0.3, dtype=x.dtype, device=x.device)
    o, z = torch.ones_like(v), torch.zeros_like(v)
    rows = ([o, v, z], [z, o, z]) if axis == 0 else ([o, z, z], [v, o, z])
    return _affine(x, torch.stack([torch.stack(rows[0], 1), torch.stack(rows[1], 1)], 1))


def _translate(x, rng, sev, axis):
    v = torch.as_tensor(_lvl(rng, x.shape[0], sev) * (2.0 / 3.0), dtype=x.dtype, device=x.device)  # 1/3 width
    o, z = torch.ones_like(v), torch.zeros_like(v)
    rows = ([o, z, v], [z, o, z]) if axis == 0 else ([o, z, z], [z, o, v])
    return _affine(x, torch.stack([torch.stack(rows[0], 1), torch.stack(rows[1], 1)], 1))


def _op_autocontrast(x, rng, sev):
    lo = x.amin(dim=(2, 3), keepdim=True)
    hi = x.amax(dim=(2, 3), keepdim=True)
    return ((x - lo) / (hi - lo).clamp_min(1e-3)).clamp(0, 1)


def _op_equalize(x, rng, sev):
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    q = (flat * 255).round()
    # empirical CDF value of each pixel's level (rank of its level among the image's pixels)
    cnt = (q.unsqueeze(-1) >= q.unsqueeze(-2)).float().mean(-1) if flat.shape[-1] <= 1024 else None
    if cnt is None:  # large images: histogram per channel
        hist = torch.zeros(n, c, 256, device=x.device).scatter_add_(2, q.long(), torch.ones_like(q))
        cdf = hist.cumsum(2) / flat.shape[-1]
        cnt = cdf.gather(2, q.long())
    return cnt.reshape_as(x).clamp(0, 1)


def _op_posterize(x, rng, sev):
    bits = torch.as_tensor(4 - (np.abs(_lvl(rng, x.shape[0], sev)) * 4).astype(int), device=x.device)
    shift = (2 ** (8 - bits)).view(-1, 1, 1, 1).to(x.dtype)
    return (torch.floor(x * 255 / shift) * shift / 255).clamp(0, 1)


def _op_solarize(x, rng, sev):
    t = torch.as_tensor(1 - np.abs(_lvl(rng, x.shape[0], sev)), dtype=x.dtype, device=x.device).view(-1, 1, 1, 1)
    return torch.where(x >= t, 1 - x, x)


AUGMIX_OPS: dict[str, Callable[[torch.Tensor, np.random.Generator, float], torch.Tensor]] = {
    "autocontrast": _op_autocontrast,
    "equalize": _op_equalize,
    "posterize": _op_posterize,
    "solarize": _op_solarize,
    "rotate": _op_rotate,
    "shear_x": lambda x, r, s: _shear(x, r, s, 0),
    "shear_y": lambda x, r, s: _shear(x, r, s, 1),
    "translate_x": lambda x, r, s: _translate(x, r, s, 0),
    "translate_y": lambda x, r, s: _translate(x, r, s, 1),
}
"""AugMix's operations (Hendrycks et al. 2020) without the ones that overlap the common corruptions
(contrast, colour, brightness, sharpness), batched with per-sample random magnitudes."""


def _corruption_op(name: str) -> Callable[[torch.Tensor, np.random.Generator, float], torch.Tensor]:
    from robustest import corruptions as corr

    def op(x: torch.Tensor, rng: np.random.Generator, sev: float) -> torch.Tensor:
        return corr.corrupt(x, name, int(rng.integers(1, 4)), seed=int(rng.integers(2**31 - 1)))

    return op


def augmentation_pool(weaknesses: Sequence[str] = ()) -> tuple[list[str], list[Callable]]:
    """The AugMix pool extended by the corruption types among ``weaknesses`` -> (names, ops).

    Attack names are accepted (the adversarial copy covers them) and add nothing; any other name raises
    :class:`ConfigError`.
    """
    from robustest import attacks as atk_mod
    from robustest import corruptions as corr

    pool_names = list(AUGMIX_OPS)
    ops: list[Callable] = list(AUGMIX_OPS.values())
    cnames = set(corr.names())
    known_attacks = set(ATTACKS) | set(atk_mod.names())
    for w in weaknesses:
        if w in cnames:
            if w not in pool_names:
                pool_names.append(w)
                ops.append(_corruption_op(w))
        elif w not in known_attacks:
            raise ConfigError(f"unknown weakness {w!r}: give corruption names ({', '.join(sorted(cnames))}) "
                              "or attack names")
    return pool_names, ops


def _augmix(x: torch.Tensor, ops: Sequence[Callable], rng: np.random.Generator, width: int = 3, depth: int = -1,
            severity: float = 3.0, alpha: float = 1.0) -> torch.Tensor:
    """AugMix: x_aug = m x + (1 - m) sum_i w_i chain_i(x), w ~ Dir(alpha), m ~ Beta(alpha, alpha); each chain
    applies 1-3 (or ``depth``) random ops; every sample draws its own ops and magnitudes. x: N x C x H x W."""
    n = x.shape[0]
    w = torch.as_tensor(rng.dirichlet([alpha] * width, n), dtype=x.dtype, device=x.device)
    m = torch.as_tensor(rng.beta(alpha, alpha, n), dtype=x.dtype, device=x.device).view(-1, 1, 1, 1)
    mix = torch.zeros_like(x)
    for i in range(width):
        xi = x.clone()
        d = rng.integers(1, 4, n) if depth <= 0 else np.full(n, depth)
        for step in range(int(d.max())):
            choice = rng.integers(0, len(ops), n)
            for j, op in enumerate(ops):
                sel = np.nonzero((choice == j) & (d > step))[0]
                if sel.size:
                    st = torch.as_tensor(sel, device=x.device)
                    xi[st] = op(xi[st], rng, severity).to(x.dtype)
        mix += w[:, i].view(-1, 1, 1, 1) * xi
    return (m * x + (1 - m) * mix).clamp(0, 1)


def _jsd(logits: Sequence[torch.Tensor]) -> torch.Tensor:
    ps = [lg.softmax(1) for lg in logits]
    logm = torch.clamp(sum(ps) / len(ps), 1e-7, 1).log()
    return sum(F.kl_div(logm, p, reduction="batchmean") for p in ps) / len(ps)


@dataclass
class EnhanceResult:
    """What :func:`enhance` did: per-epoch losses, the augmentation pool, the weaknesses used, timings."""

    epochs: list[dict[str, float]]
    pool: list[str]
    weaknesses: list[str]
    config: dict[str, Any]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "pool": self.pool, "weaknesses": self.weaknesses, "config": self.config,
                "seconds": self.seconds}


def enhance(
    model: nn.Module,
    train: DataLike,
    weaknesses: Sequence[str] | ValidationResult | None = (),
    epochs: int = 1,
    *,
    augmix: bool = True,
    adversarial: bool = True,
    jsd_weight: float = 6.0,
    adv_weight: float = 0.5,
    adv_eps: float | None = None,
    adv_steps: int = 10,
    adv_alpha: float | None = None,
    adv_source: str = "offline",
    width: int = 3,
    severity: float = 3.0,
    lr: float = 1e-3,
    batch_size: int = 64,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> EnhanceResult:
    """Targeted enhancement (METHODS B3): train ``model`` in place on labelled ``train`` with
    ``L = CE(x) + jsd_weight * JSD(p(x), p(aug1), p(aug2)) + adv_weight * CE(x_adv)``.

    ``aug1``/``aug2`` are two independent AugMix mixtures over :data:`AUGMIX_OPS` extended by the corruption
    types in ``weaknesses`` (names from ``robustest.corruptions``; attack names are accepted and covered by
    the adversarial term; a :class:`ValidationResult` contributes its ``weaknesses()``). ``x_adv``: L-inf
    PGD (``adv_eps``, default the middle of :func:`default_eps_grid`; ``adv_steps`` steps of ``adv_alpha``,
    default ``adv_eps / 4``) against the model as it is at the start (``adv_source="offline"``, the reference
    recipe) or against the current model every batch (``"online"``). ``augmix=False`` drops the JSD term
    (adversarial fine-tuning only); ``adversarial=False`` drops ``x_adv`` (AugMix only); both False is
    plain training with the same budget. The model ends in eval mode.
    """
    from robustest import attacks as atk_mod

    if epochs < 0:
        raise ConfigError(f"epochs must be >= 0, got {epochs}")
    if adv_source not in ("offline", "online"):
        raise ConfigError(f"adv_source must be 'offline' or 'online', got {adv_source!r}")
    if isinstance(weaknesses, ValidationResult):
        weaknesses = weaknesses.weaknesses()
    weak = [str(w) for w in (weaknesses or [])]
    pool_names, ops = augmentation_pool(weak)
    x, y = as_tensors(train)
    if y is None:
        raise DataError("enhance needs labelled training data")
    check_images(x, "train images")
    y = check_labels(y, x.shape[0], name="train labels").long()
    dev = resolve_device(model, device)
    model.to(dev)
    eps = float(adv_eps) if adv_eps is not None else default_eps_grid(x.shape[1])[1]
    alpha = float(adv_alpha) if adv_alpha is not None else eps / 4
    t0 = time.perf_counter()
    seed_everything(seed)
    x_adv_all = None
    if adversarial and adv_source == "offline":
        parts = []
        for s in range(0, x.shape[0], 256):
            parts.append(atk_mod.pgd(model, x[s:s + 256].to(dev), y[s:s + 256].to(dev), eps=eps, alpha=alpha,
                                     steps=adv_steps, seed=seed + s).detach().cpu())
        x_adv_all = torch.cat(parts)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    gen = make_generator(seed)
    rng = np.random.default_rng(seed)
    n = x.shape[0]
    history = []
    for ep in progress_bar(range(1, epochs + 1), enabled=progress, desc="enhance", unit="epoch"):
        te = time.perf_counter()
        perm = torch.randperm(n, generator=gen)
        tot = {"loss": 0.0, "ce": 0.0, "jsd": 0.0, "adv": 0.0}
        for s in range(0, n, batch_size):
            ib = perm[s:s + batch_size]
            xb, yb = x[ib].to(dev), y[ib].to(dev)
            inputs = [xb]
            if augmix:
                inputs += [_augmix(xb, ops, rng, width, -1, severity), _augmix(xb, ops, rng, width, -1, severity)]
            if adversarial:
                if x_adv_all is not None:
                    inputs.append(x_adv_all[ib].to(dev))
                else:
                    inputs.append(atk_mod.pgd(model, xb, yb, eps=eps, alpha=alpha, steps=adv_steps,
                                              seed=seed + ep * n + s).detach())
            model.train()
            logits = forward(model, torch.cat(inputs)).split(xb.shape[0])
            ce = F.cross_entropy(logits[0], yb)
            loss = ce
            jsd = adv = torch.zeros((), device=dev)
            if augmix:
                jsd = _jsd(logits[:3])
                loss = loss + jsd_weight * jsd
            if adversarial:
                adv = F.cross_entropy(logits[-1], yb)
                loss = loss + adv_weight * adv
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            m = len(ib)
            for k_, v in (("loss", loss), ("ce", ce), ("jsd", jsd), ("adv", adv)):
                tot[k_] += float(v.detach()) * m
        history.append({"epoch": ep, **{k_: v / n for k_, v in tot.items()}, "seconds": time.perf_counter() - te})
    model.eval()
    config = {"epochs": epochs, "augmix": augmix, "adversarial": adversarial, "jsd_weight": jsd_weight,
              "adv_weight": adv_weight, "adv_eps": eps, "adv_steps": adv_steps, "adv_alpha": alpha,
              "adv_source": adv_source, "width": width, "severity": severity, "lr": lr, "batch_size": batch_size,
              "seed": seed}
    return EnhanceResult(epochs=history, pool=pool_names, weaknesses=weak, config=config,
                         seconds=time.perf_counter() - t0)
