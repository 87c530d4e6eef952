"""Derived seeds: training draws every random number of an epoch (shuffling, random starts, dropout) from a seed
derived from ``(seed, epoch, purpose)``, so the epoch number is the whole random state and a resumed run
draws what an uninterrupted one does."""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["derive_seed"]


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed derived from ``parts`` (their ``str``; stable across runs, processes and platforms)."""
    digest = hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
