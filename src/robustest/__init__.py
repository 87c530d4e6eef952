"""robustest: robustness testing and enhancement for PyTorch classifiers.

Sub-modules are imported lazily (``robustest.data``, ``robustest.models``, ...), so ``import robustest``
stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from robustest.core.errors import CheckpointError, ConfigError, DataError, RobustestError

__version__ = "0.1.0"

__all__ = ["CheckpointError", "ConfigError", "DataError", "RobustestError", "__version__"]


def __getattr__(name: str) -> Any:
    if name.startswith("_"):
        raise AttributeError(name)
    try:
        return importlib.import_module(f"robustest.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"robustest.{name}":
            raise AttributeError(f"module 'robustest' has no attribute {name!r}") from None
        raise
