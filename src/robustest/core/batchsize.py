"""Batch sizes that fill the device: what ``--batch-size auto`` resolves to.

On CUDA, :func:`auto_batch_size` runs the job's real forward pass (plus the backward pass to the input when
the job needs input gradients: attacks, FOL, the activations coverage and surprise metrics keep) on batches
of doubling size, from the verb's default up to a cap, until the device runs out of memory
(``torch.cuda.OutOfMemoryError``); the default itself too large halves instead, down to one image. It keeps
the largest batch that fitted times :data:`SAFETY` (the real job holds a little more than the probe: the
attack's copies of the batch, the data loader's next batch), or the cap itself when the cap fitted. Memory
is freed between tries (``torch.cuda.empty_cache``). The probe's inputs are constant images (no random
draw: the global generators are left as they were).

On the CPU (and any device but CUDA) ``auto`` is the verb's default batch size: the CPU has no separate
memory to fill and its speed hardly depends on the batch size beyond a few hundred images.

Under torchrun every rank probes its own device and all take the smallest result, so the ranks cut the data
into the same batches (attack batches draw their randomness by batch number). The batch size a probe
picks depends on the device and the model: results that depend on the batch size (the attacks' random
starts) are reproduced by passing the recorded size, which ``results.json`` keeps in ``settings.batch_size``.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from robustest.core.errors import ConfigError

__all__ = ["AUTO", "MAX_IMAGES", "MAX_VALUES", "SAFETY", "auto_batch_size", "is_out_of_memory",
           "probe_batch_size"]

AUTO = "auto"
#: the share of the largest batch that fitted which the job uses
SAFETY = 0.8
#: the probe's cap: at most this many pixel values per batch (1 GiB of float32 images) ...
MAX_VALUES = 2**28
#: ... and at most this many images
MAX_IMAGES = 2**20


def is_out_of_memory(exc: BaseException) -> bool:
    """The device ran out of memory: ``torch.cuda.OutOfMemoryError``, or a RuntimeError saying so (cuDNN's
    and older torch's)."""
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def probe_batch_size(try_batch: Callable[[int], Any], start: int, cap: int, *, safety: float = SAFETY,
                     free: Callable[[], Any] | None = None) -> int:
    """The batch size to use: ``try_batch(n)`` runs one batch of ``n`` images and raises an out-of-memory error
    (:func:`is_out_of_memory`) when it does not fit. Tries ``start`` (at most ``cap``), then doubles while
    batches fit (never beyond ``cap``), or halves while they do not; ``free()`` runs after every try.
    Returns ``cap`` when ``cap`` fitted, else ``max(1, floor(largest fit x safety))``. Any other error of
    ``try_batch`` propagates; a single image that does not fit raises :class:`ConfigError`."""
    if not 1 <= int(start) or not 1 <= int(cap):
        raise ConfigError(f"the probe needs a start and cap >= 1, got {start} and {cap}")
    if not 0 < safety <= 1:
        raise ConfigError(f"safety must lie in (0, 1], got {safety}")
    fit, failed = 0, 0  # largest size that fitted, smallest that did not
    n = min(int(start), int(cap))
    while True:
        ok = True
        try:
            try_batch(n)
        except Exception as exc:  # noqa: BLE001 - anything but running out of memory propagates
            if not is_out_of_memory(exc):
                raise
            ok = False
        finally:
            if free is not None:
                free()
        if ok:
            fit = n
            if n >= cap:
                return int(cap)
            if failed:
                break
            n = min(2 * n, int(cap))
        else:
            failed = n
            if fit:
                break
            if n == 1:
                raise ConfigError("one image does not fit in the device's memory: use a smaller model or images, "
                                  "or run on another device")
            n //= 2
    return max(1, int(math.floor(fit * safety)))


def _free_cuda() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _cuda_try(model: nn.Module, shape: tuple[int, ...], device: torch.device, grad: bool,
              amp: str | None) -> Callable[[int], None]:
    """One forward (+ input-gradient backward with ``grad``) of ``n`` constant images of ``shape`` on CUDA."""
    from robustest.core.amp import autocast
    from robustest.core.modelcall import eval_mode, forward, frozen_params

    def run(n: int) -> None:
        x = torch.full((n, *shape), 0.5, device=device)
        with eval_mode(model):
            if grad:
                x.requires_grad_(True)
                with frozen_params(model):
                    loss = forward(model, x).float().logsumexp(1).sum()
                    loss.backward()
            else:
                with torch.no_grad(), autocast(amp, device):
                    forward(model, x)
        torch.cuda.synchronize(device)

    return run


def auto_batch_size(value: int | str | None, model: nn.Module, data: Any, *, default: int, grad: bool,
                    amp: str | None = None, device: torch.device | str | None = None,
                    cap: int | None = None) -> int:
    """``value`` itself when it is a batch size; for ``"auto"``: on CUDA the size :func:`probe_batch_size`
    finds for ``model`` on images of ``data``'s shape (C x H x W), starting at ``default`` and capped at
    ``cap`` (default: :data:`MAX_VALUES` pixel values, at most :data:`MAX_IMAGES` images, never below
    ``default``), with a backward pass to the input when ``grad`` and the forward under ``amp`` autocast
    otherwise; elsewhere ``default``. Under torchrun the smallest size over the ranks. None is ``default``."""
    from robustest.core import distributed
    from robustest.core.batching import image_shape
    from robustest.core.devices import resolve_device

    if value is None:
        return int(default)
    if value != AUTO:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"batch_size must be a positive integer or 'auto', got {value!r}")
        return value
    dev = resolve_device(model, device)
    size = int(default)
    if dev.type == "cuda":
        shape = tuple(int(s) for s in image_shape(data))
        if cap is None:
            cap = max(size, min(MAX_IMAGES, MAX_VALUES // max(1, math.prod(shape))))
        size = probe_batch_size(_cuda_try(model, shape, dev, grad, amp), size, int(cap), free=_free_cuda)
    if distributed.world_size() > 1:
        size = min(int(s) for s in distributed.all_gather_objects(size))
    return size
