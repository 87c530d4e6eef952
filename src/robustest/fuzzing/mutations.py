"""Batched DeepHunter image mutations (Xie et al., ISSTA 2019) on N x C x H x W images in [0, 1].

Two classes of mutation, each with per-sample random parameters drawn from a ``torch.Generator``:

- affine (``AFFINE``): translation, scale, shear, rotation - one ``kornia.geometry.warp_affine`` call with a
  per-sample 2 x 3 matrix about the image centre (zero padding);
- pixel-value (``PIXEL``): contrast (x * a), brightness (x + b), blur (box 3/5, Gaussian 3/5/7, median 3/5),
  noise (Gaussian, salt-and-pepper, multiplicative), pixel change (1-9 random values set to random levels).

DeepHunter's validity rule, vectorised: a mutant ``x'`` of an image with reference ``r`` is valid when
``L0(x', r) < alpha * size`` (few values changed, any amount) or ``Linf(x', r) < beta`` (many values, each
changed a little); ``size = C * H * W`` and a value counts as changed when it moves by more than half an
8-bit level (1/510). The reference ``r`` starts as the seed's original image. At most one affine mutation is
allowed per lineage: when it is applied the same transform is applied to the reference (DeepHunter's
``s0'``), the mutant is valid by construction and the sample's state switches to pixel-value mutations only.

Parameter ranges (:data:`DEFAULT_RANGES`) follow DeepHunter's, rescaled to [0, 1] images and to the image
size (translation is a fraction of the side). Sampling happens on the generator's device; the same
generator state gives the same mutants.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import kornia
import torch

from robustest.core import reprs
from robustest.core.errors import ConfigError
from robustest.core.inputs import check_images

__all__ = [
    "AFFINE",
    "DEFAULT_RANGES",
    "OPS",
    "PIXEL",
    "MutationBatch",
    "apply",
    "blur",
    "brightness",
    "contrast",
    "is_valid",
    "mutate",
    "noise",
    "pixel_change",
    "rotation",
    "sample_params",
    "scale",
    "shear",
    "translation",
]

AFFINE = ("translation", "scale", "shear", "rotation")
PIXEL = ("contrast", "brightness", "blur", "noise", "pixel_change")
OPS = AFFINE + PIXEL

#: Uniform ranges [lo, hi) of each mutation's parameter (DeepHunter's, on [0, 1] images).
DEFAULT_RANGES: dict[str, tuple[float, float]] = {
    "translation": (-0.1, 0.1),   # fraction of the image side, drawn for x and y separately (DeepHunter: +-3 px / 28)
    "scale": (0.7, 1.2),
    "shear": (-0.6, 0.6),
    "rotation": (-50.0, 50.0),    # degrees
    "contrast": (0.5, 1.3),
    "brightness": (-20 / 255, 20 / 255),
    "noise": (0.01, 0.05),        # sigma of the Gaussian and multiplicative noise
    "pixel_change": (1, 10),      # how many values change (integer in [1, 9])
}
BLUR_KINDS = ("box3", "box5", "gauss3", "gauss5", "gauss7", "median3", "median5")
NOISE_KINDS = ("gaussian", "salt_pepper", "multiplicative")
_CHANGED = 0.5 / 255.0


# ------------------------------------------------------------------------------------------- operations
def _per_sample(v: torch.Tensor | float, x: torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(v, dtype=x.dtype, device=x.device)
    return t.expand(x.shape[0]) if t.dim() == 0 else t


def _warp(x: torch.Tensor, a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Apply ``p -> a (p - c) + c + t`` (a: N x 2 x 2, t: N x 2 pixels, c the centre) with zero padding."""
    n, _, h, w = x.shape
    c = torch.tensor([(w - 1) / 2.0, (h - 1) / 2.0], dtype=x.dtype, device=x.device).expand(n, 2)
    m = torch.cat([a, (c - (a @ c.unsqueeze(-1)).squeeze(-1) + t).unsqueeze(-1)], dim=2)
    return kornia.geometry.transform.warp_affine(x, m, dsize=(h, w), mode="bilinear", padding_mode="zeros",
                                                 align_corners=True).clamp(0.0, 1.0)


def _eye(x: torch.Tensor) -> torch.Tensor:
    return torch.eye(2, dtype=x.dtype, device=x.device).expand(x.shape[0], 2, 2).clone()


def translation(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Shift images by ``shift`` (N x 2: dx, dy in pixels, positive = right/down); zero fill."""
    return _warp(x, _eye(x), shift.to(x))


def scale(x: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """Zoom about the centre by ``factor`` ([N] or scalar; < 1 shrinks with zero padding)."""
    f = _per_sample(factor, x)
    return _warp(x, _eye(x) * f.view(-1, 1, 1), torch.zeros(x.shape[0], 2, dtype=x.dtype, device=x.device))


def shear(x: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """Horizontal shear about the centre: ``x' = x + factor * y`` (factor [N] or scalar)."""
    f = _per_sample(factor, x)
    a = _eye(x)
    a[:, 0, 1] = f
    return _warp(x, a, torch.zeros(x.shape[0], 2, dtype=x.dtype, device=x.device))


def rotation(x: torch.Tensor, degrees: torch.Tensor | float) -> torch.Tensor:
    """Rotate about the centre by ``degrees`` ([N] or scalar; positive = counter-clockwise, as OpenCV)."""
    th = _per_sample(degrees, x) * (math.pi / 180.0)
    cos, sin = torch.cos(th), torch.sin(th)
    a = torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], -2)
    return _warp(x, a, torch.zeros(x.shape[0], 2, dtype=x.dtype, device=x.device))


def contrast(x: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """``clip(x * factor, 0, 1)`` (DeepHunter's contrast), factor [N] or scalar."""
    return (x * _per_sample(factor, x).view(-1, 1, 1, 1)).clamp(0.0, 1.0)


def brightness(x: torch.Tensor, delta: torch.Tensor | float) -> torch.Tensor:
    """``clip(x + delta, 0, 1)``, delta [N] or scalar."""
    return (x + _per_sample(delta, x).view(-1, 1, 1, 1)).clamp(0.0, 1.0)


def blur(x: torch.Tensor, kind: torch.Tensor | int) -> torch.Tensor:
    """Blur each image with the filter ``BLUR_KINDS[kind]`` (kind: int64 [N] or an int); reflect borders."""
    k = torch.as_tensor(kind, device=x.device).long().expand(x.shape[0])
    out = x.clone()
    for i, name in enumerate(BLUR_KINDS):
        idx = (k == i).nonzero().squeeze(1)
        if idx.numel() == 0:
            continue
        xs = x[idx]
        ks = int(name[-1])
        pad_ok = min(x.shape[-2:]) > ks // 2
        if not pad_ok:
            continue
        if name.startswith("box"):
            r = kornia.filters.box_blur(xs, (ks, ks))
        elif name.startswith("gauss"):
            sigma = 0.3 * ((ks - 1) * 0.5 - 1) + 0.8  # OpenCV's default for a given kernel size
            r = kornia.filters.gaussian_blur2d(xs, (ks, ks), (sigma, sigma))
        else:
            r = kornia.filters.median_blur(xs, (ks, ks))
        out[idx] = r.clamp(0.0, 1.0)
    return out


def noise(x: torch.Tensor, kind: torch.Tensor | int, sigma: torch.Tensor | float,
          generator: torch.Generator | None = None) -> torch.Tensor:
    """Add noise ``NOISE_KINDS[kind]`` per image: Gaussian ``x + N(0, sigma)``, salt-and-pepper (0.4% of
    values set to 0 or 1), multiplicative ``x * (1 + N(0, sigma))``; clipped to [0, 1]."""
    k = torch.as_tensor(kind, device=x.device).long().expand(x.shape[0])
    s = _per_sample(sigma, x).view(-1, 1, 1, 1)
    gdev = generator.device if generator is not None else x.device
    z = torch.randn(x.shape, generator=generator, device=gdev, dtype=x.dtype).to(x.device)
    r = torch.rand(x.shape, generator=generator, device=gdev, dtype=x.dtype).to(x.device)
    kk = k.view(-1, 1, 1, 1)
    gauss = x + s * z
    salt = torch.where(r < 0.004, (z > 0).to(x.dtype), x)
    mult = x * (1 + s * z)
    return torch.where(kk == 0, gauss, torch.where(kk == 1, salt, mult)).clamp(0.0, 1.0)


def pixel_change(x: torch.Tensor, count: torch.Tensor | int, generator: torch.Generator | None = None
                 ) -> torch.Tensor:
    """Set ``count`` ([N] or int, at most 9) randomly chosen values of each image to random levels in [0, 1]."""
    n = x.shape[0]
    d = x[0].numel() if n else 0
    cnt = torch.as_tensor(count, device=x.device).long().expand(n)
    kmax = max(1, int(cnt.max())) if n else 1
    gdev = generator.device if generator is not None else x.device
    pos = torch.randint(0, max(d, 1), (n, kmax), generator=generator, device=gdev).to(x.device)
    val = torch.rand((n, kmax), generator=generator, device=gdev, dtype=x.dtype).to(x.device)
    flat = x.reshape(n, -1).clone()
    use = torch.arange(kmax, device=x.device).expand(n, kmax) < cnt[:, None]
    cur = flat.gather(1, pos)
    flat.scatter_(1, pos, torch.where(use, val, cur))
    return flat.view_as(x)


# ------------------------------------------------------------------------------------------- sampling
def sample_params(op: str, n: int, generator: torch.Generator | None = None,
                  ranges: dict[str, tuple[float, float]] | None = None, size: int = 28) -> torch.Tensor:
    """Random parameters for ``n`` applications of ``op``: float64 [n, 2] on the generator's device.

    Column meanings: translation (dx, dy) in pixels (range x ``size``); blur (kind, -); noise (kind, sigma);
    pixel_change (count, -); otherwise (value, -).
    """
    rg = {**DEFAULT_RANGES, **(ranges or {})}
    dev = generator.device if generator is not None else torch.device("cpu")
    u = torch.rand((n, 2), generator=generator, device=dev, dtype=torch.float64)
    out = torch.zeros((n, 2), dtype=torch.float64, device=dev)
    if op == "translation":
        lo, hi = rg["translation"]
        out = (lo + (hi - lo) * u) * size
    elif op == "blur":
        out[:, 0] = (u[:, 0] * len(BLUR_KINDS)).floor().clamp_max(len(BLUR_KINDS) - 1)
    elif op == "noise":
        lo, hi = rg["noise"]
        out[:, 0] = (u[:, 0] * len(NOISE_KINDS)).floor().clamp_max(len(NOISE_KINDS) - 1)
        out[:, 1] = lo + (hi - lo) * u[:, 1]
    elif op == "pixel_change":
        lo, hi = rg["pixel_change"]
        out[:, 0] = (lo + (hi - lo) * u[:, 0]).floor().clamp(lo, hi - 1)
    elif op in rg:
        lo, hi = rg[op]
        out[:, 0] = lo + (hi - lo) * u[:, 0]
    else:
        raise ConfigError(f"unknown mutation {op!r}: use one of {', '.join(OPS)}")
    return out


def apply(x: torch.Tensor, op: str, params: torch.Tensor, generator: torch.Generator | None = None
          ) -> torch.Tensor:
    """Apply mutation ``op`` with per-sample ``params`` (from :func:`sample_params`) to the batch ``x``."""
    p = params.to(device=x.device, dtype=x.dtype)
    if op == "translation":
        return translation(x, p)
    if op == "scale":
        return scale(x, p[:, 0])
    if op == "shear":
        return shear(x, p[:, 0])
    if op == "rotation":
        return rotation(x, p[:, 0])
    if op == "contrast":
        return contrast(x, p[:, 0])
    if op == "brightness":
        return brightness(x, p[:, 0])
    if op == "blur":
        return blur(x, p[:, 0].round().long())
    if op == "noise":
        return noise(x, p[:, 0].round().long(), p[:, 1], generator)
    if op == "pixel_change":
        return pixel_change(x, p[:, 0].round().long(), generator)
    raise ConfigError(f"unknown mutation {op!r}: use one of {', '.join(OPS)}")


# ------------------------------------------------------------------------------------------- validity
def is_valid(x: torch.Tensor, ref: torch.Tensor, alpha: float = 0.02, beta: float = 0.2) -> torch.Tensor:
    """DeepHunter's validity rule: BoolTensor [N], ``L0(x, ref) < alpha * C*H*W  or  Linf(x, ref) < beta``."""
    diff = (x - ref).abs().flatten(1)
    l0 = (diff > _CHANGED).sum(1)
    linf = diff.amax(1) if diff.shape[1] else diff.new_zeros(diff.shape[0])
    return (l0 < alpha * diff.shape[1]) | (linf < beta)


@dataclass
class MutationBatch:
    """Result of :func:`mutate` (all tensors length N, in input order).

    x: mutants (the input image where no valid mutant was found); ref: each sample's reference image after
    the mutation (affine-transformed when an affine mutation was applied); affine_done: BoolTensor, an
    affine mutation has been applied in the lineage; valid: BoolTensor, a valid mutant was produced;
    op: int64 index into :data:`OPS` of the mutation applied (-1 where none was valid).
    """

    x: torch.Tensor
    ref: torch.Tensor
    affine_done: torch.Tensor
    valid: torch.Tensor
    op: torch.Tensor

    def __repr__(self) -> str:
        return reprs.one_line(self, n=int(self.x.shape[0]), valid=int(self.valid.sum()),
                              affine_done=int(self.affine_done.sum()), x=reprs.shape(self.x))


def mutate(x: torch.Tensor, generator: torch.Generator | None = None, *, ref: torch.Tensor | None = None,
           affine_done: torch.Tensor | None = None, alpha: float = 0.02, beta: float = 0.2, tries: int = 3,
           ops: Sequence[str] | None = None, ranges: dict[str, tuple[float, float]] | None = None
           ) -> MutationBatch:
    """One DeepHunter mutation per image of ``x`` (N x C x H x W in [0, 1]), batched.

    Each sample draws a mutation uniformly from ``ops`` (default :data:`OPS`; only the pixel-value ones once
    ``affine_done`` is set) and its parameters, applies it, and checks validity against ``ref`` (default: ``x``
    itself). Samples without a valid mutant retry, up to ``tries`` rounds in all (DeepHunter's try_num), each
    round batched over the samples still pending.
    """
    x = check_images(x)
    n = x.shape[0]
    ref = x if ref is None else ref
    if ref.shape != x.shape:
        raise ConfigError(f"ref has shape {tuple(ref.shape)} but x has {tuple(x.shape)}: give one reference per image")
    ops = tuple(ops) if ops is not None else OPS
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise ConfigError(f"unknown mutations {bad}: use a non-empty subset of {', '.join(OPS)}")
    if tries < 1:
        raise ConfigError(f"tries must be >= 1, got {tries}")
    done_aff = (torch.zeros(n, dtype=torch.bool, device=x.device) if affine_done is None
                else affine_done.to(x.device).bool().clone())
    all_ops = torch.tensor([OPS.index(o) for o in ops], device=x.device)
    pix_ops = torch.tensor([OPS.index(o) for o in ops if o in PIXEL], device=x.device)
    size = int(max(x.shape[-2:]))
    gdev = generator.device if generator is not None else torch.device("cpu")

    out_x, out_ref = x.clone(), ref.clone()
    out_aff, valid = done_aff.clone(), torch.zeros(n, dtype=torch.bool, device=x.device)
    out_op = torch.full((n,), -1, dtype=torch.long, device=x.device)
    for _ in range(tries):
        pend = (~valid).nonzero().squeeze(1)
        if pend.numel() == 0:
            break
        r = torch.rand(pend.numel(), generator=generator, device=gdev, dtype=torch.float64).to(x.device)
        pix_only = done_aff[pend]
        choice = torch.empty(pend.numel(), dtype=torch.long, device=x.device)
        n_all = all_ops.numel()
        choice[~pix_only] = all_ops[(r[~pix_only] * n_all).long().clamp_max(n_all - 1)]
        if pix_ops.numel():
            n_pix = pix_ops.numel()
            choice[pix_only] = pix_ops[(r[pix_only] * n_pix).long().clamp_max(n_pix - 1)]
        else:
            choice[pix_only] = -1  # nothing allowed after an affine mutation
        for oi, name in enumerate(OPS):
            sel = (choice == oi).nonzero().squeeze(1)
            if sel.numel() == 0:
                continue
            params = sample_params(name, int(sel.numel()), generator, ranges, size)
            idx = pend[sel]
            if name in AFFINE:
                both = apply(torch.cat([x[idx], ref[idx]]), name, params.repeat(2, 1), generator)
                out_x[idx], out_ref[idx] = both[: idx.numel()], both[idx.numel():]
                out_aff[idx] = True
                valid[idx] = True
            else:
                cand = apply(x[idx], name, params, generator)
                ok = is_valid(cand, ref[idx], alpha, beta)
                good = idx[ok]
                out_x[good] = cand[ok]
                valid[good] = True
            out_op[idx[valid[idx]]] = oi
    return MutationBatch(x=out_x, ref=out_ref, affine_done=out_aff, valid=valid, op=out_op)
