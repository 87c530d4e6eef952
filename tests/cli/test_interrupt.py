"""Ctrl-C at any moment of a ``robustest`` command exits with status 130 and one line: also during the first
seconds, while torch and the verbs are imported (before the entry point handled it, the import printed a
traceback and the process died by SIGINT, status -2)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGINT") or sys.platform == "win32",
                                reason="POSIX signals")

DELAYS = (0.05, 0.1, 0.2, 0.3, 0.6, 1.5)


def _startup_s() -> float:
    """Seconds until the interpreter has run site and imported the entry point (its handler is then installed):
    an interrupt before that is Python's own, whatever the program does."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import robustest._entry"], check=True)
    return time.perf_counter() - t0


def _interrupt(cmd: list[str], delay: float) -> tuple[int, str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=Path(__file__).parent)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err.decode(errors="replace")


def _commands() -> dict[str, list[str]]:
    cmds = {"python -m robustest": [sys.executable, "-m", "robustest", "--help"]}
    script = Path(sys.executable).parent / "robustest"
    if script.is_file() and "robustest._entry" in script.read_text(errors="replace"):
        cmds["robustest (console script)"] = [str(script), "--help"]
    return cmds


@pytest.mark.parametrize("name", sorted(_commands()))
def test_ctrl_c_while_starting_exits_130_with_one_line(name):
    cmd = _commands()[name]
    floor = 1.2 * _startup_s()
    for delay in sorted({max(d, floor) for d in DELAYS}):
        code, err = _interrupt(cmd, delay)
        if code == 0:  # the command finished before the signal: nothing left to interrupt
            continue
        assert code == 130, (delay, code, err)
        assert "Traceback" not in err, (delay, err)
        assert err.strip() == "robustest: interrupted", (delay, err)


def test_the_console_script_is_the_light_entry_point():
    """The script's module imports nothing heavy: its parent package imports only the error classes."""
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert 'robustest = "robustest._entry:main"' in pyproject.splitlines()
    out = subprocess.run([sys.executable, "-c", "import sys, robustest._entry; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_in_process_main_leaves_the_callers_sigint_handler_alone(capsys):
    from robustest import cli

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert signal.getsignal(signal.SIGINT) is before
    capsys.readouterr()
