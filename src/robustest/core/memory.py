"""The peak memory of this process, as results.json records it."""

from __future__ import annotations

import resource
import sys

__all__ = ["peak_rss_mib"]


def peak_rss_mib() -> float:
    """Peak resident memory of this process in MiB (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024.0 if sys.platform != "darwin" else kb / 2**20
