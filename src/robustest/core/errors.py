"""Exceptions raised by robustest.

Every error a user can cause (bad data, bad arguments, bad files) is a :class:`RobustestError`; the CLI
prints its message as one line and exits with status 2.
"""

from __future__ import annotations

import errno

#: the exit statuses of the ``robustest`` command: 0 done, 1 a gate failed (eval --fail-under, suite check), 2 bad
#: input (a RobustestError), 3 an internal error (a bug), 130 interrupted
EXIT_OK = 0
EXIT_GATE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130


class RobustestError(Exception):
    """Base class of all user-facing robustest errors (message is one line, names problem and fix)."""


class DataError(RobustestError, ValueError):
    """A data set is missing, malformed or inconsistent (shape, range, dtype, labels, truncation)."""


class CheckpointError(RobustestError, ValueError):
    """A file is not a loadable robustest checkpoint."""


class ConfigError(RobustestError, ValueError):
    """An argument or configuration value is invalid."""


class OutputError(RobustestError, OSError):
    """An output folder or file cannot be written (read-only, disk full, file size limit): nothing already
    written is lost, and the same command continues the work once the cause is fixed."""


class TrainingDiverged(RobustestError, ArithmeticError):
    """Training produced a non-finite loss (NaN or infinity); the weights are not saved, and the message names
    the epoch, the step and the setting to lower."""


def user_error(exc: BaseException, keep: int = 200) -> str:
    """``"ValueError: message"`` of an exception raised by the user's code, on one line and at most ``keep``
    characters of message: the part of a one-line error that says what the user's code raised."""
    text = " ".join(str(exc).split())
    if len(text) > keep:
        text = text[:keep] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: OSError numbers that mean the path the user gave is unusable (besides the exceptions caught by type): the fix
BAD_PATHS = {errno.ENAMETOOLONG: "the file system refuses a name this long: shorten it",
             errno.ELOOP: "the path runs through a loop of symbolic links"}
_FILE_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def error_line(exc: BaseException) -> tuple[int, str]:
    """The exit status of a command that stopped on ``exc``, and the line it prints after ``robustest VERB: ``:
    ``error: ...`` (status 2) for bad input: a :class:`RobustestError`, a missing or refused file (with its path), a
    text file holding binary bytes, a path the file system refuses (named, cut short); else ``internal error: ...``
    (status 3, a bug) with the exception's type and a hint to rerun with ``--debug``."""
    if isinstance(exc, RobustestError):
        return EXIT_USAGE, f"error: {_text(exc)}"
    if isinstance(exc, _FILE_ERRORS):
        where = f": {exc.filename}" if exc.filename else ""
        return EXIT_USAGE, f"error: {exc.strerror or _text(exc)}{where}"
    if isinstance(exc, UnicodeDecodeError):  # a text file (a YAML config, a CSV) holding binary bytes
        return EXIT_USAGE, (f"error: a file read as UTF-8 text holds binary bytes (byte {exc.start}): pass a text "
                            "file")
    if isinstance(exc, OSError) and exc.errno in BAD_PATHS:
        where = f": {_shorten(str(exc.filename))}" if exc.filename else ""
        return EXIT_USAGE, f"error: {exc.strerror or _text(exc)} ({BAD_PATHS[exc.errno]}){where}"
    return EXIT_INTERNAL, (f"internal error: {type(exc).__name__}: {_text(exc)} (rerun with --debug for the "
                           "traceback)")


def _shorten(text: str, keep: int = 80) -> str:
    """``text`` cut in the middle to about ``keep`` characters (a path over the file-system limit is long)."""
    return text if len(text) <= keep else f"{text[:keep // 2]}...{text[-keep // 2:]}"


def _text(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
