"""spatter: water drops (Canny edges, a truncated Euclidean distance transform, histogram equalisation)
and mud splashes, batched in torch."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from robustest.corruptions.filters import _filter2d, _gaussian, _luma
from robustest.corruptions.sampling import _randn
from robustest.corruptions.spec import CorruptionSpec


def _dilate3(mask: torch.Tensor) -> torch.Tensor:
    """3 x 3 (8-connected) dilation of a boolean N x 1 x H x W mask, zero outside."""
    p = F.pad(mask.to(torch.uint8), (1, 1, 1, 1))
    r = p[..., :, :-2] | p[..., :, 1:-1] | p[..., :, 2:]
    return (r[..., :-2, :] | r[..., 1:-1, :] | r[..., 2:, :]).bool()


def _canny(img: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """cv2.Canny(img, low, high) for uint8-valued float images N x 1 x H x W: 3x3 Sobel (replicated
    border), L1 magnitude, non-maximum suppression in 4 directions, hysteresis (8-connected)."""
    sob = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], dtype=img.dtype, device=img.device)
    gx = _filter2d(img, sob, "replicate")
    gy = _filter2d(img, sob.T.contiguous(), "replicate")
    mag = gx.abs() + gy.abs()
    ax, ay = gx.abs(), gy.abs()
    tan22 = math.tan(math.radians(22.5))
    tan67 = math.tan(math.radians(67.5))
    horiz = ay < ax * tan22
    vert = ay > ax * tan67
    diag_same = (gx * gy) > 0

    h, w = mag.shape[-2], mag.shape[-1]
    magp = F.pad(mag, (1, 1, 1, 1))  # zero outside: every neighbour below is a view of this one copy

    def nb(dy: int, dx: int) -> torch.Tensor:  # out[..., i, j] = mag[..., i + dy, j + dx]
        return magp[..., 1 + dy:1 + dy + h, 1 + dx:1 + dx + w]

    keep_h = (mag > nb(0, -1)) & (mag >= nb(0, 1))
    keep_v = (mag > nb(-1, 0)) & (mag >= nb(1, 0))
    keep_d1 = (mag > nb(-1, -1)) & (mag > nb(1, 1))  # gradient along the main diagonal
    keep_d2 = (mag > nb(-1, 1)) & (mag > nb(1, -1))
    keep = torch.where(horiz, keep_h, torch.where(vert, keep_v, torch.where(diag_same, keep_d1, keep_d2)))
    cand = keep & (mag > low)
    edges = cand & (mag > high)
    for _ in range(img.shape[-1] * img.shape[-2]):
        grown = cand & _dilate3(edges)
        if torch.equal(grown, edges):
            break
        edges = grown
    return edges


def _distance_to_zero(zero: torch.Tensor, cap: int = 20) -> torch.Tensor:
    """Exact Euclidean distance of every pixel to the nearest True pixel of ``zero`` (N x H x W), capped at
    ``cap``: distance along each row by min-plus doubling (shifts 1, 2, 4, ... cover every offset up to the
    cap exactly), then the lower envelope over rows."""
    n, h, w = zero.shape
    big = float(cap + 1)
    g = torch.where(zero, 0.0, big).to(torch.float32)
    s = 1
    while s <= cap:  # g(j) = min(g(j), g(j - s) + s, g(j + s) + s); offsets up to 2s - 1 reached exactly
        if s < w:
            left = F.pad(g[..., :w - s], (s, 0), value=big) + s
            right = F.pad(g[..., s:], (0, s), value=big) + s
            g = torch.minimum(g, torch.minimum(left, right))
        s *= 2
    g = g.clamp_(max=big)
    g2 = F.pad(g * g, (0, 0, cap, cap), value=big * big)
    d2 = g2[:, cap:cap + h].clone()
    tmp = torch.empty_like(d2)
    for s in range(1, min(cap, h - 1) + 1):
        for off in (cap + s, cap - s):
            torch.minimum(d2, torch.add(g2[:, off:off + h], float(s * s), out=tmp), out=d2)
    return torch.sqrt(d2).clamp(max=float(cap))


def _box3(t: torch.Tensor) -> torch.Tensor:
    return _filter2d(t, torch.full((3, 3), 1.0 / 9.0, dtype=t.dtype, device=t.device), "reflect101")


def _equalize_hist(t: torch.Tensor) -> torch.Tensor:
    """cv2.equalizeHist per image for integer-valued float images N x 1 x H x W (values 0..255)."""
    n = t.shape[0]
    flat = t.reshape(n, -1).long().clamp(0, 255)
    total = flat.shape[1]
    hist = torch.zeros(n, 256, dtype=torch.float64, device=t.device).scatter_add_(
        1, flat, torch.ones_like(flat, dtype=torch.float64))
    cdf = hist.cumsum(1)
    first = (hist > 0).double().argmax(1, keepdim=True)
    first_count = hist.gather(1, first)
    denom = (total - first_count).clamp_min(1)
    lut = torch.round((cdf - first_count) * (255.0 / denom)).clamp(0, 255)
    constant = first_count == total
    lut = torch.where(constant, first.double().expand(-1, 256), lut)
    return lut.gather(1, flat).reshape(t.shape).to(t.dtype)


def _spatter(x: torch.Tensor, c: tuple, gen: torch.Generator, table: str) -> torch.Tensor:
    n, ch, h, w = x.shape
    liquid = _randn((n, 1, h, w), gen, x) * c[1] + c[0]
    liquid = _gaussian(liquid, float(c[2]))
    liquid = torch.where(liquid < c[3], torch.zeros_like(liquid), liquid)
    if c[5] == 0:  # water
        liquid8 = torch.floor((liquid * 255).clamp(0, 255))
        edges = _canny(liquid8, 50.0, 150.0)
        dist = _distance_to_zero(edges[:, 0], 20)[:, None].to(x.dtype)
        dist = torch.floor(_box3(dist))  # cv2.blur, astype(uint8)
        dist = _equalize_hist(dist)
        ker = torch.tensor([[-2.0, -1.0, 0.0], [-1.0, 1.0, 1.0], [0.0, 1.0, 2.0]], dtype=x.dtype, device=x.device)
        dist = torch.round(_filter2d(dist, ker, "reflect101")).clamp(0, 255)  # CV_8U output
        dist = torch.round(_box3(dist))  # cv2.blur on uint8
        m = liquid8 * dist
        mx = m.amax(dim=(2, 3), keepdim=True)
        m = torch.where(mx > 0, m / torch.where(mx > 0, mx, torch.ones_like(mx)), torch.zeros_like(m)) * c[4]
        color = torch.tensor([175 / 255, 238 / 255, 238 / 255], dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
        add = m * color
        if ch == 1:
            return x + _luma(add.clamp(0, 1))
        return x + add
    # mud
    m = (liquid > c[3]).to(x.dtype)
    m = _gaussian(m, float(c[4]))
    m = torch.where(m < 0.8, torch.zeros_like(m), m)
    color = torch.tensor([63 / 255, 42 / 255, 20 / 255], dtype=x.dtype, device=x.device).view(1, 3, 1, 1) * m
    if ch == 1:
        color = _luma(color)
    return x * (1 - m) + color


#: the corruptions of this module with their published parameters, registered by robustest.corruptions
RECORDS = (
    CorruptionSpec(
        "spatter", _spatter,
        "water drops (severities 1-3 CIFAR / 1-3 ImageNet) or mud splashes (4-5)",
        {"cifar": [(0.62, 0.1, 0.7, 0.7, 0.5, 0), (0.65, 0.1, 0.8, 0.7, 0.5, 0), (0.65, 0.3, 1, 0.69, 0.5, 0),
                   (0.65, 0.1, 0.7, 0.69, 0.6, 1), (0.65, 0.1, 0.5, 0.68, 0.6, 1)],
         "imagenet": [(0.65, 0.3, 4, 0.69, 0.6, 0), (0.65, 0.3, 3, 0.68, 0.6, 0), (0.65, 0.3, 2, 0.68, 0.5, 0),
                      (0.65, 0.3, 1, 0.65, 1.5, 1), (0.67, 0.4, 1, 0.65, 1.5, 1)]},
        held_out=True, number=17, chunked=True),
)
