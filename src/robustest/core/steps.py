"""Resumable steps: long work split into steps whose outputs are saved atomically, fingerprinted by their
inputs, so a killed run continues where it stopped and a changed run starts afresh.

``Steps(folder, settings)`` keeps its state in ``folder/state/steps/``. ``steps.run(key, fn)`` returns the
saved output of step ``key`` when an earlier run with the same fingerprint finished it, else computes
``fn()``, saves it (``torch.save`` of plain data, read back with ``weights_only=True``) and returns it. The
fingerprint covers the settings that determine the results, the model's weights and the data (by
content, see :func:`fingerprint`); when it differs from the saved one the old steps are discarded.

Rerunning the same command is how ``analyze``, ``validate``, ``enhance`` and ``corrupt`` resume (no flag
needed); ``run`` and ``compare`` keep their ``--resume`` flag. Under torchrun every rank computes each step
(its own share of the samples) and rank 0 alone saves it; rank 0 decides which steps are done and sends
their outputs to the other ranks, so no rank reads a file another one is writing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from robustest.core import distributed
from robustest.core.atomic import atomic_save, atomic_write_json

__all__ = ["Steps", "data_fingerprint", "fingerprint"]

T = TypeVar("T")


def fingerprint(*parts: Any) -> str:
    """SHA-256 of JSON-able ``parts`` (settings, model and data fingerprints)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def data_fingerprint(data: Any, probe: int = 64) -> str:
    """A fingerprint of a data set's content that costs little: its size, all its labels (when it keeps
    them apart) and its first and last ``probe`` images."""
    from robustest.core.batching import labels_of, num_samples, take

    n = num_samples(data)
    h = hashlib.sha256(f"n={n}".encode())
    y = labels_of(data)
    if y is not None:
        h.update(y.detach().cpu().long().numpy().tobytes())
    for idx in (torch.arange(min(n, probe)), torch.arange(max(0, n - probe), n)):
        if len(idx):
            x, _ = take(data, idx)
            h.update(x.detach().cpu().contiguous().float().numpy().tobytes())
    return h.hexdigest()


class Steps:
    """Saved, fingerprinted steps of one run under ``folder/state/steps`` (see the module docstring)."""

    def __init__(self, folder: str | Path, fingerprint_: str, *, log: Callable[[str], None] | None = None) -> None:
        self.dir = Path(folder) / "state" / "steps"
        self.fingerprint = fingerprint_
        self.log = log or (lambda msg: None)
        self.resumed = 0
        marker = self.dir / "steps.json"
        previous = None
        if distributed.is_main() and marker.is_file():
            try:
                previous = json.loads(marker.read_text()).get("fingerprint")
            except (OSError, ValueError, AttributeError):
                previous = None
            if previous != fingerprint_:
                self.log(f"{folder}: settings, model or data changed since the saved steps: starting afresh")
                shutil.rmtree(self.dir, ignore_errors=True)
        atomic_write_json(marker, {"fingerprint": fingerprint_})

    def _path(self, key: str) -> Path:
        return self.dir / f"{key}.pt"

    def run(self, key: str, fn: Callable[[], T]) -> T:
        """The output of step ``key``: loaded when saved earlier, else ``fn()`` computed and saved."""
        path = self._path(key)
        done = distributed.broadcast(path.is_file() if distributed.is_main() else None)
        if done:
            value = torch.load(path, map_location="cpu", weights_only=True) if distributed.is_main() else None
            self.resumed += 1
            return distributed.broadcast(value)
        value = fn()
        atomic_save(value, path)
        return value
