"""Noise corruptions: gaussian_noise, shot_noise (with an exact inverse-CDF Poisson sampler for 8-bit
images on the CPU), impulse_noise and speckle_noise."""

from __future__ import annotations

import functools
import math

import torch

from robustest.core.tasks import run_tasks
from robustest.corruptions.sampling import SERIAL_CHUNK, _chunk_generators, _poisson, _randn, _uniform
from robustest.corruptions.spec import CorruptionSpec


def _gaussian_noise(x: torch.Tensor, c: float, gen: torch.Generator, table: str) -> torch.Tensor:
    return x + _randn(x.shape, gen, x) * c


POISSON_GUIDE_BINS = 1024  # guide-table resolution of the CPU sampler for rates on the 8-bit grid
GRID_TOL = 1e-4  # x * 255 within this of an integer counts as on the 8-bit grid


@functools.lru_cache(maxsize=16)
def _poisson_grid_tables(c: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse-CDF tables of Poisson(c * v / 255) for the 256 levels v = 0..255, flattened level-major.

    Returns the CDFs (256 x K float32; the last column set to 1, cutting a tail of probability below 1e-20
    at K = c + 10 sqrt(c) + 20), the value k of every CDF entry (float32), and a guide table (256 x M int64):
    the flat CDF index of the smallest k with CDF(k) > b / M, for every bin b."""
    lam = torch.arange(256, dtype=torch.float64) * (c / 255)
    k_max = int(math.ceil(c + 10 * math.sqrt(c) + 20))
    k = torch.arange(k_max, dtype=torch.float64)
    logp = k[None, :] * torch.log(lam[1:, None]) - lam[1:, None] - torch.lgamma(k + 1)[None, :]
    pmf = torch.cat([(k == 0).double()[None, :], logp.exp()])  # level 0: rate 0, always 0
    cdf = pmf.cumsum(1).clamp_(max=1.0).float()
    cdf[:, -1] = 1.0
    bins = (torch.arange(POISSON_GUIDE_BINS, dtype=torch.float32) / POISSON_GUIDE_BINS).expand(256, -1)
    guide = torch.searchsorted(cdf, bins.contiguous(), right=True) + torch.arange(256)[:, None] * k_max
    values = k.float().expand(256, -1)
    return cdf.reshape(-1).contiguous(), values.reshape(-1).contiguous(), guide.reshape(-1).contiguous()


def _poisson_scaled(x: torch.Tensor, c: float, gen: torch.Generator) -> torch.Tensor:
    """Poisson draws with rates ``x * c`` for ``x`` in [0, 1] (any shape), as a tensor of x's dtype.

    On the CPU, torch's sampler is serial and costs about ``x * c`` uniform draws per value. Images mostly
    come from 8-bit files, so the rates split as ``c * v / 255 + r``, v = 0..255 the grid level at or below
    x * 255: the grid part is drawn by inversion of a tabulated CDF (one uniform per value, a guide table
    and a short search), the residual rate ``r`` (zero on the grid) by :func:`_poisson`; the sum of the two
    independent Poisson draws is Poisson(x c). Values within ``GRID_TOL / 255`` of the grid count as on it;
    the uniforms have float32 resolution (2^-24)."""
    if x.device.type != "cpu":
        return torch.poisson(x * c, generator=gen)
    cdf, values, guide = _poisson_grid_tables(float(c))
    values = values.to(x.dtype)
    flat = x.reshape(-1)
    out = torch.empty_like(flat)
    chunks = _chunk_generators(flat.numel(), gen, x.device)

    def chunk(i: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        # One seeded chunk from start to end on the calling thread: its uniforms, then the lookups in pieces of
        # SERIAL_CHUNK values (cache-sized, and below torch's grain size, so no operation opens an OpenMP team:
        # under contention a team waits at every operation for its slowest, descheduled thread).
        a, b, g = chunks[i]
        uniforms = torch.empty(b - a, dtype=torch.float32).uniform_(0.0, 1.0, generator=g)
        off_idx, off_rate = [], []
        for s in range(a, b, SERIAL_CHUNK):
            e = min(s + SERIAL_CHUNK, b)
            q = flat[s:e] * 255
            level = torch.floor(q + GRID_TOL).clamp_(0, 255)
            resid = q.sub_(level)
            off = resid > GRID_TOL
            if bool(off.any()):
                off_idx.append(off.nonzero().squeeze(1).add_(s))
                off_rate.append(resid[off].clamp_(min=0) * (c / 255))
            u = uniforms[s - a:e - a]
            # guide index level * M + floor(u M), exact in float32 (below 2^18)
            gidx = torch.floor(u * POISSON_GUIDE_BINS).add_(level.mul_(POISSON_GUIDE_BINS)).to(torch.int64)
            pos = guide.take(gidx)  # flat CDF index of (level, k), k at most a step short except in far tails
            pos.add_(cdf.take(pos) <= u)
            short = cdf.take(pos) <= u
            if bool(short.any()):  # rare: finish these one step at a time (a level's last CDF entry is 1 > u)
                idx = short.nonzero(as_tuple=True)
                p, uu = pos[idx], u[idx]
                while True:
                    more = cdf.take(p) <= uu
                    if not bool(more.any()):
                        break
                    p.add_(more)
                pos.index_put_(idx, p)
            torch.take(values, pos, out=out[s:e])
        return off_idx, off_rate

    parts = run_tasks(len(chunks), chunk)  # chunks handed out one at a time to whichever thread is free
    off_idx = [t for idx, _ in parts for t in idx]
    off_rate = [t for _, rate in parts for t in rate]
    if off_idx:  # rates off the 8-bit grid: add Poisson draws of the residual rates
        idx = torch.cat(off_idx)
        out.index_add_(0, idx, _poisson(torch.cat(off_rate), gen).to(x.dtype))
    return out.reshape(x.shape)


def _shot_noise(x: torch.Tensor, c: float, gen: torch.Generator, table: str) -> torch.Tensor:
    return _poisson_scaled(x, c, gen) / c


def _impulse_noise(x: torch.Tensor, c: float, gen: torch.Generator, table: str) -> torch.Tensor:
    # skimage.util.random_noise(mode='s&p', amount=c, salt_vs_pepper=0.5): independent per value
    # one uniform u per value: u < c/2 -> salt (1), c/2 <= u < c -> pepper (0); same distribution
    u = _uniform(x.shape, 0, 1, gen, x)
    out = torch.where(u < c, (u < 0.5 * c).to(x.dtype), x)
    return out


def _speckle_noise(x: torch.Tensor, c: float, gen: torch.Generator, table: str) -> torch.Tensor:
    return x + x * _randn(x.shape, gen, x) * c


#: the corruptions of this module with their published parameters, registered by robustest.corruptions
RECORDS = (
    CorruptionSpec(
        "gaussian_noise", _gaussian_noise,
        "additive Gaussian noise, x + N(0, c^2) per pixel and channel",
        {"cifar": [0.04, 0.06, 0.08, 0.09, 0.1],
         "imagenet": [0.08, 0.12, 0.18, 0.26, 0.38]},
        family="noise", number=0),
    CorruptionSpec(
        "shot_noise", _shot_noise,
        "Poisson (photon) noise, Poisson(x * c) / c",
        {"cifar": [500, 250, 100, 75, 50],
         "imagenet": [60, 25, 12, 5, 3]},
        family="noise", number=1),
    CorruptionSpec(
        "impulse_noise", _impulse_noise,
        "salt-and-pepper noise: a fraction c of pixel values set to 0 or 1",
        {"cifar": [0.01, 0.02, 0.03, 0.05, 0.07],
         "imagenet": [0.03, 0.06, 0.09, 0.17, 0.27]},
        family="noise", number=2),
    CorruptionSpec(
        "speckle_noise", _speckle_noise,
        "multiplicative Gaussian noise, x + x * N(0, c^2)",
        {"cifar": [0.06, 0.1, 0.12, 0.16, 0.2],
         "imagenet": [0.15, 0.2, 0.35, 0.45, 0.6]},
        held_out=True, number=15),
)
