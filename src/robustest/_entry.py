"""The ``robustest`` console script: Ctrl-C exits with status 130 and one line from its first instant.

Importing the command (torch, the verbs) takes seconds; an interrupt then would print a traceback and kill the
process by SIGINT. This module imports nothing heavy (``robustest/__init__.py`` imports only the error classes),
so the console script installs its interrupt handling before anything else is imported: until the command starts
its work an interrupt exits at once (nothing is written yet); from then on it is the ``KeyboardInterrupt`` that
:func:`robustest.cli.main` turns into status 130 after the work in progress has cleaned up.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

EXIT_INTERRUPTED = 130
INTERRUPTED = b"robustest: interrupted\n"


def exit_interrupted(signum: int, frame: FrameType | None) -> None:
    """SIGINT handler while the command is being imported and parsed: one line, status 130, no cleanup needed."""
    try:
        os.write(2, INTERRUPTED)
    finally:
        os._exit(EXIT_INTERRUPTED)


exit_interrupted.while_starting = True  # type: ignore[attr-defined]  # robustest.cli.main replaces it then


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``robustest`` console script (and ``python -m robustest``); returns the exit status."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when the caller handles SIGINT itself
        signal.signal(signal.SIGINT, exit_interrupted)
    try:
        from robustest.cli import main as run
    except KeyboardInterrupt:  # a handler of the caller's raised it
        sys.stderr.write(INTERRUPTED.decode())
        return EXIT_INTERRUPTED
    return run(argv)
