"""``robustest info``: what data sets, models and methods are registered."""

from __future__ import annotations

import argparse
import importlib

from robustest.cli._common import log

ORDER = 0

# module -> heading; each module that exists exposes names() (and optionally describe(name))
SECTIONS = [
    ("data", "data sets"),
    ("models", "models"),
    ("metrics", "metrics"),
    ("attacks", "attacks"),
    ("fuzzing", "fuzzers"),
    ("corruptions", "corruptions"),
    ("selection", "selection strategies"),
]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="list data sets, models and methods", description=__doc__)
    # info writes no files: it has no --out and no results.json
    p.set_defaults(func=run)


def registries() -> dict[str, list[tuple[str, str]]]:
    """Heading -> [(name, description)] for every registry present in this installation."""
    out: dict[str, list[tuple[str, str]]] = {}
    for mod_name, heading in SECTIONS:
        try:
            mod = importlib.import_module(f"robustest.{mod_name}")
        except ModuleNotFoundError:
            continue
        if not hasattr(mod, "names"):
            continue
        rows = []
        for name in mod.names():
            desc = ""
            if hasattr(mod, "describe"):
                desc = mod.describe(name)
            elif hasattr(mod, "info"):
                desc = getattr(mod.info(name), "description", "")
            rows.append((name, desc))
        out[heading] = rows
    return out


def run(args: argparse.Namespace) -> int:
    import torch

    from robustest import __version__

    cuda = "yes" if torch.cuda.is_available() else "no"
    log.info(f"robustest {__version__} (torch {torch.__version__}, CUDA {cuda})")
    for heading, rows in registries().items():
        log.info(f"\n{heading}:")
        width = max((len(n) for n, _ in rows), default=0)
        for name, desc in rows:
            log.info(f"  {name.ljust(width)}  {desc}")
    return 0
