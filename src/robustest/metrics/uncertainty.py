"""Prediction-uncertainty metrics from one forward pass (softmax probabilities ``p = softmax(f(x))``).

* ``gini``: DeepGini impurity ``1 - sum_i p_i^2`` (higher = more uncertain; DeepGini selects the highest).
* ``entropy``: Shannon entropy ``-sum_i p_i log p_i`` in nats (higher = more uncertain).
* ``margin``: ``p_top1 - p_top2`` (LOWER = more uncertain).
* ``max_prob``: ``max_i p_i`` (LOWER = more uncertain).

Each has a ``*_from_logits(logits [N, K]) -> [N]`` twin for logits already computed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError, DataError
from robustest.core.inputs import check_images
from robustest.core.modelcall import eval_mode, forward

__all__ = [
    "entropy",
    "entropy_from_logits",
    "gini",
    "gini_from_logits",
    "margin",
    "margin_from_logits",
    "max_prob",
    "max_prob_from_logits",
]

DEFAULT_BATCH_SIZE = 1024


def _check_logits(logits: torch.Tensor, min_classes: int = 1) -> torch.Tensor:
    if not isinstance(logits, torch.Tensor):
        raise DataError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2:
        raise DataError(f"logits must have shape [N, K], got {tuple(logits.shape)}")
    if logits.shape[1] < min_classes:
        raise DataError(f"logits have {logits.shape[1]} classes; this metric needs at least {min_classes}")
    return logits


def gini_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """DeepGini ``1 - sum p^2`` of logits ``[N, K]`` -> ``[N]``."""
    p = torch.softmax(_check_logits(logits).float(), dim=1)
    return 1.0 - (p * p).sum(dim=1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(logits ``[N, K]``) -> ``[N]``; stable for saturated probabilities."""
    logp = torch.log_softmax(_check_logits(logits).float(), dim=1)
    return -(logp.exp() * logp).sum(dim=1)


def margin_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 probability of logits ``[N, K]`` (K >= 2) -> ``[N]``."""
    p = torch.softmax(_check_logits(logits, 2).float(), dim=1)
    top = p.topk(2, dim=1).values
    return top[:, 0] - top[:, 1]


def max_prob_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Largest softmax probability of logits ``[N, K]`` -> ``[N]``."""
    return torch.softmax(_check_logits(logits).float(), dim=1).max(dim=1).values


def _from_model(fn: Callable[[torch.Tensor], torch.Tensor], model: nn.Module, x: torch.Tensor,
                batch_size: int | None) -> torch.Tensor:
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_images(x)
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    bs = batch_size or DEFAULT_BATCH_SIZE
    device = resolve_device(model)
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    with eval_mode(model), torch.no_grad():
        for s in range(0, x.shape[0], bs):
            e = min(s + bs, x.shape[0])
            out[s:e] = fn(forward(model, x[s:e].to(device))).to(x.device)
    return out


def gini(model: nn.Module, x: torch.Tensor, *, batch_size: int | None = None) -> torch.Tensor:
    """DeepGini ``1 - sum p^2`` of each image ``x`` ``[N, C, H, W]`` -> ``[N]`` on ``x``'s device."""
    return _from_model(gini_from_logits, model, x, batch_size)


def entropy(model: nn.Module, x: torch.Tensor, *, batch_size: int | None = None) -> torch.Tensor:
    """Softmax entropy (nats) of each image ``x`` ``[N, C, H, W]`` -> ``[N]`` on ``x``'s device."""
    return _from_model(entropy_from_logits, model, x, batch_size)


def margin(model: nn.Module, x: torch.Tensor, *, batch_size: int | None = None) -> torch.Tensor:
    """Top-1 minus top-2 probability of each image ``x`` ``[N, C, H, W]`` -> ``[N]`` (low = uncertain)."""
    return _from_model(margin_from_logits, model, x, batch_size)


def max_prob(model: nn.Module, x: torch.Tensor, *, batch_size: int | None = None) -> torch.Tensor:
    """Largest softmax probability of each image ``x`` ``[N, C, H, W]`` -> ``[N]`` (low = uncertain)."""
    return _from_model(max_prob_from_logits, model, x, batch_size)
