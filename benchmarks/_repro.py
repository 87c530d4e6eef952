"""What the reproduction scripts share: the process rank (only rank 0 writes), synthetic stand-in data sets
for --dry-run, timestamped logging."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np


def rank() -> int:
    """This process's rank under torchrun (the RANK environment variable), 0 otherwise."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def is_rank0() -> bool:
    """Whether this process writes files: rank 0 of a torchrun job, or a plain single process."""
    return rank() == 0


def log(*parts: object) -> None:
    if is_rank0():
        print(time.strftime("%H:%M:%S"), *parts, flush=True)


def synthetic_npz(path: Path, shape: tuple[int, int, int], classes: int, n_train: int, n_test: int,
                  seed: int = 0) -> Path:
    """A learnable stand-in data set of the right shape (C x H x W uint8 images, ``classes`` labels): every
    class is a fixed random colour pattern at low resolution, upsampled, plus noise. Written atomically as a
    Keras-style npz (x_train, y_train, x_test, y_test, NHWC) that ``data.load("npz", ...)`` reads."""
    from robustest.core.atomic import atomic_write_bytes

    c, h, w = shape
    rng = np.random.default_rng(seed)
    protos = rng.uniform(0.2, 0.8, (classes, max(1, h // 8), max(1, w // 8), c))
    protos = protos.repeat(-(-h // protos.shape[1]), axis=1).repeat(-(-w // protos.shape[2]), axis=2)[:, :h, :w]

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.arange(n) % classes
        rng.shuffle(y)
        x = protos[y] + rng.normal(0, 0.12, (n, h, w, c))
        return (np.clip(x, 0, 1) * 255).round().astype(np.uint8), y.astype(np.int64)

    xtr, ytr = split(n_train)
    xte, yte = split(n_test)
    import io

    buf = io.BytesIO()
    np.savez(buf, x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    if is_rank0():
        atomic_write_bytes(path, buf.getvalue())
    else:  # other ranks wait for rank 0's file
        for _ in range(600):
            if path.is_file():
                break
            time.sleep(0.1)
    return path
