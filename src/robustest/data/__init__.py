"""Data sets in the robustest contract: float32 images N x C x H x W in [0, 1] and int64 labels.

``load(name, root=None, split="train", ...)`` returns a ``torch.utils.data.Dataset`` that keeps images
compact: an :class:`ImageDataset` (uint8 levels in memory, or memory-mapped from ``.npy`` files) or a
:class:`FolderDataset` (image files decoded lazily). Both convert to float per batch, so streaming a data
set through :func:`robustest.core.batching.iter_batches` costs one batch of float memory; ``ds.tensors`` gives
the whole set as float tensors for small data. Nothing is ever downloaded and nothing is written: every
loader reads standard on-disk formats from ``root`` (the argument, else the ``ROBUSTEST_DATA``
environment variable). The built-in default, ``digits``, is scikit-learn's bundled 8x8 digits.

Formats:

* ``digits``: scikit-learn's 1797 8x8 digits, rescaled to [0, 1]; a fixed stratified split (seed 0,
  20 % test: 1437 train / 360 test).
* ``mnist``, ``fashion-mnist``: a folder with the four IDX files (plain or ``.gz``; the original site's
  and torchvision's names, also under ``raw/`` or ``MNIST/raw``/``FashionMNIST/raw``), or a Keras-style npz
  (``x_train, y_train, x_test, y_test``) given as the file or found in the folder.
* ``cifar10``, ``cifar100``: the python batches folder (``cifar-10-batches-py``/``cifar-100-python``, read
  with a restricted unpickler that accepts only plain containers, bytes and bounded numpy arrays) or a
  Keras-style npz (N x 32 x 32 x 3).
* ``npz``: any npz with ``x``/``y`` (or ``x_<split>``/``y_<split>``, or ``images``/``labels``) arrays, NHW,
  NHWC or NCHW, uint8 (0-255) or float (already in [0, 1]); ``npy``: a folder with ``x.npy``/``y.npy`` (or
  ``<split>_images.npy``/``<split>_labels.npy``), memory-mapped.
* ``folder``: class-per-subfolder PNG/JPEG images (``root/<class>/*.png``, or ``root/<split>/<class>/...``),
  decoded lazily; ``resize=(H, W)`` and ``center_crop=(H, W)`` for images of mixed sizes.
* ``cifar10-c``, ``cifar100-c``, ``tinyimagenet-c``, ``mnist-c``, ``imagenet-c``: the published corrupted
  sets (see :mod:`robustest.data.corrupted`), selected with ``corruption=`` and ``severity=``.
* ``tests``: a tests file written by ``robustest generate``.

Resource bounds: an array whose declared size exceeds :func:`max_array_bytes` is refused before it is
read, ``limit`` is applied before decoding, and labels must lie below ``num_classes`` when given (below
:data:`MAX_CLASSES` otherwise). ``limit`` keeps the first N samples of the array formats (MNIST, CIFAR, npz,
npy, tests files: files whose order is the publisher's) and a seeded, class-stratified subset of N images of a
class-per-folder set (whose first N files would all be one class).
"""

from __future__ import annotations

# the loaders register themselves on import
from robustest.data import builtin, corrupted  # noqa: F401
from robustest.data.builtin import load_tests, save_tests
from robustest.data.dataset import MAX_CLASSES, FolderDataset, ImageDataset, arrays_to_dataset
from robustest.data.formats import open_npy, read_idx, read_npz, restricted_unpickle
from robustest.data.registry import (
    IMAGE_SUFFIXES,
    SPLITS,
    DatasetInfo,
    LoadOptions,
    canonical,
    info,
    load,
    names,
    num_classes_of,
    register,
)

__all__ = [
    "IMAGE_SUFFIXES",
    "MAX_CLASSES",
    "SPLITS",
    "DatasetInfo",
    "FolderDataset",
    "ImageDataset",
    "LoadOptions",
    "arrays_to_dataset",
    "canonical",
    "info",
    "load",
    "load_tests",
    "names",
    "num_classes_of",
    "open_npy",
    "read_idx",
    "read_npz",
    "register",
    "restricted_unpickle",
    "save_tests",
]
