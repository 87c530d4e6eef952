"""Size and cost of a model: parameters and multiply-adds of one forward pass of one image (:func:`profile`), and
the zoo as a table of them (:func:`catalogue`, what ``robustest info --models`` prints).

Multiply-adds (MACs) are counted by ``torch.utils.flop_counter.FlopCounterMode`` (MACs = FLOPs / 2) over
convolutions, matrix products and attention (q k^T and the weighted sum of v); normalisation, activations,
pooling and additions are not counted, the convention of the published figures (ResNet-50: 4.1 GMACs).
A zoo model named by string is built on the ``meta`` device, so profiling the largest ones allocates no
weights and computes nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError
from robustest.core.modelcall import eval_mode, forward
from robustest.models.registry import create, describe, names, native, resolve_name, variants

__all__ = ["catalogue", "profile", "si"]


def _sdpa_cpu_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# attention kernels FlopCounterMode does not know (the CPU one); the CUDA and meta ones are registered by torch
_EXTRA: dict[Any, Any] = {}
if hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
    _EXTRA[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu] = _sdpa_cpu_flops


def profile(model: str | nn.Module, input_size: int | None = None, in_channels: int | None = None, *,
            num_classes: int | None = None, **options: Any) -> dict[str, int]:
    """``{"params": P, "macs": M}`` of ``model`` on one ``in_channels`` x ``input_size`` x ``input_size`` image.

    ``model`` is a zoo name (``"resnet50"``, ``"wrn-28-10"``; sizes and classes default to its native ones,
    ``options`` are passed to :func:`robustest.models.create`) or any ``nn.Module`` (sizes default to its
    zoo spec; one forward pass of a zero image on the model's device, in eval mode, without gradients).
    ``params`` counts trainable and frozen parameters, not buffers.
    """
    if isinstance(model, str):
        c0, s0, k0 = native(model)
        c = c0 if in_channels is None else in_channels
        s = s0 if input_size is None else input_size
        with torch.device("meta"):
            net = create(model, num_classes=k0 if num_classes is None else num_classes, in_channels=c,
                             input_size=s, **options)
    elif isinstance(model, nn.Module):
        if options or num_classes is not None:
            raise ConfigError("options and num_classes apply to a zoo model given by name, not to a built model")
        net = model
        spec = getattr(model, "robustest_spec", None) or {}
        c = spec.get("in_channels") if in_channels is None else in_channels
        s = spec.get("input_size") if input_size is None else input_size
        if c is None or s is None:
            raise ConfigError("the model has no zoo spec: give input_size and in_channels")
    else:
        raise ConfigError(f"model must be a zoo model name or an nn.Module, got {type(model).__name__}")
    for arg, val in (("input_size", s), ("in_channels", c)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ConfigError(f"{arg} must be a positive integer, got {val!r}")
    params = sum(p.numel() for p in net.parameters())
    x = torch.zeros(1, c, s, s, device=resolve_device(net))
    counter = FlopCounterMode(display=False, custom_mapping=_EXTRA)
    with eval_mode(net), torch.no_grad(), counter:
        forward(net, x)
    return {"params": int(params), "macs": int(counter.get_total_flops()) // 2}


def si(n: int) -> str:
    """A count in SI units, with two decimals below ten of the unit and one above: 950 -> "950", 1234 -> "1.23k",
    25_557_032 -> "25.6M" (999,999 -> "1000.0k": the unit is the largest the count reaches)."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}" if n < 10 * scale else f"{n / scale:.1f}{unit}"
    return str(n)


def catalogue() -> list[dict[str, str]]:
    """The zoo as a table: one row per model and named variant (``wrn-28-10``) with its name, native input
    (``CxHxW``), classes, parameters and multiply-adds at that input (:func:`si`) and description (a variant's:
    its family and options)."""
    rows = []
    for name in names() + variants():
        c, s, k = native(name)
        prof = profile(name)
        family, opts = resolve_name(name)
        desc = describe(name) if family == name else f"{family} with " + ", ".join(f"{o} {v}" for o, v in opts.items())
        rows.append({"name": name, "input": f"{c}x{s}x{s}", "classes": str(k), "params": si(prof["params"]),
                     "MACs": si(prof["macs"]), "description": desc})
    return rows
