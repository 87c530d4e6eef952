"""``robustest info``: what data sets, models and methods are registered."""

from __future__ import annotations

import argparse
import importlib

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

    print(f"robustest {__version__} (torch {torch.__version__}, CUDA {'yes' if torch.cuda.is_available() else 'no'})")
    for heading, rows in registries().items():
        print(f"\n{heading}:")
        width = max((len(n) for n, _ in rows), default=0)
        for name, desc in rows:
            print(f"  {name.ljust(width)}  {desc}")
    return 0
