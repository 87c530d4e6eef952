"""One-line ``repr`` s for result objects: sizes and key figures, never tensor contents."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


class Raw(str):
    """Text that :func:`one_line` shows as it is (shapes, counts), not quoted."""


def shape(t: torch.Tensor | None) -> Raw:
    """``<1000x1x28x28 float32>`` (plus the device when it is not the CPU); ``"None"`` for None."""
    if t is None:
        return Raw("None")
    if not isinstance(t, torch.Tensor):
        return Raw(type(t).__name__)
    dims = "x".join(str(d) for d in t.shape) or "scalar"
    dev = "" if t.device.type == "cpu" else f" {t.device}"
    return Raw(f"<{dims} {str(t.dtype).replace('torch.', '')}{dev}>")


def number(v: Any) -> str:
    """A figure rounded to 4 significant digits (ints and None as they are)."""
    if v is None or isinstance(v, (bool, int)):
        return repr(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return number(v.item())
    return repr(v)


def counts(d: Mapping[str, Any], limit: int = 4) -> Raw:
    """``{'fgsm': 12, 'pgd': 30}``, the first ``limit`` entries and how many more."""
    items = list(d.items())
    shown = ", ".join(f"{k!r}: {v}" for k, v in items[:limit])
    return Raw("{" + shown + (f", ... {len(items) - limit} more" if len(items) > limit else "") + "}")


def one_line(obj: object, **fields: Any) -> str:
    """``ClassName(key=value, ...)`` with strings quoted, floats rounded and everything else as given."""
    parts = [f"{k}={v}" if isinstance(v, Raw) else f"{k}={v!r}" if isinstance(v, str) else f"{k}={number(v)}"
             for k, v in fields.items()]
    return f"{type(obj).__name__}({', '.join(parts)})"
