"""CROWN's intermediate bounds of a convolution in patch form.

The backward coefficients of one convolution neuron are non-zero only on its receptive field, so instead of a
full map per neuron (S x C x H x W) each row keeps a patch (C x ph x pw) and its top-left position in the current
layer. Through ReLUs and per-channel maps the patch is multiplied by the window of slopes it covers; through a
convolution (stride s, kernel k) it becomes a ``(ph - 1) s + k`` patch by a transposed convolution of the patch
itself. The bounds equal the dense propagation's (the same relaxation, fewer zeros), for the chains this covers:
convolutions (no groups, no dilation), ReLUs, BatchNorm, Normalize and identities down to the input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from robustest.certify.graph import Graph, Op, diag_params
from robustest.certify.interval import Bounds
from robustest.certify.ops import maxpool_relaxation, relaxed, relu_relaxation


def _plain_conv(op: Op) -> bool:
    p = op.params
    return op.kind == "affine" and op.kind_detail == "conv" and p["groups"] == 1 and p["dilation"] == (1, 1)


def chain(graph: Graph, target: int) -> list[int] | None:
    """The ops from ``target`` (a convolution) down to the input when the patch form covers them, else None."""
    if not _plain_conv(graph.ops[target]):
        return None
    path = [target]
    i = graph.ops[target].inputs[0]
    while graph.ops[i].kind != "input":
        op = graph.ops[i]
        if not (op.kind in ("relu", "identity", "maxpool") or _plain_conv(op)
                or op.kind == "affine" and op.kind_detail == "diag"):
            return None
        path.append(i)
        i = op.inputs[0]
    return path


def patch_width(graph: Graph, path: list[int]) -> int:
    """The largest patch (C x ph x pw elements) a row reaches along ``path``."""
    weight = graph.ops[path[0]].params["weight"]
    c, ph, pw = weight.shape[1:]
    widest = c * ph * pw
    for i in path[1:]:
        op = graph.ops[i]
        if op.kind == "affine" and op.kind_detail == "conv":
            w, (sy, sx) = op.params["weight"], op.params["stride"]
            c, ph, pw = w.shape[1], (ph - 1) * sy + w.shape[2], (pw - 1) * sx + w.shape[3]
            widest = max(widest, c * ph * pw)
        elif op.kind == "maxpool":
            ky, kx = op.params["kernel"]
            ph, pw = ph * ky, pw * kx
            widest = max(widest, c * ph * pw * ky * kx)  # the one-hot expansion
    return widest


def _windows(image: torch.Tensor, oy: torch.Tensor, ox: torch.Tensor, ph: int, pw: int) -> torch.Tensor:
    """N x S x C x ph x pw: the window of ``image`` (N x C x H x W) at each row's top-left ``(oy, ox)`` (S each);
    zero outside the image."""
    h, w = image.shape[-2:]
    m = max(0, -int(oy.min()), -int(ox.min()), int(oy.max()) + ph - h, int(ox.max()) + pw - w)
    padded = F.pad(image, (m, m, m, m))
    ry = (oy + m).unsqueeze(1) + torch.arange(ph, device=oy.device)  # S x ph
    rx = (ox + m).unsqueeze(1) + torch.arange(pw, device=ox.device)  # S x pw
    out = padded[:, :, ry[:, :, None], rx[:, None, :]]  # N x C x S x ph x pw
    return out.permute(0, 2, 1, 3, 4)


def _inside(oy: torch.Tensor, ox: torch.Tensor, ph: int, pw: int, h: int, w: int) -> torch.Tensor:
    """S x 1 x ph x pw: 1 where a row's patch lies on the layer, 0 on its padding."""
    ry = oy.unsqueeze(1) + torch.arange(ph, device=oy.device)
    rx = ox.unsqueeze(1) + torch.arange(pw, device=ox.device)
    ok = ((ry >= 0) & (ry < h))[:, :, None] & ((rx >= 0) & (rx < w))[:, None, :]
    return ok.unsqueeze(1)


def conv_bounds(graph: Graph, path: list[int], rows: torch.Tensor, bounds_of, x: torch.Tensor,
                box: Bounds, eps: float, norm: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Lower and upper bounds (N x S) of the target convolution's neurons ``rows`` (flat indices into its
    C x H x W output) over the ball; ``bounds_of(i)`` gives op ``i``'s bounds, ``path`` comes from :func:`chain`."""
    target = graph.ops[path[0]]
    p = target.params
    _, ho, wo = target.out_shape
    c = rows // (ho * wo)
    oy = (rows % (ho * wo)) // wo * p["stride"][0] - p["padding"][0]
    ox = rows % wo * p["stride"][1] - p["padding"][1]
    patch = p["weight"][c].unsqueeze(0)  # 1 x S x C_in x kh x kw, the same for every sample
    const = (p["bias"][c] if p["bias"] is not None else patch.new_zeros(rows.numel())).unsqueeze(0)
    lo_p, hi_p = patch, patch
    const_lo, const_hi = const, const
    for i in path[1:]:
        op = graph.ops[i]
        ph, pw = lo_p.shape[-2:]
        inside = _inside(oy, ox, ph, pw, *op.out_shape[-2:]).to(patch.dtype)
        lo_p, hi_p = lo_p * inside, hi_p * inside
        if op.kind == "relu":
            lower, upper = bounds_of(op.inputs[0])
            lo_s, up_s, up_b = (_windows(t, oy, ox, ph, pw) for t in relu_relaxation(lower, upper))
            lo_p, cl = relaxed(lo_p, lo_s, up_s, up_b, upper=False)
            hi_p, cu = relaxed(hi_p, lo_s, up_s, up_b, upper=True)
            const_lo, const_hi = const_lo + cl, const_hi + cu
        elif op.kind == "maxpool":
            (lo_p, hi_p), (cl, cu) = _maxpool(lo_p, hi_p, bounds_of(op.inputs[0]), op.params["kernel"], oy, ox)
            const_lo, const_hi = const_lo + cl, const_hi + cu
            oy, ox = oy * op.params["kernel"][0], ox * op.params["kernel"][1]
        elif op.kind == "affine" and op.kind_detail == "diag":
            scale, shift = diag_params(op)
            shift_w = _windows(shift.expand(1, *op.out_shape), oy, ox, ph, pw)
            const_lo = const_lo + (lo_p * shift_w).flatten(2).sum(-1)
            const_hi = const_hi + (hi_p * shift_w).flatten(2).sum(-1)
            lo_p, hi_p = lo_p * scale, hi_p * scale
        elif op.kind == "affine":
            q = op.params
            if q["bias"] is not None:
                const_lo = const_lo + torch.einsum("nschw,c->ns", lo_p, q["bias"])
                const_hi = const_hi + torch.einsum("nschw,c->ns", hi_p, q["bias"])
            lo_p, hi_p = (_transpose(t, q) for t in (lo_p, hi_p))
            oy, ox = oy * q["stride"][0] - q["padding"][0], ox * q["stride"][1] - q["padding"][1]
    ph, pw = lo_p.shape[-2:]
    inside = _inside(oy, ox, ph, pw, *x.shape[-2:]).to(patch.dtype)
    lo_p, hi_p = lo_p * inside, hi_p * inside
    if norm == "linf":
        lo_w, hi_w = (_windows(t, oy, ox, ph, pw) for t in box)
        lower = const_lo + (lo_p.clamp(min=0) * lo_w + lo_p.clamp(max=0) * hi_w).flatten(2).sum(-1)
        upper = const_hi + (hi_p.clamp(min=0) * hi_w + hi_p.clamp(max=0) * lo_w).flatten(2).sum(-1)
        return lower, upper
    x_w = _windows(x, oy, ox, ph, pw)
    lower = const_lo + (lo_p * x_w).flatten(2).sum(-1) - eps * lo_p.flatten(2).norm(dim=-1)
    upper = const_hi + (hi_p * x_w).flatten(2).sum(-1) + eps * hi_p.flatten(2).norm(dim=-1)
    return lower, upper


def _maxpool(lo_p: torch.Tensor, hi_p: torch.Tensor, bounds: Bounds, kernel: tuple[int, int], oy: torch.Tensor,
             ox: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Patches on a max-pool's output moved to its input (the relaxation of :mod:`.backward`): each coefficient
    goes to its window's element with the largest lower bound; the windows' constants are returned too."""
    lower, upper = bounds
    ky, kx = kernel
    w = lower.shape[-1]
    index, linear, icpt = maxpool_relaxation(lower, upper, kernel)
    local = (index // w % ky) * kx + index % w % kx
    ph, pw = lo_p.shape[-2:]
    local_w = _windows(local, oy, ox, ph, pw)
    linear_w, icpt_w = _windows(linear, oy, ox, ph, pw), _windows(icpt, oy, ox, ph, pw)
    lo_c, cl = relaxed(lo_p, 1.0, linear_w, icpt_w, upper=False)
    hi_c, cu = relaxed(hi_p, 1.0, linear_w, icpt_w, upper=True)
    onehot = F.one_hot(local_w, ky * kx).to(lower.dtype)  # N x S x C x ph x pw x ky*kx

    def expand(coef: torch.Tensor) -> torch.Tensor:
        full = coef.unsqueeze(-1) * onehot
        n, s, c = full.shape[:3]
        return full.view(n, s, c, ph, pw, ky, kx).permute(0, 1, 2, 3, 5, 4, 6).reshape(n, s, c, ph * ky, pw * kx)

    return (expand(lo_c), expand(hi_c)), (cl, cu)


def _transpose(patch: torch.Tensor, q: dict) -> torch.Tensor:
    """The patch (N x S x C_out x ph x pw) through the convolution's transpose: one matrix product with the
    transposed convolution written out for this patch size (a CPU's transposed convolution of many small images
    is several times slower), or the transposed convolution itself when that matrix would be large."""
    n, s, c, ph, pw = patch.shape
    weight, stride = q["weight"], q["stride"]
    size = (weight.shape[1], (ph - 1) * stride[0] + weight.shape[2], (pw - 1) * stride[1] + weight.shape[3])
    if c * ph * pw * size[0] * size[1] * size[2] > _MATRIX_LIMIT:
        out = F.conv_transpose2d(patch.reshape(n * s, c, ph, pw), weight, None, stride)
        return out.reshape(n, s, *out.shape[1:])
    basis = torch.eye(c * ph * pw, dtype=patch.dtype, device=patch.device).view(-1, c, ph, pw)
    matrix = F.conv_transpose2d(basis, weight, None, stride).flatten(1)
    return (patch.reshape(n * s, -1) @ matrix).view(n, s, *size)


_MATRIX_LIMIT = 1 << 24
