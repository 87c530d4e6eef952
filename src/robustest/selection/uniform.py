"""``random``: ``n`` inputs uniformly at random (seeded); only the pool's size matters."""

from __future__ import annotations

import torch

from robustest.selection.registry import Request, Strategy

__all__ = ["STRATEGY", "uniform"]


def uniform(req: Request) -> torch.Tensor:
    """``n`` distinct indices drawn uniformly from ``[0, N)`` -> int64 ``[n]``, in draw order."""
    return torch.randperm(req.inputs.shape[0], generator=req.gen)[:req.n]


STRATEGY = Strategy("random", "n inputs uniformly at random", uniform, seeded=True, reads_scores=False)
