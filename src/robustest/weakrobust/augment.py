"""AugMix (Hendrycks et al. 2020) for targeted enhancement: the batched operations, the pool extended by
weak corruption types, the mixing and the Jensen-Shannon consistency loss."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from robustest.errors import ConfigError
from robustest.weakrobust.validation import ATTACKS


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
