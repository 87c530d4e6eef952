"""The suite file: a versioned, self-checking container that loads without unpickling.

A suite file is ``torch.save`` of one plain dict, read back with ``torch.load(weights_only=True)``::

    format    "robustest-suite"
    version   1, or 2 for a suite that stores certified outcomes (SUITE_VERSION = 2, the newest this reads); a file
              of a newer version is refused
    meta      JSON-able settings and provenance (see docs/SUITE.md): data set and split, the split's size N and its
              SHA-256 (``data_sha256``), strata (``strata``: how they were cut; ``stratum_sizes`` N_h;
              ``stratum_weights`` W_h = N_h / N), attack settings (eps, norm, version, n_targets, seed,
              batch_size), corruption settings (names and severities, seed), the analysis settings, the
              baseline model's fingerprint (``baseline_sha256``: SHA-256 of its state_dict) and the baseline's
              estimates
    tensors   x (K x C x H x W: uint8 when the images are exact multiples of 1/255, else float32), y (int64 [K]),
              index (int64 [K]: positions in the split), stratum (int64 [K]), score (float32 [K]: local robustness
              score under the baseline), and the baseline's per-sample outcomes: clean (bool [K]), robust
              (bool [K]), corruption (bool [K, S]: correct under each of the S corruption settings; [K, 0]
              without corruptions); optional (version 2, a suite built with a certificate): certified (bool [K]:
              the baseline's certificate, ``meta["certify"]`` naming the method, at the attack's eps and norm)
    sha256    SHA-256 of meta (canonical JSON) and every tensor (name, dtype, shape, bytes): a file altered after
              it was written is refused

:func:`model_fingerprint` is the SHA-256 of a model's state_dict (names, dtypes, shapes and bytes, in key order):
a check whose baseline has the suite's fingerprint reuses the stored outcomes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from robustest.core.atomic import atomic_save
from robustest.core.errors import DataError
from robustest.core.inputs import check_image_size
from robustest.core.reading import check_torch_file
from robustest.suite.meta import check_meta

__all__ = ["SUITE_FORMAT", "SUITE_VERSION", "Suite", "content_sha256", "model_fingerprint"]

SUITE_FORMAT = "robustest-suite"
SUITE_VERSION = 2
TENSORS = ("x", "y", "index", "stratum", "score", "clean", "robust", "corruption")
#: tensors only some suites hold (and the file version that introduced them)
OPTIONAL_TENSORS = {"certified": 2}


def _update(h: Any, name: str, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def model_fingerprint(model: nn.Module) -> str:
    """SHA-256 of ``model.state_dict()``: every entry's name, dtype, shape and bytes, in key order. Two models with
    the same weights and buffers have the same fingerprint, wherever they were loaded from."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        if isinstance(t, torch.Tensor):
            _update(h, name, t)
    return h.hexdigest()


def content_sha256(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> str:
    """The ``sha256`` of a suite file: canonical JSON of ``meta``, then every tensor by name."""
    h = hashlib.sha256(json.dumps(meta, sort_keys=True, separators=(",", ":")).encode())
    for name in sorted(tensors):
        _update(h, name, tensors[name])
    return h.hexdigest()


@dataclass
class Suite:
    """A regression suite of K samples (see the module docstring for the fields). ``images()`` gives the samples
    as float32 K x C x H x W in [0, 1]. ``timings``: seconds of the build (not stored, so two builds with the
    same inputs write the same file)."""

    x: torch.Tensor
    y: torch.Tensor
    index: torch.Tensor
    stratum: torch.Tensor
    score: torch.Tensor
    clean: torch.Tensor
    robust: torch.Tensor
    corruption: torch.Tensor
    meta: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict, compare=False)  # seconds of the build (not stored)
    certified: torch.Tensor | None = None  # the baseline's certified outcomes (a suite built with a certificate)

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def __repr__(self) -> str:
        m = self.meta
        a = m.get("attack", {})
        return (f"Suite(k={len(self)}, dataset={m.get('dataset')!r}, split={m.get('split')!r}, "
                f"n_population={m.get('n_population')}, strata={len(m.get('stratum_sizes', []))}, "
                f"{a.get('norm')} eps={a.get('eps')}, version={a.get('version')!r})")

    def summary_line(self) -> str:
        """The suite in one line: its size, population, strata, the baseline's robust accuracy with its 95 %
        interval, and the threat model (what ``robustest suite build`` prints)."""
        m, a = self.meta, self.meta["attack"]
        r = m["baseline"]["robust_accuracy"]
        return (f"suite of {m['k']} of {m['n_population']} samples in {len(m['stratum_sizes'])} strata; baseline "
                f"robust accuracy {100 * r['value']:.1f}% [{100 * r['ci_low']:.1f}, {100 * r['ci_high']:.1f}] "
                f"({a['norm']} eps={a['eps']:g}, {a['version']})")

    @property
    def sizes(self) -> torch.Tensor:
        """Population sizes N_h of the strata (int64 [H])."""
        return torch.tensor(self.meta["stratum_sizes"], dtype=torch.long)

    def images(self) -> torch.Tensor:
        """The samples as float32 K x C x H x W in [0, 1]."""
        return self.x.float() / 255.0 if self.x.dtype == torch.uint8 else self.x.float()

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor the suite holds, the optional ones (certified) only when present."""
        t = {k: getattr(self, k) for k in TENSORS}
        t.update({k: getattr(self, k) for k in OPTIONAL_TENSORS if getattr(self, k) is not None})
        return t

    @property
    def format_version(self) -> int:
        """The file version: 1, or the version that introduced an optional tensor the suite holds (so a suite
        without one stays readable by earlier robustest)."""
        return max([1, *(v for k, v in OPTIONAL_TENSORS.items() if getattr(self, k) is not None)])

    def to_dict(self) -> dict[str, Any]:
        t = self.tensors()
        return {"format": SUITE_FORMAT, "version": self.format_version, "meta": self.meta, "tensors": t,
                "sha256": content_sha256(self.meta, t)}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the suite atomically (rank 0 only under torchrun)."""
        return atomic_save(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Suite:
        """Read a suite file safely (``weights_only=True``), refusing another format, a newer version, a file whose
        content does not match its SHA-256 and inconsistent fields (one-line :class:`DataError`)."""
        path = Path(path)
        fix = "build one with 'robustest suite build'"
        if not path.is_file():
            raise DataError(f"suite file {str(path)!r} does not exist: {fix}")
        check_torch_file(path, "suite file")  # a member declaring gigabytes is refused before it is read
        try:  # memory-mapped: shapes are checked before the images are read
            d = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # noqa: BLE001 - any failure means the file is refused
            raise DataError(f"{path} is not a robustest suite (cannot be read safely: {type(exc).__name__}): "
                            f"{fix}") from None
        if not isinstance(d, dict) or d.get("format") != SUITE_FORMAT:
            raise DataError(f"{path} is not a robustest suite: {fix}")
        version = d.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise DataError(f"{path}: the suite has no valid format version: {fix}")
        if version > SUITE_VERSION:
            raise DataError(f"{path} is a suite of format version {version}, newer than this robustest reads "
                            f"({SUITE_VERSION}): upgrade robustest or rebuild the suite")
        meta, tensors = d.get("meta"), d.get("tensors")
        if not isinstance(meta, dict) or not isinstance(tensors, dict) or \
                any(not isinstance(tensors.get(k), torch.Tensor) for k in TENSORS):
            raise DataError(f"{path}: damaged suite (fields missing): {fix}")
        x = tensors["x"]
        if x.dim() == 4:  # refused before a byte of them is read
            check_image_size(tuple(x.shape[1:]), source=str(path), what="the suite's images", error=DataError,
                             fix="build the suite from images of that size at most")
        held = [k for k in OPTIONAL_TENSORS if k in tensors]
        if any(not isinstance(tensors[k], torch.Tensor) or OPTIONAL_TENSORS[k] > version for k in held):
            raise DataError(f"{path}: damaged suite (a field its version {version} does not have): {fix}")
        if d.get("sha256") != content_sha256(meta, {k: tensors[k] for k in (*TENSORS, *held)}):
            raise DataError(f"{path}: the suite's content does not match its SHA-256 (the file was altered or "
                            f"damaged after it was written): {fix}")
        suite = cls(**{k: tensors[k] for k in (*TENSORS, *held)}, meta=meta)
        suite.validate(str(path))
        return suite

    def validate(self, source: str = "suite") -> None:
        """Check that the fields fit together (shapes, dtypes, strata); one-line :class:`DataError` otherwise."""
        k = len(self)
        bad = f"{source}: damaged suite:"
        check_meta(self.meta, k, source)  # every stored value: its type and range
        if self.x.dim() != 4 or self.x.shape[0] != k or self.x.dtype not in (torch.uint8, torch.float32):
            raise DataError(f"{bad} x must be uint8 or float32 K x C x H x W with K = {k}")
        for name in ("index", "stratum", "score", "clean", "robust"):
            t = getattr(self, name)
            if t.dim() != 1 or t.shape[0] != k:
                raise DataError(f"{bad} {name} must hold one value per sample ({k})")
        if self.corruption.dim() != 2 or self.corruption.shape[0] != k:
            raise DataError(f"{bad} corruption must be K x S")
        sizes = self.meta["stratum_sizes"]
        if k == 0 or int(self.stratum.min()) < 0 or int(self.stratum.max()) >= len(sizes):
            raise DataError(f"{bad} stratum ids must lie in 0..{len(sizes) - 1}")
        counts = torch.bincount(self.stratum.long(), minlength=len(sizes))
        if bool((counts == 0).any()) or bool((counts > torch.tensor(sizes)).any()):
            raise DataError(f"{bad} every stratum needs 1..N_h samples")
        names = self.meta["corruption"]["settings"]
        if len(names) != self.corruption.shape[1]:
            raise DataError(f"{bad} {self.corruption.shape[1]} corruption outcomes per sample but "
                            f"{len(names)} corruption settings")
        if (self.certified is None) != ("certify" not in self.meta):
            raise DataError(f"{bad} certified outcomes and meta['certify'] come together")
        if self.certified is not None and (self.certified.dim() != 1 or self.certified.shape[0] != k):
            raise DataError(f"{bad} certified must hold one value per sample ({k})")
