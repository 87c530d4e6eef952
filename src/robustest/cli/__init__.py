"""The ``robustest`` command.

Each verb lives in its own module of this package and exposes ``add_parser(subparsers)``, which
registers an argparse sub-parser whose ``func(args) -> int`` runs the verb. Verbs are discovered
automatically, so adding one is adding one module. Every user error (:class:`robustest.RobustestError`,
a missing file, a path the file system refuses, a config file that is not text, a bad argument) is printed as
one line on stderr with exit status 2, without a traceback.

Exit status: 0 done, 1 a gate failed (``eval --fail-under``), 2 bad input, 3 an internal error (a bug: one
line that says to rerun with ``--debug``), 130 interrupted.

Every verb gets ``--quiet`` and ``--no-progress`` here, plain-text help (reStructuredText markup stripped),
and one logging set-up per command (:func:`robustest.cli.output.configure_logging`): the verb's report lines
on stdout, messages and warnings on stderr, nothing but errors with ``--quiet``. Progress bars are drawn only
when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import signal
import sys
from collections.abc import Sequence
from typing import Any

from robustest import __version__
from robustest.cli.args import available_cores, finish_verb_parser
from robustest.cli.output import configure_logging, plain, progress_enabled
from robustest.core.errors import EXIT_INTERRUPTED, EXIT_USAGE, ConfigError, error_line

__all__ = ["build_parser", "main"]


class OneLineParser(argparse.ArgumentParser):
    """ArgumentParser whose errors are a single line naming the verb and pointing to --help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("unrecognized arguments"):
            stray = message.partition(":")[2].split()
            if any(not t.startswith("-") for t in stray):  # a value left over: a list given with spaces
                message += "; list options take one comma-separated value, e.g. --severities 1-3,5"
        message = " ".join(message.split())
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(EXIT_USAGE)


#: how ``robustest --help`` groups the verbs, in this order (a verb in no group is listed under "other")
VERB_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("test a model", ("eval", "suite", "certify")),
    ("make it robust", ("harden", "train")),
    ("research methods", ("run", "compare", "analyze", "validate", "enhance")),
    ("data", ("corrupt", "generate", "score", "select")),
    ("get to know robustest", ("info", "demo")),
)
START = ("For your own model, start with:\n"
         "  robustest eval --model pkg.module:factory --weights FILE --dataset NAME --eps 8/255 --out DIR\n"
         "(a model trained by robustest: robustest eval --checkpoint model.pt ...). Every verb has --help.")


def _grouped_verbs(helps: dict[str, str]) -> str:
    """The verbs by group, each with its one-line help: the body of ``robustest --help``."""
    import textwrap

    width = max(len(v) for v in helps) + 2
    grouped = [(title, [v for v in verbs if v in helps]) for title, verbs in VERB_GROUPS]
    listed = {v for _, verbs in grouped for v in verbs}
    grouped.append(("other", [v for v in helps if v not in listed]))
    lines = []
    for title, verbs in grouped:
        if not verbs:
            continue
        lines.append(f"{title}:")
        for v in verbs:
            text = textwrap.wrap(" ".join(helps[v].split()), 100 - width - 2) or [""]
            lines.append(f"  {v.ljust(width)}{text[0]}")
            lines.extend(f"  {' ' * width}{t}" for t in text[1:])
        lines.append("")
    return "\n".join(lines) + "\n" + START


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="robustest",
        description="Test deep-learning classifiers for robustness and make them more robust.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"robustest {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=OneLineParser)
    verbs = []
    for mod in pkgutil.iter_modules(__path__):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{mod.name}")
        if hasattr(module, "add_parser"):
            verbs.append((getattr(module, "ORDER", 100), mod.name, module))
    for _, _, module in sorted(verbs, key=lambda t: (t[0], t[1])):
        module.add_parser(sub)
    for p in sub.choices.values():
        finish_verb_parser(p)
    helps = {a.dest: plain(a.help) or "" for a in sub._choices_actions}
    sub._choices_actions = []  # listed by group instead, in the description
    sub.help = "the verb to run: one of those above ('robustest VERB --help' for its options)"
    parser.description = f"{parser.description}\n\n{_grouped_verbs(helps)}"
    parser.set_defaults(verb_parsers=dict(sub.choices))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``robustest`` console script; returns the exit status."""
    if hasattr(signal, "SIGXFSZ"):  # past the file size limit a write fails with EFBIG instead of killing us
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    verb_parsers = args.__dict__.pop("verb_parsers", {})
    if extras:  # reported by the verb's parser, so the message names the verb
        verb_parsers.get(getattr(args, "verb", None), parser).error(f"unrecognized arguments: {' '.join(extras)}")
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from robustest.core import distributed

    main_rank = True
    restore_logging = configure_logging(args.verb, quiet=bool(getattr(args, "quiet", False)))
    # progress_lines: progress asked for but stderr is no terminal, so long steps print plain lines instead of bars
    args.progress_lines = not getattr(args, "no_progress", False) and not getattr(args, "quiet", False)
    args.no_progress = not progress_enabled(args)  # what every verb reads: off when stderr is not a terminal
    args.progress_lines = args.progress_lines and args.no_progress
    try:
        if getattr(signal.getsignal(signal.SIGINT), "while_starting", False):  # robustest._entry's: the work
            signal.signal(signal.SIGINT, signal.default_int_handler)  # starts, Ctrl-C now lets it clean up
        if getattr(args, "threads", None):
            import torch

            if args.threads > available_cores():  # a verb's own --threads flag is bounded by the cores as well
                raise ConfigError(f"--threads {args.threads} is more than the {available_cores()} cores available "
                                  "to this process")
            torch.set_num_threads(args.threads)
        if distributed.launched() and hasattr(signal, "SIGTERM"):  # torchrun stops the others when a rank dies
            signal.signal(signal.SIGTERM, _stopped_by_launcher)
        distributed.init(getattr(args, "device", None))  # under torchrun: join the process group
        main_rank = distributed.is_main()
        if not main_rank:  # only rank 0 prints; outputs are written by rank 0 alone (runtime's writers)
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of this rank's process
        if getattr(args, "out", None) is not None:  # an unwritable (or empty) --out is found before the work
            from robustest.core.atomic import check_writable

            check_writable(args.out, create=False)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        sys.stderr.write("robustest: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - every error is one line, never a bare traceback
        if args.debug:
            raise
        status, text = error_line(exc)
        if main_rank or not isinstance(exc, distributed.RankFailure):  # a rank's own failure is the cause
            sys.stderr.write(f"{_who(args.verb, main_rank)}: {text}\n")
        return status
    finally:
        distributed.shutdown()
        restore_logging()


def _who(verb: str, main_rank: bool) -> str:
    """How an error line starts: the verb, and the rank when it is not rank 0 (whose errors every rank may
    share; another rank's own failure is printed by that rank)."""
    if main_rank:
        return f"robustest {verb}"
    from robustest.core.distributed import rank

    return f"robustest {verb} (rank {rank()})"


def _stopped_by_launcher(signum: int, frame: Any) -> None:
    from robustest.core.distributed import RankFailure

    raise RankFailure("stopped by torchrun (another rank failed, or the job was cancelled); rerun the same "
                      "command to continue from the last saved step (run/compare: with --resume)")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
