"""``crown-ibp``: CROWN-IBP training (Zhang et al. 2020). The step of :mod:`.ibp` with tighter margins early on:

    kappa * CE(z(x), y) + (1 - kappa) * CE(-(beta * m_crown_ibp + (1 - beta) * m_ibp), y)

``m_crown_ibp``: CROWN's backward linear bounds over IBP's intermediate boxes, ``m_ibp``: IBP's
(:func:`robustest.certify.margin_bounds` with ``crown-ibp`` / ``ibp``). Along the ramp (the same options as ibp:
``ramp_warmup``, ``ramp_length``, ``eps_train``) ``kappa`` falls from 1 to ``kappa_end`` (default 0) and ``beta``
from 1 to ``beta_end`` (default 0: Zhang et al.'s "CROWN-IBP 1 -> 0", pure IBP bounds once the radius has reached
``eps_train``, which is also when the bounds are cheapest). Every epoch's record keeps the last batch's ``eps``,
``kappa`` and ``beta``.

Compute per batch of B: B passes of the clean term (while kappa > 0) and, once the ramp has begun, 2 B of the IBP
margins (while beta < 1) plus (2 + K) B of CROWN-IBP's (while beta > 0; K classes: the K margins' linear bounds
pushed back through the network cost about one forward each, after the intermediate boxes).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from robustest.certify import margin_bounds
from robustest.certify.graph import Graph
from robustest.core.options import checked_option
from robustest.core.validation import check_float
from robustest.train.objectives.base import Objective, StepContext, StepOutput
from robustest.train.objectives.ibp import RAMP_LENGTH, RAMP_WARMUP, certified_step, check_ramp, kappa_end

__all__ = ["OBJECTIVE", "step"]


def _bounds(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, graph: Graph, r: float,
            s: dict[str, Any]) -> tuple[torch.Tensor, int, dict[str, float]]:
    """beta * m_crown_ibp + (1 - beta) * m_ibp at ramp position ``r`` (B x K), each term computed only when its
    weight is not 0."""
    beta = 1.0 - (1.0 - float(s["beta_end"])) * r
    parts, passes = [], 0
    if beta > 0.0:
        crown = margin_bounds(model, x, y, eps, "linf", "crown-ibp", graph=graph)
        parts.append(crown if beta == 1.0 else beta * crown)
        passes += 2 + int(crown.shape[1])
    if beta < 1.0:
        box = margin_bounds(model, x, y, eps, "linf", "ibp", graph=graph)
        parts.append(box if beta == 0.0 else (1.0 - beta) * box)
        passes += 2
    return (parts[0] if len(parts) == 1 else parts[0] + parts[1]), passes, {"beta": beta}


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator | None,
         ctx: StepContext) -> StepOutput:
    """One CROWN-IBP-training step on the batch x (B x C x H x W), y (int64 [B]); draws no random number."""
    return certified_step(model, x, y, ctx, "crown-ibp", _bounds)


OBJECTIVE = Objective(
    name="crown-ibp", step=step, summary="Zhang et al.: CROWN-IBP (certified training, CROWN-IBP 1 -> IBP bounds)",
    options=(RAMP_WARMUP, RAMP_LENGTH, kappa_end(0.0),
             checked_option("beta_end", 0.0, lambda v, n: check_float(n, v, lo=0.0, hi=1.0),
                            "weight beta of the CROWN-IBP margins after the ramp, from 1 before it (1 - beta: IBP's)")),
    check=check_ramp, certificates=("ibp", "crown"),
)
