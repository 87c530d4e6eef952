"""Runtime helpers every other module uses: seeding, devices, batching, model modes, atomic writes,
input validation, progress bars and independent CPU tasks on several threads.

One place for these so that the data contract (float32 N x C x H x W in [0, 1], int64 labels, device
taken from the model, modes restored after use) is enforced the same way everywhere.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import random
import tempfile
import weakref
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from robustest.distributed import Shard, count_share, is_main
from robustest.errors import ConfigError, DataError, OutputError

DataLike = Any  # (x, y) tensor pair, a bare x tensor, a Dataset or a DataLoader
T = TypeVar("T")

__all__ = [
    "MAX_ARRAY_BYTES",
    "Shard",
    "as_tensors",
    "atomic_save",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_images",
    "check_labels",
    "channels_last_wanted",
    "check_finite_logits",
    "check_logits",
    "check_model_fits",
    "check_torch_file",
    "converts_batches",
    "eval_mode",
    "forward",
    "frozen_params",
    "image_shape",
    "iter_batches",
    "labels_of",
    "load_plain",
    "logits_of",
    "make_generator",
    "max_array_bytes",
    "model_device",
    "num_samples",
    "progress",
    "resolve_device",
    "run_tasks",
    "seed_everything",
    "set_mode",
    "split_batch",
    "take",
]


# ------------------------------------------------------------------------------------------- CPU tasks
def run_tasks(count: int, task: Callable[[int], T]) -> list[T]:
    """``[task(0), ..., task(count - 1)]``, on up to ``torch.get_num_threads()`` threads that each take the
    next task as soon as they finish one (dynamic scheduling: a thread that the OS deschedules because other
    processes share the cores delays only the task it holds, never waits at a barrier for the others). For
    work torch runs serially on the CPU, such as seeded random draws. The tasks must not depend on each other
    or on the order they run in; results come back in task order."""
    workers = min(torch.get_num_threads(), count)
    if workers <= 1 or count < 4:  # a few tasks do not pay for starting threads
        return [task(i) for i in range(count)]
    # a pool per call: threads that outlive their work keep OpenMP thread teams alive, and with more
    # OpenMP threads than cores libgomp stops spinning between parallel regions, which made every later
    # small tensor operation of the process slower (measured: spatter 2x slower after shot_noise).
    # ThreadPoolExecutor hands each idle worker the next queued task.
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="robustest-tasks") as pool:
        return list(pool.map(task, range(count)))


# ----------------------------------------------------------------------------------------------- seeding
def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's global generators (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def make_generator(seed: int | None, device: torch.device | str | None = None) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (a fresh random seed when None)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    gen = torch.Generator(device=dev)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen


# ------------------------------------------------------------------------------------------------ device
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


# ------------------------------------------------------------------------------------------ model calls
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
MAX_IMAGE_VALUES = 3 * 1024 * 1024
#: values (images x C x H x W) of the first batch whose logits :func:`check_finite_logits` checks
FIRST_BATCH_VALUES = 2**20


def check_image_size(shape: tuple[int, ...]) -> None:
    """Refuse images larger than :data:`MAX_IMAGE_VALUES` (one line naming the shape), before any model sees
    one."""
    values = math.prod(int(d) for d in shape)
    if values > MAX_IMAGE_VALUES:
        raise ConfigError(f"the images are {'x'.join(map(str, shape))} ({values:,} values each), more than the "
                          f"{MAX_IMAGE_VALUES:,} (3 x 1024 x 1024) a model is run on: resize them (image folders: "
                          "--resize H W) to the size the model was built for")


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
        raise ConfigError(f"the model cannot take the data's {'x'.join(map(str, shape))} images{want}: {first}; "
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


def check_logits(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` unchanged when every value is finite; :class:`DataError` (one line) otherwise. The one check
    of a model's outputs: a model with NaN weights (a diverged training run) or an input scaling that
    overflows gives NaN or infinite logits, and every accuracy, score or attack computed on them is wrong."""
    if not bool(torch.isfinite(logits).all()):
        raise DataError("the model outputs NaN or infinite logits: check its weights (a diverged training run "
                        "leaves NaN weights) and its input scaling")
    return logits


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
        with torch.no_grad(), eval_mode(model):
            check_logits(forward(model, xb[:n]))
        return


# ----------------------------------------------------------------------------------------------- modes
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


# ------------------------------------------------------------------------------------------- validation
def check_images(x: Any, name: str = "x", *, allow_3d: bool = False, allow_uint8: bool = False) -> torch.Tensor:
    """Validate an image batch: a floating tensor N x C x H x W, finite, values in [0, 1].

    Returns the tensor (unchanged). Raises :class:`DataError` with a one-line message otherwise.
    ``allow_3d`` accepts a single C x H x W image and returns it with a batch axis added. ``allow_uint8``
    also accepts uint8 levels 0..255 (always finite and in range: only the shape is checked).
    """
    if not isinstance(x, torch.Tensor):
        raise DataError(f"{name} must be a torch.Tensor, got {type(x).__name__}: convert with torch.as_tensor")
    if allow_3d and x.dim() == 3:
        x = x.unsqueeze(0)
    if x.dim() != 4:
        raise DataError(
            f"{name} must have shape N x C x H x W, got {tuple(x.shape)}: add a channel axis with x[:, None]"
        )
    n_, c_, h_, w_ = x.shape
    if c_ > 4 and w_ in (1, 3, 4) and c_ == h_:
        raise DataError(f"{name} has shape {tuple(x.shape)}, which looks like N x H x W x C (channels last); robustest "
                        "takes N x C x H x W: use x.permute(0, 3, 1, 2)")
    if allow_uint8 and x.dtype == torch.uint8:
        return x
    if not x.is_floating_point():
        raise DataError(f"{name} has dtype {x.dtype}; images must be floating point in [0, 1]: use x.float() / 255")
    if x.numel() == 0:
        return x
    # one pass: min and max propagate NaN, and an infinity shows up as the min or the max
    lo_t, hi_t = torch.aminmax(x)
    lo, hi = float(lo_t), float(hi_t)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise DataError(f"{name} contains NaN or infinite values: clean the input before testing")
    if lo < 0.0 or hi > 1.0:
        raise DataError(
            f"{name} values lie in [{lo:.4g}, {hi:.4g}] but must lie in [0, 1]: "
            "rescale (e.g. x / 255) and keep normalisation inside the model"
        )
    return x


def check_labels(y: Any, n: int, num_classes: int | None = None, name: str = "y") -> torch.Tensor:
    """Validate labels: an integer tensor of shape [n] with values in [0, num_classes)."""
    if not isinstance(y, torch.Tensor):
        raise DataError(f"{name} must be a torch.Tensor of class indices, got {type(y).__name__}")
    if y.dim() != 1 or y.shape[0] != n:
        raise DataError(
            f"{name} must have shape [{n}] (class indices, not one-hot), got {tuple(y.shape)}"
        )
    if y.is_floating_point() or y.dtype == torch.bool:
        raise DataError(f"{name} has dtype {y.dtype}; labels must be integer class indices: use y.long()")
    if n and num_classes is not None:
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= num_classes:
            raise DataError(f"{name} has labels in [{lo}, {hi}] outside [0, {num_classes}): check the label encoding")
    return y


# --------------------------------------------------------------------------------------------- batching
def as_tensors(data: DataLike) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Materialise any data-like object as full tensors ``(x, y)`` (``y`` None for a bare x tensor)."""
    if isinstance(data, torch.Tensor):
        return data, None
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        y = data[1]
        if y is not None and not isinstance(y, torch.Tensor):
            y = torch.as_tensor(y)
        return data[0], y
    if isinstance(data, TensorDataset) and len(data.tensors) >= 2:
        return data.tensors[0], data.tensors[1]
    if isinstance(data, TensorDataset) and len(data.tensors) == 1:
        return data.tensors[0], None
    if converts_batches(data):
        return data.get_batch(slice(None))
    if not isinstance(data, (Dataset, DataLoader)):  # anything else would recurse via iter_batches
        raise DataError(f"unsupported data of type {type(data).__name__}: pass an (x, y) pair of torch tensors, "
                        "an x tensor, a Dataset or a DataLoader")
    xs, ys = [], []
    for x, y in iter_batches(data, batch_size=1024):
        xs.append(x)
        ys.append(y)
    if not xs:
        raise DataError("the data set is empty: check the split and the path")
    return torch.cat(xs), (torch.cat(ys) if ys[0] is not None else None)


def checked_inputs(x: DataLike, y: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Images and optional labels from an x tensor (with ``y`` given or not) or any data-like object
    (whose labels are used unless ``y`` is given), validated: x N x C x H x W in [0, 1], y int [N] or None."""
    if not isinstance(x, torch.Tensor):
        x, y_data = as_tensors(x)
        y = y if y is not None else y_data
    x = check_images(x)
    if y is not None:
        y = check_labels(y, int(x.shape[0]))
    return x, y


def converts_batches(data: Any) -> bool:
    """A data set that converts whole batches itself (``robustest.data.ImageDataset``)."""
    return isinstance(data, Dataset) and callable(getattr(type(data), "get_batch", None))


#: keys of a dict sample or batch (Hugging Face style) that hold the images and the labels, in order of preference
IMAGE_KEYS = ("pixel_values", "image", "images", "img", "x")
LABEL_KEYS = ("labels", "label", "targets", "target", "y")


def split_batch(batch: Any) -> tuple[Any, Any]:
    """(images, labels or None) of one sample or batch as a Dataset or DataLoader yields it: a tuple/list, a
    mapping with an image key (:data:`IMAGE_KEYS`: ``pixel_values``, ``image``, ...) and optionally a label key
    (:data:`LABEL_KEYS`: ``labels``, ``label``, ...), or a bare tensor. A mapping without an image key is a
    :class:`DataError` naming the keys it has."""
    if isinstance(batch, (tuple, list)):
        return batch[0], (batch[1] if len(batch) > 1 else None)
    if isinstance(batch, Mapping):
        xk = next((k for k in IMAGE_KEYS if k in batch), None)
        if xk is None:
            raise DataError(f"a data set item is a dict with keys {sorted(map(str, batch))[:8]}: robustest reads the "
                            f"images from one of {', '.join(IMAGE_KEYS)} and the labels from one of "
                            f"{', '.join(LABEL_KEYS)}")
        yk = next((k for k in LABEL_KEYS if k in batch), None)
        return batch[xk], (batch[yk] if yk is not None else None)
    return batch, None


@contextlib.contextmanager
def _worker_errors() -> Iterator[None]:
    """Re-raise a robustest error from a DataLoader worker as the one-line error it was (DataLoader wraps it
    in a multi-line message carrying the worker's traceback)."""
    from robustest.errors import RobustestError

    try:
        yield
    except RobustestError as exc:
        text = str(exc)
        if text.startswith("Caught ") and "Original Traceback" in text:
            last = text.strip().splitlines()[-1]
            raise type(exc)(last.split(": ", 1)[1] if ": " in last else last) from None
        raise


def _part(shard: Shard, n: int, align: int, span: tuple[int, int] | None) -> tuple[int, int]:
    """[lo, hi) of positions this shard reads: the ``span`` of the data (default all ``n``) cut into
    contiguous rank parts whose boundaries fall on multiples of ``align`` counted from the span's start."""
    a, b = (0, n) if span is None else (max(0, min(n, int(span[0]))), max(0, min(n, int(span[1]))))
    lo, hi = shard.bounds(max(0, b - a), align=align)
    return a + lo, a + hi


def _loader_index_batches(loader: DataLoader, shard: Shard, span: tuple[int, int] | None = None
                          ) -> list[list[int]] | None:
    """The data set indices of every batch ``loader`` would yield now (its sampler's draw), this shard's part
    (``span``: positions in the loader's order)."""
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return None
    if loader.batch_sampler is not None:
        batches = [[int(i) for i in b] for b in loader.batch_sampler]
        size = loader.batch_size or max((len(b) for b in batches), default=1)
    else:
        batches = [[int(i)] for i in loader.sampler]
        size = 1
    if shard.world_size == 1 and span is None:
        return batches
    flat = [i for b in batches for i in b]
    lo, hi = _part(shard, len(flat), size, span)
    flat = flat[lo:hi]
    return [flat[s:s + size] for s in range(0, len(flat), size)]


def batch_origin(data: DataLike, batch_size: int, shard: Shard | None = None) -> tuple[int, int]:
    """(batch length, first position): the length of the batches :func:`iter_batches` yields for ``data``
    (``batch_size``, or a DataLoader's own) and the position in the data of ``shard``'s first sample, so that
    a caller numbers its batches ``k = position // length`` exactly as a single process would."""
    step = data.batch_size if isinstance(data, DataLoader) and data.batch_size else batch_size
    return step, (shard or Shard()).bounds(num_samples(data), align=step)[0]


def iter_batches(
    data: DataLike,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    *,
    with_index: bool = False,
    shard: Shard | None = None,
    workers: int | None = None,
    span: tuple[int, int] | None = None,
    align: int | None = None,
) -> Iterator[Any]:
    """Iterate over ``data`` yielding ``(x, y)`` batches on ``device`` (``y`` None for unlabelled data).

    ``data`` may be an ``(x, y)`` tensor pair, a bare ``x`` tensor, a ``TensorDataset``, a robustest
    ``ImageDataset`` (converted batch by batch from its compact storage), any other ``Dataset`` (read in
    order through a DataLoader with ``workers`` worker processes, default the data set's ``num_workers``
    attribute or 0) or a ``DataLoader``. With ``with_index=True`` yields ``(idx, x, y)`` where ``idx`` holds
    the int64 positions of the batch's samples IN THE DATA SET: for a DataLoader, the indices its sampler
    drew (so shuffling never changes which sample a result belongs to; an ``IterableDataset`` has no
    indices, and its samples are numbered in stream order). With ``shard`` (e.g. ``Shard.current()`` under
    torchrun) only that contiguous part is read, its boundaries on multiples of ``batch_size`` so every rank
    sees exactly the batches a single process would; by default the whole data set. ``span=(lo, hi)``
    restricts the iteration to those positions (before sharding). ``align`` (default ``batch_size``) sets the
    multiple the rank parts' boundaries fall on instead: work whose results do not depend on the batching
    (``analyze``, seeded per block of 16 samples) balances the ranks better with a small ``align``.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    dev = torch.device(device) if device is not None else None
    shard = shard or Shard()
    pin = dev is not None and dev.type == "cuda"
    if align is not None and (isinstance(align, bool) or not isinstance(align, int) or align < 1):
        raise ConfigError(f"align must be a positive integer, got {align!r}")
    unit = align or batch_size

    def move(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or dev is None:
            return t
        return t.to(dev, non_blocking=True)

    def out(idx: torch.Tensor, x: Any, y: Any) -> Any:
        if shard.world_size > 1:
            count_share(len(idx))
        return (idx, move(x), move(y)) if with_index else (move(x), move(y))

    if isinstance(data, DataLoader):
        batches = _loader_index_batches(data, shard, span)
        with _worker_errors():
            if batches is None:  # an IterableDataset: number the samples in stream order
                start = 0
                for batch in data:
                    x, y = split_batch(batch)
                    yield out(torch.arange(start, start + len(x)), x, y)
                    start += len(x)
                return
            kw: dict[str, Any] = {}
            if data.num_workers > 0:
                kw = {"prefetch_factor": data.prefetch_factor, "worker_init_fn": data.worker_init_fn,
                      "multiprocessing_context": data.multiprocessing_context}
            fixed = DataLoader(data.dataset, batch_sampler=batches, num_workers=data.num_workers,
                               collate_fn=data.collate_fn, pin_memory=data.pin_memory or pin, **kw)
            for idx, batch in zip(batches, fixed):
                x, y = split_batch(batch)
                yield out(torch.as_tensor(idx, dtype=torch.int64), x, y)
                del batch, x, y
                trim_heap()
        return

    if converts_batches(data):
        lo, hi = _part(shard, len(data), unit, span)  # type: ignore[arg-type]
        for s in range(lo, hi, batch_size):
            e = min(s + batch_size, hi)
            x, y = data.get_batch(slice(s, e))
            if pin:
                x = x.pin_memory()
            yield out(torch.arange(s, e), x, y)
        return

    if isinstance(data, Dataset) and not isinstance(data, TensorDataset):
        n = len(data)  # type: ignore[arg-type]
        lo, hi = _part(shard, n, unit, span)
        nw = int(workers if workers is not None else getattr(data, "num_workers", 0) or 0)
        subset = torch.utils.data.Subset(data, range(lo, hi))
        start = lo
        with _worker_errors():
            for batch in DataLoader(subset, batch_size=batch_size, shuffle=False, num_workers=nw, pin_memory=pin):
                x, y = split_batch(batch)
                n_batch = len(x)
                yield out(torch.arange(start, start + n_batch), x, y)
                start += n_batch
                del batch, x, y
                trim_heap()
        return

    x, y = as_tensors(data)
    n = x.shape[0]
    if y is not None and y.shape[0] != n:
        raise DataError(f"x has {n} samples but y has {y.shape[0]}: give one label per image")
    lo, hi = _part(shard, n, unit, span)
    for s in range(lo, hi, batch_size):
        e = min(s + batch_size, hi)
        yield out(torch.arange(s, e), x[s:e], y[s:e] if y is not None else None)


_LIBC: Any = None


def trim_heap() -> None:
    """Give freed heap memory back to the operating system (glibc's ``malloc_trim``; a no-op elsewhere).

    Streaming decoded images interleaves each batch's large buffers with many small allocations, and glibc
    then keeps the freed buffers: resident memory grows with the number of batches although nothing is
    held (measured: 1.4 GB after 20,000 PNGs of 64 x 64, 0.76 GB with a trim per batch, at no cost in time).
    """
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


def take(data: DataLike, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The samples at data-set positions ``index`` (int64 [K]) of any data-like object, as (x, y) tensors.

    For a DataLoader the positions refer to its data set (as :func:`iter_batches` reports them), so a
    shuffled loader gives back exactly the samples an analysis named.
    """
    index = torch.as_tensor(index, dtype=torch.int64).reshape(-1)
    n = num_samples(data)
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= n):
        raise DataError(f"sample index out of range: positions must lie in [0, {n}), got "
                        f"[{int(index.min())}, {int(index.max())}]")
    if isinstance(data, DataLoader):
        data = data.dataset
    if converts_batches(data):
        return data.get_batch(index)
    if isinstance(data, Dataset) and not isinstance(data, TensorDataset):
        if index.numel() == 0:
            raise DataError("no samples to take: the index is empty")
        items = [data[int(i)] for i in index]
        batch = torch.utils.data.default_collate(items)
        x, y = split_batch(batch)
        return x, y
    x, y = as_tensors(data)
    return x[index], (y[index] if y is not None else None)


def labels_of(data: DataLike) -> torch.Tensor | None:
    """The int64 labels of a data set without reading its images, when it keeps them apart (else None)."""
    if isinstance(data, DataLoader):
        data = data.dataset
    if isinstance(data, torch.Tensor):
        return None
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        return torch.as_tensor(data[1]) if data[1] is not None else None
    labels = getattr(data, "labels", None)
    if isinstance(labels, torch.Tensor):
        return labels
    tensors = getattr(data, "tensors", None) if isinstance(data, TensorDataset) else None
    if isinstance(tensors, tuple) and len(tensors) >= 2:
        return tensors[1]
    return None


def image_shape(data: DataLike) -> tuple[int, ...]:
    """(C, H, W) of the images of any data-like object (reads at most one sample)."""
    if isinstance(data, DataLoader):
        data = data.dataset
    shape = getattr(data, "image_shape", None)
    if shape is not None:
        return tuple(shape)
    if isinstance(data, torch.Tensor):
        return tuple(data.shape[1:])
    if isinstance(data, (tuple, list)) and isinstance(data[0], torch.Tensor):
        return tuple(data[0].shape[1:])
    if isinstance(data, TensorDataset):
        return tuple(data.tensors[0].shape[1:])
    if isinstance(data, Dataset):
        x, _ = split_batch(data[0])
        return tuple(torch.as_tensor(x).shape)
    raise DataError(f"unsupported data of type {type(data).__name__}")


def num_samples(data: DataLike) -> int:
    """Number of samples in any data-like object."""
    if isinstance(data, torch.Tensor):
        return int(data.shape[0])
    if isinstance(data, (tuple, list)) and isinstance(data[0], torch.Tensor):
        return int(data[0].shape[0])
    if isinstance(data, DataLoader):
        return len(data.dataset)  # type: ignore[arg-type]
    return len(data)


# ---------------------------------------------------------------------------------------- atomic writes
def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, all_ranks: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename).

    Under torchrun only rank 0 writes (other ranks return at once), so outputs are never written twice;
    ``all_ranks=True`` writes from any rank (files a rank owns alone)."""
    path = Path(path)
    if not all_ranks and not is_main():
        return path
    try:
        return _write_atomically(path, data)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {describe_os_error(exc)}; the files already written in "
                          f"{path.parent} are complete: free space or fix the folder, then rerun the same command "
                          "(with --resume where the verb has it) to continue") from exc


def describe_os_error(exc: OSError) -> str:
    """``"File too large (the file size limit is reached)"`` and the like: the system's words and their cause."""
    return f"{exc.strerror or exc} ({_WHY.get(exc.errno, 'write failed')})"


_WHY = {errno.ENOSPC: "the disk is full", errno.EFBIG: "the file size limit is reached",
        errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
        errno.EPERM: "permission denied", errno.EDQUOT: "the disk quota is exceeded"}


def _write_atomically(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        if hasattr(os, "fchmod"):  # mkstemp creates 0600; give the mode open() would (0666 minus the umask)
            os.fchmod(fd, 0o666 & ~_current_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


TMP_SUFFIX = ".tmp"


def check_writable(folder: str | os.PathLike[str], *, create: bool = True) -> Path:
    """Prove ``folder`` writable before any work: write, sync and remove a probe file in it (or, with
    ``create=False`` and a folder that does not exist yet, create and remove a probe folder in its nearest
    existing parent, leaving nothing behind); with ``create`` make the folder. Temporary files a killed
    atomic write left behind are removed. Raises :class:`OutputError` in one line (also for an empty path,
    which would otherwise mean the current folder)."""
    if isinstance(folder, str) and not folder.strip():
        raise OutputError("--out is empty: give the output folder's path")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"--out {str(folder)!r} exists and is not a folder: choose another path")
    if not is_main():
        return folder
    try:
        if not folder.exists() and not create:
            parent = next(p for p in folder.absolute().parents if p.exists())
            os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".robustest-probe."))
            return folder
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".robustest-probe.", suffix=TMP_SUFFIX)
        with os.fdopen(fd, "wb") as fh:
            fh.write(b"robustest write probe\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"--out {str(folder)!r} is not writable: {exc.strerror or exc} "
                          f"({_WHY.get(exc.errno, 'write failed')}): choose another folder or fix its permissions"
                          ) from exc
    remove_stale_temporaries(folder)
    return folder


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete ``.NAME.XXXXXXXX.tmp`` files (left by an atomic write that was killed) under ``folder``."""
    removed = []
    for p in Path(folder).rglob(f".*{TMP_SUFFIX}"):
        if p.is_file() and p.name.count(".") >= 3:
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
    return removed


def _current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux), else via os.umask."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike[str], text: str, *, all_ranks: bool = False) -> Path:
    """Write UTF-8 text to ``path`` atomically (rank 0 only unless ``all_ranks``)."""
    return atomic_write_bytes(path, text.encode("utf-8"), all_ranks=all_ranks)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, all_ranks: bool = False) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically (NaN written as null; rank 0 only unless
    ``all_ranks``)."""
    return atomic_write_text(path, json.dumps(_json_safe(obj), indent=2, sort_keys=False) + "\n",
                             all_ranks=all_ranks)


def atomic_save(obj: Any, path: str | os.PathLike[str], *, all_ranks: bool = False) -> Path:
    """``torch.save`` ``obj`` to ``path`` atomically (rank 0 only unless ``all_ranks``)."""
    import io

    if not all_ranks and not is_main():
        return Path(path)
    buf = io.BytesIO()
    torch.save(obj, buf)
    return atomic_write_bytes(path, buf.getvalue(), all_ranks=all_ranks)


# ----------------------------------------------------------------------------------- bounded reading
_MEMORY_FRACTION = 0.5
#: the most a reader allocates for the arrays of one file unless ``ROBUSTEST_MAX_ARRAY_BYTES`` says otherwise
#: (and at most half of the memory available): 1 GiB holds CIFAR-10 as float32 or ImageNet-100's validation
#: images as uint8, while a hostile file (a deflate bomb declaring gigabytes) is refused before it is unpacked
MAX_ARRAY_BYTES = 2**30


def max_array_bytes() -> int:
    """Largest array (in bytes) a reader may allocate: ``ROBUSTEST_MAX_ARRAY_BYTES`` when set, else
    :data:`MAX_ARRAY_BYTES` or half of the memory available now (``MemAvailable``), whichever is smaller."""
    env = os.environ.get("ROBUSTEST_MAX_ARRAY_BYTES")
    if env:
        try:
            v = int(float(env))
        except ValueError:
            raise DataError(f"ROBUSTEST_MAX_ARRAY_BYTES={env!r} is not a number of bytes: unset it or give one"
                            ) from None
        if v <= 0:
            raise DataError(f"ROBUSTEST_MAX_ARRAY_BYTES must be positive, got {env}")
        return v
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return min(MAX_ARRAY_BYTES, int(int(line.split()[1]) * 1024 * _MEMORY_FRACTION))
    except (OSError, ValueError, IndexError):
        pass
    return MAX_ARRAY_BYTES


def check_torch_file(path: str | os.PathLike[str], what: str) -> None:
    """Before ``torch.load``: the members of a zip-format ``.pt`` file must not declare more bytes than they can
    hold. torch.save stores members uncompressed, so a stored member is at most the file's size; a compressed
    member (which torch.load also decompresses) may declare at most :func:`max_array_bytes` in all: a deflate
    bomb of a few MB declaring gigabytes is refused before anything is allocated. Other files are left to
    torch.load."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            members = zf.infolist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return
    size = path.stat().st_size
    lying = [m for m in members if m.compress_type == zipfile.ZIP_STORED and m.file_size > size]
    if lying:
        raise DataError(f"{path}: the {what} is damaged: member {lying[0].filename!r} declares {lying[0].file_size:,} "
                        f"bytes in a {size:,}-byte file")
    packed = sum(m.file_size for m in members if m.compress_type != zipfile.ZIP_STORED)
    cap = max_array_bytes()
    if packed > cap:
        raise DataError(f"{path}: the {what}'s compressed members declare {packed / 2**30:.3g} GiB, more than the "
                        f"{cap / 2**30:.3g} GiB a reader may allocate (torch.save never compresses: the file was not "
                        "written by robustest or torch)")


def load_plain(path: str | os.PathLike[str], *, fmt: str, what: str, fix: str) -> dict[str, Any]:
    """Read a robustest data file (a ``torch.save`` of plain data tagged ``{"format": fmt, ...}``) safely.

    The file is loaded with ``torch.load(weights_only=True)``: tensors and plain containers only, never
    arbitrary pickled objects. A missing, unreadable or differently tagged file raises :class:`DataError`
    with a one-line message naming ``what`` was expected and ``fix`` (how to obtain one).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} {str(path)!r} does not exist: {fix}")
    check_torch_file(path, what)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure means the file is refused
        raise DataError(f"{path} is not a {what} (cannot be read safely: {type(exc).__name__}): {fix}") from exc
    if not isinstance(payload, dict) or payload.get("format") != fmt:
        raise DataError(f"{path} is not a {what}: {fix}")
    return payload


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return _json_safe(obj.detach().cpu().tolist())
    if isinstance(obj, np.ndarray):
        return _json_safe(obj.tolist())
    if isinstance(obj, np.generic):
        return _json_safe(obj.item())
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


# ---------------------------------------------------------------------------------------------- progress
def progress(iterable: Iterable[Any], *, enabled: bool = True, desc: str | None = None,
             total: int | None = None, unit: str = "it") -> Iterable[Any]:
    """Wrap ``iterable`` in a tqdm progress bar on stderr when ``enabled``."""
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, leave=False, dynamic_ncols=True)
