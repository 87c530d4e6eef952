"""The compute record of one RobOT comparison cell or loop round (:func:`cell_compute`), in the passes of
:mod:`robustest.core.compute` (measured there by :class:`~robustest.core.compute.PassCounter`)."""

from __future__ import annotations

__all__ = ["cell_compute"]


def cell_compute(pool_generation: float | None = 0.0, selection_scoring: float | None = 0.0,
                 finetune: float | None = 0.0, adversarial: float | None = 0.0) -> dict[str, float | None]:
    """The compute record of one comparison cell or loop round, in passes: its parts and their ``total`` (None
    when a part could not be counted)."""
    parts = {"pool_generation": pool_generation, "selection_scoring": selection_scoring, "finetune": finetune,
             "adversarial": adversarial}
    total = None if any(v is None for v in parts.values()) else float(sum(parts.values()))
    return {**{k: (None if v is None else float(v)) for k, v in parts.items()}, "total": total}
