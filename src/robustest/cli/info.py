"""``robustest info``: what data sets, models and methods are registered.

``--models`` lists the models alone with their native input (channels x height x width, classes),
parameters and multiply-adds of one forward pass of one image at that size (``robustest.models.profile``).
"""

from __future__ import annotations

import argparse
import importlib

from robustest.cli.output import log

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
    p.add_argument("--models", action="store_true",
                   help="only the models, with native input, parameters and multiply-adds")
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
    if getattr(args, "models", False):
        log.info("\nmodels (input and classes: the native size; parameters and multiply-adds (MACs) of one image "
                 "at it):")
        cols = ["name", "input", "classes", "params", "MACs", "description"]
        from robustest import models

        table = models.catalogue()
        widths = {c: max(len(c), *(len(r[c]) for r in table)) for c in cols[:-1]}
        right = ("classes", "params", "MACs")

        def line(r: dict[str, str]) -> str:
            return "  " + "  ".join(r[c] if c not in widths else r[c].rjust(widths[c]) if c in right
                                    else r[c].ljust(widths[c]) for c in cols)

        log.info(line({c: c for c in cols}))
        for r in table:
            log.info(line(r))
        return 0
    for heading, rows in registries().items():
        log.info(f"\n{heading}:" + ("  (sizes, parameters, multiply-adds: robustest info --models)"
                                     if heading == "models" else ""))
        width = max((len(n) for n, _ in rows), default=0)
        for name, desc in rows:
            log.info(f"  {name.ljust(width)}  {desc}")
    return 0
