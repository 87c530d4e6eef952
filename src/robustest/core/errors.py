"""Exceptions raised by robustest.

Every error a user can cause (bad data, bad arguments, bad files) is a :class:`RobustestError`; the CLI
prints its message as one line and exits with status 2.
"""

from __future__ import annotations

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
