"""Input validation at the public boundary: images, labels, image size, model fit, finite logits."""

from __future__ import annotations

import math
from typing import Any

import torch

from robustest.core.errors import ConfigError, DataError

MAX_IMAGE_VALUES = 3 * 1024 * 1024


def check_image_size(shape: tuple[int, ...], *, source: str | None = None, what: str = "the images",
                     fix: str = "resize them (image folders: --resize H W) to the size the model was built for",
                     error: type[Exception] = ConfigError) -> None:
    """Refuse images of shape C x H x W larger than :data:`MAX_IMAGE_VALUES`: one line naming the shape, the
    limit and ``fix``, raised as ``error`` (prefixed ``source: `` when given). The one size check: before any
    model sees an image, and from a file's header (npy, npz, IDX, a suite) before the array is read."""
    values = math.prod(int(d) for d in shape)
    if values > MAX_IMAGE_VALUES:
        where = f"{source}: " if source else ""
        raise error(f"{where}{what} are {'x'.join(str(int(d)) for d in shape)} ({values:,} values each), more "
                    f"than the {MAX_IMAGE_VALUES:,} (3 x 1024 x 1024) a model is run on: {fix}")


def check_logits(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` unchanged when every value is finite; :class:`DataError` (one line) otherwise. The one check
    of a model's outputs: a model with NaN weights (a diverged training run) or an input scaling that
    overflows gives NaN or infinite logits, and every accuracy, score or attack computed on them is wrong."""
    if not bool(torch.isfinite(logits).all()):
        raise DataError("the model outputs NaN or infinite logits: check its weights (a diverged training run "
                        "leaves NaN weights) and its input scaling")
    return logits


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
