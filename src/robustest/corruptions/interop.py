"""A drop-in for the ``imagecorruptions`` package: :func:`corrupt_image` takes and returns one H x W x C uint8
NumPy image with the signature and conventions of ``imagecorruptions.corrupt``, and
:func:`get_corruption_names` lists names by the same subsets. Code written against imagecorruptions keeps
working with ``from robustest.corruptions import corrupt_image as corrupt, get_corruption_names``."""

from __future__ import annotations

import numpy as np
import torch

from robustest.core.errors import ConfigError, DataError
from robustest.corruptions.registry import _check_name, _check_severity, corrupt, published
from robustest.corruptions.spec import TABLES, group

_SUBSETS = {"common": "common", "validation": "validation", "all": None, "noise": "noise", "blur": "blur",
            "weather": "weather", "digital": "digital"}


def get_corruption_names(subset: str = "common") -> list[str]:
    """Corruption names of ``subset`` as imagecorruptions lists them: ``"common"`` (the 15 benchmark
    corruptions), ``"validation"`` (the 4 held-out ones), ``"all"`` (all 19), or one family: ``"noise"``,
    ``"blur"``, ``"weather"``, ``"digital"``."""
    if subset not in _SUBSETS:
        raise ConfigError(f"unknown subset {subset!r}: use one of {', '.join(_SUBSETS)}")
    members = published()
    if _SUBSETS[subset] is None:
        return members
    return [n for n in group(_SUBSETS[subset]) or [] if n in members]


def corrupt_image(image: np.ndarray, severity: int = 1, corruption_name: str | None = None,
                  corruption_number: int = -1, *, seed: int | None = None, table: str | None = "imagenet"
                  ) -> np.ndarray:
    """Corrupt one image, as ``imagecorruptions.corrupt(image, severity, corruption_name, corruption_number)``.

    ``image``: uint8 NumPy array H x W x 3, H x W x 1 or H x W (grayscale). As in imagecorruptions, a
    grayscale image is replicated to three channels and the result is H x W x 3 uint8; the corrupted values
    are truncated to integers (NumPy's ``np.uint8`` of the float result, as imagecorruptions returns them;
    :func:`corrupt` on uint8 rounds instead). ``severity``: 1-5. Give ``corruption_name`` (one of
    :func:`get_corruption_names` ``("all")``) or ``corruption_number`` (its position in that list, 0-18).

    The parameters are the ImageNet-C ones at every image size, as in imagecorruptions (``table=None``:
    robustest's default by size, CIFAR-10-C's for images up to 64 px; see :func:`default_table`); images
    smaller than imagecorruptions' 32 x 32 minimum are accepted. The corruption itself is robustest's
    (documented deviations in docs/CORRUPTIONS.md, e.g. procedural frost textures).

    Randomness: with ``seed=None`` the seed is drawn from NumPy's global generator, the one imagecorruptions
    draws its noise from, so ``np.random.seed(s)`` makes a sequence of calls reproducible and successive
    calls give fresh noise, as there; ``seed=`` fixes the draws of this call alone.
    """
    if not isinstance(image, np.ndarray):
        raise DataError(f"image must be a numpy.ndarray, got {type(image).__name__}: use np.asarray(image)")
    if image.dtype != np.uint8:
        raise DataError(f"image has dtype {image.dtype}; corrupt_image takes uint8 images (levels 0-255): "
                        "use corrupt() for float tensors")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3):
        raise DataError(f"image has shape {image.shape}; expected H x W, H x W x 1 or H x W x 3")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise DataError(f"image has shape {image.shape}: it has no pixels")
    severity = _check_severity(severity)
    if corruption_name is not None:
        name = _check_name(corruption_name)
    elif corruption_number != -1:
        if isinstance(corruption_number, bool) or not isinstance(corruption_number, (int, np.integer)) \
                or not 0 <= int(corruption_number) < len(published()):
            raise ConfigError(f"corruption_number must be an integer in 0-{len(published()) - 1}, "
                              f"got {corruption_number!r}")
        name = published()[int(corruption_number)]
    else:
        raise ConfigError("give corruption_name or corruption_number: names from get_corruption_names('all')")
    if table is not None and table not in TABLES:
        raise ConfigError(f"unknown parameter table {table!r}: use one of {', '.join(TABLES)} or None")
    if seed is None:
        seed = int(np.random.randint(0, 2**31 - 1))
    rgb = np.repeat(image, 3, axis=2) if image.shape[2] == 1 else image
    x = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)[None].float().div_(255)
    y = corrupt(x, name, severity, seed=seed, table=table)[0].permute(1, 2, 0).numpy()
    # truncation as np.uint8(float image); the 1e-4 keeps integer levels the float32 result carries as
    # k - 1 ulp (e.g. jpeg_compression, pixelate) at k
    return np.floor(y * 255 + 1e-4).clip(0, 255).astype(np.uint8)
