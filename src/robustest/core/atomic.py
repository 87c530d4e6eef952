"""Atomic writes (write to a temporary file, then rename) and the checks of an output folder."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robustest.core.distributed import is_main
from robustest.core.errors import OutputError


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
            os.fchmod(fd, 0o666 & ~current_umask())
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


def current_umask() -> int:
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
    return atomic_write_text(path, json.dumps(json_safe(obj), indent=2, sort_keys=False) + "\n",
                             all_ranks=all_ranks)


def atomic_save(obj: Any, path: str | os.PathLike[str], *, all_ranks: bool = False) -> Path:
    """``torch.save`` ``obj`` to ``path`` atomically (rank 0 only unless ``all_ranks``)."""
    import io

    if not all_ranks and not is_main():
        return Path(path)
    buf = io.BytesIO()
    torch.save(obj, buf)
    return atomic_write_bytes(path, buf.getvalue(), all_ranks=all_ranks)


def json_safe(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return json_safe(obj.detach().cpu().tolist())
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, np.generic):
        return json_safe(obj.item())
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj
