"""Compute counted in forward+backward passes over one sample (:class:`PassCounter`), the unit of
docs/HARDEN.md: a sample's forward counts 1/3 of a pass and its backward 2/3, ``passes = (forward + 2 *
backward) / 3``.

The counter is measured, not estimated: a forward hook on the model adds the batch size of every call, and
when the output takes part in autograd a hook on the output tensor adds the batch size again when a backward
(``loss.backward()`` or ``torch.autograd.grad`` w.r.t. the input) runs through it. Forwards without a backward
(evaluation, scoring under ``no_grad``) therefore count 1/3 each; a training step or an attack step 1.
Under torchrun the work that the ranks share out (:func:`robustest.core.distributed.sharded_work`, e.g. the
batches of ``attack()``) is summed over the ranks, and what every rank repeats is counted once, so the
count equals one process's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from robustest.core import distributed


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
        return (self.forward + 2 * self.backward) / 3


def cell_compute(pool_generation: float | None = 0.0, selection_scoring: float | None = 0.0,
                 finetune: float | None = 0.0, adversarial: float | None = 0.0) -> dict[str, float | None]:
    """The compute record of one comparison cell or loop round, in passes: its parts and their ``total`` (None
    when a part could not be counted)."""
    parts = {"pool_generation": pool_generation, "selection_scoring": selection_scoring, "finetune": finetune,
             "adversarial": adversarial}
    total = None if any(v is None for v in parts.values()) else float(sum(parts.values()))
    return {**{k: (None if v is None else float(v)) for k, v in parts.items()}, "total": total}
