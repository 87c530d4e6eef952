"""The peak memory figure (robustest.core.memory)."""

from __future__ import annotations

import resource
import sys

import pytest

from robustest.core.memory import peak_rss_mib


@pytest.mark.skipif(sys.platform == "darwin", reason="ru_maxrss counts bytes on macOS")
def test_peak_rss_is_ru_maxrss_in_mib():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    value = peak_rss_mib()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert before / 1024 <= value <= after / 1024 and value > 10  # a Python process with torch holds > 10 MiB
