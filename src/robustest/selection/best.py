"""``best`` (RobOT's BE-ST): both ends of the score range."""

from __future__ import annotations

import torch

from robustest.selection.registry import Request, Strategy

__all__ = ["STRATEGY", "best"]


def best(req: Request) -> torch.Tensor:
    """The ``n // 2`` lowest and the ``n - n // 2`` highest of the scores ``[N]`` -> int64 ``[n]``: lowest
    first (ascending), then highest (descending); ties go to the lower index."""
    s, n = req.inputs, req.n
    asc = torch.sort(s, stable=True).indices
    lo, hi = n // 2, n - n // 2
    return torch.cat([asc[:lo], asc[s.shape[0] - hi:].flip(0)])


STRATEGY = Strategy("best", "BE-ST: n//2 lowest and n - n//2 highest scores (RobOT)", best)
