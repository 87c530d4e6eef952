"""A model as a graph of the operations bound propagation understands.

:func:`trace` follows the model's forward with ``torch.fx`` (so residual blocks written as ``out + shortcut`` are
followed too), runs it once on a zero input to learn every shape, and turns each step into an :class:`Op`:

``affine``   Linear, Conv2d (any stride, padding, dilation, groups), AvgPool2d and AdaptiveAvgPool2d (as
             depthwise convolutions), BatchNorm1d/2d in eval mode and the zoo's Normalize (as per-channel
             scale and shift); ``reshape`` (Flatten, view, reshape, flatten that keep the batch); ``identity``
             (Dropout, Identity); ``relu``; ``maxpool`` (non-overlapping windows: stride = kernel, no padding);
             ``add`` (the sum of two tensors of one shape).

Anything else is refused before any work with one line naming the layer and the supported set.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from robustest.core.errors import ConfigError
from robustest.models import Normalize

SUPPORTED = ("Linear", "Conv2d", "ReLU", "Flatten", "BatchNorm1d/2d (eval)", "AvgPool2d", "AdaptiveAvgPool2d",
             "MaxPool2d (stride = kernel, no padding)", "Normalize", "Dropout", "Identity", "x + y (residual add)")

_LEAVES = (nn.Linear, nn.Conv2d, nn.ReLU, nn.Flatten, nn.BatchNorm1d, nn.BatchNorm2d, nn.AvgPool2d,
           nn.AdaptiveAvgPool2d, nn.MaxPool2d, Normalize, nn.Dropout, nn.Identity)


@dataclass
class Op:
    """One step of the graph. ``inputs`` index earlier ops; shapes exclude the batch dimension.

    For ``affine`` ops, ``kind_detail`` is ``"linear"``, ``"conv"`` or ``"diag"`` and ``params`` holds
    ``weight``/``bias`` (linear, conv: with ``stride``, ``padding``, ``dilation``, ``groups``) or what
    :func:`diag_params` reads (a BatchNorm module, or Normalize's ``scale``/``shift``). ``maxpool`` holds ``kernel``.
    BatchNorm is bounded with its running statistics (its eval form) whatever the model's mode.
    """

    name: str
    kind: str
    inputs: tuple[int, ...]
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    kind_detail: str = ""
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Graph:
    """Ops in topological order: ``ops[0]`` is the input, ``ops[-1]`` the logits (N x K)."""

    ops: list[Op]

    def consumers(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.ops]
        for i, op in enumerate(self.ops):
            for j in op.inputs:
                out[j].append(i)
        return out


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, _LEAVES) or super().is_leaf_module(m, qualname)


class _Recorder(fx.Interpreter):
    """Runs the traced graph once, keeping every node's value so shape arguments can be read concretely."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[fx.Node, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        self.values[n] = value
        return value


def _refuse(what: str) -> ConfigError:
    return ConfigError(f"certify cannot bound {what}; supported layers: {', '.join(SUPPORTED)}")


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _avgpool_conv(channels: int, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int],
                  dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    weight = torch.full((channels, 1, *kernel), 1.0 / (kernel[0] * kernel[1]), dtype=dtype, device=device)
    return {"weight": weight, "bias": None, "stride": stride, "padding": padding, "dilation": (1, 1),
            "groups": channels}


def _conv_params(name: str, m: nn.Conv2d) -> dict[str, Any]:
    if m.padding_mode != "zeros":
        raise _refuse(f"layer '{name}' (Conv2d with padding_mode {m.padding_mode!r})")
    if m.padding == "valid":
        pad = (0, 0)
    elif m.padding == "same":
        total = [d * (k - 1) for d, k in zip(_pair(m.dilation), _pair(m.kernel_size))]
        if total[0] % 2 or total[1] % 2:
            raise _refuse(f"layer '{name}' (Conv2d with asymmetric 'same' padding)")
        pad = (total[0] // 2, total[1] // 2)
    else:
        pad = _pair(m.padding)
    return {"weight": m.weight, "bias": m.bias, "stride": _pair(m.stride), "padding": pad,
            "dilation": _pair(m.dilation), "groups": m.groups}


def _check_bn(m: nn.BatchNorm1d | nn.BatchNorm2d, name: str) -> None:
    if m.running_mean is None or m.running_var is None:
        raise _refuse(f"layer '{name}' (BatchNorm without running statistics)")


def diag_params(op: Op) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, shift)`` of a ``diag`` op, broadcastable over its shape; BatchNorm's are read from the module
    at each call (its running statistics in eval form), so a graph stays valid while the model trains."""
    if "module" not in op.params:
        return op.params["scale"], op.params["shift"]
    m = op.params["module"]
    scale = torch.rsqrt(m.running_var + m.eps)
    if m.weight is not None:
        scale = scale * m.weight
    shift = -m.running_mean * scale
    if m.bias is not None:
        shift = shift + m.bias
    view = (-1,) + (1,) * (len(op.in_shape) - 1)
    return scale.view(view), shift.view(view)


def _module_op(name: str, m: nn.Module, in_shape: tuple[int, ...], out_shape: tuple[int, ...],
               x: torch.Tensor) -> tuple[str, str, dict[str, Any]]:
    if isinstance(m, nn.Linear):
        return "affine", "linear", {"weight": m.weight, "bias": m.bias}
    if isinstance(m, nn.Conv2d):
        return "affine", "conv", _conv_params(name, m)
    if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
        _check_bn(m, name)
        return "affine", "diag", {"module": m}
    if isinstance(m, Normalize):
        inv = 1.0 / m.std.view(-1, 1, 1)
        return "affine", "diag", {"scale": inv, "shift": -m.mean.view(-1, 1, 1) * inv}
    if isinstance(m, nn.AvgPool2d):
        pad = _pair(m.padding)
        if m.ceil_mode or m.divisor_override is not None or (pad != (0, 0) and not m.count_include_pad):
            raise _refuse(f"layer '{name}' (AvgPool2d with ceil_mode, divisor_override or count_include_pad=False)")
        stride = _pair(m.stride if m.stride is not None else m.kernel_size)
        return "affine", "conv", _avgpool_conv(in_shape[0], _pair(m.kernel_size), stride, pad, x.dtype, x.device)
    if isinstance(m, nn.AdaptiveAvgPool2d):
        return "affine", "conv", _adaptive(name, in_shape, out_shape, x)
    if isinstance(m, nn.MaxPool2d):
        k, s = _pair(m.kernel_size), _pair(m.stride if m.stride is not None else m.kernel_size)
        if k != s or _pair(m.padding) != (0, 0) or _pair(m.dilation) != (1, 1) or m.ceil_mode:
            raise _refuse(f"layer '{name}' (MaxPool2d with overlapping windows, padding, dilation or ceil_mode)")
        return "maxpool", "", {"kernel": k}
    if isinstance(m, nn.ReLU):
        return "relu", "", {}
    if isinstance(m, nn.Flatten):
        return "reshape", "", {}
    if isinstance(m, (nn.Dropout, nn.Identity)):
        return "identity", "", {}
    raise _refuse(f"layer '{name}' ({type(m).__name__})")


def _adaptive(name: str, in_shape: tuple[int, ...], out_shape: tuple[int, ...], x: torch.Tensor) -> dict[str, Any]:
    (h, w), (oh, ow) = in_shape[-2:], out_shape[-2:]
    if h % oh or w % ow:
        raise _refuse(f"layer '{name}' (adaptive average pooling from {h}x{w} to {oh}x{ow}, not a whole factor)")
    k = (h // oh, w // ow)
    return _avgpool_conv(in_shape[0], k, k, (0, 0), x.dtype, x.device)


_ADD = (operator.add, torch.add)
_RELU = (F.relu, torch.relu)
_RESHAPE_METHODS = ("view", "reshape", "flatten")


def _function_op(n: fx.Node, values: dict[fx.Node, Any], in_shape: tuple[int, ...], out_shape: tuple[int, ...],
                 x: torch.Tensor) -> tuple[str, str, dict[str, Any]]:
    target = n.target
    if n.op == "call_method":
        if target in _RESHAPE_METHODS:
            return "reshape", "", {}
        if target == "relu":
            return "relu", "", {}
        raise _refuse(f"the tensor method '.{target}()' (node '{n.name}')")
    if target in _ADD:
        tensors = [a for a in n.args if isinstance(a, fx.Node) and isinstance(values.get(a), torch.Tensor)]
        if len(tensors) != 2 or len(n.args) != 2 or n.kwargs:
            raise _refuse(f"'{n.name}' (an addition with a constant or a scale)")
        return "add", "", {}
    if target in _RELU:
        return "relu", "", {}
    if target is torch.flatten:
        return "reshape", "", {}
    if target is F.avg_pool2d:
        args = [values[a] if isinstance(a, fx.Node) else a for a in n.args[1:]]
        kw = {k: values[v] if isinstance(v, fx.Node) else v for k, v in n.kwargs.items()}
        names = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
        opts = dict(zip(names, args)) | kw
        k = _pair(opts["kernel_size"])
        s = _pair(opts.get("stride") or k)
        pad = _pair(opts.get("padding", 0))
        if opts.get("ceil_mode") or opts.get("divisor_override") is not None or (
                pad != (0, 0) and not opts.get("count_include_pad", True)):
            raise _refuse(f"'{n.name}' (avg_pool2d with ceil_mode, divisor_override or count_include_pad=False)")
        return "affine", "conv", _avgpool_conv(in_shape[0], k, s, pad, x.dtype, x.device)
    if target is F.adaptive_avg_pool2d:
        return "affine", "conv", _adaptive(n.name, in_shape, out_shape, x)
    if target is operator.getitem:
        raise _refuse(f"'{n.name}' (indexing or slicing a tensor)")
    raise _refuse(f"the function '{getattr(target, '__name__', target)}' (node '{n.name}')")


def trace(model: nn.Module, input_shape: tuple[int, ...], *, dtype: torch.dtype = torch.float32,
          device: torch.device | str = "cpu") -> Graph:
    """The graph of ``model`` for inputs of ``input_shape`` (C x H x W, no batch). Raises ConfigError with one
    line for a layer bound propagation does not support or a forward ``torch.fx`` cannot follow."""
    if isinstance(model, torch.jit.ScriptModule):
        raise ConfigError("certify follows a model's Python forward, which a TorchScript archive does not keep: "
                          "certify the Python model (--model pkg.module:factory --weights FILE)")
    try:
        graph = _Tracer().trace(model)
    except Exception as exc:  # noqa: BLE001 - any tracing failure is the same refusal
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"certify cannot follow the model's forward ({first}); supported layers: "
                          f"{', '.join(SUPPORTED)}") from None
    gm = fx.GraphModule(model, graph)
    recorder = _Recorder(gm)
    x = torch.zeros((1, *input_shape), dtype=dtype, device=device)
    with torch.no_grad():
        recorder.run(x)
    values = recorder.values
    ops: list[Op] = []
    index: dict[fx.Node, int] = {}
    for n in graph.nodes:
        value = values.get(n)
        if n.op == "placeholder":
            if ops:
                raise _refuse("a model with more than one input")
            index[n] = 0
            ops.append(Op("input", "input", (), tuple(input_shape), tuple(input_shape)))
            continue
        if n.op == "output":
            src = n.args[0]
            if not isinstance(src, fx.Node) or src not in index:
                raise _refuse("a model whose output is not one tensor")
            last = index[src]
            if last != len(ops) - 1:  # the logits must be the last op: append an identity that points to it
                shape = ops[last].out_shape
                ops.append(Op("output", "identity", (last,), shape, shape))
            break
        if not isinstance(value, torch.Tensor):
            continue  # shape arithmetic (x.size(0), getitem): read concretely where an op needs it
        if n.op == "get_attr":
            raise _refuse(f"'{n.target}' (a tensor constant used in the forward)")
        tensor_args = [a for a in (*n.args, *n.kwargs.values()) if isinstance(a, fx.Node) and a in index]
        if not tensor_args:
            raise _refuse(f"'{n.name}' (a tensor that does not depend on the input)")
        in_shape = ops[index[tensor_args[0]]].out_shape
        out_shape = tuple(value.shape[1:])
        if value.ndim == 0 or value.shape[0] != 1:
            raise _refuse(f"'{n.name}' (an operation across the batch dimension)")
        if n.op == "call_module":
            kind, detail, params = _module_op(str(n.target), gm.get_submodule(str(n.target)), in_shape, out_shape, x)
        else:
            kind, detail, params = _function_op(n, values, in_shape, out_shape, x)
        if kind != "add" and len(tensor_args) != 1:
            raise _refuse(f"'{n.name}' (an operation on several tensors)")
        ops.append(Op(n.name, kind, tuple(index[a] for a in tensor_args), in_shape, out_shape, detail, params))
        index[n] = len(ops) - 1
    if len(ops[-1].out_shape) != 1:
        raise _refuse(f"a model whose output has shape {list(ops[-1].out_shape)} (logits N x K expected)")
    return Graph(ops)
