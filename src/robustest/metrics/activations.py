"""Hook-based activation extraction for any ``nn.Module``, shared by coverage and surprise adequacy.

Layers are chosen by module name (``"relu1"``, ``"net.fc2"``; a name also matches a unique dotted suffix, so
``"relu1"`` finds ``"net.relu1"`` inside a model wrapped with a normalisation layer), by module type
(``nn.ReLU``, ``nn.Linear``) or by a list mixing both. The default is the output of every activation module
(ReLU, LeakyReLU, ELU, GELU, SiLU, Tanh, Sigmoid, ...); a model without any (one that calls ``F.relu`` in
``forward``) falls back to every ``Conv``/``Linear`` module except the last one (the logits).

A neuron of a convolutional layer is one channel: outputs of shape ``[N, C, *spatial]`` are reduced to
``[N, C]`` by the mean over the spatial positions, the convention of the coverage and surprise-adequacy
literature (DeepHunter, dnn-tip, Kim et al.'s SADL). Fully-connected outputs ``[N, F]`` are kept as they are.
The traces of all chosen layers are concatenated into one ``[N, F]`` float32 tensor, layers in the model's
module order.

Extraction runs the model in eval mode without gradients; hooks are always removed and each sub-module's
training flag restored, even when the forward pass raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from robustest.core import batching, devices, inputs, modelcall, reprs
from robustest.core.errors import ConfigError, DataError

__all__ = [
    "ACTIVATION_TYPES",
    "LayerSpec",
    "Traces",
    "capture",
    "default_layers",
    "extract",
    "iter_traces",
    "penultimate_features",
    "reduce_output",
    "resolve_layers",
]

LayerSpec = str | type | Sequence[str | type] | None

#: Module types whose outputs are the default coverage / surprise-adequacy layers.
ACTIVATION_TYPES: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.ELU, nn.CELU, nn.SELU, nn.GELU, nn.SiLU,
    nn.Mish, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Softplus, nn.Tanh, nn.Sigmoid,
)
_WEIGHT_TYPES: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def default_layers(model: nn.Module) -> list[str]:
    """Names of the default layers: every activation module, or else every Conv/Linear but the last."""
    named = [(n, m) for n, m in model.named_modules() if n]
    acts = [n for n, m in named if isinstance(m, ACTIVATION_TYPES)]
    if acts:
        return acts
    weights = [n for n, m in named if isinstance(m, _WEIGHT_TYPES)]
    if len(weights) >= 2:
        return weights[:-1]
    raise ConfigError(
        "the model has no activation modules and fewer than two Conv/Linear layers: choose layers= explicitly"
    )


_NO_HOOKS = ("coverage and surprise adequacy read layer activations through forward hooks, which a {what} does not "
             "run: load the model as Python code instead (--model pkg.module:factory --weights FILE)")


def _compiled_kind(model: nn.Module) -> str | None:
    """'TorchScript model' or 'torch.export program' when Python forward hooks cannot see inside ``model``."""
    if isinstance(model, torch.jit.ScriptModule):
        return "TorchScript model"
    src = getattr(model, "robustest_source", None)
    if isinstance(src, dict) and src.get("kind") == "export":
        return "torch.export program"
    return None


def resolve_layers(model: nn.Module, layers: LayerSpec = None) -> list[str]:
    """Resolve a layer choice to module names of ``model`` (in module order, no duplicates).

    ``layers``: None (the default layers), a name, a module type, or a sequence of names and types.
    A name matches a module exactly or, failing that, a unique dotted suffix (``"fc2"`` -> ``"net.fc2"``).
    """
    kind = _compiled_kind(model)
    if kind is not None:
        raise ConfigError(_NO_HOOKS.format(what=kind))
    if layers is None:
        return default_layers(model)
    specs = [layers] if isinstance(layers, (str, type)) else list(layers)
    if not specs:
        raise ConfigError("layers is empty: give at least one layer name or type (or None for the default)")
    named = [(n, m) for n, m in model.named_modules() if n]
    all_names = [n for n, _ in named]
    chosen: set[str] = set()
    for spec in specs:
        if isinstance(spec, type):
            hits = [n for n, m in named if isinstance(m, spec)]
            if not hits:
                raise ConfigError(f"the model has no {spec.__name__} module: choose other layers")
            chosen.update(hits)
        elif isinstance(spec, str):
            if spec in all_names:
                chosen.add(spec)
                continue
            hits = [n for n in all_names if n.endswith("." + spec)]
            if len(hits) == 1:
                chosen.add(hits[0])
            elif len(hits) > 1:
                raise ConfigError(f"layer name {spec!r} is ambiguous ({', '.join(hits)}): give the full dotted name")
            else:
                shown = ", ".join(all_names[:30]) + (" ..." if len(all_names) > 30 else "")
                raise ConfigError(f"the model has no layer named {spec!r}: choose from {shown}")
        else:
            raise ConfigError(f"a layer is a module name or an nn.Module type, got {type(spec).__name__}")
    return [n for n in all_names if n in chosen]


def reduce_output(out: Any) -> torch.Tensor:
    """One module output -> float32 ``[N, F]``: the first tensor of a tuple; ``[N, C, *spatial]`` -> mean
    over the spatial positions (one neuron per channel); ``[N]`` -> ``[N, 1]``. Always a fresh tensor."""
    if isinstance(out, (tuple, list)):
        out = next((o for o in out if isinstance(o, torch.Tensor)), None)
    if not isinstance(out, torch.Tensor):
        raise DataError("a chosen layer returns no tensor: choose layers whose output is a tensor")
    out = out.detach()
    if out.dim() == 1:
        out = out[:, None]
    if out.dim() > 2:
        return out.float().mean(dim=tuple(range(2, out.dim())))
    red = out.float()
    return red.clone() if red.data_ptr() == out.data_ptr() else red


@contextlib.contextmanager
def capture(model: nn.Module, names: Sequence[str]) -> Iterator[dict[str, list[torch.Tensor]]]:
    """Register forward hooks on the modules ``names``; yield a dict name -> list of reduced outputs.

    A module called several times in one forward pass appends one entry per call. The caller clears the
    lists between batches. Hooks are removed on exit, whatever happens inside the block.
    """
    modules = dict(model.named_modules())
    store: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    handles = []
    try:
        for n in names:
            def hook(_mod: nn.Module, _inp: Any, out: Any, _n: str = n) -> None:
                store[_n].append(reduce_output(out))

            handles.append(modules[n].register_forward_hook(hook))
        yield store
    finally:
        for h in handles:
            h.remove()


@dataclass
class Traces:
    """Activation traces of a batch: ``acts`` float32 ``[B, F]``, ``logits`` ``[B, K]``, ``index`` int64 ``[B]``
    (positions in the data set) and ``sizes`` (neurons per layer, summing to F)."""

    acts: torch.Tensor
    logits: torch.Tensor
    index: torch.Tensor
    sizes: list[int]

    def __repr__(self) -> str:
        return reprs.one_line(self, n=int(self.acts.shape[0]), acts=reprs.shape(self.acts),
                              logits=reprs.shape(self.logits), layers=len(self.sizes))


def iter_traces(model: nn.Module, data: Any, layers: LayerSpec = None, batch_size: int = 256,
                device: torch.device | str | None = None) -> Iterator[Traces]:
    """Stream activation traces of ``data`` (images ``[N, C, H, W]`` in [0, 1], or any data set) batch by batch.

    Runs under ``eval_mode`` and ``no_grad``; hooks are removed and modes restored when the iterator is
    exhausted or closed. Yields :class:`Traces` on the model's device.
    """
    dev = devices.resolve_device(model, device)
    names = resolve_layers(model, layers)
    sizes: list[int] | None = None
    with modelcall.eval_mode(model), capture(model, names) as store:
        for idx, xb, _ in batching.iter_batches(data, batch_size, dev, with_index=True):
            inputs.check_images(xb, "x")
            for v in store.values():
                v.clear()
            with torch.no_grad():  # not held across the yield: the caller's grad mode stays its own
                logits = modelcall.forward(model, xb)
            parts: list[torch.Tensor] = []
            for n in names:
                if not store[n]:
                    if type(model).__name__.startswith("GraphModule"):  # its graph calls functions, not modules
                        raise ConfigError(_NO_HOOKS.format(what="torch.export or traced graph module"))
                    raise ConfigError(f"layer {n!r} is not used in the model's forward pass: choose another layer")
                parts.extend(store[n])
            b_sizes = [p.shape[1] for p in parts]
            if sizes is None:
                sizes = b_sizes
            elif sizes != b_sizes:
                raise DataError("the chosen layers' sizes change between batches: give inputs of one shape")
            yield Traces(torch.cat(parts, dim=1), logits.detach(), idx.to(xb.device), list(sizes))


def extract(model: nn.Module, data: Any, layers: LayerSpec = None, batch_size: int = 256,
            device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """All activation traces of ``data``: ``(acts [N, F] float32, logits [N, K])`` on the model's device."""
    acts, logits = [], []
    it = iter_traces(model, data, layers, batch_size, device)
    with contextlib.closing(it):  # type: ignore[type-var]
        for t in it:
            acts.append(t.acts)
            logits.append(t.logits)
    if not acts:
        raise DataError("no inputs given: the data set is empty")
    return torch.cat(acts), torch.cat(logits)


def penultimate_features(model: nn.Module, data: Any, batch_size: int = 512,
                         device: torch.device | str | None = None) -> torch.Tensor:
    """Penultimate-layer features of ``data`` (images ``[N, C, H, W]`` in [0, 1], or any data set): float32
    ``[N, D]`` on the model's device, the output of the deepest default layer (the last hidden activation
    module, or the last Conv/Linear before the logits; :func:`default_layers`), conv outputs averaged over
    space. The embedding core-set selection (``selection.select(..., "kcenter")``) works on."""
    return extract(model, data, default_layers(model)[-1:], batch_size=batch_size, device=device)[0]
