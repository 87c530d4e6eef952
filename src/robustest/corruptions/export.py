"""Write corrupted copies of a data set to disk, streaming: a -C data set.

:func:`export` reads the data set one batch at a time and writes each corruption's rows as they are
made, so memory holds one batch (one severity under torchrun, where the ranks' shares are gathered to
rank 0), not the whole set. Two layouts:

* ``"npz"``: one ``<corruption>.npz`` per corruption with Keras-style uint8 arrays ``x_<split>``
  (severities stacked, S*N x H x W[ x 3]), ``y_<split>`` (labels per row), ``severity`` and ``index``;
  ``robustest.data.load("npz", FILE, split=SPLIT)`` reads it.
* ``"npy"``: the CIFAR-10-C layout, ``<corruption>.npy`` holding severities 1-5 stacked (5N x H x W x C
  uint8) and ``labels.npy`` (5N labels), so ``data.load("cifar10-c", OUT, corruption=, severity=)`` reads our
  -C sets exactly like the published ones.

Each batch is corrupted with seed ``seed + index of its first image``; batches start at multiples of
``batch_size`` on every rank, so the files are the same with one process or many. Each finished
corruption is a saved step (:mod:`robustest.core.steps`): rerunning the same command after a kill skips it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from robustest.core import distributed
from robustest.core.atomic import current_umask, describe_os_error
from robustest.core.batching import image_shape, iter_batches, labels_of, num_samples
from robustest.core.errors import ConfigError, OutputError
from robustest.core.progress import progress
from robustest.corruptions.registry import corrupt, default_table

__all__ = ["export"]

SEVERITIES = (1, 2, 3, 4, 5)


def _header(fh: IO[bytes], shape: tuple[int, ...], dtype: np.dtype) -> None:
    np.lib.format.write_array_header_2_0(fh, {"descr": np.lib.format.dtype_to_descr(dtype),
                                              "fortran_order": False, "shape": shape})


class _Writer:
    """One output file written member by member, rows appended in order; atomic (temp file, rename)."""

    def __init__(self, path: Path, fmt: str) -> None:
        self.path, self.fmt = path, fmt
        fd, self.tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        self.zip = zipfile.ZipFile(self.tmp, "w", compression=zipfile.ZIP_DEFLATED) if fmt == "npz" else None
        self.fh: IO[bytes] | None = None

    def begin(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.end()
        if self.zip is not None:
            self.fh = self.zip.open(f"{name}.npy", "w", force_zip64=True)
        else:
            self.fh = open(self.tmp, "wb")  # noqa: SIM115 - closed in end()
        _header(self.fh, shape, np.dtype(dtype))

    def write(self, arr: np.ndarray) -> None:
        assert self.fh is not None
        self.fh.write(np.ascontiguousarray(arr).tobytes())

    def end(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None

    def commit(self) -> str:
        self.end()
        if self.zip is not None:
            self.zip.close()
        os.chmod(self.tmp, 0o666 & ~current_umask())  # mkstemp made it 0600: the mode open() would give
        h = hashlib.sha256()
        with open(self.tmp, "rb") as fh:
            os.fsync(fh.fileno())
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        os.replace(self.tmp, self.path)
        return h.hexdigest()

    def abort(self) -> None:
        """Drop the partial file (closing may itself fail on a full disk: the file goes anyway)."""
        for close in (self.end, self.zip.close if self.zip is not None else None):
            if close is not None:
                try:
                    close()
                except (OSError, ValueError):
                    self.fh = None
        try:
            os.unlink(self.tmp)
        except OSError:
            pass


def _as_rows(x: torch.Tensor, channels: int) -> np.ndarray:
    """float images B x C x H x W in [0, 1] -> uint8 B x H x W[ x C] (round(255 x))."""
    arr = torch.round(x * 255).to(torch.uint8).cpu().permute(0, 2, 3, 1).numpy()
    return arr[..., 0] if channels == 1 else arr


def export(data: Any, out: str | os.PathLike[str], names: Sequence[str], severities: Sequence[int] = SEVERITIES, *,
           fmt: str = "npz", split: str = "test", table: str | None = None, batch_size: int = 256, seed: int = 0,
           device: torch.device | str | None = None, show_progress: bool = False,
           run_step: Callable[[str, Callable[[], dict[str, Any]]], dict[str, Any]] | None = None
           ) -> dict[str, dict[str, Any]]:
    """Write corrupted copies of ``data`` (labelled images N x C x H x W in [0, 1], C = 1 or 3) into ``out``.

    ``names``: corruptions; ``severities``: 1-5 (``fmt="npy"`` needs all five, the CIFAR-10-C layout).
    ``table``: the parameter table (default by image size). ``run_step(key, fn)`` makes each corruption a
    resumable step (see :class:`robustest.core.steps.Steps`). Returns ``{name: {file, sha256, rows, seconds}}``.
    """
    if fmt not in ("npz", "npy"):
        raise ConfigError(f"unknown format {fmt!r}: use npz or npy")
    sev = [int(s) for s in severities]
    if fmt == "npy" and sorted(sev) != list(SEVERITIES):
        raise ConfigError("--format npy writes the CIFAR-10-C layout, which holds severities 1-5: "
                          "pass --severities 1-5")
    c, h, w = image_shape(data)
    if c not in (1, 3):
        raise ConfigError(f"the data has {c} channels; corruptions need 1 (grayscale) or 3 (RGB)")
    n = num_samples(data)
    y = labels_of(data)
    if y is None:
        y = torch.cat([yb for _, yb in iter_batches(data, batch_size)])
    label_dtype = np.uint8 if n and int(y.min()) >= 0 and int(y.max()) < 256 else np.int64
    y_np = y.numpy().astype(label_dtype)
    table = table or default_table(h, w)
    out = Path(out)
    row_shape = (h, w) if c == 1 else (h, w, c)
    if fmt == "npy" and c == 1:
        row_shape = (h, w, 1)
    shard = distributed.Shard.current()
    step = run_step or (lambda key, fn: fn())
    if fmt == "npy" and distributed.is_main():
        path = out / "labels.npy"
        w_ = _Writer(path, "npy")
        try:
            w_.begin("labels", (len(sev) * n,), y_np.dtype)
            w_.write(np.tile(y_np, len(sev)))
            w_.commit()
        except BaseException:
            w_.abort()
            raise

    def one(name: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        path = out / f"{name}.{fmt}"
        writer = _Writer(path, fmt) if distributed.is_main() else None
        try:
            if writer is not None:
                writer.begin(f"x_{split}" if fmt == "npz" else "x", (len(sev) * n, *row_shape), np.dtype(np.uint8))
            for s in sev:
                rows = []
                for idx, xb, _ in iter_batches(data, batch_size, device, with_index=True, shard=shard):
                    r = _as_rows(corrupt(xb, name, s, seed=seed + int(idx[0]), table=table), c)
                    if fmt == "npy" and c == 1:
                        r = r[..., None]
                    if shard.world_size == 1:
                        assert writer is not None
                        writer.write(r)
                    else:
                        rows.append(torch.from_numpy(r))
                if shard.world_size > 1:  # gather this severity's rows to rank 0, in data-set order
                    part = torch.cat(rows) if rows else torch.empty((0, *row_shape), dtype=torch.uint8)
                    full = distributed.all_gather_cat({"rows": part})["rows"]
                    if writer is not None:
                        writer.write(full.numpy())
            if writer is None:
                return {}
            if fmt == "npz":
                for key, arr in ((f"y_{split}", np.tile(y_np, len(sev))),
                                 ("severity", np.repeat(np.asarray(sev, dtype=np.uint8), n)),
                                 ("index", np.tile(np.arange(n, dtype=np.int64), len(sev)))):
                    writer.begin(key, arr.shape, arr.dtype)
                    writer.write(arr)
            digest = writer.commit()
        except OSError as exc:
            if writer is not None:
                writer.abort()
            raise OutputError(f"cannot write {path}: {describe_os_error(exc)}; the corruptions already written in "
                              f"{out} are complete: free space, then rerun the same command to continue") from exc
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        return {"file": path.name, "sha256": digest, "rows": len(sev) * n, "seconds": time.perf_counter() - t0}

    files: dict[str, dict[str, Any]] = {}
    for name in progress(list(names), enabled=show_progress, desc="corrupt", unit="corruption"):
        rec = distributed.broadcast(step(f"corrupt_{name}", lambda name=name: one(name)))
        if distributed.broadcast(distributed.is_main() and not (out / rec.get("file", "-")).is_file()):
            rec = distributed.broadcast(one(name))  # the step was saved but its file is gone: write it again
        files[name] = rec
    return files
