"""Mixed precision for forward passes: the autocast context and the check that an amp mode runs on a device."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from robustest.core.errors import ConfigError

AMP_MODES = ("bf16", "fp16")


@contextlib.contextmanager
def autocast(amp: str | None, device: torch.device) -> Iterator[None]:
    """``torch.autocast`` for ``amp`` ("bf16" or "fp16") on ``device``; nothing when ``amp`` is None."""
    if amp is None:
        yield
        return
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def check_amp(amp: str | None, device: torch.device) -> str | None:
    """``amp`` for inference forward passes under :func:`autocast` on ``device``, refused in one line when it
    cannot run there: None, "bf16" (the CPU, or a GPU with bf16 support) or "fp16" (CUDA only)."""
    if amp not in (None, *AMP_MODES):
        raise ConfigError(f"unknown amp {amp!r}: use None, 'bf16' or 'fp16'")
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError("amp='fp16' needs CUDA: use amp='bf16' on the CPU")
    if amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("amp='bf16' is not supported by this GPU: use amp='fp16'")
    if amp is not None and device.type not in ("cuda", "cpu"):
        raise ConfigError(f"amp={amp!r} runs on CUDA or the CPU, not {device.type}: drop amp")
    return amp
