"""The result of a bound-propagation certificate: per-sample lower bounds on the logit margins."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Certificate:
    """Per-sample certificate of one bound-propagation method on one norm ball.

    ``margins`` (N x K) holds sound lower bounds on ``z_y(x') - z_j(x')`` over every ``x'`` of the ball (the
    L-inf ball is intersected with the pixel box [0, 1]); column ``y`` is 0. ``certified`` (N, bool) is
    ``min_{j != y} margins > 0``: no point of the ball changes the prediction away from the label, so a certified
    sample is also correctly classified. ``method`` is ``"ibp"`` or ``"crown"``; ``eps`` and ``norm`` give the ball.
    """

    margins: torch.Tensor
    certified: torch.Tensor
    method: str
    eps: float
    norm: str

    @property
    def lower_margin(self) -> torch.Tensor:
        """N: the smallest margin lower bound over the classes other than the label (> 0 means certified)."""
        return self.margins.min(dim=1).values

    @property
    def certified_accuracy(self) -> float:
        """The share of certified samples (0.0 for an empty batch)."""
        n = int(self.certified.numel())
        return float(self.certified.sum().item()) / n if n else 0.0
