"""robustest.evaluate is a layer below train, robot, weakrobust, suite and cli: none of its files imports them
(nor the old training module), so measurement never depends on what is built on top of it."""

from __future__ import annotations

import ast
from pathlib import Path

EVALUATE = Path(__file__).resolve().parents[1] / "src" / "robustest" / "evaluate"
ABOVE = ("train", "training", "hardening", "checkpoints", "recipes", "robot", "weakrobust", "suite", "cli",
         "testing", "pytest_plugin")


def _imported(tree: ast.AST) -> list[str]:
    """Every module an ``import`` / ``from ... import`` names, with the names a ``from robustest import`` takes."""
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
            if node.module == "robustest":
                out += [f"robustest.{a.name}" for a in node.names]
    return out


def test_evaluate_imports_no_higher_layer() -> None:
    files = sorted(EVALUATE.glob("*.py"))
    assert files, f"no Python files under {EVALUATE}"
    bad = [(f.name, m) for f in files for m in _imported(ast.parse(f.read_text(), str(f)))
           if m.split(".")[0] == "robustest" and len(m.split(".")) > 1 and m.split(".")[1] in ABOVE]
    assert not bad, f"robustest.evaluate imports a higher layer: {bad}"


def test_evaluate_files_stay_small() -> None:
    for f in EVALUATE.glob("*.py"):
        assert len(f.read_text().splitlines()) <= 650, f"{f.name} is over 650 lines"
