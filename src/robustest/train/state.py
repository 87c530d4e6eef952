"""The one resume format of training: :func:`robustest.train.fit`, :func:`robustest.train.harden` and
:func:`robustest.weakrobust.enhance` take the same two arguments, ``state_dir`` (write the state there after every
epoch, as :data:`STATE_FILES` names it) and ``resume`` (continue from it), and keep their state through a
:class:`StateFile` (:func:`in_state_dir` applies the rules every loop shares).

A state file is a ``torch.save`` of plain data (tensors, numbers, strings, lists, dicts), written atomically by rank
0 (:func:`robustest.core.atomic.atomic_save`) and read with ``torch.load(weights_only=True)`` after
:func:`robustest.core.reading.check_torch_file`::

    {"format": "robustest-train-state", "version": 1, "kind": "fit" | "harden" | "enhance",
     "settings": the run's settings as canonical JSON (sorted keys),
     "fingerprint": sha256 of the settings JSON and the data digest (where the run has one),
     "epoch": completed epochs, "model": state_dict, "optimizer": state_dict,
     "schedule": state_dict | None, "scaler": state_dict | None,
     "rng": {"torch": ByteTensor | None, "cuda": ByteTensor | None, "numpy": JSON str | None,
             "generators": {name: ByteTensor}},
     "history": [the per-epoch records], "best": {"epoch", "score", "model"} | None (best keeping),
     "seconds": training time so far, "extra": {kind-specific, e.g. harden's "guard_epoch"}}

:meth:`StateFile.load` refuses, with one line naming the fix, a file that is no training state, one of another kind,
version or older format, and one written with other settings (or, under torchrun, another number of ranks).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from robustest.core.atomic import atomic_save
from robustest.core.errors import ConfigError, DataError
from robustest.core.reading import check_torch_file

__all__ = ["FORMAT", "KINDS", "STATE_FILES", "VERSION", "StateFile", "check_state_dir", "data_digest", "in_state_dir",
           "restore_rng", "rng_state"]

FORMAT = "robustest-train-state"
VERSION = 1
KINDS = ("fit", "harden", "enhance")
#: the file each kind of run keeps in its ``state_dir``
STATE_FILES = {"fit": "train_state.pt", "harden": "harden_state.pt", "enhance": "enhance_state.pt"}
#: the tags of the per-verb state files of earlier releases (refused: they cannot be continued)
OLD_FORMATS = ("robustest-fit-state-1", "robustest-harden-state", "robustest-enhance-state-1")
#: what a state written with other settings holds, per kind (the refusal's words)
_OTHER = {"fit": "training with other settings (epochs, data, recipe)",
          "harden": "a run with other settings or data",
          "enhance": "an enhancement with other settings, another starting model or other data"}


def canonical(settings: dict[str, Any]) -> str:
    """The canonical JSON of a run's settings (sorted keys; values JSON cannot hold written as strings)."""
    return json.dumps(settings, sort_keys=True, default=str)


def data_digest(*tensors: torch.Tensor) -> str:
    """sha256 of the tensors' shapes, dtypes and bytes (hex): what a run's fingerprint says of its data."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def rng_state(device: torch.device | None = None, generators: dict[str, torch.Generator | None] | None = None,
              numpy_rng: np.random.Generator | None = None, *, global_torch: bool = True) -> dict[str, Any]:
    """The random states a run continues from: torch's global CPU state (and the CUDA one of ``device``) with
    ``global_torch``, each named generator's state (None ones are left out) and ``numpy_rng``'s, as JSON."""
    gens = {k: g.get_state() for k, g in (generators or {}).items() if g is not None}
    cuda = device is not None and device.type == "cuda"
    return {"torch": torch.get_rng_state() if global_torch else None,
            "cuda": torch.cuda.get_rng_state(device) if global_torch and cuda else None,
            "numpy": json.dumps(numpy_rng.bit_generator.state) if numpy_rng is not None else None,
            "generators": gens}


def restore_rng(st: dict[str, Any], device: torch.device | None = None,
                generators: dict[str, torch.Generator | None] | None = None,
                numpy_rng: np.random.Generator | None = None) -> None:
    """Set the random states :func:`rng_state` recorded (``st``) back into the run's generators."""
    for name, gen in (generators or {}).items():
        if gen is not None:
            gen.set_state(st["generators"][name])
    if numpy_rng is not None:
        numpy_rng.bit_generator.state = json.loads(st["numpy"])
    if st.get("torch") is not None:
        torch.set_rng_state(st["torch"])
    if device is not None and device.type == "cuda" and st.get("cuda") is not None:
        torch.cuda.set_rng_state(st["cuda"], device)


@dataclass(frozen=True)
class StateFile:
    """Where one run keeps its training state, and what a state there must match to be continued.

    ``kind``: "fit", "harden" or "enhance". ``settings``: the run's settings as canonical JSON (:func:`canonical`);
    ``fingerprint``: sha256 of it and the data digest. ``label``: how messages name the file (e.g.
    ``state '/x/state.pt'``); ``fix``: what the user does about a file this run cannot continue."""

    path: Path
    kind: str
    settings: str
    fingerprint: str
    label: str
    fix: str

    @classmethod
    def of(cls, path: str | os.PathLike[str], kind: str, settings: dict[str, Any], digest: str = "", *,
           label: str | None = None, fix: str = "delete it to start again") -> StateFile:
        """The state file at ``path`` of a ``kind`` run with ``settings`` over data of ``digest``
        (:func:`data_digest`; "" where the run fingerprints its data by its settings alone)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        text = canonical(settings)
        fp = hashlib.sha256(f"{text}\n{digest}".encode()).hexdigest()
        return cls(Path(path), kind, text, fp, label if label is not None else str(path), fix)

    def save(self, epoch: int, *, model: nn.Module, optimizer: torch.optim.Optimizer,
             schedule: Any = None, scaler: Any = None, rng: dict[str, Any] | None = None,
             history: list[dict[str, Any]], best: dict[str, Any] | None = None, seconds: float = 0.0,
             extra: dict[str, Any] | None = None) -> None:
        """Write the state after ``epoch`` completed epochs atomically (rank 0 under torchrun). ``schedule`` and
        ``scaler``: the LR scheduler and GradScaler (or None); ``rng``: :func:`rng_state`'s record; ``history``:
        the per-epoch records; ``best``: {"epoch", "score", "model"} of best keeping."""
        atomic_save({"format": FORMAT, "version": VERSION, "kind": self.kind, "settings": self.settings,
                     "fingerprint": self.fingerprint, "epoch": int(epoch), "model": model.state_dict(),
                     "optimizer": optimizer.state_dict(),
                     "schedule": schedule.state_dict() if schedule is not None else None,
                     "scaler": scaler.state_dict() if scaler is not None else None,
                     "rng": rng if rng is not None else rng_state(global_torch=False), "history": history,
                     "best": best, "seconds": float(seconds), "extra": dict(extra or {})}, self.path)

    def load(self) -> dict[str, Any]:
        """The state saved at :attr:`path` (on the CPU), checked to be one this run continues: a one-line
        ConfigError for a file that is no training state, another kind's, an older format's or one with other
        settings; a DataError for a damaged file or one a newer robustest wrote."""
        bad = f"{self.label} is not a training state robustest wrote: {self.fix}"
        check_torch_file(self.path, "training state")
        try:
            st = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - truncated, foreign or unsafe file
            raise ConfigError(bad) from exc
        fmt = st.get("format") if isinstance(st, dict) else None
        if fmt in OLD_FORMATS:
            raise ConfigError(f"{self.label} holds a state in an earlier format ({fmt}) this robustest cannot "
                              f"continue: {self.fix}")
        if fmt != FORMAT:
            raise ConfigError(bad)
        if st.get("kind") != self.kind:
            raise ConfigError(f"{self.label} holds the state of a {st.get('kind')} run, not of {self.kind}: "
                              f"{self.fix}")
        version = int(st.get("version", 0))
        if version > VERSION:
            raise DataError(f"{self.label} was written by a newer robustest: upgrade, or {self.fix}")
        if version != VERSION:
            raise ConfigError(f"{self.label} holds a state of version {version}, not {VERSION}: {self.fix}")
        if st.get("settings") != self.settings or st.get("fingerprint") != self.fingerprint:
            raise ConfigError(self._other_settings(st.get("settings")))
        return st

    def _other_settings(self, saved: Any) -> str:
        """The refusal of a state written with other settings: by another number of ranks when that is the one
        difference, else the kind's words."""
        try:
            old, new = json.loads(saved), json.loads(self.settings)
        except (TypeError, ValueError):
            old, new = {}, {}
        if isinstance(old, dict) and isinstance(new, dict):
            w_old, w_new = old.pop("world_size", 1), new.pop("world_size", 1)
            if w_old != w_new and old == new:
                return (f"{self.label} holds training by {w_old} process(es) and this run has {w_new}: resume "
                        f"with the same number (torchrun --nproc-per-node {w_old}), or {self.fix}")
        return f"{self.label} holds {_OTHER[self.kind]}: resume with the same ones, or {self.fix}"


def check_state_dir(kind: str, state_dir: str | os.PathLike[str] | None, resume: bool) -> Path | None:
    """The state file path of a ``kind`` run in ``state_dir`` (None without one), by the rules every loop shares,
    checked before any work: ``resume=True`` needs a ``state_dir``; a ``state_dir`` that exists must be a folder; a
    state already there is continued only with ``resume=True`` (never overwritten by a fresh run). ``resume=True``
    where there is no state yet starts afresh. One-line ConfigErrors."""
    if resume and state_dir is None:
        raise ConfigError("resume=True needs the state_dir of the interrupted run")
    if state_dir is None:
        return None
    folder = Path(state_dir)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"state_dir {str(folder)!r} exists and is not a folder")
    path = folder / STATE_FILES[kind]
    if path.is_file() and not resume:
        raise ConfigError(f"{folder} already holds the state of an interrupted {kind} run: resume it (resume=True; "
                          "the CLI's --resume) or choose another folder")
    return path


def in_state_dir(kind: str, state_dir: str | os.PathLike[str] | None, resume: bool, settings: dict[str, Any],
                 digest: str = "", *, fix: str = "delete the state folder to start afresh") -> StateFile | None:
    """The :class:`StateFile` of a ``kind`` run with ``settings`` over data of ``digest`` in ``state_dir`` (None
    without one), after :func:`check_state_dir`'s checks."""
    path = check_state_dir(kind, state_dir, resume)
    return None if path is None else StateFile.of(path, kind, settings, digest, fix=fix)
