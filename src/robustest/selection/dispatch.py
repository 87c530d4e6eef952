""":func:`select`: check the inputs a registered strategy declares it needs, then run it."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from robustest.core.errors import ConfigError
from robustest.selection.checks import check_inputs, check_k, check_labels, check_n
from robustest.selection.coverage import FILLS
from robustest.selection.registry import Request, get, names

__all__ = ["select"]


def select(
    scores: Any,
    n: int,
    strategy: str,
    *,
    k: int = 4,
    seed: int | None = 0,
    fill: str = "total",
    labels: Any = None,
) -> torch.Tensor:
    """Select ``n`` inputs from a scored pool.

    Args:
        scores: ``[N]`` real scores (tensor, array or list), or for a strategy that needs coverage bits
            (``coverage``) a ``BoolTensor[N, F]`` of covered coverage cells, or for one that needs features
            (``kcenter``) a float ``[N, D]`` tensor of features (the greedy runs on its device).
        n: how many to select (>= 0); more than ``N`` returns the whole pool with a warning.
        strategy: a registered name: ``best``, ``kmst``, ``top``, ``bottom``, ``random``, ``coverage``,
            ``stratified``, ``fol-prop``, ``kcenter`` or one added with :func:`register` (see the package
            docstring).
        k: number of KM-ST sections (``kmst``) or of score-quantile bins (``stratified``).
        seed: seed of the random draws (``kmst``, ``random``, ``stratified``, ``fol-prop``, ``kcenter``'s first
            centre, ``coverage`` with ``fill="random"``).
        fill: how ``coverage`` completes the selection once nothing adds coverage: ``total`` or ``random``.
        labels: for strategies that take them (``stratified``; optional): int64 ``[N]`` class of each input;
            the strata are then score bin x class.

    Returns:
        int64 CPU tensor of ``min(n, N)`` distinct indices into the pool.
    """
    spec = get(strategy)
    n = check_n(n)
    check_k(k)
    if fill not in FILLS:
        raise ConfigError(f"fill must be 'total' or 'random', got {fill!r}")
    s = check_inputs(scores, spec.needs, strategy)
    pool = s.shape[0]
    if labels is not None and not spec.labels:
        takers = " or ".join(repr(name) for name in names() if get(name).labels)
        raise ConfigError(f"labels apply to strategy {takers} only, not {strategy!r}: leave them out")
    lab = check_labels(labels, pool) if labels is not None else None
    if n > pool:
        warnings.warn(f"asked for {n} inputs but the pool holds only {pool}: returning the whole pool",
                      UserWarning, stacklevel=2)
        n = pool
    gen = torch.Generator().manual_seed(int(seed)) if seed is not None else torch.Generator()
    if seed is None:
        gen.seed()
    if n == 0:
        return torch.zeros(0, dtype=torch.int64)
    out = spec.fn(Request(s, n, int(k), fill, lab, gen))
    return out.to(torch.int64)
