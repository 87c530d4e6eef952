"""The README's Python examples run as written (in a scratch folder)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _blocks() -> dict[str, str]:
    """The python blocks of the README by the heading above them."""
    out: dict[str, str] = {}
    heading = ""
    for part in re.split(r"(^## .*$)", README.read_text(), flags=re.M):
        if part.startswith("## "):
            heading = part[3:].strip()
            continue
        for code in re.findall(r"```python\n(.*?)```", part, flags=re.S):
            out.setdefault(heading, code)
    return out


@pytest.mark.slow  # trains two small models: about 40 s
@pytest.mark.parametrize("heading", ["Python in ten lines", "Your own selection strategy",
                                     "What a verb runs, from Python"])
def test_the_readme_example_runs(heading, tmp_path, monkeypatch, capsys):
    code = _blocks()[heading]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"README.md: {heading}", "exec"), {"__name__": "readme"})  # noqa: S102 - our own docs
    if heading == "What a verb runs, from Python":
        assert (tmp_path / "digits-model" / "model.pt").is_file()
        assert (tmp_path / "digits-eval" / "results.json").is_file()
        accuracy, robust, passed, lines = capsys.readouterr().out.split(" ", 3)
        assert 0.8 < float(accuracy) <= 1 and passed in ("True", "False")


def test_ci_runs_the_readme_test_command():
    """The README's opening block holds the two commands (install and demo; install and tests), and `.ci/run`
    runs the second line as written, so that the command the README promises is the one CI checks."""
    opening = re.search(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    assert opening is not None
    install_demo, install_tests = opening.group(1).strip().splitlines()
    assert install_demo.endswith("robustest demo")
    assert install_tests.endswith("python -m pytest -q -n 2")
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert install_tests in ci
    assert "python -m pytest -q -m slow -n 2 || rc=$?" in ci
