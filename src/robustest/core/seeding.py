"""Seeding: every random number generator at once, explicit torch generators, and derived seeds.

Training draws every random number of an epoch (shuffling, random starts, dropout) from a seed derived from
``(seed, epoch, purpose)``, so the epoch number is the whole random state and a resumed run draws what an
uninterrupted one does; RobOT derives each round's and cell's seeds the same way."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's global generators (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def make_generator(seed: int | None, device: torch.device | str | None = None) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (a fresh random seed when None)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    gen = torch.Generator(device=dev)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed derived from ``parts`` (their ``str``; stable across runs, processes and platforms)."""
    digest = hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
