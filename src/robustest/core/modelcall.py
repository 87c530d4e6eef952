"""The one model call (any output to logits, the model's dtype, channels_last) and the
model-mode context managers that restore what they change."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from robustest.core.devices import channels_last_wanted
from robustest.core.errors import ConfigError


def logits_of(output: Any) -> torch.Tensor:
    """The logits in a model's output: a tensor itself, the ``logits`` attribute or key (Hugging Face style),
    else the first tensor of a tuple/list or the first tensor value of a dict.

    Raises :class:`ConfigError` naming what was returned when no tensor of logits can be found; wrap such a
    model in :class:`robustest.models.Logits` with ``output=`` to say which part holds the logits.
    """
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):
        if isinstance(output.get("logits"), torch.Tensor):
            return output["logits"]
        for v in output.values():
            if isinstance(v, torch.Tensor):
                return v
    elif isinstance(getattr(output, "logits", None), torch.Tensor):
        return output.logits
    elif isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise ConfigError(f"the model returned a {type(output).__name__} without a tensor of logits: wrap it in "
                      "robustest.models.Logits(model, output=KEY_OR_INDEX) to say where the logits are")


def model_dtype(model: nn.Module) -> torch.dtype:
    """The floating dtype of the model's first floating parameter (float32 for a parameter-free model)."""
    for t in model.parameters():
        if t.is_floating_point():
            return t.dtype
    return torch.float32


def forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Call ``model`` on images ``x`` (N x C x H x W) and return its logits (N x K, float32 or wider).

    Every robustest call of a model goes through here, so any ``nn.Module`` works: the output may be a
    tensor, a tuple, a dict or an object with ``.logits``; the input is cast to the model's floating dtype
    (gradients still flow back to the original ``x``), and half-precision (bf16/fp16) logits are returned
    in float32, so losses, softmax and gradients are computed in float32. A conv net on CUDA runs in the
    ``channels_last`` memory format (:func:`channels_last_wanted`): same values, faster convolutions.
    """
    dt = model_dtype(model)
    if dt != x.dtype and x.is_floating_point():
        x = x.to(dt)
    if x.dim() == 4 and channels_last_wanted(model, x.device):
        x = x.contiguous(memory_format=torch.channels_last)
    out = logits_of(model(x))
    return out.float() if out.dtype in (torch.float16, torch.bfloat16) else out


def set_mode(model: nn.Module, train: bool) -> nn.Module:
    """``model.train(train)``, tolerating modules whose mode is fixed (a ``torch.export`` program's module
    raises NotImplementedError: its dropout/batch-norm behaviour was fixed when it was exported)."""
    try:
        model.train(train)
    except NotImplementedError:
        pass
    return model


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put ``model`` (and every sub-module) in eval mode; restore each module's previous mode on exit."""
    modes = [(m, m.training) for m in model.modules()]
    set_mode(model, False)
    try:
        yield model
    finally:
        for m, was_training in modes:
            m.training = was_training


@contextlib.contextmanager
def frozen_params(model: nn.Module) -> Iterator[nn.Module]:
    """Switch off ``requires_grad`` on the model's parameters (gradients w.r.t. inputs only); restore."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


@torch.no_grad()
def predict(model: nn.Module, data: Any, batch_size: int = 512, device: torch.device | str | None = None
            ) -> torch.Tensor:
    """Logits of ``model`` on ``data`` (images N x C x H x W, an (x, y) pair, a Dataset or a DataLoader), N x K float
    on the CPU, computed in batches of ``batch_size`` in eval mode (the model's mode restored), on ``device``
    (default: the model's)."""
    from robustest.core.batching import iter_batches
    from robustest.core.devices import resolve_device

    dev = resolve_device(model, device)
    outs = []
    with eval_mode(model):
        for xb, _ in iter_batches(data, batch_size, dev):
            outs.append(forward(model, xb).float().cpu())
    return torch.cat(outs) if outs else torch.empty(0)
