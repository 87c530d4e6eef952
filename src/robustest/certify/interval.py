"""Interval bound propagation (Gowal et al. 2018): each layer's output box from its input box.

For L-inf the input box is the ball clipped to [0, 1]; interval arithmetic through one affine layer of that box is
exact. For L2 the first weight layer after the input (through Normalize, Flatten and the like) is bounded exactly
with the dual norm, ``W x + b +- eps ||W_i||_2``, and the layers before it with the ball's bounding box.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from robustest.certify.graph import Graph, Op
from robustest.certify.ops import affine, affine_squared

Bounds = tuple[torch.Tensor, torch.Tensor]


def input_box(x: torch.Tensor, eps: float, norm: str) -> Bounds:
    """The box holding the ball: ``[x - eps, x + eps]``, clipped to [0, 1] for L-inf."""
    if norm == "linf":
        return (x - eps).clamp(0.0, 1.0), (x + eps).clamp(0.0, 1.0)
    return x - eps, x + eps


def step(op: Op, bounds: Sequence[Bounds] | Mapping[int, Bounds]) -> Bounds:
    """The op's output box from its inputs' boxes (``bounds`` indexed like the graph's ops)."""
    if op.kind == "affine":
        lo, hi = bounds[op.inputs[0]]
        mid, rad = (hi + lo) / 2, (hi - lo) / 2
        centre, radius = affine(op, mid), affine(op, rad, absolute=True)
        return centre - radius, centre + radius
    if op.kind == "relu":
        lo, hi = bounds[op.inputs[0]]
        return lo.clamp(min=0), hi.clamp(min=0)
    if op.kind == "maxpool":
        lo, hi = bounds[op.inputs[0]]
        k = op.params["kernel"]
        return F.max_pool2d(lo, k, k), F.max_pool2d(hi, k, k)
    if op.kind == "add":
        (l1, u1), (l2, u2) = bounds[op.inputs[0]], bounds[op.inputs[1]]
        return l1 + l2, u1 + u2
    lo, hi = bounds[op.inputs[0]]
    if op.kind == "reshape":
        n = lo.shape[0]
        return lo.reshape(n, *op.out_shape), hi.reshape(n, *op.out_shape)
    return lo, hi  # identity


def first_weight_layer(graph: Graph) -> int | None:
    """The index of the first linear or convolution op when only per-element maps (Normalize, BatchNorm, reshape,
    identity) lie between it and the input, else None."""
    consumers = graph.consumers()
    i = 0
    while len(consumers[i]) == 1:
        op = graph.ops[consumers[i][0]]
        if op.kind == "affine" and op.kind_detail in ("linear", "conv"):
            return consumers[i][0]
        if not (op.kind in ("reshape", "identity") or op.kind == "affine" and op.kind_detail == "diag"):
            return None
        i = consumers[i][0]
    return None


def interval_bounds(graph: Graph, x: torch.Tensor, eps: float, norm: str) -> list[Bounds]:
    """Every op's output box (lower, upper), each N x op shape, for the ball of radius ``eps`` around ``x``."""
    bounds: list[Bounds] = [input_box(x, eps, norm)]
    first = first_weight_layer(graph) if norm == "l2" else None
    centre = x
    squares = torch.ones_like(x[:1])
    for i, op in enumerate(graph.ops[1:], start=1):
        if first is not None and i <= first:
            if i == first:
                mid = affine(op, centre)
                radius = eps * affine_squared(op, squares).clamp(min=0).sqrt()
                bounds.append((mid - radius, mid + radius))
                continue
            if op.kind == "reshape":
                centre = centre.reshape(centre.shape[0], *op.out_shape)
                squares = squares.reshape(1, *op.out_shape)
            elif op.kind == "affine":
                centre = affine(op, centre)
                squares = affine_squared(op, squares)
        bounds.append(step(op, bounds))
    return bounds
