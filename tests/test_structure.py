"""The shape of the package (docs/ARCHITECTURE.md), checked on the source tree: files of one idea, short
functions, no private names across packages, no import cycles between packages, the layers of
pyproject.toml's import-linter contract."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "robustest"
MAX_FILE_LINES = 650
LONG_FUNCTION = 100
MAX_LONG_FUNCTIONS = 1  # attacks.apgd._apgd_run, the algorithm in one piece
MAX_CLI_LINES = 3000  # thin verbs: parse, one pipeline call, print (the pipelines live in their packages)


def _modules() -> dict[str, ast.Module]:
    out = {}
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
    return out


def _package(module: str) -> str:
    """The top-level unit a module belongs to: ``robustest.attacks.apgd`` -> ``attacks``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(module: str, tree: ast.Module) -> list[tuple[str, str]]:
    """(imported module, imported name or "") for every robustest import in ``tree``, at any depth."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("robustest"):
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if a.name.startswith("robustest")]
    return out


def test_no_file_is_longer_than_the_limit() -> None:
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES}
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_the_verbs_stay_thin() -> None:
    n = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in (SRC / "cli").glob("*.py"))
    assert n <= MAX_CLI_LINES, (f"cli/ has {n} lines, over {MAX_CLI_LINES}: move what a verb computes into its "
                                "package's pipeline (docs/ARCHITECTURE.md), the verb only parses, calls and prints")


def test_at_most_a_few_long_functions() -> None:
    long = sorted(
        (node.end_lineno - node.lineno + 1, f"{name}.{node.name}")
        for name, tree in _modules().items() for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > LONG_FUNCTION)
    assert len(long) <= MAX_LONG_FUNCTIONS, f"functions over {LONG_FUNCTION} lines: {long}"


def test_no_package_imports_another_packages_private_names() -> None:
    bad = []
    for name, tree in _modules().items():
        for mod, item in _imports(name, tree):
            if _package(mod) in ("", _package(name)):
                continue
            private = [p for p in mod.split(".")[2:] if p.startswith("_")] + ([item] if item.startswith("_") else [])
            if private:
                bad.append(f"{name} imports {mod}.{item or ''}")
    assert not bad, bad


def _cycle(graph: dict[str, set[str]]) -> str | None:
    """A node of ``graph`` (node -> the nodes it imports) that reaches itself, or None."""
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            node = todo.pop()
            if node == start:
                return start
            if node not in seen:
                seen.add(node)
                todo += graph.get(node, ())
    return None


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == "a"
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_between_packages() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, tree in _modules().items():
        for mod, item in _imports(name, tree):
            target = _package(mod) or (item if (SRC / item).exists() or (SRC / f"{item}.py").exists() else "")
            if target and target != _package(name) and _package(name):
                graph[_package(name)].add(target)
    assert _cycle(graph) is None, f"import cycle through {_cycle(graph)}: {dict(graph)}"


def test_old_homes_are_gone() -> None:
    """Names are imported from their home: the modules the code moved out of do not linger as re-exports."""
    for old in ("runtime", "config", "errors", "training", "hardening", "checkpoints", "recipes", "evaluation",
                "robustness", "distributed", "steps", "batchsize", "_repr"):
        assert not (SRC / f"{old}.py").exists(), f"src/robustest/{old}.py is still there"


def test_one_home_per_helper() -> None:
    """A helper is defined once: derived seeds live in core/seeding.py only."""
    homes = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if "def derive_seed(" in p.read_text()]
    assert homes == ["core/seeding.py"]


@pytest.mark.skipif(importlib.util.find_spec("importlinter") is None, reason="import-linter is not installed")
def test_layers_contract_holds() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    res = subprocess.run([exe, "--config", str(SRC.parents[1] / "pyproject.toml")], capture_output=True, text=True,
                         cwd=SRC.parents[1])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]


def test_no_extra_requires_a_package_that_replaces_the_installed_torch() -> None:
    """torchattacks (its torchvision pin), imagecorruptions (opencv-python) and dnn-tip are installed with --no-deps
    by CI and the benchmarks' instructions; an extra that required them would let pip swap the CPU torch."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pulled = {"torch", "torchvision", "torchattacks", "imagecorruptions", "dnn-tip", "opencv-python"}
    for name, reqs in extras.items():
        names = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs}
        assert not names & pulled, (name, names & pulled)
    ci = (root / ".ci" / "run").read_text()
    assert "--no-deps torchattacks==3.5.1 dnn-tip==0.1.1" in ci and "--no-deps imagecorruptions==1.1.2" in ci
