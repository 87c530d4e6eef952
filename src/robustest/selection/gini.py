"""``top`` / ``bottom``: the ``n`` highest / lowest scores in rank order (``top`` for DeepGini, entropy,
LSA/DSA, FOL; ``bottom`` for margin or max probability)."""

from __future__ import annotations

import torch

from robustest.selection.registry import Request, Strategy

__all__ = ["BOTTOM", "TOP", "bottom", "top"]


def top(req: Request) -> torch.Tensor:
    """The ``n`` highest of the scores ``[N]`` -> int64 ``[n]``, highest first (ties: lower index first)."""
    return torch.sort(-req.inputs, stable=True).indices[:req.n]


def bottom(req: Request) -> torch.Tensor:
    """The ``n`` lowest of the scores ``[N]`` -> int64 ``[n]``, lowest first (ties: lower index first)."""
    return torch.sort(req.inputs, stable=True).indices[:req.n]


TOP = Strategy("top", "the n highest scores (e.g. DeepGini's most uncertain first)", top, ranking=True)
BOTTOM = Strategy("bottom", "the n lowest scores (e.g. smallest margin first)", bottom, ranking=True)
