"""Checks that a model runs on a data set before the work starts: its fixed batch size, that it accepts
the images (one clear error instead of a shape error deep inside), and that its logits are finite."""

from __future__ import annotations

import math

import torch
from torch import nn

from robustest.core.batching import DataLike, image_shape, iter_batches, labels_of
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError, user_error
from robustest.core.inputs import check_image_size, check_logits
from robustest.core.modelcall import eval_mode, forward

#: values (images x C x H x W) of the first batch whose logits :func:`check_finite_logits` checks
FIRST_BATCH_VALUES = 2**20


def fixed_batch_size(model: nn.Module) -> int | None:
    """The batch size a ``torch.export`` program was exported for when its batch dimension is not dynamic (its
    image input's first dimension is a plain integer), else None (dynamic, or not an exported program)."""
    graph = getattr(model, "graph", None)
    if (getattr(model, "robustest_source", None) or {}).get("kind") != "export" or graph is None:
        return None
    for node in graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor) and val.dim() == 4:
            b = val.shape[0]
            return int(b) if isinstance(b, int) else None
    return None


def check_model_fits(model: nn.Module, data: DataLike, *, device: torch.device | str | None = None) -> int:
    """Check, before any work, that ``model`` takes the images of ``data`` and that its labels index its
    outputs: the data's image shape against :data:`MAX_IMAGE_VALUES` and the model's declared input, then one
    forward pass on one blank image of the data's shape. Returns the model's number of classes K. Raises
    :class:`ConfigError` naming the data's and the model's shapes otherwise.
    """
    shape = image_shape(data)
    check_image_size(shape)
    spec = getattr(model, "robustest_spec", None) or {}
    c, size = spec.get("in_channels"), spec.get("input_size")
    if c is not None and shape[0] != c:
        raise ConfigError(f"the model takes {c}-channel images but the data has {shape[0]} channels: check the "
                          "data set against the model")
    batch = fixed_batch_size(model)
    if batch is not None:
        raise ConfigError(f"the torch.export program was exported for batches of exactly {batch} images (its batch "
                          "dimension is fixed): export it again with a dynamic batch, dynamic_shapes=({0: "
                          "torch.export.Dim('batch')},), or pass the model as a checkpoint or --model")
    dev = resolve_device(model, device)
    x = torch.zeros((1, *shape), device=dev)
    try:
        with torch.no_grad(), eval_mode(model):
            out = forward(model, x)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the model raised, the input does not fit it
        first = " ".join(str(exc).split())[:160] or type(exc).__name__
        want = f" (it was built for {c or '?'}x{size}x{size})" if size else ""
        raise ConfigError(f"{model_name(model)} cannot take the data's {'x'.join(map(str, shape))} images{want}: "
                          f"{first}; "
                          "check the data set (or --resize) against the model's input") from exc
    if out.dim() != 2 or out.shape[0] != 1:
        raise ConfigError(f"the model returned outputs of shape {tuple(out.shape)} for one image: a classifier "
                          "returns N x K logits (wrap it in robustest.models.Logits to select them)")
    k = int(out.shape[1])
    if k < 2:
        raise ConfigError(f"the model has {k} output class(es): a classifier needs at least 2 classes")
    y = labels_of(data)
    if y is not None and y.numel() and int(y.max()) >= k:
        raise ConfigError(f"the data has label {int(y.max())} but the model has {k} classes: check the data set "
                          "against the model")
    return k


def check_finite_logits(model: nn.Module, data: DataLike, *, device: torch.device | str | None = None,
                        n: int = 32) -> None:
    """Before the work: the model's logits on the first ``n`` samples of ``data`` (fewer for large images: at
    most :data:`FIRST_BATCH_VALUES` values, at least one image) are finite (:func:`check_logits`), so a verb
    never writes results computed from NaN or infinite logits."""
    shape = image_shape(data)
    check_image_size(shape)
    n = max(1, min(n, FIRST_BATCH_VALUES // max(1, math.prod(int(d) for d in shape))))
    dev = resolve_device(model, device)
    for xb, _ in iter_batches(data, n, dev, workers=0):  # a few images: no worker processes to start
        try:
            with torch.no_grad(), eval_mode(model):
                out = forward(model, xb[:n])
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - the model's own code failed on real images
            raise ConfigError(f"{model_name(model)} raised {user_error(exc)} on the first batch of the data: fix its "
                              "forward (run it in Python on a batch to see the traceback)") from exc
        check_logits(out)
        return


def model_name(model: nn.Module) -> str:
    """How a one-line error names the code behind ``model``: the factory, zoo name or class it was built by."""
    src = getattr(model, "robustest_source", None) or {}
    spec = getattr(model, "robustest_spec", None) or {}
    if src.get("kind") == "factory":
        return f"the model built by {src.get('factory')}"
    if src.get("kind") == "export":
        return "the torch.export program"
    if src.get("kind") == "torchscript" or isinstance(model, torch.jit.ScriptModule):
        return "the TorchScript model"
    if spec.get("name"):
        return f"the zoo model {spec['name']}"
    cls = type(model)
    return f"the model {cls.__module__}.{cls.__qualname__}"
