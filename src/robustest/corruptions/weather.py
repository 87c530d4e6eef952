"""Weather corruptions: fog (plasma fractal), snow, frost (procedural textures matched to the original
photographs' statistics) and brightness."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from robustest.corruptions.filters import _clipped_zoom, _gaussian, _luma, _motion_blur_batch
from robustest.corruptions.sampling import _randn, _uniform
from robustest.corruptions.spec import CorruptionSpec

_CV_GRAY = (0.299, 0.587, 0.114)  # OpenCV's COLOR_RGB2GRAY, used by snow on colour images


def _plasma_fractal(n: int, mapsize: int, wibbledecay: float, gen: torch.Generator,
                    device: torch.device) -> torch.Tensor:
    """Hendrycks' plasma_fractal (diamond-square, toroidal) for ``n`` maps at once -> n x S x S in [0, 1]."""
    m = torch.zeros(n, mapsize, mapsize, dtype=torch.float64, device=device)
    step = mapsize
    wibble = 100.0

    def wibbled_mean(arr: torch.Tensor) -> torch.Tensor:
        noise = torch.rand(arr.shape, generator=gen, device=device, dtype=torch.float64) * 2 * wibble - wibble
        return arr / 4 + wibble * noise

    while step >= 2:
        half = step // 2
        corner = m[:, 0:mapsize:step, 0:mapsize:step]
        sq = corner + torch.roll(corner, -1, dims=1)
        sq = sq + torch.roll(sq, -1, dims=2)
        m[:, half:mapsize:step, half:mapsize:step] = wibbled_mean(sq)
        dr = m[:, half:mapsize:step, half:mapsize:step]
        ul = m[:, 0:mapsize:step, 0:mapsize:step]
        lt = dr + torch.roll(dr, 1, dims=1) + ul + torch.roll(ul, -1, dims=2)
        m[:, 0:mapsize:step, half:mapsize:step] = wibbled_mean(lt)
        tt = dr + torch.roll(dr, 1, dims=2) + ul + torch.roll(ul, -1, dims=1)
        m[:, half:mapsize:step, 0:mapsize:step] = wibbled_mean(tt)
        step //= 2
        wibble /= wibbledecay
    m -= m.amin(dim=(1, 2), keepdim=True)
    return m / m.amax(dim=(1, 2), keepdim=True).clamp_min(1e-12)


def _fog(x: torch.Tensor, c: tuple, gen: torch.Generator, table: str) -> torch.Tensor:
    n, _, h, w = x.shape
    size = 1 << max(1, (max(h, w) - 1).bit_length())
    plasma = _plasma_fractal(n, size, float(c[1]), gen, x.device)[:, None, :h, :w].to(x.dtype)
    max_val = x.amax(dim=(1, 2, 3), keepdim=True)
    y = x + c[0] * plasma
    return y * max_val / (max_val + c[0])


def _snow(x: torch.Tensor, c: tuple, gen: torch.Generator, table: str) -> torch.Tensor:
    n, ch, h, w = x.shape
    layer = _randn((n, 1, h, w), gen, x) * c[1] + c[0]
    layer = _clipped_zoom(layer, float(c[2]))
    layer = torch.where(layer < c[3], torch.zeros_like(layer), layer)
    layer = torch.floor(layer.clamp(0, 1) * 255) / 255  # PIL 'L' image of the layer
    angle = _uniform((n,), -135, -45, gen, x)
    layer = _motion_blur_batch(layer, int(c[4]), float(c[5]), angle)
    layer = torch.round(layer * 255) / 255
    gray = x if ch == 1 else _luma(x, _CV_GRAY)
    y = c[6] * x + (1 - c[6]) * torch.maximum(x, gray * 1.5 + 0.5)
    return y + layer + torch.rot90(layer, 2, dims=(2, 3))


# measured per-channel mean and std of the five original frost photographs at CIFAR scale
_FROST_STATS = (
    ((0.304, 0.584, 0.650), (0.105, 0.064, 0.060)),
    ((0.787, 0.805, 0.841), (0.084, 0.087, 0.089)),
    ((0.787, 0.805, 0.841), (0.084, 0.087, 0.089)),
    ((0.541, 0.601, 0.649), (0.114, 0.114, 0.119)),
    ((0.440, 0.483, 0.528), (0.174, 0.169, 0.163)),
)
_FROST_SEED = 20190101
_FROST_BASE = 512


@functools.lru_cache(maxsize=1)
def _frost_pattern() -> torch.Tensor:
    """Five standardised procedural frost patterns (5 x 512 x 512, float32, CPU), from a fixed seed."""
    gen = torch.Generator().manual_seed(_FROST_SEED)
    k, s = len(_FROST_STATS), _FROST_BASE
    base = _plasma_fractal(k, s, 2.0, gen, torch.device("cpu")).float()[:, None]
    seeds = (torch.rand(k, 1, s, s, generator=gen) < 0.004).float() * torch.rand(k, 1, s, s, generator=gen)
    needles = torch.zeros_like(seeds)
    for _ in range(3):
        angle = torch.rand(k, generator=gen) * 360.0
        needles += _motion_blur_batch(seeds, 14, 7.0, angle)
    fine = _gaussian(torch.rand(k, 1, s, s, generator=gen), 1.0, "symmetric")

    def standard(t: torch.Tensor) -> torch.Tensor:
        return (t - t.mean(dim=(2, 3), keepdim=True)) / t.std(dim=(2, 3), keepdim=True).clamp_min(1e-8)

    pattern = 0.6 * standard(base) + standard(_gaussian(needles, 0.7, "symmetric")) + 0.3 * standard(fine)
    return standard(pattern)[:, 0].contiguous()


_FROST_CACHE: dict[tuple, torch.Tensor] = {}


def _frost_textures(table: str, min_side: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """K x 3 x T x T frost textures in [0, 1] at the table's scale (CIFAR: x0.2 like the reference)."""
    key = (table, min_side, str(device), dtype)
    if key not in _FROST_CACHE:
        pat = _frost_pattern()[:, None]
        side = _FROST_BASE // 5 if table == "cifar" else _FROST_BASE
        if side <= min_side:
            side = int(math.ceil(1.1 * min_side)) + 1
        if side != _FROST_BASE:
            pat = F.interpolate(pat, size=(side, side), mode="bilinear", align_corners=False,
                                antialias=side < _FROST_BASE)
        mean = torch.tensor([m for m, _ in _FROST_STATS]).view(-1, 3, 1, 1)
        std = torch.tensor([s for _, s in _FROST_STATS]).view(-1, 3, 1, 1)
        tex = (mean + std * pat).clamp(0, 1)
        if len(_FROST_CACHE) > 16:
            _FROST_CACHE.clear()
        _FROST_CACHE[key] = tex.to(device=device, dtype=dtype)
    return _FROST_CACHE[key]


def _frost(x: torch.Tensor, c: tuple, gen: torch.Generator, table: str) -> torch.Tensor:
    n, ch, h, w = x.shape
    tex = _frost_textures(table, max(h, w), x.device, x.dtype)
    k, _, t, _ = tex.shape
    idx = torch.randint(0, k, (n,), generator=gen, device=x.device)
    oy = torch.randint(0, t - h, (n,), generator=gen, device=x.device)
    ox = torch.randint(0, t - w, (n,), generator=gen, device=x.device)
    rows = oy[:, None] + torch.arange(h, device=x.device)[None, :]
    cols = ox[:, None] + torch.arange(w, device=x.device)[None, :]
    crop = tex[idx[:, None, None], :, rows[:, :, None], cols[:, None, :]]  # N x H x W x 3
    crop = crop.permute(0, 3, 1, 2)
    if ch == 1:
        crop = _luma(crop)
    return c[0] * x + c[1] * crop


def _brightness(x: torch.Tensor, c: float, gen: torch.Generator, table: str) -> torch.Tensor:
    # HSV V + c with H, S fixed: RGB scales by V'/V (a black pixel becomes grey V')
    v = x.amax(dim=1, keepdim=True)
    v2 = (v + c).clamp(0, 1)
    return torch.where(v > 0, x * (v2 / torch.where(v > 0, v, torch.ones_like(v))), v2.expand_as(x))


#: the corruptions of this module with their published parameters, registered by robustest.corruptions
RECORDS = (
    CorruptionSpec(
        "snow", _snow,
        "motion-blurred snow flakes plus a whitened (grey-brightened) image",
        {"cifar": [(0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
                   (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
                   (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)],
         "imagenet": [(0.1, 0.3, 3, 0.5, 10, 4, 0.8), (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
                      (0.55, 0.3, 4, 0.9, 12, 8, 0.7), (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
                      (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55)]},
        family="weather", number=7, chunked=True),
    CorruptionSpec(
        "frost", _frost,
        "blend with a frost texture (procedural substitute for the original photographs)",
        {"cifar": [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],
         "imagenet": [(1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)]},
        family="weather", number=8, chunked=True),
    CorruptionSpec(
        "fog", _fog,
        "additive plasma-fractal (diamond-square) haze",
        {"cifar": [(0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],
         "imagenet": [(1.5, 2), (2.0, 2), (2.5, 1.7), (2.5, 1.5), (3.0, 1.4)]},
        family="weather", number=9, chunked=True),
    CorruptionSpec(
        "brightness", _brightness,
        "V channel of HSV increased by c",
        {"cifar": [0.05, 0.1, 0.15, 0.2, 0.3],
         "imagenet": [0.1, 0.2, 0.3, 0.4, 0.5]},
        family="weather", number=10),
)
