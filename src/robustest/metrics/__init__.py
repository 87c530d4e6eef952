"""Per-sample test metrics: loss (ZOL, FOL), prediction uncertainty (DeepGini, entropy, margin, max
probability), neuron coverage (NC, KMNC, NBC, SNAC, TKNC) and surprise adequacy (LSA, DSA).

Every metric returns a 1-D tensor of length N in input order. The loss and uncertainty functions are
importable from here directly; :mod:`robustest.metrics.coverage` and :mod:`robustest.metrics.surprise`
(and their main names) load on first use.

``names()`` lists every metric name, ``describe(name)`` says what it measures and which direction means
"more interesting", and ``compute(name, model, x, ...)`` evaluates any of them by name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from robustest.core.errors import ConfigError
from robustest.metrics.loss import fol, fol_gradnorm, input_gradients, zol
from robustest.metrics.uncertainty import (
    entropy,
    entropy_from_logits,
    gini,
    gini_from_logits,
    margin,
    margin_from_logits,
    max_prob,
    max_prob_from_logits,
)

__all__ = [
    "MetricInfo",
    "compute",
    "describe",
    "entropy",
    "entropy_from_logits",
    "fol",
    "fol_gradnorm",
    "gini",
    "gini_from_logits",
    "info",
    "input_gradients",
    "margin",
    "margin_from_logits",
    "max_prob",
    "max_prob_from_logits",
    "names",
    "zol",
]


@dataclass(frozen=True)
class MetricInfo:
    """Registry entry: ``kind`` (loss, uncertainty, coverage, surprise), whether the metric needs labels,
    whether it needs training data (a coverage profile / SA reference), ``higher`` (what a high value
    means), a one-line description and the ``options`` it takes (keyword arguments of :func:`compute` a command
    line offers as flags)."""

    name: str
    kind: str
    needs_labels: bool
    needs_train: bool
    higher: str
    description: str
    options: tuple[str, ...] = ()


_REGISTRY: dict[str, MetricInfo] = {
    m.name: m
    for m in [
        MetricInfo("zol", "loss", True, False, "higher loss",
                   "zero-order loss: cross-entropy J(f(x), y) per sample"),
        MetricInfo("fol", "loss", True, False, "further from a first-order stationary point",
                   "first-order loss (RobOT FOSC): eps*||g||_q - <x - x0, g>, g = grad_x J, q dual to --norm",
                   ("eps", "norm", "label")),
        MetricInfo("fol_gradnorm", "loss", True, False, "larger loss gradient",
                   "plain L2 norm of the input gradient of the loss (RobOT reference code's 'L2' FOL)", ("label",)),
        MetricInfo("gini", "uncertainty", False, False, "more uncertain",
                   "DeepGini impurity 1 - sum_i p_i^2 of the softmax probabilities"),
        MetricInfo("entropy", "uncertainty", False, False, "more uncertain",
                   "Shannon entropy -sum_i p_i log p_i of the softmax probabilities (nats)"),
        MetricInfo("margin", "uncertainty", False, False, "more confident",
                   "top-1 minus top-2 softmax probability (low = uncertain)"),
        MetricInfo("max_prob", "uncertainty", False, False, "more confident",
                   "largest softmax probability (low = uncertain)"),
        MetricInfo("nc", "coverage", False, True, "more neurons covered",
                   "neuron coverage: neurons whose activation exceeds a threshold", ("threshold",)),
        MetricInfo("kmnc", "coverage", False, True, "more sections covered",
                   "k-multisection neuron coverage: sections of each neuron's training range [min, max] hit", ("k",)),
        MetricInfo("nbc", "coverage", False, True, "more boundaries covered",
                   "neuron boundary coverage: activations below the training min or above the training max",
                   ("scale",)),
        MetricInfo("snac", "coverage", False, True, "more corner cases covered",
                   "strong neuron activation coverage: activations above the training max", ("scale",)),
        MetricInfo("tknc", "coverage", False, True, "more top neurons covered",
                   "top-k neuron coverage: neurons among the k most active of their layer", ("top_k",)),
        MetricInfo("lsa", "surprise", False, True, "more surprising",
                   "likelihood-based surprise adequacy: -log KDE density of the activation trace"),
        MetricInfo("dsa", "surprise", False, True, "more surprising",
                   "distance-based surprise adequacy: distance to same-class trace / to nearest other class"),
    ]
}


def names(kind: str | None = None) -> list[str]:
    """Metric names (optionally only those of one ``kind``: loss, uncertainty, coverage, surprise)."""
    return [n for n, m in _REGISTRY.items() if kind is None or m.kind == kind]


def info(name: str) -> MetricInfo:
    """The registry entry of ``name``; :class:`ConfigError` for an unknown name."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown metric {name!r}: choose one of {', '.join(_REGISTRY)}") from None


def describe(name: str) -> str:
    """One line saying what metric ``name`` measures and what a high value means."""
    m = info(name)
    return f"{m.name} ({m.kind}): {m.description}; higher = {m.higher}"


def compute(
    name: str,
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor | None = None,
    *,
    x0: torch.Tensor | None = None,
    train: Any = None,
    batch_size: int | None = None,
    **opts: Any,
) -> torch.Tensor:
    """Evaluate metric ``name`` on images ``x`` ``[N, C, H, W]`` -> ``[N]``.

    ``y`` is needed by loss metrics (unless ``label="pred"``), ``x0`` is FOL's seed, ``train`` the training
    data coverage and surprise metrics build their reference from. ``opts`` go to the metric (e.g. ``eps``,
    ``norm``, ``label`` for FOL; ``k``, ``threshold``, ``top_k``, ``layers`` for coverage).
    """
    m = info(name)
    if m.needs_train and train is None:
        raise ConfigError(f"metric {name!r} needs training data for its reference profile: pass train=")
    if name == "zol":
        return zol(model, x, y, batch_size=batch_size)  # type: ignore[arg-type]
    if name == "fol":
        return fol(model, x, y, x0=x0, batch_size=batch_size, **opts)
    if name == "fol_gradnorm":
        return fol_gradnorm(model, x, y, batch_size=batch_size, **opts)
    if m.kind == "uncertainty":
        return {"gini": gini, "entropy": entropy, "margin": margin, "max_prob": max_prob}[name](
            model, x, batch_size=batch_size)
    if m.kind == "coverage":
        from robustest.metrics import coverage as _cov

        return _cov.per_input_scores(model, train, x, name, **opts)
    from robustest.metrics import surprise as _sa

    return _sa.sa_scores(model, train, x, metric=name, **opts)


# Coverage and surprise adequacy load lazily (their modules import more and build hooks).
_LAZY = {
    "coverage": ("robustest.metrics.coverage", None),
    "surprise": ("robustest.metrics.surprise", None),
    "CoverageProfile": ("robustest.metrics.coverage", "CoverageProfile"),
    "per_input_scores": ("robustest.metrics.coverage", "per_input_scores"),
    "SurpriseAdequacy": ("robustest.metrics.surprise", "SurpriseAdequacy"),
    "sa_scores": ("robustest.metrics.surprise", "sa_scores"),
    "score": ("robustest.metrics.scoring", "score"),
    "ScoreResult": ("robustest.metrics.scoring", "ScoreResult"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'robustest.metrics' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    return module if attr is None else getattr(module, attr)
