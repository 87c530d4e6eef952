"""Compute accounting of adversarial training.

One *pass* is a forward plus a backward over one sample; a forward alone counts 1/3 of a pass and a backward
2/3 (the usual estimate: a backward costs about twice a forward). Counts are kept separately as sample-forwards
and sample-backwards, for the attack (inner maximisation) and the update step: ``passes = (forward + 2 *
backward) / 3``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ComputeCount"]


@dataclass
class ComputeCount:
    """Sample-forwards and sample-backwards of the attack and of the update step (see the module docstring)."""

    attack_forward: int = 0
    attack_backward: int = 0
    train_forward: int = 0
    train_backward: int = 0

    @property
    def forward(self) -> int:
        return self.attack_forward + self.train_forward

    @property
    def backward(self) -> int:
        return self.attack_backward + self.train_backward

    @property
    def passes(self) -> float:
        """Forward+backward passes over one sample: ``(forward + 2 * backward) / 3``."""
        return (self.forward + 2 * self.backward) / 3

    @property
    def attack_passes(self) -> float:
        return (self.attack_forward + 2 * self.attack_backward) / 3

    def add(self, other: ComputeCount) -> ComputeCount:
        return ComputeCount(self.attack_forward + other.attack_forward, self.attack_backward + other.attack_backward,
                            self.train_forward + other.train_forward, self.train_backward + other.train_backward)

    def to_dict(self) -> dict[str, Any]:
        return {"passes": self.passes, "attack_passes": self.attack_passes,
                "train_passes": (self.train_forward + 2 * self.train_backward) / 3,
                "forward": self.forward, "backward": self.backward,
                "attack_forward": self.attack_forward, "attack_backward": self.attack_backward,
                "train_forward": self.train_forward, "train_backward": self.train_backward}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ComputeCount:
        return cls(int(d["attack_forward"]), int(d["attack_backward"]), int(d["train_forward"]),
                   int(d["train_backward"]))
