"""The settings a verb records in results.json: the data and model options in effect."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from robustest.cli.args import LOADER_FLAGS
from robustest.core.options import OptionSource

__all__ = ["DATA_KEYS", "data_settings", "model_settings", "option_settings", "pick"]


DATA_KEYS = ("dataset", "data_dir", "split", *LOADER_FLAGS)


def pick(args: argparse.Namespace, keys: Iterable[str]) -> dict[str, Any]:
    """The options ``keys`` of ``args`` that hold a value (None = not given and no default: not in effect)."""
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def data_settings(args: argparse.Namespace, split: str | None = None) -> dict[str, Any]:
    """The data options in effect (``split`` overrides --split for verbs that read a fixed split)."""
    d = pick(args, DATA_KEYS)
    if split is not None:
        d["split"] = split
    if not d.get("workers"):
        d.pop("workers", None)  # 0: decoded in the main process, nothing to record
    return d


def model_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The model options in effect: checkpoint, model (pkg.module:factory), model_args, weights, torchscript."""
    d: dict[str, Any] = {}
    for key, name in (("checkpoint", "checkpoint"), ("model_factory", "model"), ("model_args", "model_args"),
                      ("weights", "weights")):
        if getattr(args, key, None) is not None:
            d[name] = getattr(args, key)
    if getattr(args, "torchscript", False):
        d["torchscript"] = True
    return d


def option_settings(source: OptionSource, args: argparse.Namespace, names: Iterable[str] | None = None
                    ) -> dict[str, Any]:
    """The flags generated from the options of ``source`` (:func:`robustest.cli.args.add_option_args`; ``names``:
    only those), by the flag's name with ``_`` for ``-``, as the verb parsed them."""
    from robustest.core.options import options_of

    return {o.dest: getattr(args, o.dest) for o in options_of(source, None if names is None else tuple(names))}
