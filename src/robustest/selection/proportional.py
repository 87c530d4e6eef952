"""``fol-prop``: weighted sampling without replacement with probability proportional to the score (e.g.
FOL; scores must be >= 0), by the exponential-key method of Efraimidis and Spirakis (2006).

Each input draws ``u ~ U(0, 1)`` and the ``n`` largest keys ``log(u) / score`` win, in one sort. Inputs of
score 0 come last, in random order, and only when fewer than ``n`` inputs have a positive score. Order:
draw order.
"""

from __future__ import annotations

import torch

from robustest.core.errors import ConfigError
from robustest.selection.registry import Request, Strategy

__all__ = ["STRATEGY", "proportional"]


def proportional(req: Request) -> torch.Tensor:
    """``n`` draws without replacement, probability proportional to the scores ``[N]`` (>= 0) -> int64
    ``[n]`` in draw order."""
    s, n, gen = req.inputs, req.n, req.gen
    if bool((s < 0).any()):
        raise ConfigError(f"strategy 'fol-prop' samples with probability proportional to the score, which must be "
                          f">= 0; got a minimum of {float(s.min()):.4g} (use FOL, DeepGini or another non-negative "
                          "score)")
    u = torch.rand(s.shape[0], generator=gen, dtype=torch.float64).clamp_min_(1e-300)
    pos = torch.nonzero(s > 0).flatten()
    keys = torch.log(u[pos]) / s[pos]
    first = pos[torch.sort(keys, descending=True, stable=True).indices[:n]]
    if first.numel() >= n:
        return first
    zero = torch.nonzero(s <= 0).flatten()
    return torch.cat([first, zero[torch.randperm(zero.numel(), generator=gen)[: n - first.numel()]]])


STRATEGY = Strategy("fol-prop", "n inputs drawn without replacement with probability proportional to the score "
                    "(>= 0)", proportional, seeded=True)
