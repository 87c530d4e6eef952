"""Progress bars on stderr (tqdm)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def progress(iterable: Iterable[Any], *, enabled: bool = True, desc: str | None = None,
             total: int | None = None, unit: str = "it") -> Iterable[Any]:
    """Wrap ``iterable`` in a tqdm progress bar on stderr when ``enabled``."""
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, leave=False, dynamic_ncols=True)
