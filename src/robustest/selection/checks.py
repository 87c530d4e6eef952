"""Input checks shared by the selection strategies: each turns what the caller passed into the tensor a
strategy expects, or raises :class:`~robustest.core.errors.ConfigError` with a one-line message."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from robustest.core.errors import ConfigError

__all__ = ["as_tensor", "check_bits", "check_features", "check_inputs", "check_k", "check_labels", "check_n",
           "check_scores"]


def as_tensor(scores: Any) -> torch.Tensor:
    """``scores`` as a CPU tensor (a tensor is detached and moved, anything else goes through numpy)."""
    if isinstance(scores, torch.Tensor):
        return scores.detach().cpu()
    try:
        return torch.as_tensor(np.asarray(scores))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"scores must be a tensor or array of numbers, got {type(scores).__name__}") from exc


def check_scores(scores: Any) -> torch.Tensor:
    """Real, finite scores ``[N]`` -> float64 ``[N]`` on the CPU."""
    s = as_tensor(scores)
    if s.dim() != 1:
        raise ConfigError(f"scores must be a 1-D tensor [N] (one score per input), got shape {tuple(s.shape)}")
    if s.dtype == torch.bool or s.is_complex():
        raise ConfigError(f"scores must be real numbers, got dtype {s.dtype}")
    s = s.to(torch.float64)
    if bool(torch.isnan(s).any()):
        raise ConfigError(f"scores contain {int(torch.isnan(s).sum())} NaN values: drop or recompute them first")
    if bool(torch.isinf(s).any()):
        raise ConfigError("scores contain infinite values: clip or drop them first")
    return s


def check_bits(bits: Any, strategy: str = "coverage") -> torch.Tensor:
    """0/1 coverage cells ``[N, F]`` -> BoolTensor ``[N, F]`` on the CPU (``strategy`` names the caller)."""
    b = as_tensor(bits)
    if b.dim() != 2:
        raise ConfigError(f"strategy {strategy!r} needs a BoolTensor [N, F] of covered cells (profile.bits), got "
                          f"shape {tuple(b.shape)}")
    if b.dtype != torch.bool:
        if b.is_floating_point() and bool(torch.isnan(b).any()):
            raise ConfigError("coverage cells contain NaN: pass a BoolTensor [N, F] from profile.bits")
        if not bool(((b == 0) | (b == 1)).all()):
            raise ConfigError(f"strategy {strategy!r} needs 0/1 (boolean) coverage cells [N, F], got other values")
        b = b.bool()
    return b


def check_features(feats: Any, strategy: str = "kcenter") -> torch.Tensor:
    """Finite real features ``[N, D]`` -> a floating ``[N, D]`` on the features' own device (half precision is
    widened to float32; ``strategy`` names the caller)."""
    f = feats.detach() if isinstance(feats, torch.Tensor) else as_tensor(feats)  # keeps the features' device
    if f.dim() != 2:
        raise ConfigError(f"strategy {strategy!r} needs a float tensor [N, D] of features (e.g. penultimate-layer "
                          f"activations), got shape {tuple(f.shape)}")
    if f.dtype == torch.bool or f.is_complex():
        raise ConfigError(f"{strategy} features must be real numbers, got dtype {f.dtype}")
    f = f.float() if not f.is_floating_point() or f.dtype in (torch.float16, torch.bfloat16) else f
    if not bool(torch.isfinite(f).all()):
        raise ConfigError(f"{strategy} features contain NaN or infinite values: recompute them (is the model "
                          "diverged?)")
    return f


def check_inputs(scores: Any, needs: str, strategy: str) -> torch.Tensor:
    """Check ``scores`` as what a strategy ``needs`` (``scores``, ``bits`` or ``features``, see
    :data:`robustest.selection.registry.INPUTS`)."""
    if needs == "bits":
        return check_bits(scores, strategy)
    if needs == "features":
        return check_features(scores, strategy)
    return check_scores(scores)


def check_n(n: Any) -> int:
    """A selection size: a non-negative integer."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ConfigError(f"n must be a non-negative integer, got {n!r}")
    n = int(n)
    if n < 0:
        raise ConfigError(f"n must be >= 0, got {n}")
    return n


def check_k(k: Any) -> int:
    """A number of sections or bins: a positive integer."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"k must be a positive integer, got {k!r}")
    return int(k)


def check_labels(labels: Any, num: int) -> torch.Tensor:
    """Integer class labels, one per score -> int64 ``[num]``."""
    lab = as_tensor(labels)
    if lab.dim() != 1 or lab.shape[0] != num:
        raise ConfigError(f"labels must be a 1-D tensor with one label per score ({num}), got shape "
                          f"{tuple(lab.shape)}")
    if lab.is_floating_point() or lab.dtype == torch.bool or lab.is_complex():
        raise ConfigError(f"labels must be integer class indices, got dtype {lab.dtype}")
    return lab.to(torch.int64)
