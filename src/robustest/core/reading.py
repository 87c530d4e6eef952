"""Bounded reading: the memory bound on one file's arrays and the checks before torch.load."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import torch

from robustest.core.errors import DataError

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
