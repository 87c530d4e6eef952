"""Blur corruptions: gaussian_blur, defocus_blur (anti-aliased disk), glass_blur (blur, local pixel swaps,
blur), motion_blur and zoom_blur."""

from __future__ import annotations

import functools

import numpy as np
import torch

from robustest.corruptions.filters import (
    DENSE_MAX_PIXELS,
    _clipped_zoom,
    _dense_apply,
    _filter2d_any,
    _gaussian,
    _motion_blur_batch,
    _zoom_matrix,
)
from robustest.corruptions.sampling import _uniform
from robustest.corruptions.spec import CorruptionSpec


def _gaussian_blur(x: torch.Tensor, c: float, gen: torch.Generator, table: str) -> torch.Tensor:
    return _gaussian(x, c)


@functools.lru_cache(maxsize=32)
def _disk_kernel(radius: float, alias_blur: float) -> np.ndarray:
    """Hendrycks' disk(): aliased disk, normalised, then cv2.GaussianBlur(ksize 3 or 5, sigma=alias_blur)."""
    if radius <= 8:
        coords = np.arange(-8, 8 + 1)
        ksize = 3
    else:
        coords = np.arange(-radius, radius + 1)
        ksize = 5
    xx, yy = np.meshgrid(coords, coords)
    disk = np.array((xx**2 + yy**2) <= radius**2, dtype=np.float64)
    disk /= disk.sum()
    t = np.arange(ksize) - (ksize - 1) / 2
    g = np.exp(-(t**2) / (2 * alias_blur**2))
    g /= g.sum()
    r = ksize // 2
    padded = np.pad(disk, r, mode="reflect")  # numpy 'reflect' == OpenCV BORDER_REFLECT_101
    tmp = sum(g[i] * padded[:, i:i + disk.shape[1]] for i in range(ksize))
    out = sum(g[i] * tmp[i:i + disk.shape[0], :] for i in range(ksize))
    return out.astype(np.float32)


def _defocus_blur(x: torch.Tensor, c: tuple, gen: torch.Generator, table: str) -> torch.Tensor:
    kernel = torch.as_tensor(_disk_kernel(float(c[0]), float(c[1])))
    return _filter2d_any(x, kernel, "reflect101")


def _glass_shuffle(n: int, h: int, w: int, d: int, iterations: int, gen: torch.Generator,
                   device: torch.device) -> torch.Tensor:
    """Source position (N x H*W, row-major) of every pixel after glass blur's local swaps.

    The reference visits positions (h, w) from (H - d, W - d) down to (d + 1, d + 1) one at a time and
    swaps each with (h + dy, w + dx), dx, dy uniform in [-d, d). Here all positions 2d apart in both axes
    are swapped at once (their 2d x 2d windows are disjoint, so parallel swaps never conflict); the
    (2d)^2 offset classes run one after another, from the bottom-right class to the top-left one.
    """
    perm = torch.arange(h * w, device=device).expand(n, h * w).clone()
    rows_all = torch.arange(d + 1, max(d + 1, h - d + 1), device=device)  # empty on images of at most 2d + 1
    cols_all = torch.arange(d + 1, max(d + 1, w - d + 1), device=device)
    if rows_all.numel() == 0 or cols_all.numel() == 0:
        return perm
    lo, step = d + 1, 2 * d
    for _ in range(iterations):
        dys = torch.randint(-d, d, (n, h, w), generator=gen, device=device)
        dxs = torch.randint(-d, d, (n, h, w), generator=gen, device=device)
        for oy in reversed(range(step)):
            r0 = lo + (oy - lo) % step  # the first position of this offset class: a strided slice
            rows = rows_all[r0 - lo::step]
            if rows.numel() == 0:
                continue
            for ox in reversed(range(step)):
                c0 = lo + (ox - lo) % step
                cols = cols_all[c0 - lo::step]
                if cols.numel() == 0:
                    continue
                a = (rows[:, None] * w + cols[None, :]).reshape(1, -1).expand(n, -1)
                dy = dys[:, r0:r0 + step * rows.numel():step, c0:c0 + step * cols.numel():step].reshape(n, -1)
                dx = dxs[:, r0:r0 + step * rows.numel():step, c0:c0 + step * cols.numel():step].reshape(n, -1)
                b = a + dy * w + dx
                va = perm.gather(1, a)
                vb = perm.gather(1, b)
                perm.scatter_(1, a, vb)
                perm.scatter_(1, b, va)
    return perm


def _glass_blur(x: torch.Tensor, c: tuple, gen: torch.Generator, table: str) -> torch.Tensor:
    sigma, d, iterations = float(c[0]), int(c[1]), int(c[2])
    n, ch, h, w = x.shape
    y = torch.floor(_gaussian(x, sigma).clamp(0, 1) * 255) / 255  # np.uint8(gaussian(x) * 255)
    perm = _glass_shuffle(n, h, w, d, iterations, gen, x.device)
    y = y.reshape(n, ch, h * w).gather(2, perm[:, None, :].expand(n, ch, h * w)).reshape(n, ch, h, w)
    return _gaussian(y, sigma)


def _motion_blur(x: torch.Tensor, c: tuple, gen: torch.Generator, table: str) -> torch.Tensor:
    angle = _uniform((x.shape[0],), -45, 45, gen, x)
    return _motion_blur_batch(x, int(c[0]), float(c[1]), angle)


def _zoom_blur(x: torch.Tensor, c: tuple, gen: torch.Generator, table: str) -> torch.Tensor:
    zooms = np.arange(*c)
    h, w = x.shape[-2], x.shape[-1]
    if h * w <= DENSE_MAX_PIXELS:
        def build() -> np.ndarray:
            m = np.eye(h * w)
            for z in zooms:
                m += np.kron(_zoom_matrix(h, float(z)), _zoom_matrix(w, float(z)))
            return m / (len(zooms) + 1)

        return _dense_apply(x, ("zoom_blur", h, w, tuple(c)), build)
    out = x.clone()
    for z in zooms:
        out += _clipped_zoom(x, float(z))
    return out / (len(zooms) + 1)


#: the corruptions of this module with their published parameters, registered by robustest.corruptions
RECORDS = (
    CorruptionSpec(
        "defocus_blur", _defocus_blur,
        "convolution with an anti-aliased disk of radius c",
        {"cifar": [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],
         "imagenet": [(3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)]},
        family="blur", number=3),
    CorruptionSpec(
        "glass_blur", _glass_blur,
        "Gaussian blur, local pixel shuffling, Gaussian blur (frosted glass)",
        {"cifar": [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],
         "imagenet": [(0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)]},
        family="blur", number=4, chunked=True),
    CorruptionSpec(
        "motion_blur", _motion_blur,
        "line blur of ImageMagick's motion-blur kernel at a random angle in [-45, 45] degrees",
        {"cifar": [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],
         "imagenet": [(10, 3), (15, 5), (15, 8), (15, 12), (20, 15)]},
        family="blur", number=5, chunked=True),
    CorruptionSpec(
        "zoom_blur", _zoom_blur,
        "mean of the image and centre zooms of it by the factors 1 ... z",
        {"cifar": [(1, 1.06, 0.01), (1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.01), (1, 1.26, 0.01)],
         "imagenet": [(1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.02), (1, 1.26, 0.02), (1, 1.31, 0.03)]},
        family="blur", number=6),
    CorruptionSpec(
        "gaussian_blur", _gaussian_blur,
        "Gaussian blur with standard deviation c",
        {"cifar": [0.4, 0.6, 0.7, 0.8, 1.0],
         "imagenet": [1, 2, 3, 4, 6]},
        held_out=True, number=16),
)
