"""The results contract every verb follows: one ``results.json`` per output folder.

A results document is a JSON object with a fixed header followed by the verb's own results::

    format       "robustest-<verb>-results"   names the verb (and so the schema: docs/schemas/<verb>.schema.json)
    version      1                            version of the contract
    settings     the options in effect for that verb, with resolved defaults (never argparse's namespace)
    timings      wall-clock seconds: keys ending in ``_s`` (``total_s`` always present)
    world_size   number of processes that produced the results (1 unless run under torchrun)
    rank_samples under torchrun only: samples each rank read of its share, in rank order
    ...          the verb's results (documented per verb in docs/RESULTS_SCHEMA.md)

:func:`write_results` builds the document and writes it atomically; :func:`document` only builds it.
:func:`read_results` reads one back and checks its header.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from robustest.core.atomic import atomic_write_json, json_safe
from robustest.core.errors import DataError

__all__ = ["HEADER_KEYS", "OPTIONAL_HEADER_KEYS", "RESULTS_FILE", "RESULTS_VERSION", "document", "read_results",
           "results_format", "write_results"]

RESULTS_FILE = "results.json"
RESULTS_VERSION = 1
HEADER_KEYS = ("format", "version", "settings", "timings", "world_size")
#: header keys present only in some documents (rank_samples: under torchrun)
OPTIONAL_HEADER_KEYS = ("rank_samples",)


def results_format(verb: str) -> str:
    """The ``format`` tag of a verb's results: ``"robustest-<verb>-results"``."""
    if not verb or not verb.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"not a verb name: {verb!r}")
    return f"robustest-{verb}-results"


def _clean_timings(timings: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in timings.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            raise ValueError(f"timing {k!r} must be a finite number of seconds, got {v!r}")
        out[str(k)] = float(v)
    if "total_s" not in out:
        raise ValueError("timings need 'total_s' (seconds of the whole verb)")
    return out


def document(verb: str, settings: Mapping[str, Any], results: Mapping[str, Any], timings: Mapping[str, Any],
             world_size: int | None = None) -> dict[str, Any]:
    """The results document of ``verb``: the contract's header, then ``results`` (JSON-safe: tensors become
    lists, NaN becomes null). ``results`` must not use the header's keys. ``world_size`` defaults to the
    number of torchrun ranks (1 in a single process)."""
    if world_size is None:
        from robustest.core.distributed import world_size as ranks

        world_size = ranks()
    clash = [k for k in results if k in HEADER_KEYS or k in OPTIONAL_HEADER_KEYS]
    if clash:
        raise ValueError(f"results may not use the header key(s) {', '.join(clash)}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    doc = {"format": results_format(verb), "version": RESULTS_VERSION, "settings": dict(settings),
           "timings": _clean_timings(timings), "world_size": world_size, **results}
    return json_safe(doc)


def write_results(out: str | os.PathLike[str], verb: str, settings: Mapping[str, Any], results: Mapping[str, Any],
                  timings: Mapping[str, Any], world_size: int | None = None) -> dict[str, Any]:
    """Write ``OUT/results.json`` (see :func:`document`) atomically and return the document written. Under
    torchrun every rank calls it; ``rank_samples`` then records the samples each rank read of its share
    (in rank order)."""
    from robustest.core import distributed

    doc = document(verb, settings, results, timings, world_size)
    shares = distributed.shares()  # a collective: every rank writes (only rank 0's write lands)
    if shares is not None:
        doc["rank_samples"] = shares
    atomic_write_json(Path(out) / RESULTS_FILE, doc)
    return doc


def read_results(path: str | os.PathLike[str], verb: str | None = None) -> dict[str, Any]:
    """Read a results document (a folder or its results.json); with ``verb``, require that verb's format."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.is_file():
        raise DataError(f"results file {str(path)!r} does not exist: pass the --out folder of a robustest verb")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is not a JSON file ({type(exc).__name__}): pass a results.json of robustest") \
            from None
    if not isinstance(doc, dict) or not str(doc.get("format", "")).startswith("robustest-"):
        raise DataError(f"{path} is not a robustest results file (no 'format' tag)")
    if verb is not None and doc["format"] != results_format(verb):
        raise DataError(f"{path} holds {doc['format']!r}, not the results of 'robustest {verb}'")
    return doc
