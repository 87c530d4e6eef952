"""The "Your own model" sections of docs/EVAL.md, docs/HARDEN.md and docs/SUITE.md run as written, each in an empty
folder holding MNIST as ``mnist.npz``: a Python block that starts with ``# NAME.py`` is written to that file, any
other Python block runs there, and each line of a bash block runs (``python NAME.py`` as a script, ``robustest ...``
through the CLI). Slow: each section trains a small CNN and evaluates it on real MNIST."""

from __future__ import annotations

import json
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
import torch

from conftest import SHARED_DATA
from robustest.cli import main

DOCS = Path(__file__).resolve().parents[2] / "docs"
MNIST = SHARED_DATA / "mnist.npz"

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not MNIST.is_file(), reason=f"MNIST not found at {MNIST}")]


def section(doc: str) -> str:
    """The text of the "## Your own model" section of ``docs/<doc>``."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    m = re.search(r"^## Your own model\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert m, f"docs/{doc} has no 'Your own model' section"
    return m.group(1)


def blocks(doc: str) -> list[tuple[str, str]]:
    return re.findall(r"```(python|bash)\n(.*?)```", section(doc), flags=re.S)


def commands(code: str) -> list[list[str]]:
    """The command lines of a bash block, continuation lines joined."""
    return [shlex.split(line) for line in code.replace("\\\n", " ").strip().splitlines() if line.strip()]


def run_section(doc: str, folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> list[str]:
    """Run every block of the section in ``folder``; returns the robustest command lines run."""
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    (folder / "mnist.npz").symlink_to(MNIST)
    ran = []
    try:
        for kind, code in blocks(doc):
            first = code.splitlines()[0]
            if kind == "python" and re.fullmatch(r"# \w+\.py", first):
                (folder / first[2:]).write_text(code, encoding="utf-8")
            elif kind == "python":
                exec(compile(code, f"{doc} block", "exec"), {"__name__": "doc_block"})
            else:
                for args in commands(code):
                    if args[0] == "python":
                        assert len(args) == 2 and (folder / args[1]).is_file(), args
                        runpy.run_path(args[1], run_name="__main__")
                        continue
                    assert args[0] == "robustest", args
                    rc = main([*args[1:], "--no-progress"])
                    assert rc == 0, (args, capsys.readouterr().err)
                    ran.append(" ".join(args))
    finally:
        sys.modules.pop("mynet", None)
    return ran


def test_the_three_sections_share_one_network():
    nets = {doc: next(code for kind, code in blocks(doc) if code.startswith("# mynet.py")) for doc in
            ("EVAL.md", "HARDEN.md", "SUITE.md")}
    assert len(set(nets.values())) == 1, "mynet.py differs between the docs"
    code = nets["EVAL.md"]
    assert "def make() -> nn.Module:" in code and 'torch.save(model.state_dict(), "mynet.pt")' in code
    for doc in nets:
        assert "_common" not in section(doc) and "load_model" not in section(doc)  # no pointer into the source


def test_eval_section_runs(tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    ran = run_section("EVAL.md", tmp_path, monkeypatch, capsys)
    assert ran == ["robustest eval --model mynet:make --weights mynet.pt --dataset mnist --data-dir mnist.npz "
                   "--eps 0.1 --version fast --limit 200 --out eval-mynet"]
    doc = json.loads((tmp_path / "eval-mynet" / "results.json").read_text())
    assert doc["num_samples"] == 200 and doc["clean_accuracy"] > 0.7 and doc["settings"]["model"] == "mynet:make"


def test_harden_section_runs_and_reloads_the_hardened_weights(tmp_path, monkeypatch, capsys):
    ran = run_section("HARDEN.md", tmp_path, monkeypatch, capsys)
    assert [line.split()[1] for line in ran] == ["harden", "eval"]
    assert "--weights harden-mynet/model.pt" in ran[1]  # the hardened network reloads into the same factory
    hardened = json.loads((tmp_path / "harden-mynet" / "results.json").read_text())
    reloaded = json.loads((tmp_path / "eval-hardened" / "results.json").read_text())
    assert hardened["kept_epoch"] == 1 and hardened["training_cpu_s"] > 0
    # the same test images: the reloaded weights are the hardened ones, not mynet.pt's
    assert reloaded["clean_accuracy"] == pytest.approx(hardened["after"]["clean_accuracy"])


def test_suite_section_runs(tmp_path, monkeypatch, capsys):
    ran = run_section("SUITE.md", tmp_path, monkeypatch, capsys)
    assert [line.split()[1:3] for line in ran] == [["suite", "build"], ["suite", "check"]]
    check = json.loads((tmp_path / "check-mynet" / "results.json").read_text())
    assert check["command"] == "check" and check["verdict"] == "pass" and check["suite"]["k"] == 100
    assert (tmp_path / "candidate.pt").is_file()
