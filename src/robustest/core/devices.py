"""Devices: the model's device, an explicit device, and the channels_last memory format."""

from __future__ import annotations

import contextlib
import os
import weakref

import torch
from torch import nn

from robustest.core.errors import ConfigError


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); CPU for a parameter-free model."""
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def resolve_device(model: nn.Module | None = None, device: torch.device | str | None = None) -> torch.device:
    """An explicit ``device`` wins; else the model's device; else CPU. Never a silent ``cuda:0``.

    ``device="auto"`` picks CUDA when available, else CPU.
    """
    if device is not None:
        if isinstance(device, str) and device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ConfigError(f"unknown device {device!r}: use 'cpu', 'cuda', 'cuda:N' or 'auto'") from exc
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {device!r} requested but CUDA is not available: use --device cpu")
        return dev
    if model is not None:
        return model_device(model)
    return torch.device("cpu")


CHANNELS_LAST_MODES = ("auto", "on", "off")
_HAS_CONV: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
_IN_CHANNELS_LAST: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def channels_last_wanted(model: nn.Module, device: torch.device | str, mode: str | None = None) -> bool:
    """Whether :func:`forward` runs ``model`` on ``device`` in the ``channels_last`` memory format, and, when
    it does, converts the model's parameters to it (once; values unchanged). ``mode`` (default: the
    ``ROBUSTEST_CHANNELS_LAST`` environment variable, else "auto"): "auto" on CUDA only, "on" on any device,
    "off" never; always only for a model with ``nn.Conv2d`` layers, and never for a DistributedDataParallel
    wrapper (its gradient buckets are laid out when it is built)."""
    mode = mode or os.environ.get("ROBUSTEST_CHANNELS_LAST") or "auto"
    if mode not in CHANNELS_LAST_MODES:
        raise ConfigError(f"unknown channels_last mode {mode!r} (ROBUSTEST_CHANNELS_LAST): use auto, on or off")
    if mode == "off" or (mode == "auto" and torch.device(device).type != "cuda"):
        return False
    try:
        has = _HAS_CONV.get(model)
        if has is None:
            has = not isinstance(model, nn.parallel.DistributedDataParallel) and any(
                isinstance(m, nn.Conv2d) for m in model.modules())
            _HAS_CONV[model] = has
        if has and not _IN_CHANNELS_LAST.get(model, False):
            with torch.inference_mode(False):  # the converted weights stay usable by autograd
                model.to(memory_format=torch.channels_last)
            _IN_CHANNELS_LAST[model] = True
    except (TypeError, RuntimeError):  # a module that cannot be weak-referenced or converted runs as it is
        with contextlib.suppress(TypeError):
            _HAS_CONV[model] = False
        return False
    return bool(has)


#: the largest image (values per image, C x H x W) a model is run on: 3 x 1024 x 1024. Beyond it one forward
#: pass of one image can take gigabytes (a 4000 x 4000 image through a residual network was reported at 10 GB),
#: so a larger image set is refused by its shape before any forward pass
