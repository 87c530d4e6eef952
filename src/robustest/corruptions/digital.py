"""Digital corruptions: contrast, saturate, pixelate (Pillow's BOX filter) and elastic_transform
(jpeg_compression has its own module)."""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from robustest.corruptions.filters import _apply_rows_cols, _gaussian, _luma
from robustest.corruptions.sampling import _uniform
from robustest.corruptions.spec import CorruptionSpec


def _contrast(x: torch.Tensor, c: float, gen: torch.Generator, table: str) -> torch.Tensor:
    means = x.mean(dim=(2, 3), keepdim=True)
    return (x - means) * c + means


def _saturate(x: torch.Tensor, c: tuple, gen: torch.Generator, table: str) -> torch.Tensor:
    # HSV round trip with H and V fixed, in closed form: every channel is v (1 - s a(h)), so with the new
    # saturation s' it becomes v - (v - x) s' / s; a grey pixel (s = 0, h = 0 as in skimage) becomes
    # (v, v (1 - s'), v (1 - s')). Equal to skimage's rgb2hsv / hsv2rgb up to float rounding.
    gray = x.shape[1] == 1
    rgb = x.expand(-1, 3, -1, -1) if gray else x
    v = rgb.amax(dim=1, keepdim=True)
    delta = v - rgb.amin(dim=1, keepdim=True)
    safe_v = torch.where(v > 0, v, torch.ones_like(v))
    s = delta / safe_v
    s2 = (s * c[0] + c[1]).clamp(0, 1)
    ratio = s2 / torch.where(s > 0, s, torch.ones_like(s))
    out = v - (v - rgb) * ratio
    if c[1] != 0:
        grey_px = torch.cat([v, v * (1 - s2), v * (1 - s2)], dim=1)
        out = torch.where(delta > 0, out, grey_px)
    return _luma(out) if gray else out


@functools.lru_cache(maxsize=64)
def _pil_box_matrix(in_size: int, out_size: int) -> np.ndarray:
    """Pillow's BOX resampling along one axis as an out x in matrix (ImagingResample precompute_coeffs)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 0.5 * filterscale
    m = np.zeros((out_size, in_size), dtype=np.float64)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size)
        for xi in range(xmin, xmax):
            v = (xi - center + 0.5) / filterscale
            m[xx, xi] = 1.0 if -0.5 < v <= 0.5 else 0.0
        total = m[xx].sum()
        if total > 0:
            m[xx] /= total
    return m


@functools.lru_cache(maxsize=64)
def _pixelate_matrix(n: int, c: float) -> np.ndarray:
    """BOX down to int(n * c) and BOX back up to n, as one n x n matrix."""
    small = max(1, int(n * c))
    return _pil_box_matrix(small, n) @ _pil_box_matrix(n, small)


@functools.lru_cache(maxsize=64)
def _box_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise nonzeros of Pillow's BOX matrix in -> out: (indices, weights), both out x max_taps."""
    m = _pil_box_matrix(in_size, out_size)
    nz = [np.flatnonzero(row) for row in m]
    taps = max(1, max(len(z) for z in nz))
    idx = np.zeros((m.shape[0], taps), dtype=np.int64)
    wts = np.zeros((m.shape[0], taps), dtype=np.float64)
    for r, z in enumerate(nz):
        idx[r, :len(z)] = z
        wts[r, :len(z)] = m[r, z]
    return idx, wts


def _resample_axis(x: torch.Tensor, in_size: int, out_size: int, dim: int) -> torch.Tensor:
    """x resampled along ``dim`` by Pillow's BOX filter (in -> out) as a few weighted index_selects."""
    idx, wts = _box_taps(in_size, out_size)
    shape = [1] * x.dim()
    shape[dim] = idx.shape[0]
    out = None
    for t in range(idx.shape[1]):
        term = x.index_select(dim, torch.as_tensor(idx[:, t], device=x.device))
        wt = wts[:, t]
        if not np.all(wt == 1.0):
            term = term * torch.as_tensor(wt, dtype=x.dtype, device=x.device).view(shape)
        out = term if out is None else out + term
    return out


def _pixelate(x: torch.Tensor, c: float, gen: torch.Generator, table: str) -> torch.Tensor:
    h, w = x.shape[-2], x.shape[-1]
    if max(h, w) <= 64:
        return _apply_rows_cols(x, _pixelate_matrix(h, float(c)), _pixelate_matrix(w, float(c)))
    sh, sw = max(1, int(h * c)), max(1, int(w * c))  # large images: sparse BOX down, nearest-like BOX up
    y = _resample_axis(x, h, sh, 2)
    y = _resample_axis(y, w, sw, 3)
    y = _resample_axis(y, sh, h, 2)
    return _resample_axis(y, sw, w, 3)



def _elastic_transform(x: torch.Tensor, c: tuple, gen: torch.Generator, table: str) -> torch.Tensor:
    n, ch, h, w = x.shape
    size = min(h, w) * (1.0 if table == "cifar" else 244.0 / 224.0)
    alpha, sigma, affine = c[0] * size, c[1] * size, c[2] * size
    dev, dt = x.device, x.dtype
    # random affine: three points around the centre moved by U(-affine, affine) (cv2.getAffineTransform)
    cx, cy = float(w // 2), float(h // 2)
    sq = float(min(h, w) // 3)
    pts1 = torch.tensor([[cx + sq, cy + sq], [cx + sq, cy - sq], [cx - sq, cy - sq]], dtype=torch.float64,
                        device=dev)
    pts2 = pts1[None] + _uniform((n, 3, 2), -affine, affine, gen, x).to(torch.float64)
    ones = torch.ones(3, 1, dtype=torch.float64, device=dev)
    a = torch.cat([pts2, ones.expand(n, 3, 1)], dim=2)  # solve dst -> src map: [x2 y2 1] @ B = [x1 y1]
    b_mat = torch.linalg.solve(a, pts1[None].expand(n, 3, 2))  # N x 3 x 2 (inverse affine, as warpAffine)
    yy, xx = torch.meshgrid(torch.arange(h, dtype=torch.float64, device=dev),
                            torch.arange(w, dtype=torch.float64, device=dev), indexing="ij")
    grid_pts = torch.stack([xx, yy, torch.ones_like(xx)], dim=-1).reshape(1, h * w, 3)
    src = torch.matmul(grid_pts, b_mat).reshape(n, h, w, 2)  # (x, y) source coordinates
    gx = 2 * src[..., 0] / max(w - 1, 1) - 1
    gy = 2 * src[..., 1] / max(h - 1, 1) - 1
    # BORDER_REFLECT_101 == reflection about pixel centres (align_corners=True)
    y = F.grid_sample(x, torch.stack([gx, gy], -1).to(dt), mode="bilinear", padding_mode="reflection",
                      align_corners=True)
    # smoothed random displacement field (skimage gaussian, mode='reflect', truncate=3)
    field = _uniform((n, 2, h, w), -1, 1, gen, x)
    field = _gaussian(field, sigma, "symmetric", truncate=3.0) * alpha if sigma > 0 else field * alpha
    dx, dy = field[:, 0], field[:, 1]
    px = xx.to(dt)[None] + dx
    py = yy.to(dt)[None] + dy
    # scipy map_coordinates(order=1, mode='reflect') == reflection about the image border (align_corners=False)
    gx = (2 * px + 1) / w - 1
    gy = (2 * py + 1) / h - 1
    return F.grid_sample(y, torch.stack([gx, gy], -1), mode="bilinear", padding_mode="reflection",
                         align_corners=False)


#: the corruptions of this module with their published parameters, registered by robustest.corruptions
RECORDS = (
    CorruptionSpec(
        "contrast", _contrast,
        "(x - mean) * c + mean per image and channel",
        {"cifar": [0.75, 0.5, 0.4, 0.3, 0.15],
         "imagenet": [0.4, 0.3, 0.2, 0.1, 0.05]},
        family="digital", number=11),
    CorruptionSpec(
        "elastic_transform", _elastic_transform,
        "random affine warp followed by a smoothed random displacement field",
        # (alpha, sigma, affine) as fractions of the reference size: 32 (make_cifar_c.py's IMSIZE), 244 for
        # a 224-px image (make_imagenet_c.py)
        {"cifar": [(0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05), (0.1, 0.03, 0.03)],
         "imagenet": [(2, 0.7, 0.1), (2, 0.08, 0.2), (0.05, 0.01, 0.02), (0.07, 0.01, 0.02), (0.12, 0.01, 0.02)]},
        family="digital", number=12, chunked=True, aliases=("elastic",)),
    CorruptionSpec(
        "pixelate", _pixelate,
        "box downsampling by a factor c and box upsampling back (Pillow BOX filter)",
        {"cifar": [0.95, 0.9, 0.85, 0.75, 0.65],
         "imagenet": [0.6, 0.5, 0.4, 0.3, 0.25]},
        family="digital", number=13),
    CorruptionSpec(
        "saturate", _saturate,
        "S channel of HSV scaled by c0 and shifted by c1",
        {"cifar": [(0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)],
         "imagenet": [(0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2)]},
        held_out=True, number=18),
)
