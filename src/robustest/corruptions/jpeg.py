"""jpeg_compression: baseline libjpeg (the codec behind Pillow) re-implemented on whole batches in its own
integer arithmetic, equal to Pillow's JPEG round trip bit for bit."""

from __future__ import annotations

import functools
import io

import numpy as np
import torch
import torch.nn.functional as F

from robustest.corruptions.spec import CorruptionSpec

# Baseline JPEG as libjpeg (the codec behind Pillow) runs it with its default settings, on whole batches and
# in libjpeg's own integer arithmetic: JFIF colour conversion and 2 x 2 chroma downsampling in 16.16 fixed
# point, the integer ("islow") 8 x 8 DCT, the Annex K tables scaled by quality, rounding quantisation, the
# integer inverse DCT, triangular ("fancy") chroma upsampling and fixed-point YCbCr -> RGB. The decoded
# images equal Pillow's bit for bit. (Entropy coding is lossless and is skipped.)
_JPEG_LUMA_Q = (
    16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55, 14, 13, 16, 24, 40, 57, 69, 56,
    14, 17, 22, 29, 51, 87, 80, 62, 18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99)
_JPEG_CHROMA_Q = (
    17, 18, 24, 47, 99, 99, 99, 99, 18, 21, 26, 66, 99, 99, 99, 99, 24, 26, 56, 99, 99, 99, 99, 99,
    47, 66, 99, 99, 99, 99, 99, 99) + (99,) * 32


def _fix(v: float) -> int:
    """libjpeg's FIX(): a constant in 16.16 fixed point."""
    return int(v * 65536 + 0.5)


def _jpeg_qtable(base: tuple[int, ...], quality: int, device: torch.device) -> torch.Tensor:
    """libjpeg's jpeg_set_quality: the base table scaled by quality, clamped to 1..255 (baseline); int32 8 x 8."""
    q = min(max(int(quality), 1), 100)
    scale = 5000 // q if q < 50 else 200 - 2 * q
    t = [min(max((b * scale + 50) // 100, 1), 255) for b in base]
    return torch.tensor(t, dtype=torch.int32, device=device).view(8, 8)


# libjpeg's integer ("islow") DCTs, exactly: jfdctint.c / jidctint.c, 13-bit constants, 2 extra bits in pass 1
_CB, _P1 = 13, 2
_F = {"0.298631336": 2446, "0.390180644": 3196, "0.541196100": 4433, "0.765366865": 6270, "0.899976223": 7373,
      "1.175875602": 9633, "1.501321110": 12299, "1.847759065": 15137, "1.961570560": 16069,
      "2.053119869": 16819, "2.562915447": 20995, "3.072711026": 25172}


def _descale(v: torch.Tensor, n: int) -> torch.Tensor:
    return (v + (1 << (n - 1))) >> n


def _odd_part(t0: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor, t3: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The shared odd part of libjpeg's LL&M butterflies (t0..t3 in the FDCT's tmp4..tmp7 order)."""
    z1, z2, z3, z4 = t0 + t3, t1 + t2, t0 + t2, t1 + t3
    z5 = (z3 + z4) * _F["1.175875602"]
    t0, t1 = t0 * _F["0.298631336"], t1 * _F["2.053119869"]
    t2, t3 = t2 * _F["3.072711026"], t3 * _F["1.501321110"]
    z1, z2 = z1 * -_F["0.899976223"], z2 * -_F["2.562915447"]
    z3, z4 = z3 * -_F["1.961570560"] + z5, z4 * -_F["0.390180644"] + z5
    return t0 + z1 + z3, t1 + z2 + z4, t2 + z2 + z3, t3 + z1 + z4


def _fdct_1d(d: torch.Tensor, dim: int, first: bool) -> torch.Tensor:
    d0, d1, d2, d3, d4, d5, d6, d7 = d.unbind(dim)
    tmp0, tmp7, tmp1, tmp6 = d0 + d7, d0 - d7, d1 + d6, d1 - d6
    tmp2, tmp5, tmp3, tmp4 = d2 + d5, d2 - d5, d3 + d4, d3 - d4
    tmp10, tmp13, tmp11, tmp12 = tmp0 + tmp3, tmp0 - tmp3, tmp1 + tmp2, tmp1 - tmp2
    shift = _CB - _P1 if first else _CB + _P1
    if first:
        o0, o4 = (tmp10 + tmp11) << _P1, (tmp10 - tmp11) << _P1
    else:
        o0, o4 = _descale(tmp10 + tmp11, _P1), _descale(tmp10 - tmp11, _P1)
    z1 = (tmp12 + tmp13) * _F["0.541196100"]
    o2 = _descale(z1 + tmp13 * _F["0.765366865"], shift)
    o6 = _descale(z1 - tmp12 * _F["1.847759065"], shift)
    a7, a5, a3, a1 = _odd_part(tmp4, tmp5, tmp6, tmp7)
    o7, o5, o3, o1 = (_descale(a, shift) for a in (a7, a5, a3, a1))
    return torch.stack([o0, o1, o2, o3, o4, o5, o6, o7], dim)


def _idct_1d(d: torch.Tensor, dim: int, first: bool) -> torch.Tensor:
    d0, d1, d2, d3, d4, d5, d6, d7 = d.unbind(dim)
    z1 = (d2 + d6) * _F["0.541196100"]
    tmp2, tmp3 = z1 - d6 * _F["1.847759065"], z1 + d2 * _F["0.765366865"]
    tmp0, tmp1 = (d0 + d4) << _CB, (d0 - d4) << _CB
    tmp10, tmp13, tmp11, tmp12 = tmp0 + tmp3, tmp0 - tmp3, tmp1 + tmp2, tmp1 - tmp2
    t0, t1, t2, t3 = _odd_part(d7, d5, d3, d1)
    shift = _CB - _P1 if first else _CB + _P1 + 3
    outs = (tmp10 + t3, tmp11 + t2, tmp12 + t1, tmp13 + t0, tmp13 - t0, tmp12 - t1, tmp11 - t2, tmp10 - t3)
    return torch.stack([_descale(o, shift) for o in outs], dim)


# output shift of each of the 8 outputs of the four 1-D passes (0: no descale)
_DCT_SHIFTS = {
    ("fdct", True): (0, _CB - _P1, _CB - _P1, _CB - _P1, 0, _CB - _P1, _CB - _P1, _CB - _P1),
    ("fdct", False): (_P1, _CB + _P1, _CB + _P1, _CB + _P1, _P1, _CB + _P1, _CB + _P1, _CB + _P1),
    ("idct", True): (_CB - _P1,) * 8,
    ("idct", False): (_CB + _P1 + 3,) * 8,
}


@functools.lru_cache(maxsize=8)
def _dct_pass(kind: str, first: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One 1-D pass of libjpeg's islow FDCT/IDCT as ``out_i = descale(sum_j L_ij d_j, s_i)``: every pass is an
    integer linear map followed by one rounding shift per output. Returns L (8 x 8, float64) and, per output,
    the rounding offset 2^(s_i - 1) and the factor 2^-s_i (8 x 1 each). L is read off the butterfly code by
    probing it with scaled unit vectors (2^20 e_j: the shifts are at most 18, so the probe is exact)."""
    shifts = _DCT_SHIFTS[(kind, first)]
    fn = _fdct_1d if kind == "fdct" else _idct_1d
    probe = torch.eye(8, dtype=torch.int64) << 20  # column j: 2^20 e_j
    raw = fn(probe, 0, first)  # raw[i, j] = L_ij 2^(20 - s_i)
    lin = torch.stack([raw[i] >> (20 - shifts[i]) for i in range(8)]).to(torch.float64)
    assert torch.equal(torch.stack([lin[i].long() << (20 - shifts[i]) for i in range(8)]), raw)
    sh = torch.tensor(shifts, dtype=torch.float64)[:, None]
    offset = torch.where(sh > 0, torch.exp2(sh - 1), torch.zeros_like(sh))
    return lin.to(device), offset.to(device), torch.exp2(-sh).to(device)


def _dct_apply(d: torch.Tensor, kind: str, first: bool, dim: int) -> torch.Tensor:
    """Apply a 1-D pass along ``dim`` (0 or 1) of an 8 x 8 x B float64 block stack: one matrix product and the
    rounding shifts, exact in float64 (all sums are integers below 2^38)."""
    lin, off, scale = _dct_pass(kind, first, d.device)
    if dim == 0:
        out = torch.matmul(lin, d.reshape(8, -1)).reshape(d.shape)
        return out.add_(off[:, :, None]).mul_(scale[:, :, None]).floor_()
    out = torch.matmul(lin, d)  # batched over the 8 rows: out[r, i, b] = sum_j L_ij d[r, j, b]
    return out.add_(off).mul_(scale).floor_()


def _jpeg_plane(p: torch.Tensor, quality: int, base: tuple[int, ...]) -> torch.Tensor:
    """Encode and decode one component: ``p`` integer N x H x W levels 0..255 (H, W multiples of 8) ->
    decoded int32 levels 0..255, same shape, exactly as libjpeg's islow DCT, quantiser and IDCT."""
    n, h, w = p.shape
    q = _jpeg_qtable(base, quality, p.device)[:, :, None].to(torch.float64)
    # Layout 8 (row) x 8 (column) x blocks. libjpeg works in 32/64-bit integers; every step here is an
    # integer computation carried exactly in float64 (matrix products of the butterfly maps, power-of-two
    # rounding shifts, integer division by flooring a quotient below 2^53).
    blocks = (p.to(torch.float64) - 128).reshape(n, h // 8, 8, w // 8, 8).permute(2, 4, 0, 1, 3).reshape(8, 8, -1)
    coef = _dct_apply(_dct_apply(blocks, "fdct", True, 1), "fdct", False, 0)  # rows, then columns; scaled by 8
    div = q * 8  # quantise: round half away from zero of coef / (8 q)
    half = torch.floor(div / 2)
    qc = torch.floor((coef.abs() + half) / div).mul_(coef.sign())
    out = _dct_apply(_dct_apply(qc.mul_(q), "idct", True, 0), "idct", False, 1)  # columns, then rows
    out = (out + 128).clamp_(0, 255).to(torch.int32).reshape(8, 8, n, h // 8, w // 8)
    return out.permute(2, 3, 0, 4, 1).reshape(n, h, w)


def _fancy_upsample(c: torch.Tensor) -> torch.Tensor:
    """libjpeg's h2v2 fancy upsampling of integer chroma N x h x w -> N x 2h x 2w: 3/4 nearer + 1/4 further
    sample in each direction, the edge rows/columns duplicated, libjpeg's integer rounding. Like libjpeg,
    planes at most 2 samples wide are upsampled by plain replication instead."""
    if c.shape[-1] <= 2:
        return c.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)
    up = torch.cat([c[:, :1], c[:, :-1]], 1)
    down = torch.cat([c[:, 1:], c[:, -1:]], 1)
    colsum = torch.stack([3 * c + up, 3 * c + down], 2).flatten(1, 2)  # N x 2h x w
    left = torch.cat([colsum[..., :1], colsum[..., :-1]], 2)
    right = torch.cat([colsum[..., 1:], colsum[..., -1:]], 2)
    even = (3 * colsum + left + 8) >> 4
    odd = (3 * colsum + right + 7) >> 4
    return torch.stack([even, odd], 3).flatten(2, 3)


JPEG_PILLOW_MIN_PIXELS = 96 * 96  # on the CPU, larger images go through Pillow's SIMD codec (same output)


def _jpeg_pillow(x: torch.Tensor, quality: int) -> torch.Tensor:
    """JPEG round trip through Pillow, one image at a time (CPU). Gives the same output as the batched codec
    below, which is faster for small images; Pillow's SIMD libjpeg is faster above about 96 x 96 pixels."""
    from PIL import Image

    # few full-size float temporaries: at this size each fresh one costs page faults as well as a pass
    arr = x.mul(255).round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
    gray = arr.shape[-1] == 1
    out = np.empty_like(arr)
    for i in range(arr.shape[0]):  # the codec takes one image per call
        buf = io.BytesIO()
        Image.fromarray(arr[i, :, :, 0] if gray else arr[i], mode="L" if gray else "RGB").save(
            buf, "JPEG", quality=int(quality))
        buf.seek(0)
        with Image.open(buf) as dec:
            out[i] = np.asarray(dec.convert("L" if gray else "RGB")).reshape(out.shape[1:])
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous().to(x.dtype).div_(255)


def _jpeg_compression(x: torch.Tensor, c: int, gen: torch.Generator, table: str) -> torch.Tensor:
    n, ch, h, w = x.shape
    if x.device.type == "cpu" and h * w > JPEG_PILLOW_MIN_PIXELS:
        return _jpeg_pillow(x, c)
    v = torch.round(x.clamp(0, 1) * 255)
    if ch == 1:
        hp, wp = -(-h // 8) * 8, -(-w // 8) * 8
        p = F.pad(v[:, 0], (0, wp - w, 0, hp - h), mode="replicate") if (hp, wp) != (h, w) else v[:, 0]
        return (_jpeg_plane(p, c, _JPEG_LUMA_Q)[:, None, :h, :w].to(x.dtype) / 255)
    # one MCU is 16 x 16 pixels; libjpeg fills partial ones by replicating the last column and row
    hp, wp = -(-h // 16) * 16, -(-w // 16) * 16
    if (hp, wp) != (h, w):
        v = F.pad(v, (0, wp - w, 0, hp - h), mode="replicate")
    v = v.to(torch.int32)
    r, g, b = v[:, 0], v[:, 1], v[:, 2]
    half, offset = 1 << 15, 128 << 16
    y = (_fix(0.299) * r + _fix(0.587) * g + _fix(0.114) * b + half) >> 16
    cb = (-_fix(0.16874) * r - _fix(0.33126) * g + _fix(0.5) * b + offset + half - 1) >> 16
    cr = (_fix(0.5) * r - _fix(0.41869) * g - _fix(0.08131) * b + offset + half - 1) >> 16
    # h2v2 downsampling: (sum of the 2 x 2 pixels + bias) >> 2 with the bias alternating 1, 2 along a row.
    # Columns are filled with replicated pixels before downsampling, rows only to an even count; the
    # remaining rows of the last MCU repeat the last downsampled row (libjpeg's expand_bottom_edge).
    ch_h, ch_w = -(-h // 2), -(-w // 2)  # the chroma samples inside the image; upsampling stops there
    bias = torch.tensor([1, 2], dtype=torch.int32, device=v.device).repeat(wp // 4)

    def down(t: torch.Tensor) -> torch.Tensor:
        rows = t[:, 0:2 * ch_h:2] + t[:, 1:2 * ch_h:2]
        s = (rows[..., 0::2] + rows[..., 1::2] + bias) >> 2
        return torch.cat([s, s[:, -1:].expand(n, hp // 2 - ch_h, wp // 2)], 1) if hp // 2 > ch_h else s

    cb = _fancy_upsample(_jpeg_plane(down(cb), c, _JPEG_CHROMA_Q)[:, :ch_h, :ch_w]) - 128
    cr = _fancy_upsample(_jpeg_plane(down(cr), c, _JPEG_CHROMA_Q)[:, :ch_h, :ch_w]) - 128
    y = _jpeg_plane(y, c, _JPEG_LUMA_Q)[:, :2 * ch_h, :2 * ch_w]
    rgb = torch.stack([
        y + ((_fix(1.402) * cr + half) >> 16),
        y + ((-_fix(0.34414) * cb - _fix(0.71414) * cr + half) >> 16),
        y + ((_fix(1.772) * cb + half) >> 16),
    ], 1).clamp_(0, 255)
    return rgb[:, :, :h, :w].to(x.dtype) / 255


#: the corruptions of this module with their published parameters, registered by robustest.corruptions
RECORDS = (
    CorruptionSpec(
        "jpeg_compression", _jpeg_compression,
        "JPEG encode/decode at quality c (baseline libjpeg with its defaults, batched)",
        {"cifar": [80, 65, 58, 50, 40],
         "imagenet": [25, 18, 15, 10, 7]},
        family="digital", number=14, aliases=("jpeg",)),
)
