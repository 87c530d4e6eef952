"""AugMix (Hendrycks et al. 2020) for targeted enhancement: the batched operations, the pool extended by
weak corruption types, the mixing and the Jensen-Shannon consistency loss."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from robustest.core.errors import ConfigError
from robustest.weakrobust.validation import ATTACKS

# The operations run through kornia where kornia's op computes the same thing: posterize and solarize
# (kornia.enhance) and the geometric ops (kornia.geometry.transform: rotation about the image centre,
# translation in pixels, shear about the centre through get_shear_matrix2d and warp_affine, bilinear with zero
# padding, half-pixel convention): true rotations and shears in pixels on any shape, as in AugMix's PIL
# reference. Equalize is ours: see _op_equalize.


def _lvl(rng: np.random.Generator, n: int, severity: float) -> np.ndarray:
    """AugMix's random level in [0.1, severity] of 10, per sample, with a random sign."""
    return rng.uniform(0.1, severity, n) / 10.0 * rng.choice([-1.0, 1.0], n)


def _centre(x: torch.Tensor) -> torch.Tensor:
    """Pixel centre (x, y) of the images of ``x`` (N x C x H x W), one row per image: N x 2."""
    h, w = x.shape[-2:]
    return torch.tensor([(w - 1) / 2, (h - 1) / 2], dtype=x.dtype, device=x.device).expand(x.shape[0], 2)


def _op_rotate(x, rng, sev):
    from kornia.geometry.transform import rotate

    deg = torch.as_tensor(_lvl(rng, x.shape[0], sev) * 30.0, dtype=x.dtype, device=x.device)  # up to 30 degrees
    return rotate(x, deg, _centre(x), mode="bilinear", padding_mode="zeros", align_corners=False)


def _shear(x, rng, sev, axis):
    from kornia.geometry.transform import get_shear_matrix2d, warp_affine

    v = torch.as_tensor(_lvl(rng, x.shape[0], sev) * 0.3, dtype=x.dtype, device=x.device)
    angle = torch.atan(v)  # get_shear_matrix2d takes angles: x' = x - tan(sx) (y - cy) about the centre
    zero = torch.zeros_like(v)
    m = get_shear_matrix2d(_centre(x), sx=angle if axis == 0 else zero, sy=zero if axis == 0 else angle)
    return warp_affine(x, m[:, :2, :], (x.shape[-2], x.shape[-1]), mode="bilinear", padding_mode="zeros",
                       align_corners=False)


def _translate(x, rng, sev, axis):
    from kornia.geometry.transform import translate

    size = x.shape[-1] if axis == 0 else x.shape[-2]
    v = torch.as_tensor(_lvl(rng, x.shape[0], sev) * (size / 3.0), dtype=x.dtype, device=x.device)  # 1/3 size
    zero = torch.zeros_like(v)
    shift = torch.stack([-v, zero] if axis == 0 else [zero, -v], 1)  # pixels (dx, dy)
    return translate(x, shift, mode="bilinear", padding_mode="zeros", align_corners=False)


def _op_autocontrast(x, rng, sev):
    lo = x.amin(dim=(2, 3), keepdim=True)
    hi = x.amax(dim=(2, 3), keepdim=True)
    return ((x - lo) / (hi - lo).clamp_min(1e-3)).clamp(0, 1)


def _op_equalize(x, rng, sev):
    """Each pixel becomes the empirical CDF of its 8-bit level in its image and channel (the fraction of the
    plane's pixels at or below that level), from a 256-bin histogram per plane: O(N C (H W + 256)) time and
    memory at every image size.

    Not kornia.enhance.equalize: that is PIL's ImageOps.equalize (levels truncated, a lookup table built from
    the cumulative counts shifted by one bin and divided by a step, planes with step 0 left unchanged), a
    different mapping with 256 output levels; this one keeps the textbook continuous equalisation the
    enhancement results in docs/WEAKROBUST.md were measured with."""
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    levels = (flat * 255).round_().clamp_(0, 255).long()
    count_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32  # exact counts up to 2^24 pixels
    hist = torch.zeros(n, c, 256, dtype=count_dtype, device=x.device)
    hist.scatter_add_(2, levels, torch.ones(levels.shape, dtype=count_dtype, device=x.device))
    cdf = hist.cumsum_(2).div_(flat.shape[-1])
    return cdf.gather(2, levels).reshape(x.shape).clamp_(0, 1).to(x.dtype)


def _op_posterize(x, rng, sev):
    from kornia.enhance import posterize

    bits = torch.as_tensor(4 - (np.abs(_lvl(rng, x.shape[0], sev)) * 4).astype(np.int64), device=x.device)
    return posterize(x, bits)


def _op_solarize(x, rng, sev):
    from kornia.enhance import solarize

    t = torch.as_tensor(1 - np.abs(_lvl(rng, x.shape[0], sev)), dtype=x.dtype, device=x.device)
    return solarize(x, t)  # 1 - x where x >= t


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
    # KL(p || m) from log-probabilities (log_target): with probabilities as the target, a class whose
    # softmax underflows to exactly 0 gives the gradient log(0) * 0 = NaN and poisons every weight.
    logps = [lg.float().log_softmax(1) for lg in logits]
    logm = torch.clamp(sum(lp.exp() for lp in logps) / len(logps), 1e-7, 1).log()
    return sum(F.kl_div(logm, lp, reduction="batchmean", log_target=True) for lp in logps) / len(logps)
