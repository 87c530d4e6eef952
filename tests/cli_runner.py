"""``run_cli``: the CLI run in-process, as the command-line tests call it."""

from __future__ import annotations

from robustest import cli


def run_cli(capsys, *argv: object) -> tuple[int, str, str]:
    """Run ``robustest ARGV`` in-process; return (exit code, stdout, stderr). argparse exits are caught."""
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err
