"""How a command states the exception it stopped on (robustest.core.errors.error_line): one line and its status."""

from __future__ import annotations

import errno

import pytest

from robustest.core.distributed import RankFailure
from robustest.core.errors import (
    EXIT_INTERNAL,
    EXIT_USAGE,
    ConfigError,
    DataError,
    OutputError,
    error_line,
)


@pytest.mark.parametrize("exc, expected", [
    (ConfigError("bad  value:\n  fix it"), (EXIT_USAGE, "error: bad value: fix it")),
    (DataError("truncated file"), (EXIT_USAGE, "error: truncated file")),
    (OutputError("--out 'x' is not writable"), (EXIT_USAGE, "error: --out 'x' is not writable")),
    (RankFailure("rank 1 stopped"), (EXIT_USAGE, "error: rank 1 stopped")),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "a.pt"),
     (EXIT_USAGE, "error: No such file or directory: a.pt")),
    (PermissionError(errno.EACCES, "Permission denied"), (EXIT_USAGE, "error: Permission denied")),
    (IsADirectoryError("is a folder"), (EXIT_USAGE, "error: is a folder")),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "f/x"), (EXIT_USAGE, "error: Not a directory: f/x")),
    (UnicodeDecodeError("utf-8", b"ab\xff", 2, 3, "invalid start byte"),
     (EXIT_USAGE, "error: a file read as UTF-8 text holds binary bytes (byte 2): pass a text file")),
    (OSError(errno.ELOOP, "Too many levels of symbolic links", "l"),
     (EXIT_USAGE, "error: Too many levels of symbolic links (the path runs through a loop of symbolic links): l")),
    (OSError(errno.ENOSPC, "No space left on device"),
     (EXIT_INTERNAL, "internal error: OSError: [Errno 28] No space left on device (rerun with --debug for the "
                     "traceback)")),
    (KeyError("w"), (EXIT_INTERNAL, "internal error: KeyError: 'w' (rerun with --debug for the traceback)")),
    (RuntimeError(), (EXIT_INTERNAL, "internal error: RuntimeError: RuntimeError (rerun with --debug for the "
                                     "traceback)")),
])
def test_each_exception_gets_its_status_and_one_line(exc, expected):
    assert error_line(exc) == expected


def test_a_name_too_long_is_cut_in_the_middle():
    name = "a" * 50 + "b" * 50 + "c" * 50
    status, line = error_line(OSError(errno.ENAMETOOLONG, "File name too long", name))
    assert status == EXIT_USAGE
    assert line == ("error: File name too long (the file system refuses a name this long: shorten it): "
                    f"{'a' * 40}...{'c' * 40}")
    short = error_line(OSError(errno.ENAMETOOLONG, "File name too long", "x" * 80))[1]
    assert short.endswith(": " + "x" * 80)  # at the limit: kept whole
    assert error_line(OSError(errno.ENAMETOOLONG, "File name too long"))[1].endswith("shorten it)")


def test_an_os_error_without_its_text_is_named_by_its_number():
    assert error_line(OSError(errno.ENAMETOOLONG, "")) == (
        EXIT_USAGE, f"error: [Errno {errno.ENAMETOOLONG}] (the file system refuses a name this long: shorten it)")
