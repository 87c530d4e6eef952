"""The affine maps of a graph, forward and transposed, and the input ball's concretisation.

Shapes: ``x`` is N x (op shape); a linear bound's coefficients ``A`` are N x S x (op shape) for S specifications
(rows); its constant is N x S.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from robustest.certify.graph import Op, diag_params


def affine(op: Op, x: torch.Tensor, *, absolute: bool = False) -> torch.Tensor:
    """The op applied to ``x`` (N x in_shape); ``absolute`` uses the absolute weights and no bias (an interval's
    radius through the op)."""
    p = op.params
    if op.kind_detail == "diag":
        scale, shift = diag_params(op)
        return x * scale.abs() if absolute else x * scale + shift
    weight = p["weight"].abs() if absolute else p["weight"]
    bias = None if absolute else p["bias"]
    if op.kind_detail == "linear":
        return F.linear(x, weight, bias)
    return F.conv2d(x, weight, bias, p["stride"], p["padding"], p["dilation"], p["groups"])


def affine_squared(op: Op, x: torch.Tensor) -> torch.Tensor:
    """The op's linear part with squared weights applied to ``x`` (no bias): row norms of a weight matrix."""
    p = op.params
    if op.kind_detail == "diag":
        return x * diag_params(op)[0] ** 2
    weight = p["weight"] ** 2
    if op.kind_detail == "linear":
        return F.linear(x, weight)
    return F.conv2d(x, weight, None, p["stride"], p["padding"], p["dilation"], p["groups"])


def affine_transposed(op: Op, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a @ W, a @ b)``: coefficients N x S x out_shape moved to the op's input (N x S x in_shape) and the
    constant they pick up (N x S)."""
    n, s = a.shape[:2]
    p = op.params
    if op.kind_detail == "diag":
        scale, shift = diag_params(op)
        const = (a * shift).flatten(2).sum(-1)
        return a * scale, const
    bias = p["bias"]
    if op.kind_detail == "linear":
        const = a @ bias if bias is not None else a.new_zeros(n, s)
        return a @ p["weight"], const
    weight = p["weight"]
    flat = a.reshape(n * s, *op.out_shape)
    sizes = []
    for d in range(2):
        full = (op.out_shape[1 + d] - 1) * p["stride"][d] - 2 * p["padding"][d] \
            + p["dilation"][d] * (weight.shape[2 + d] - 1) + 1
        sizes.append(op.in_shape[1 + d] - full)
    back = F.conv_transpose2d(flat, weight, None, p["stride"], p["padding"], tuple(sizes), p["groups"],
                              p["dilation"])
    const = a.sum((-1, -2)) @ bias if bias is not None else a.new_zeros(n, s)
    return back.reshape(n, s, *op.in_shape), const


def relu_relaxation(lower: torch.Tensor, upper: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(lower_slope, upper_slope, upper_intercept)`` of CROWN's ReLU relaxation, each shaped like the bounds:
    ``lower_slope * z <= relu(z) <= upper_slope * z + upper_intercept`` for ``z`` in ``[lower, upper]``."""
    lo = lower.clamp(max=0)
    hi = torch.maximum(upper.clamp(min=0), lo + 1e-8)
    up_slope = hi / (hi - lo)
    up_icpt = -lo * up_slope
    return (up_slope > 0.5).to(up_slope.dtype), up_slope, up_icpt



def maxpool_relaxation(lower: torch.Tensor, upper: torch.Tensor, kernel: tuple[int, int]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(index, linear, upper_intercept)`` of a non-overlapping max-pool's relaxation, each N x C x Ho x Wo, from
    its input bounds (N x C x H x W): ``max >= x_i*`` with ``i*`` = ``index`` (flat in H x W), the window's element
    with the largest lower bound; ``max <= x_i*`` where ``linear`` is 1 (``l_i* >= u_j`` for the others), else
    ``max <= upper_intercept`` (the window's largest upper bound)."""
    best, index = F.max_pool2d(lower, kernel, kernel, return_indices=True)
    others = upper.flatten(2).scatter(-1, index.flatten(2), float("-inf")).view_as(upper)
    linear = (best >= F.max_pool2d(others, kernel, kernel)).to(lower.dtype)
    return index, linear, (1 - linear) * F.max_pool2d(upper, kernel, kernel)


def relaxed(a: torch.Tensor, lower_slope: torch.Tensor | float, upper_slope: torch.Tensor,
            upper_icpt: torch.Tensor, *, upper: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Coefficients ``a`` (N x S x ...) moved through ``lower_slope * z <= f(z) <= upper_slope * z + upper_icpt``:
    for a lower bound (``upper`` False) the positive part takes the lower line and the negative part the upper one,
    for an upper bound the other way round; returns the new coefficients and the constant (N x S) they pick up."""
    pos, neg = a.clamp(min=0), a.clamp(max=0)
    if upper:
        return pos * upper_slope + neg * lower_slope, (pos * upper_icpt).flatten(2).sum(-1)
    return pos * lower_slope + neg * upper_slope, (neg * upper_icpt).flatten(2).sum(-1)


def concretize(a: torch.Tensor, x: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor, eps: float,
               norm: str, *, sign: int) -> torch.Tensor:
    """The minimum (``sign=-1``) or maximum (``sign=+1``) of ``a . x'`` (N x S) over the ball around ``x``.

    L-inf: over the box ``[lower, upper]`` (the ball clipped to [0, 1]); L2: ``a . x - eps ||a||_2`` (the ball
    unclipped, which is sound and what the dual norm gives)."""
    flat = a.flatten(2)
    if norm == "linf":
        lo, hi = lower.flatten(1).unsqueeze(1), upper.flatten(1).unsqueeze(1)
        pos, neg = flat.clamp(min=0), flat.clamp(max=0)
        if sign < 0:
            return (pos * lo).sum(-1) + (neg * hi).sum(-1)
        return (pos * hi).sum(-1) + (neg * lo).sum(-1)
    center = (flat * x.flatten(1).unsqueeze(1)).sum(-1)
    return center + sign * eps * flat.norm(dim=-1)
