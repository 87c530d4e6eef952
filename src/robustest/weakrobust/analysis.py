"""Local robustness analysis (METHODS B1): :func:`analyze` scores every sample by how often and how
confidently its Q noisy neighbours are mispredicted; :func:`adversarial_radius` is the white-box
counterpart (the smallest L-inf PGD budget that flips each sample, by batched bisection)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from robustest import attacks
from robustest.core import reprs
from robustest.core.amp import autocast, check_amp
from robustest.core.atomic import atomic_save
from robustest.core.batching import DataLike, image_shape, iter_batches, num_samples
from robustest.core.devices import resolve_device
from robustest.core.distributed import Shard, all_gather_cat
from robustest.core.errors import ConfigError, DataError
from robustest.core.inputs import check_images, check_labels, check_logits
from robustest.core.modelcall import eval_mode, forward, frozen_params
from robustest.core.progress import progress as progress_bar
from robustest.core.reading import load_plain
from robustest.core.seeding import make_generator
from robustest.core.tasks import run_tasks
from robustest.core.validation import check_eps, check_float, check_int

NOISE_BLOCK = 16
VALUES_PER_PASS = 2**22  # pixel values per forward pass when batch_size is not given (about 16 MB of input)
"""Samples per noise block: the unit whose neighbour noise is drawn from one seeded generator."""


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

    def __repr__(self) -> str:
        s = self.summary()
        return reprs.one_line(self, n=len(self), mean_score=s["mean_score"], clean_accuracy=s["clean_accuracy"],
                              frac_most_neighbours_wrong=s["frac_most_neighbours_wrong"],
                              n_neighbors=self.params.get("n_neighbors"), eps=self.params.get("eps"),
                              noise=self.params.get("noise"))

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
        return cls.from_dict(d, str(path))

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "analysis") -> Analysis:
        """An Analysis from :meth:`to_dict`'s plain data, checked as a whole: every tensor present, 1-D, of one
        length and of the right kind; indices non-negative and distinct; scores finite in [0, 1]."""
        bad = f"{source}: damaged analysis:"
        n = None
        for k in cls._TENSORS:
            t = d.get(k)
            if not isinstance(t, torch.Tensor) or t.dim() != 1:
                raise DataError(f"{bad} {k!r} is missing or not a 1-D tensor: rerun 'robustest analyze'")
            if n is None:
                n = t.shape[0]
            if t.shape[0] != n:
                raise DataError(f"{bad} {k!r} has {t.shape[0]} entries but 'score' has {n}: rerun 'robustest analyze'")
        floats, ints = ("score", "frac_misclassified", "clean_score"), ("top_wrong", "label", "index")
        for k in floats:
            t = d[k]
            if not t.is_floating_point() or (n and (not bool(torch.isfinite(t).all()) or float(t.min()) < 0
                                                     or float(t.max()) > 1)):
                raise DataError(f"{bad} {k!r} must hold finite values in [0, 1]")
        for k in ints:
            t = d[k]
            if t.is_floating_point() or t.dtype == torch.bool or (n and int(t.min()) < 0):
                raise DataError(f"{bad} {k!r} must hold non-negative integers")
        if n and len(torch.unique(d["index"])) != n:
            raise DataError(f"{bad} 'index' names a sample twice")
        params = d.get("params")
        return cls(**{k: d[k] for k in cls._TENSORS}, params=dict(params) if isinstance(params, dict) else {})

    @classmethod
    def concat(cls, parts: list[Analysis]) -> Analysis:
        """The analyses of consecutive parts of one data set as one (params of the first, seconds summed)."""
        if not parts:
            raise DataError("no analysis to join")
        params = dict(parts[0].params)
        params["seconds"] = float(sum(p.params.get("seconds", 0.0) for p in parts))
        return cls(**{k: torch.cat([getattr(p, k) for p in parts]) for k in cls._TENSORS}, params=params)


def _neighbour_noise(idx: torch.Tensor, q: int, shape: tuple[int, ...], eps: float, noise: str, seed: int,
                     device: torch.device, out: torch.Tensor | None = None) -> torch.Tensor:
    """Noise of shape [len(idx), q, *shape] for the samples at data-set positions ``idx`` (written into ``out``
    when given). Block ``b`` of :data:`NOISE_BLOCK` samples always draws the same numbers, however the
    positions are batched or ordered, so a sample's neighbours depend on its index alone. Contiguous
    positions (the usual in-order pass) draw only the blocks they cover; shuffled positions draw each
    block they touch and gather their rows."""
    n = idx.numel()
    if out is None:
        out = torch.empty((n, q, *shape), device=device)
    if n == 0:
        return out

    def fill(t: torch.Tensor, gen: torch.Generator) -> None:
        if noise == "uniform":
            t.uniform_(-eps / 2, eps / 2, generator=gen)
        else:
            t.normal_(0.0, eps / (2 * math.sqrt(3.0)), generator=gen)

    idx = idx.cpu().long()
    lo, hi = int(idx[0]), int(idx[-1]) + 1
    # Each block has its own generator, so blocks are independent tasks: on the CPU, where torch draws
    # serially, they run on several threads (same numbers for any thread count or order).
    run = run_tasks if device.type == "cpu" else (lambda count, task: [task(i) for i in range(count)])
    if hi - lo == n and torch.equal(idx, torch.arange(lo, hi)):
        first = lo // NOISE_BLOCK

        def contiguous(i: int) -> None:
            b = first + i
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

        run((hi - 1) // NOISE_BLOCK + 1 - first, contiguous)
        return out
    blocks = idx // NOISE_BLOCK
    touched = torch.unique(blocks).tolist()

    def scattered(i: int) -> None:
        b = touched[i]
        rows = torch.nonzero(blocks == b).flatten()
        blk = torch.empty((NOISE_BLOCK, q, *shape), device=device)
        fill(blk, make_generator(_block_seed(seed, b), device))
        out[rows.to(device)] = blk[(idx[rows] - b * NOISE_BLOCK).to(device)]

    run(len(touched), scattered)
    return out


def default_batch_size(data: DataLike) -> int:
    """Images per forward pass of :func:`analyze` when none is given: as many as hold :data:`VALUES_PER_PASS`
    pixel values (5349 of 1 x 28 x 28, 341 of 3 x 64 x 64)."""
    return max(1, VALUES_PER_PASS // max(1, math.prod(image_shape(data))))


@torch.no_grad()
def analyze(
    model: nn.Module,
    data: DataLike,
    n_neighbors: int = 50,
    eps: float = 0.22,
    noise: str = "uniform",
    quantize: bool = True,
    batch_size: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    span: tuple[int, int] | None = None,
    amp: str | None = None,
) -> Analysis:
    """Local robustness analysis (METHODS B1) of every sample of labelled ``data`` (images N x C x H x W).

    Neighbours ``x_q = clip(x + delta_q, 0, 1)``; ``noise="uniform"``: ``delta_q ~ U[-eps/2, eps/2]^d``;
    ``noise="gaussian"``: ``delta_q ~ N(0, s^2)^d`` with ``s = eps / (2 sqrt 3)``, the standard deviation of
    the uniform noise. With ``quantize`` the neighbours are rounded to the 256 uint8 levels. Misprediction
    score of a neighbour: ``Ms = 0`` if ``argmax p = y`` else ``max_{k != y} p_k``.

    ``batch_size`` is the number of images (neighbours + the clean sample) per forward pass (default: as many
    as hold :data:`VALUES_PER_PASS` pixel values, 5349 MNIST-sized or 341 images of 3 x 64 x 64, so memory does
    not grow with the image size); the data set is
    streamed in chunks of whole noise blocks, so memory is bounded by the chunk, not by N. Results do not
    depend on ``batch_size`` (see the module docstring). ``span=(lo, hi)`` analyses only the samples at those
    positions (their results, indices and neighbours are those of the whole run). Under torchrun each rank
    analyses its contiguous share and every rank returns the whole result, equal to a single process's.
    ``amp``: "bf16" (CPU or CUDA) or "fp16" (CUDA) runs the forward passes under ``torch.autocast`` (the
    softmax and scores stay float32): faster on GPUs with bf16/fp16 units; scores then differ from float32
    ones by the rounding of the logits (a misprediction can flip for a neighbour on the decision boundary).
    Returns an :class:`Analysis` (tensors on CPU).
    """
    check_int("n_neighbors", n_neighbors, 1, 100_000)
    check_float("eps", eps, 0.0, 2.0, lo_open=True)
    if batch_size is None:
        batch_size = default_batch_size(data)
    check_int("batch_size", batch_size, 1)
    check_int("seed", seed, 0)
    if noise not in ("uniform", "gaussian"):
        raise ConfigError(f"unknown noise {noise!r}: use 'uniform' or 'gaussian'")
    dev = resolve_device(model, device)
    amp = check_amp(amp, dev)
    q = int(n_neighbors)
    chunk = NOISE_BLOCK * max(1, batch_size // (NOISE_BLOCK * (q + 1)))
    # Results go into tensors allocated once up front: small per-chunk tensors kept alive between the large
    # temporary buffers would pin the allocator's heap and make resident memory grow with N.
    n_total = num_samples(data) if span is None else max(0, min(span[1], num_samples(data)) - max(0, span[0]))
    shard = Shard.current()
    dtypes = {"clean_correct": torch.bool, "top_wrong": torch.long, "label": torch.long, "index": torch.long}
    out = {k: torch.empty(n_total, dtype=dtypes.get(k, torch.float32)) for k in Analysis._TENSORS}
    t0 = time.perf_counter()
    n_seen = 0
    neighbours = _NeighbourInputs(q, eps, noise, quantize, seed, dev)
    with eval_mode(model):
        it = iter_batches(data, chunk, dev, with_index=True, shard=shard, span=span, align=NOISE_BLOCK)
        for idx, xb, yb in progress_bar(it, enabled=progress, desc="analyze", total=_chunk_count(data, chunk),
                                        unit="chunk"):
            yb = _chunk_labels(xb, yb)
            s = xb.shape[0]
            n_seen += s
            scores = _chunk_scores(model, neighbours(idx, xb), yb, q, amp, dev)
            if n_seen > n_total:
                raise DataError(f"the data set yielded more than the {n_total} samples it reports")
            sl = slice(n_seen - s, n_seen)
            for k, v in scores.items():
                out[k][sl] = v.cpu()
            out["label"][sl] = yb.cpu()
            out["index"][sl] = idx.cpu().long()
    parts = all_gather_cat({k: v[:n_seen] for k, v in out.items()})
    n_seen = int(parts["index"].shape[0])  # type: ignore[union-attr]
    if n_seen == 0:
        raise DataError("analyze got an empty data set: check the split and --limit")
    params = {"n_neighbors": q, "eps": float(eps), "noise": noise, "quantize": bool(quantize), "seed": int(seed),
              "batch_size": int(batch_size), "seconds": time.perf_counter() - t0, "device": str(dev),
              **({"amp": amp} if amp else {})}
    return Analysis(**parts, params=params)


def _chunk_count(data: DataLike, chunk: int) -> int | None:
    """Chunks of ``chunk`` samples in ``data``, for the progress bar; None when its size is unknown."""
    try:
        return -(-num_samples(data) // chunk)
    except Exception:  # noqa: BLE001 - only for the progress bar
        return None


def _chunk_labels(xb: torch.Tensor, yb: torch.Tensor | None) -> torch.Tensor:
    """The chunk's labels [s] as int64, after the images (s x C x H x W) and the labels are checked."""
    if yb is None:
        raise DataError("analyze needs labels: pass (x, y) or a labelled Dataset")
    check_images(xb, "data images")
    return check_labels(yb, xb.shape[0], name="data labels").long()


@dataclass
class _NeighbourInputs:
    """Builds a chunk's forward-pass input: the ``q`` neighbours of each of its ``s`` samples, then the clean
    samples, in one buffer of ``(s * q + s) x C x H x W`` on ``dev`` reused across chunks (allocated again only
    when a chunk needs a larger one or another image shape or dtype)."""

    q: int
    eps: float
    noise: str
    quantize: bool
    seed: int
    dev: torch.device
    buf: torch.Tensor | None = None

    def __call__(self, idx: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
        """The input for the samples ``xb`` (s x C x H x W) at data-set positions ``idx`` [s]: ``(s * q + s) x C x
        H x W``, a view of the buffer, valid until the next call."""
        q, s, shape = self.q, xb.shape[0], tuple(xb.shape[1:])
        buf = self.buf
        if buf is None or buf.shape[0] < s * q + s or buf.shape[1:] != shape or buf.dtype != xb.dtype:
            buf = self.buf = torch.empty((s * q + s, *shape), device=self.dev, dtype=xb.dtype)
        inp = buf[: s * q + s]  # neighbours, then the clean samples
        xn = inp[: s * q].view(s, q, *shape)
        _neighbour_noise(idx, q, shape, self.eps, self.noise, self.seed, self.dev, out=xn)
        xn.add_(xb.unsqueeze(1)).clamp_(0.0, 1.0)
        if self.quantize:
            xn.mul_(255.0).round_().div_(255.0)
        inp[s * q:].copy_(xb)
        return inp


def _chunk_scores(model: nn.Module, inp: torch.Tensor, yb: torch.Tensor, q: int, amp: str | None,
                  dev: torch.device) -> dict[str, torch.Tensor]:
    """One forward pass over a chunk's input (``s * q`` neighbours, then the ``s`` clean samples) -> the
    :class:`Analysis` figures of its samples, each [s] on ``dev``: score, frac_misclassified, clean_correct,
    clean_score, top_wrong."""
    s = yb.shape[0]
    with autocast(amp, dev):
        logits = forward(model, inp)
    logits = check_logits(logits.float())
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
    return {"score": ms_n.mean(dim=1), "frac_misclassified": wrong_n.float().mean(dim=1),
            "clean_correct": ~wrong_c, "clean_score": ms_c, "top_wrong": mean_p.argmax(dim=1)}


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
    eps_max = check_eps("eps_max", eps_max)
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
    """L-inf PGD with a per-sample budget ``eps`` [N] (step ``2.5 eps / steps``, random start ``(2u - 1) eps``
    from ``gen``); True where some iterate, the final one included, is misclassified."""
    res = attacks.pgd(model, x, y, eps, steps=steps, random_start=True, batch_size=None, generator=gen,
                      start_draw="unit", return_details=True, track_success=True)
    return res.success
