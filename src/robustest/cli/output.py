"""What a verb writes to the console and the run folder: the output folder, the end every verb's run shares
(results.json and report.html, :func:`write_run`), logging (one line per message, rank 0 only under torchrun),
progress bars, help text from docstrings, tables and number formats."""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["LOGGER", "configure_logging", "fmt", "log", "out_dir", "plain", "print_table",
           "progress_enabled", "write_run", "written"]


def out_dir(args: argparse.Namespace) -> Path:
    """The --out folder, created and proved writable (stale temporary files of a killed run removed)."""
    from robustest.core.atomic import check_writable

    return check_writable(args.out)


def write_run(out: Path, verb: str, started: float, settings: Mapping[str, Any], results: Mapping[str, Any],
              timings: Mapping[str, Any], report: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """The end every verb's run shares: ``out/results.json`` (the results contract of ``verb``; ``timings`` closed
    by ``total_s``, the seconds since ``started``, a :func:`time.perf_counter` reading taken when the verb began)
    and ``out/report.html``, drawn by ``report(document)``. Returns the document written.

    Example: ``write_run(out, "score", t0, settings, run.to_results(), run.timings, lambda d: score_report(d, s))``.
    """
    from robustest.results import write_results

    doc = write_results(out, verb, settings, results, {**timings, "total_s": time.perf_counter() - started})
    report(doc).write(Path(out) / "report.html")
    return doc


def written(out: Path, files: Sequence[str] | Mapping[str, str], started: float) -> None:
    """The last line of every verb that writes a run folder: ``wrote results.json, a, b to OUT in 1.2s``.

    ``files``: the names written in ``out`` (a list, or the values of a results document's ``files`` mapping;
    results.json is named first when missing; past eight names the rest are counted); ``started``: the
    :func:`time.perf_counter` reading taken when the verb began."""
    names = list(files.values()) if isinstance(files, Mapping) else list(files)
    if "results.json" not in names:
        names.insert(0, "results.json")
    shown = names if len(names) <= 8 else [*names[:6], f"{len(names) - 6} more"]
    log.info(f"wrote {', '.join(shown)} to {out} in {time.perf_counter() - started:.1f}s")


LOGGER = "robustest"
log = logging.getLogger("robustest.cli")  # what a verb reports: stdout; other robustest loggers: stderr


class _LiveStream(logging.StreamHandler):
    """A handler writing to sys.stdout or sys.stderr as they are when a record is emitted (so redirections made
    after the command started, such as pytest's capture, are honoured)."""

    def __init__(self, name: str) -> None:
        super().__init__(getattr(sys, name))
        self._name = name

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = getattr(sys, self._name)
        super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """A reader that went away (``robustest info | head``): the rest of the output goes to /dev/null,
        quietly, instead of one traceback per message."""
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            import os

            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
            except (OSError, ValueError, AttributeError):
                setattr(sys, self._name, open(os.devnull, "w"))  # noqa: SIM115 - for the rest of the process
            return
        super().handleError(record)


class _Formatter(logging.Formatter):
    def __init__(self, verb: str) -> None:
        super().__init__("%(message)s")
        self.prefix = f"robustest {verb}" if verb else "robustest"

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.WARNING:
            return f"{self.prefix}: {record.levelname.lower()}: {text}"
        return text


def _to_stdout(record: logging.LogRecord) -> bool:
    return record.name.startswith("robustest.cli") and record.levelno < logging.WARNING


def configure_logging(verb: str = "", quiet: bool = False) -> Callable[[], None]:
    """Route the ``robustest`` loggers for one command: the verb's report lines (logger ``robustest.cli``, INFO)
    to stdout; library messages, warnings and errors to stderr, warnings and errors prefixed with
    ``robustest VERB:``. Python warnings become one-line warnings of the ``robustest.warnings`` logger
    (deprecation warnings of libraries stay hidden, as Python hides them by default). ``quiet`` raises the
    level to ERROR. Returns a function that undoes all of it."""
    import warnings

    level = logging.ERROR if quiet else logging.INFO
    root = logging.getLogger(LOGGER)
    out, err = _LiveStream("stdout"), _LiveStream("stderr")
    out.addFilter(_to_stdout)
    err.addFilter(lambda r: not _to_stdout(r))
    for h in (out, err):
        h.setFormatter(_Formatter(verb))
    saved = (root.level, root.propagate)
    root.setLevel(level)
    root.propagate = False
    root.addHandler(out)
    root.addHandler(err)
    caught = warnings.catch_warnings()
    caught.__enter__()
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.simplefilter("ignore", PendingDeprecationWarning)
    show_default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 - warnings' signature
        if file is not None:
            return show_default(message, category, filename, lineno, file, line)
        logging.getLogger("robustest.warnings").warning(" ".join(f"{message} ({category.__name__})".split()))
        return None

    warnings.showwarning = show

    def restore() -> None:
        caught.__exit__(None, None, None)
        root.removeHandler(out)
        root.removeHandler(err)
        root.setLevel(saved[0])
        root.propagate = saved[1]

    return restore


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def progress_enabled(args: argparse.Namespace) -> bool:
    """Progress bars are drawn only when asked for (no --no-progress, no --quiet) AND stderr is a terminal: a
    captured log never fills with carriage-return frames."""
    return not getattr(args, "no_progress", False) and not getattr(args, "quiet", False) and _isatty(sys.stderr)


_RST = [(re.compile(r"``([^`]+)``"), r"\1"), (re.compile(r":(?:func|class|meth|mod|data|attr):`~?([^`]+)`"), r"\1"),
        (re.compile(r"`([^`]+)`"), r"\1")]


def plain(text: str | None) -> str | None:
    """Help text without reStructuredText markup (````code````, ``:func:`x```): plain text for --help."""
    if text is None:
        return None
    for pattern, repl in _RST:
        text = pattern.sub(repl, text)
    return text


def print_table(rows: list[dict], columns: list[str], file=None) -> None:
    """Print rows as a plain aligned table: headers as words, figures rounded by column (as in report.html).
    Goes to ``file`` when given, else through the ``robustest.cli`` logger (stdout; silent with --quiet)."""
    from robustest.report import format_value, header_label

    cells = [[header_label(c) for c in columns]] + [[format_value(r.get(c), c) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for j, row in enumerate(cells):
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    for line in lines:
        if file is not None:
            print(line, file=file)
        else:
            log.info(line)


def fmt(value: Any, key: str = "") -> str:
    """A figure for a printed line, rounded like the report (:func:`robustest.report.format_value`)."""
    from robustest.report import format_value

    return format_value(value, key)
