"""Compute in forward+backward passes over one sample, the one unit every figure of compute is stated in.

One *pass* is a forward plus a backward over one sample; a forward alone counts 1/3 of a pass and a backward
2/3 (the usual estimate: a backward costs about twice a forward): ``passes = (forward + 2 * backward) / 3``
(:func:`passes_of`). Two ways to come by the counts:

* :class:`ComputeCount`, tallied by the code that runs the work: the training objectives count their sample-forwards
  and sample-backwards, for the attack (inner maximisation) and the update step, from the batch sizes they use
  (harden, fit, enhance; docs/HARDEN.md).
* :class:`PassCounter`, measured on a model by hooks, for work whose code does not count (RobOT's pool generation,
  scoring and fine-tuning): a forward hook adds the batch size of every call, and when the output takes part in
  autograd a hook on the output tensor adds the batch size again when a backward (``loss.backward()`` or
  ``torch.autograd.grad`` w.r.t. the input) runs through it. Forwards without a backward (evaluation, scoring
  under ``no_grad``) therefore count 1/3 each; a training step or an attack step 1. Under torchrun the work that
  the ranks share out (:func:`robustest.core.distributed.sharded_work`, e.g. the batches of ``attack()``) is summed
  over the ranks, and what every rank repeats is counted once, so the count equals one process's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from robustest.core import distributed

__all__ = ["ComputeCount", "PassCounter", "passes_of"]


def passes_of(forward: int | float, backward: int | float) -> float:
    """Forward+backward passes over one sample of ``forward`` sample-forwards and ``backward`` sample-backwards:
    ``(forward + 2 * backward) / 3``."""
    return (forward + 2 * backward) / 3


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
        return passes_of(self.forward, self.backward)

    @property
    def attack_passes(self) -> float:
        return passes_of(self.attack_forward, self.attack_backward)

    def add(self, other: ComputeCount) -> ComputeCount:
        return ComputeCount(self.attack_forward + other.attack_forward, self.attack_backward + other.attack_backward,
                            self.train_forward + other.train_forward, self.train_backward + other.train_backward)

    def to_dict(self) -> dict[str, Any]:
        return {"passes": self.passes, "attack_passes": self.attack_passes,
                "train_passes": passes_of(self.train_forward, self.train_backward),
                "forward": self.forward, "backward": self.backward,
                "attack_forward": self.attack_forward, "attack_backward": self.attack_backward,
                "train_forward": self.train_forward, "train_backward": self.train_backward}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ComputeCount:
        return cls(int(d["attack_forward"]), int(d["attack_backward"]), int(d["train_forward"]),
                   int(d["train_backward"]))


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        out = out.get("logits", next(iter(out.values()), None))
        return _first_tensor(out)
    if isinstance(out, (tuple, list)):
        return _first_tensor(out[0]) if out else None
    logits = getattr(out, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else None


class PassCounter:
    """Count the sample-forwards and sample-backwards of ``model`` while the context is open.

    ``with PassCounter(model) as pc: ...`` then ``pc.forward``, ``pc.backward``, ``pc.passes``. Counters on
    the same model may nest; each counts what runs while it is open. A model that takes no hooks (some
    TorchScript modules) leaves ``available`` False and ``passes`` None.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.forward = 0
        self.backward = 0
        self._shared = [0, 0]  # forwards and backwards of work the ranks share out (summed over ranks on exit)
        self.available = True
        self._handle: Any = None
        self._open = False

    def _on_backward(self, n: int, shared: bool) -> None:
        if self._open:
            if shared:
                self._shared[1] += n
            else:
                self.backward += n

    def _hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        t = _first_tensor(output)
        if t is None:
            return
        n = int(t.shape[0]) if t.dim() > 0 else 1
        shared = distributed.in_sharded_work()
        if shared:
            self._shared[0] += n
        else:
            self.forward += n
        if t.requires_grad:
            t.register_hook(lambda grad, n=n, shared=shared: self._on_backward(n, shared))

    def __enter__(self) -> PassCounter:
        try:
            self._handle = self.model.register_forward_hook(self._hook)
        except (RuntimeError, AttributeError, NotImplementedError):
            self.available = False
        self._open = True
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._open = False
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if distributed.world_size() > 1 and exc_type is None:  # every rank leaves the block at the same point
            parts = distributed.all_gather_objects(list(self._shared))  # any backend (nccl takes no CPU tensor)
            self._shared = [0, 0]
            self.forward += sum(int(p[0]) for p in parts)
            self.backward += sum(int(p[1]) for p in parts)

    @property
    def passes(self) -> float | None:
        """Forward+backward passes over one sample: ``(forward + 2 * backward) / 3`` (None when not counted)."""
        if not self.available:
            return None
        return passes_of(self.forward, self.backward)
