"""Every code block of docs/YOUR_MODEL.md runs as written: Python blocks in one namespace, in order, and each
`robustest ...` line of the bash blocks through the CLI, all in an empty folder."""

from __future__ import annotations

import re
import shlex
import sys
import types
from pathlib import Path

import torch

from robustest.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "YOUR_MODEL.md"


def test_every_block_of_your_model_md_runs(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    torch.set_num_threads(1)
    blocks = re.findall(r"```(python|bash)\n(.*?)```", DOC.read_text(), flags=re.S)
    assert sum(k == "python" for k, _ in blocks) >= 6 and sum(k == "bash" for k, _ in blocks) >= 3
    namespace: dict = {}
    names = []
    try:
        for i, (kind, code) in enumerate(blocks):
            if kind == "python":
                # each block as a real module file: TorchScript reads the source of the classes it compiles
                name = f"your_model_doc_{i}"
                path = tmp_path / f"{name}.py"
                path.write_text(code)
                module = types.ModuleType(name)
                module.__file__ = str(path)
                sys.modules[name] = module
                names.append(name)
                namespace["__name__"] = name
                exec(compile(code, str(path), "exec"), namespace)
                continue
            for line in code.strip().splitlines():
                args = shlex.split(line)
                assert args[0] == "robustest"
                rc = main(args[1:] + ["--no-progress"])
                assert rc == 0, (line, capsys.readouterr().err)
    finally:
        for name in ["mynets", *names]:
            sys.modules.pop(name, None)
    out = capsys.readouterr().out
    assert "labels match True" in out and "TorchScript accuracy" in out
    assert (tmp_path / "out" / "kmnc" / "scores.pt").is_file() and (tmp_path / "out" / "photos-c").is_dir()
