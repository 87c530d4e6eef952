"""The linear filtering engine the corruptions share: border-aware padding, 2-D correlation (shift-and-add,
depthwise convolution, FFT, banded row products), separable and Gaussian filters, cached dense/sparse
operators on the image plane, the motion-blur line kernel, clipped zoom, and the luminance form of colour
results. Every function works on batches N x C x H x W on any device."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

_LUMA = (0.299, 0.587, 0.114)  # grayscale form of colour results (ITU-R 601 luma, as OpenCV; sums to 1)


def _pad_index(n: int, before: int, after: int, mode: str, device: torch.device) -> torch.Tensor:
    """Source index of every position of a padded axis (works for pads larger than the axis)."""
    i = torch.arange(-before, n + after, device=device)
    if n == 1 or mode == "replicate":
        return i.clamp(0, n - 1)
    if mode == "reflect101":  # OpenCV BORDER_REFLECT_101, numpy 'reflect', torch 'reflect': d c b | a b c d | c b a
        period = 2 * n - 2
        i = i.remainder(period)
        return torch.where(i >= n, period - i, i)
    if mode == "symmetric":  # scipy 'reflect', numpy 'symmetric': c b a | a b c | c b a
        period = 2 * n
        i = i.remainder(period)
        return torch.where(i >= n, period - 1 - i, i)
    raise ValueError(mode)


_TORCH_PAD = {"replicate": "replicate", "reflect101": "reflect"}


def _pad(x: torch.Tensor, ph: tuple[int, int], pw: tuple[int, int], mode: str) -> torch.Tensor:
    """Pad the last two axes of ``x`` (N x C x H x W) by ``ph`` rows and ``pw`` columns under border ``mode``."""
    h, w = x.shape[-2], x.shape[-1]
    if (mode in _TORCH_PAD and x.dim() == 4 and x.is_floating_point() and h > 1 and w > 1
            and (mode == "replicate" or max(ph) < h and max(pw) < w)):
        # torch's padding kernels: an order of magnitude faster than index_select on the last axes
        return F.pad(x, (pw[0], pw[1], ph[0], ph[1]), mode=_TORCH_PAD[mode])
    if ph != (0, 0):
        x = x.index_select(-2, _pad_index(h, ph[0], ph[1], mode, x.device))
    if pw != (0, 0):
        x = x.index_select(-1, _pad_index(w, pw[0], pw[1], mode, x.device))
    return x


def _trim_kernel(kernel: torch.Tensor) -> torch.Tensor:
    """Drop all-zero outer row pairs and column pairs of an odd-sized 2-D kernel (its centre stays put)."""
    while kernel.shape[0] > 1 and bool((kernel[0] == 0).all()) and bool((kernel[-1] == 0).all()):
        kernel = kernel[1:-1]
    while kernel.shape[1] > 1 and bool((kernel[:, 0] == 0).all()) and bool((kernel[:, -1] == 0).all()):
        kernel = kernel[:, 1:-1]
    return kernel


def _filter2d(x: torch.Tensor, kernel: torch.Tensor, mode: str) -> torch.Tensor:
    """Correlate every channel of ``x`` (N x C x H x W) with the 2-D ``kernel`` (odd size), given border.

    All-zero outer rows/columns of the kernel are dropped first; small kernels run as shift-and-add,
    medium ones as one depthwise (grouped) convolution, large ones (> 7 x 7) by FFT.
    """
    n, c, h, w = x.shape
    kernel = _trim_kernel(kernel.to(device=x.device, dtype=x.dtype))
    kh, kw = kernel.shape
    xp = _pad(x, (kh // 2, kh // 2), (kw // 2, kw // 2), mode)
    if kh * kw <= 25:
        out = torch.zeros_like(x)
        for i in range(kh):
            for j in range(kw):
                wt = float(kernel[i, j])
                if wt != 0.0:
                    out.add_(xp[:, :, i:i + h, j:j + w], alpha=wt)
        return out
    if kh * kw > 49:  # large kernel: FFT convolution of the padded image with the flipped kernel
        hp, wp = xp.shape[-2], xp.shape[-1]
        kpad = torch.zeros(hp, wp, dtype=x.dtype, device=x.device)
        kpad[:kh, :kw] = kernel.flip(0, 1)
        y = torch.fft.irfft2(torch.fft.rfft2(xp) * torch.fft.rfft2(kpad), s=(hp, wp))
        return y[..., kh - 1:kh - 1 + h, kw - 1:kw - 1 + w].contiguous()
    y = F.conv2d(xp.reshape(1, n * c, xp.shape[-2], xp.shape[-1]), kernel[None, None].expand(n * c, 1, kh, kw),
                 groups=n * c)
    return y.reshape(n, c, h, w)


def _sep_filter(x: torch.Tensor, kh: torch.Tensor, kw: torch.Tensor, mode: str) -> torch.Tensor:
    """Separable correlation with 1-D kernels ``kh`` (vertical) and ``kw`` (horizontal), odd lengths,
    as shift-and-add (faster than a convolution with one input channel on the CPU)."""
    h, w = x.shape[-2], x.shape[-1]
    y = x
    if kh.numel() > 1:
        r = kh.numel() // 2
        yp = _pad(y, (r, r), (0, 0), mode)
        y = torch.zeros_like(x)
        for i, wt in enumerate(kh.tolist()):
            y.add_(yp[:, :, i:i + h, :], alpha=wt)
    if kw.numel() > 1:
        r = kw.numel() // 2
        yp = _pad(y, (0, 0), (r, r), mode)
        y = torch.zeros_like(x)
        for j, wt in enumerate(kw.tolist()):
            y.add_(yp[:, :, :, j:j + w], alpha=wt)
    return y


MATRIX_MAX_SIDE = 256  # separable filters on axes up to this length run as one small matrix product
DENSE_MAX_PIXELS = 1024  # 2-D linear filters on images up to this many pixels run as one dense operator


@functools.lru_cache(maxsize=256)
def _filter_matrix(n: int, kernel: tuple[float, ...], mode: str) -> np.ndarray:
    """The n x n matrix of a 1-D correlation with ``kernel`` (odd length) under border ``mode``."""
    r = len(kernel) // 2
    src = _pad_index(n, r, r, mode, torch.device("cpu")).numpy()
    m = np.zeros((n, n), dtype=np.float64)
    for i in range(n):
        for t, wt in enumerate(kernel):
            m[i, src[i + t]] += wt
    return m


def _sep_filter_any(x: torch.Tensor, kh: torch.Tensor, kw: torch.Tensor, mode: str) -> torch.Tensor:
    """Separable correlation; small images as Mh @ x @ Mw^T with cached border-aware matrices."""
    h, w = x.shape[-2], x.shape[-1]
    if h <= MATRIX_MAX_SIDE and w <= MATRIX_MAX_SIDE:
        mh = _filter_matrix(h, tuple(kh.tolist()), mode)
        mw = _filter_matrix(w, tuple(kw.tolist()), mode)
        return _apply_rows_cols(x, mh, mw)
    return _sep_filter(x, kh, kw, mode)


_DENSE_CACHE: dict[tuple, tuple[bool, torch.Tensor]] = {}
SPARSE_MAX_DENSITY = 0.05  # on the CPU, operators with at most this fraction of non-zeros run as sparse products


def _dense_apply(x: torch.Tensor, key: tuple, build: Callable[[], np.ndarray]) -> torch.Tensor:
    """Apply a cached linear operator on the flattened image plane: y = x_flat @ M^T.

    ``build`` returns M (H*W x H*W, float64 NumPy) the first time ``key`` is seen on this device/dtype.
    Entries below 1e-12 of the largest (round-off of FFT-built operators) are dropped; on the CPU a mostly
    empty M (e.g. zoom blur: about 1 % non-zeros at 32 x 32) is kept sparse, which is several times faster
    than the dense product."""
    n, c, h, w = x.shape
    full = (key, str(x.device), x.dtype)
    if full not in _DENSE_CACHE:
        if len(_DENSE_CACHE) > 64:
            _DENSE_CACHE.clear()
        m = build()
        m = np.where(np.abs(m) > 1e-12 * np.abs(m).max(), m, 0.0)
        sparse = x.device.type == "cpu" and np.count_nonzero(m) <= SPARSE_MAX_DENSITY * m.size
        t = torch.as_tensor(m if sparse else m.T, dtype=x.dtype, device=x.device).contiguous()
        _DENSE_CACHE[full] = (sparse, t.to_sparse() if sparse else t)
    sparse, op = _DENSE_CACHE[full]
    flat = x.reshape(n * c, h * w)
    if sparse:  # (M @ X^T)^T
        return torch.sparse.mm(op, flat.T.contiguous()).T.reshape(n, c, h, w)
    return torch.matmul(flat, op).reshape(n, c, h, w)


_BAND_CACHE: dict[tuple, torch.Tensor] = {}


def _filter2d_any(x: torch.Tensor, kernel: torch.Tensor, mode: str) -> torch.Tensor:
    """2-D correlation of every channel of ``x`` (N x C x H x W) with ``kernel`` (odd size) under border
    ``mode``. Images up to ``DENSE_MAX_PIXELS`` whose kernel is shorter than the image go row by row through
    matrix products: output row i = [padded input rows i .. i + kh - 1] (kh W values) @ B, where B (kh W x W)
    stacks the border-aware 1-D correlation matrices of the kernel rows, the same for every output row once
    the rows are padded. That is kh W multiply-adds per pixel instead of the H W of a dense operator on the
    flattened image. Other images go through :func:`_filter2d`."""
    n, c, h, w = x.shape
    kern = _trim_kernel(kernel.detach().to(torch.float64).cpu())
    kh, r = kern.shape[0], kern.shape[0] // 2
    if h * w > DENSE_MAX_PIXELS or r >= h or kern.shape[1] // 2 >= w or mode not in _TORCH_PAD:
        return _filter2d(x, kernel, mode)
    key = ("band", w, mode, kern.numpy().tobytes(), tuple(kern.shape), str(x.device), x.dtype)
    if key not in _BAND_CACHE:
        if len(_BAND_CACHE) > 64:
            _BAND_CACHE.clear()
        rows = [_filter_matrix(w, tuple(kern[i].tolist()), mode).T for i in range(kh)]  # in x out, per row
        _BAND_CACHE[key] = torch.as_tensor(np.concatenate(rows, 0), dtype=x.dtype, device=x.device)
    band = _BAND_CACHE[key]
    flat = _pad(x, (r, r), (0, 0), mode).reshape(n * c, (h + 2 * r) * w)
    out = torch.empty(h, n * c, w, dtype=x.dtype, device=x.device)
    for i in range(h):
        torch.mm(flat[:, i * w:(i + kh) * w], band, out=out[i])
    return out.permute(1, 0, 2).reshape(n, c, h, w)


def _gauss_kernel1d(sigma: float, truncate: float = 4.0) -> torch.Tensor:
    """scipy.ndimage.gaussian_filter's 1-D kernel (radius int(truncate * sigma + 0.5))."""
    radius = int(truncate * float(sigma) + 0.5)
    if sigma <= 0 or radius == 0:
        return torch.ones(1, dtype=torch.float64)
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    k = torch.exp(-0.5 * (t / float(sigma)) ** 2)
    return k / k.sum()


def _gaussian(x: torch.Tensor, sigma: float, mode: str = "replicate", truncate: float = 4.0) -> torch.Tensor:
    """skimage.filters.gaussian / scipy gaussian_filter on the spatial axes ('nearest' = replicate)."""
    k = _gauss_kernel1d(sigma, truncate)
    return _sep_filter_any(x, k, k, mode)


def _motion_blur_batch(x: torch.Tensor, radius: int, sigma: float, angle_deg: torch.Tensor) -> torch.Tensor:
    """ImageMagick MotionBlurImage (as ported by imagecorruptions): a one-sided line kernel of width
    2 * radius + 1 with Gaussian weights exp(-i^2 / 2 sigma^2), along ``angle_deg`` (one angle per image);
    equivalent to a grouped convolution with a per-image line kernel, done as shift-and-add."""
    width = 2 * int(radius) + 1
    i = torch.arange(width, dtype=torch.float64)
    k = torch.exp(-(i**2) / (2 * float(sigma) ** 2))
    k = (k / k.sum()).tolist()
    a = torch.deg2rad(angle_deg.to(torch.float64))
    sin, cos = torch.sin(a), torch.cos(a)
    n, c, h, w = x.shape
    if n == 1:  # one image (large images are chunked one by one on the CPU): plain slices of a padded copy
        pad = width
        xp = F.pad(x, (pad, pad, pad, pad), mode="replicate")
        out1 = torch.zeros_like(x)
        for step in range(width):
            dy = -math.ceil(step * float(sin[0]) - 0.5)
            dx = -math.ceil(step * float(cos[0]) - 0.5)
            out1.add_(xp[:, :, pad - dy:pad - dy + h, pad - dx:pad - dx + w], alpha=k[step])
        return out1
    flat = x.reshape(n, c, h * w)
    ar_h = torch.arange(h, device=x.device)
    ar_w = torch.arange(w, device=x.device)
    sin, cos = sin.to(x.device), cos.to(x.device)
    out = flat * k[0]  # tap 0 is the identity
    idx = torch.empty(n, h, w, dtype=torch.int64, device=x.device)  # buffers reused by every tap
    taken = torch.empty_like(flat)
    idx_c = idx.view(n, 1, h * w).expand(n, c, h * w)
    for step in range(1, width):
        dy = -torch.ceil(step * sin - 0.5).long()
        dx = -torch.ceil(step * cos - 0.5).long()
        rows = (ar_h[None, :] - dy[:, None]).clamp_(0, h - 1).mul_(w)
        cols = (ar_w[None, :] - dx[:, None]).clamp_(0, w - 1)
        torch.add(rows[:, :, None], cols[:, None, :], out=idx)
        torch.gather(flat, 2, idx_c, out=taken)
        out.add_(taken, alpha=k[step])
    return out.reshape(n, c, h, w)


@functools.lru_cache(maxsize=256)
def _zoom_matrix(n: int, zoom: float) -> np.ndarray:
    """Matrix [n, n] of Hendrycks' clipped_zoom along one axis: centre crop ceil(n / zoom), linear
    ``scipy.ndimage.zoom`` (order 1) back up, centre trim to n."""
    ch = int(np.ceil(n / zoom))
    top = (n - ch) // 2
    out_len = int(round(ch * zoom))
    trim = (out_len - n) // 2
    m = np.zeros((n, n), dtype=np.float64)
    scale = (ch - 1) / (out_len - 1) if out_len > 1 else 0.0
    for r in range(n):
        o = r + trim
        pos = o * scale
        lo = int(np.floor(pos))
        frac = pos - lo
        lo = min(max(lo, 0), ch - 1)
        m[r, top + lo] += 1.0 - frac
        if frac > 0 and lo + 1 < ch:
            m[r, top + lo + 1] += frac
    return m


def _apply_rows_cols(x: torch.Tensor, mh: np.ndarray, mw: np.ndarray) -> torch.Tensor:
    """out = Mh @ x @ Mw^T on the last two axes."""
    th = torch.as_tensor(mh, dtype=x.dtype, device=x.device)
    tw = torch.as_tensor(mw, dtype=x.dtype, device=x.device)
    return torch.matmul(torch.matmul(th, x), tw.T)


def _clipped_zoom(x: torch.Tensor, zoom: float) -> torch.Tensor:
    h, w = x.shape[-2], x.shape[-1]
    return _apply_rows_cols(x, _zoom_matrix(h, float(zoom)), _zoom_matrix(w, float(zoom)))



def _luma(x: torch.Tensor, weights: tuple[float, float, float] = _LUMA) -> torch.Tensor:
    """N x 3 x H x W -> N x 1 x H x W weighted sum of the channels."""
    wt = torch.tensor(weights, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x * wt).sum(1, keepdim=True)

