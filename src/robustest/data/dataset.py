"""Data sets that keep images compact and convert them per batch.

* :class:`ImageDataset`: images held as stored (uint8 levels, in memory or memory-mapped from a ``.npy``
  file, in NCHW, NHWC or NHW layout; or float32 already in [0, 1]) and int64 labels. Items and batches
  come out in the robustest contract (float32 N x C x H x W in [0, 1]); :meth:`ImageDataset.get_batch`
  converts a whole slice or index set in one vectorised pass, which :func:`robustest.core.batching.iter_batches`
  uses, so streaming a data set costs one batch of float memory, not the whole set.
* :class:`FolderDataset`: class-per-subfolder image files decoded lazily with Pillow, optionally resized
  and centre-cropped to one size; ``num_workers`` sets the DataLoader workers that decode them.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from robustest.core.batching import to_float_images
from robustest.core.errors import DataError

__all__ = ["MAX_CLASSES", "FolderDataset", "ImageDataset", "arrays_to_dataset"]

MAX_CLASSES = 100_000  # labels at or above this are refused unless the caller names a larger num_classes
#: the largest image file decoded (8192 x 8192 pixels, 200 MB as RGB): a file's header declares its size, so a
#: larger one (a decompression bomb of a few KB declaring gigapixels) is refused before it is decoded
MAX_DECODE_PIXELS = 8192 * 8192
_LAYOUTS = ("NCHW", "NHWC", "NHW")


def _as_index(index: Any, n: int) -> Any:
    """A slice stays a slice; anything else becomes a 1-D int64 NumPy array of non-negative positions."""
    if isinstance(index, slice):
        return index
    idx = index.detach().cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
    idx = idx.astype(np.int64, copy=False).reshape(-1)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise DataError(f"sample index out of range: positions must lie in [0, {n}), got "
                        f"[{int(idx.min())}, {int(idx.max())}]")
    return idx


def _from_numpy(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``a``'s memory; read-only arrays (memmaps, frombuffer) are fine because every caller
    converts the result to a new float tensor before anything could write to it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.ascontiguousarray(a))


class ImageDataset(Dataset):
    """Images stored compactly with int64 labels; converted to float32 [0, 1] N x C x H x W per batch.

    ``images``: a NumPy array (possibly a read-only memmap) or a tensor, uint8 levels 0..255 or float32 in
    [0, 1], in ``layout`` NCHW, NHWC or NHW. ``labels``: int64 class indices, shape [N]. Nothing is copied
    at construction; :meth:`get_batch` converts only the requested samples.
    """

    def __init__(self, images: np.ndarray | torch.Tensor, labels: torch.Tensor | np.ndarray, *,
                 layout: str = "NCHW", source: str = "data") -> None:
        if layout not in _LAYOUTS:
            raise DataError(f"unknown image layout {layout!r}: use one of {', '.join(_LAYOUTS)}")
        if images.dtype not in (np.uint8, np.float32, torch.uint8, torch.float32):
            raise DataError(f"{source}: images must be stored as uint8 or float32, got {images.dtype}")
        if len(images.shape) != (3 if layout == "NHW" else 4):
            raise DataError(f"{source}: images of shape {tuple(images.shape)} do not match layout {layout}")
        self._x = images
        self.layout = layout
        self.source = source
        if isinstance(labels, torch.Tensor):
            y = labels
        else:  # the labels are public and small: a writable copy when the array is read-only (frombuffer, memmap)
            arr = np.ascontiguousarray(labels)
            y = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
        self.labels = y.to(torch.int64).reshape(-1)
        if self.labels.shape[0] != images.shape[0]:
            raise DataError(f"{source}: {images.shape[0]} images but {self.labels.shape[0]} labels")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of every image."""
        s = tuple(int(d) for d in self._x.shape)
        if self.layout == "NHW":
            return (1, s[1], s[2])
        if self.layout == "NHWC":
            return (s[3], s[1], s[2])
        return (s[1], s[2], s[3])

    @property
    def stored_dtype(self) -> str:
        return "uint8" if self._x.dtype in (np.uint8, torch.uint8) else "float32"

    def get_batch(self, index: slice | torch.Tensor | np.ndarray | Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (float32 B x C x H x W in [0, 1]) and labels (int64 [B]) at ``index`` (a slice or positions)."""
        idx = _as_index(index, len(self))
        raw = self._x[idx]
        x = to_float_images(raw if isinstance(raw, torch.Tensor) else _from_numpy(raw), self.layout)
        y = self.labels[idx] if isinstance(idx, slice) else self.labels[torch.from_numpy(idx)]
        return x, y

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = int(i)
        if i < 0:
            i += len(self)
        x, y = self.get_batch(slice(i, i + 1))
        if x.shape[0] != 1:
            raise IndexError(f"index {i} out of range for {len(self)} samples")
        return x[0], y[0]

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole data set as (float32 N x C x H x W, int64 [N]) tensors: a full float copy, for small data.
        Large data sets are streamed with :func:`robustest.core.batching.iter_batches` instead."""
        return self.get_batch(slice(None))

    def head(self, n: int) -> ImageDataset:
        """The first ``n`` samples (a view: nothing is copied or read)."""
        return ImageDataset(self._x[:n], self.labels[:n], layout=self.layout, source=self.source)

    def subset(self, index: torch.Tensor | np.ndarray | Sequence[int]) -> ImageDataset:
        """The samples at ``index`` (their stored bytes copied, still compact), in that order."""
        idx = _as_index(index, len(self))
        return ImageDataset(self._x[idx], self.labels[torch.from_numpy(idx)], layout=self.layout,
                            source=self.source)

    def __repr__(self) -> str:
        c, h, w = self.image_shape
        return f"ImageDataset({len(self)} x {c} x {h} x {w}, stored {self.stored_dtype} {self.layout}, {self.source})"


class FolderDataset(Dataset):
    """Class-per-subfolder images decoded lazily with Pillow; items are float32 C x H x W in [0, 1].

    ``files``/``labels``: the image paths and their class indices (``classes`` names them). Images are
    converted to ``channels`` (1: grey, 3: RGB; default: from the first image), resized to ``resize``
    (H, W) when given, then centre-cropped to ``center_crop`` (H, W) when given; without ``resize`` every
    image must have the first image's size. ``num_workers`` is the number of DataLoader worker processes
    :func:`robustest.core.batching.iter_batches` uses to decode.
    """

    def __init__(self, files: Sequence[Path], labels: Sequence[int], classes: Sequence[str], *,
                 channels: int | None = None, resize: tuple[int, int] | None = None,
                 center_crop: tuple[int, int] | None = None, num_workers: int = 0, source: str = "folder") -> None:
        from PIL import UnidentifiedImageError

        if not files:
            raise DataError(f"{source}: no images found")
        self.files = [Path(f) for f in files]
        self.labels = torch.as_tensor(list(labels), dtype=torch.int64)
        self.classes = list(classes)
        self.resize = _pair(resize, "resize")
        self.center_crop = _pair(center_crop, "center crop")
        self.num_workers = int(num_workers)
        self.source = source
        try:
            with _open_image(self.files[0]) as im:
                mode, size = im.mode, im.size
        except (UnidentifiedImageError, OSError) as exc:
            raise DataError(f"{self.files[0]}: cannot decode image ({exc}); the file is truncated or not an image") \
                from exc
        self.channels = channels or (1 if mode in ("L", "1", "I;16", "I", "LA") else 3)
        if self.channels not in (1, 3):
            raise DataError(f"channels must be 1 or 3, got {self.channels}")
        if self.resize is None and self.center_crop is None:
            self._check_sizes(size)
        h, w = self.resize or (size[1], size[0])
        if self.center_crop is not None:
            ch, cw = self.center_crop
            if ch > h or cw > w:
                raise DataError(f"{source}: centre crop {ch}x{cw} is larger than the {h}x{w} images: crop less or "
                                "resize to a larger size first")
            h, w = ch, cw
        self._hw = (h, w)

    def __len__(self) -> int:
        return len(self.files)

    def _check_sizes(self, size: tuple[int, int], probes: int = 16) -> None:
        """Read the headers of up to ``probes`` files spread over the folder: mixed sizes are found before any
        work (the decoder checks every image again)."""
        from PIL import UnidentifiedImageError

        step = max(1, len(self.files) // probes)
        for f in self.files[::step][:probes]:
            try:
                with _open_image(f) as im:
                    other = im.size
            except (UnidentifiedImageError, OSError) as exc:
                raise DataError(f"{f}: cannot decode image ({exc}); the file is truncated or not an image") from exc
            if other != size:
                raise DataError(f"{self.source}: images have different sizes ({f.name} is {other[1]}x{other[0]}, "
                                f"{self.files[0].name} {size[1]}x{size[0]}): pass --resize H W (resize=) to load "
                                "images of mixed sizes")

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.channels, *self._hw)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image, UnidentifiedImageError

        f = self.files[i]
        try:
            with _open_image(f) as im:
                if self.resize is None and self.center_crop is None and (im.size[1], im.size[0]) != self._hw:
                    raise DataError(f"{f} is {im.size[1]}x{im.size[0]} but the first image is "
                                    f"{self._hw[0]}x{self._hw[1]}: pass --resize H W (resize=) to load images of "
                                    "mixed sizes")
                im = im.convert("L" if self.channels == 1 else "RGB")
                if self.resize is not None:
                    im = im.resize((self.resize[1], self.resize[0]), Image.BILINEAR)
                if self.center_crop is not None:
                    ch, cw = self.center_crop
                    W, H = im.size
                    if ch > H or cw > W:
                        raise DataError(f"{f} is {H}x{W}, smaller than the centre crop {ch}x{cw}: pass --resize")
                    top, left = (H - ch) // 2, (W - cw) // 2
                    im = im.crop((left, top, left + cw, top + ch))
                arr = np.asarray(im, dtype=np.uint8)
        except (UnidentifiedImageError, OSError) as exc:
            raise DataError(f"{f}: cannot decode image ({exc}); the file is truncated or not an image") from exc
        t = torch.from_numpy(arr.copy())
        t = t.unsqueeze(0) if t.dim() == 2 else t.permute(2, 0, 1)
        return t.to(torch.float32).div_(255.0), self.labels[i]

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every image decoded, as (float32 N x C x H x W, int64 [N]) tensors: for small folders; large ones are
        streamed with :func:`robustest.core.batching.iter_batches`."""
        from robustest.core.batching import as_tensors

        x, y = as_tensors(self)
        assert y is not None
        return x, y

    def __repr__(self) -> str:
        c, h, w = self.image_shape
        return (f"FolderDataset({len(self)} x {c} x {h} x {w}, {len(self.classes)} classes, decoded lazily, "
                f"{self.source})")


def _open_image(f: Path) -> Any:
    """``PIL.Image.open(f)`` (lazy: only the header is read), refusing a header that declares more than
    :data:`MAX_DECODE_PIXELS` pixels (PIL's own decompression-bomb limit included) in one line."""
    from PIL import Image

    try:
        im = Image.open(f)
    except Image.DecompressionBombError:
        raise DataError(f"{f} declares more pixels than PIL decodes safely: downscale the files (at most "
                        f"{MAX_DECODE_PIXELS:,} pixels, 8192 x 8192)") from None
    try:
        _check_decode_size(f, im.size)
    except DataError:
        im.close()
        raise
    return im


def _check_decode_size(f: Path, size: tuple[int, int]) -> None:
    """Refuse an image file whose header declares more than :data:`MAX_DECODE_PIXELS` pixels."""
    w, h = size
    if w * h > MAX_DECODE_PIXELS:
        raise DataError(f"{f} is {h}x{w} ({w * h:,} pixels), more than the {MAX_DECODE_PIXELS:,} (8192 x 8192) an "
                        "image is decoded at: downscale the files")


def _pair(v: Any, what: str) -> tuple[int, int] | None:
    if v is None:
        return None
    vals = [v, v] if isinstance(v, int) else list(v)
    if len(vals) == 1:
        vals = vals * 2
    if len(vals) != 2 or any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1 for t in vals):
        raise DataError(f"{what} must be a positive size H W, got {v!r}")
    return int(vals[0]), int(vals[1])


def check_labels_array(y: np.ndarray, source: str, num_classes: int | None = None) -> np.ndarray:
    """Labels as a 1-D int64 array of class indices in [0, num_classes) (or [0, MAX_CLASSES))."""
    y = np.asarray(y)
    if y.dtype == object:
        raise DataError(f"{source}: labels are Python objects, not class indices")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(f"{source}: labels must be a 1-D array of class indices, got shape {y.shape} (one-hot?)")
    if not np.issubdtype(y.dtype, np.integer):
        if np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            raise DataError(f"{source}: labels have dtype {y.dtype}; they must be integer class indices")
    y = y.astype(np.int64, copy=False)
    if y.size:
        lo, hi = int(y.min()), int(y.max())
        if lo < 0:
            raise DataError(f"{source}: negative label {lo}; labels must lie in [0, K)")
        if num_classes is not None and hi >= num_classes:
            raise DataError(f"{source}: label {hi} outside [0, {num_classes})")
        if num_classes is None and hi >= MAX_CLASSES:
            raise DataError(f"{source}: label {hi} implies more than {MAX_CLASSES:,} classes: check the labels, or "
                            "name the class count (--num-classes)")
    return y


def arrays_to_dataset(x: np.ndarray, y: np.ndarray, source: str, num_classes: int | None = None) -> ImageDataset:
    """An :class:`ImageDataset` over image and label arrays in any accepted layout, kept compact.

    ``x``: N x H x W, N x H x W x C or N x C x H x W (C in 1, 3); uint8 levels (kept as they are, memmaps
    included), another integer type with values in 0-255 (converted to uint8), or float in [0, 1]
    (converted to float32). ``y``: N or N x 1 integer class indices.
    """
    if getattr(x, "dtype", None) is np.dtype(object):
        raise DataError(f"{source}: arrays of Python objects are not image data")
    x = x if isinstance(x, np.ndarray) else np.asarray(x)
    if x.ndim == 3:
        layout = "NHW"
    elif x.ndim == 4:
        if x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
            layout = "NHWC"
        elif x.shape[1] in (1, 3):
            layout = "NCHW"
        else:
            raise DataError(f"{source}: images of shape {x.shape} have no 1- or 3-channel axis (NHW, NHWC or NCHW)")
    else:
        raise DataError(f"{source}: images must be N x H x W, N x H x W x C or N x C x H x W, got shape {x.shape}")
    yv = check_labels_array(y, source, num_classes)
    if len(x) != len(yv):
        raise DataError(f"{source}: {len(x)} images but {len(yv)} labels")
    if x.dtype == np.uint8:
        pass
    elif np.issubdtype(x.dtype, np.integer):
        if x.size and (x.min() < 0 or x.max() > 255):
            raise DataError(f"{source}: integer pixels lie in [{x.min()}, {x.max()}], expected 0-255")
        x = x.astype(np.uint8)
    elif np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32, copy=False)
        if x.size:
            lo, hi = float(np.min(x)), float(np.max(x))
            if not (np.isfinite(lo) and np.isfinite(hi)):
                raise DataError(f"{source}: images contain NaN or infinite values")
            if lo < 0.0 or hi > 1.0:
                raise DataError(f"{source}: float pixels lie in [{lo:.4g}, {hi:.4g}]; store uint8 or floats in [0, 1]")
    else:
        raise DataError(f"{source}: images have dtype {x.dtype}, not image data (use uint8 or float)")
    return ImageDataset(x, yv, layout=layout, source=source)
