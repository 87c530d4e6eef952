"""A generated battery: every verb, every option that takes a value, given values that make no sense.

Each case must end with exit status 2, exactly one line on stderr, no traceback, no output file written
(the error comes before the work) and quickly. The options are read from the parser itself, so a new
verb or option is covered as soon as it exists; a verb without a base invocation here fails the
completeness test. The default suite runs the universal bad values; the slow sweep adds more.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest
import torch

from robustest.cli import build_parser, main

BAD_NUMBERS = ("nan", "inf", "-inf", "-1", "1e400", "abc")
MORE_BAD_NUMBERS = ("-0.5", "1e308", "0x10", "", " ", "1,5", "--")
BAD_CHOICE = "no-such-choice"
NOT_A_FILE = "/nonexistent/robustest/file"
# options whose value is a free string or a path handled elsewhere in this file
FREE = {"--out", "--device", "--config", "--layers", "--corruptions", "--weaknesses", "--perturbations",
        "--model", "--strategies", "--budgets", "--seeds", "--train-model", "--dataset", "--seeds-dataset",
        "--train-dataset", "--corruption", "--budget"}
PATHS = {"--checkpoint", "--data-dir", "--weights", "--analysis", "--scores", "--tests", "--seeds-data-dir",
         "--train-data-dir"}
# numeric options where "-1" or another listed value is legitimately fine
ALLOWED = {("score", "--threshold"): {"-1"}}


def _verbs() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.fixture(scope="module")
def files(tmp_path_factory, mlp_digits_checkpoint):
    """A checkpoint, a scores file, a tests file and an analysis of digits, made once."""
    root = tmp_path_factory.mktemp("battery")
    torch.set_num_threads(1)
    assert main(["score", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--limit", "40",
                 "--metric", "gini", "--no-progress", "--out", str(root / "s")]) == 0
    assert main(["generate", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--limit", "20",
                 "--method", "fgsm", "--eps", "0.2", "--no-progress", "--out", str(root / "g")]) == 0
    assert main(["analyze", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--limit", "30",
                 "--neighbors", "2", "--no-progress", "--out", str(root / "a")]) == 0
    return {"ckpt": mlp_digits_checkpoint, "scores": str(root / "s" / "scores.pt"),
            "tests": str(root / "g" / "tests.pt"), "analysis": str(root / "a" / "analysis.pt")}


def base_args(verb: str, f: dict[str, str], out: Path) -> list[str] | None:
    """A valid, quick invocation of ``verb`` (the battery swaps one option at a time for a bad value)."""
    m = ["--checkpoint", f["ckpt"]]
    d = ["--dataset", "digits", "--limit", "30"]
    o = ["--out", str(out)]
    table = {
        "info": [],
        "demo": ["--out", str(out)],
        "train": ["--dataset", "digits", "--limit", "30", "--model", "mlp", "--epochs", "1", *o],
        "score": [*m, *d, "--metric", "gini", *o],
        "select": ["--scores", f["scores"], "--n", "5", "--strategy", "top", *o],
        "generate": [*m, *d, "--method", "fgsm", *o],
        "corrupt": [*d, "--corruptions", "fog", "--severities", "1", *o],
        "run": [*m, "--dataset", "digits", "--train-limit", "60", "--test-limit", "20", "--rounds", "1", *o],
        "compare": [*m, "--dataset", "digits", "--train-limit", "60", "--test-limit", "20", *o],
        "analyze": [*m, *d, *o],
        "validate": [*m, *d, "--analysis", f["analysis"], *o],
        "enhance": [*m, *d, "--epochs", "1", *o],
        "eval": [*m, *d, "--eps", "0.1", *o],
        "certify": [*m, *d, "--eps", "0.1", "--method", "ibp", *o],
        "harden": [*m, *d, "--epochs", "1", "--eps", "0.1", *o],
        "suite": ["build", *m, *d, "--eps", "0.1", "--version", "fast", "--k", "10", *o],
    }
    return table.get(verb)


def _is_list_type(parse) -> bool:
    try:
        return isinstance(parse("1,2"), list)
    except Exception:  # noqa: BLE001 - a type that refuses the text is not a list type
        return False


def _cases(extra: bool) -> list[tuple[str, str, str]]:
    cases = []
    for verb, sp in _verbs().items():
        for a in sp._actions:
            if not a.option_strings or a.nargs == 0 or a.dest == "help":
                continue
            opt = a.option_strings[-1]
            if opt in FREE:
                continue
            if opt in PATHS:
                cases.append((verb, opt, NOT_A_FILE))
            elif a.choices:
                cases.append((verb, opt, BAD_CHOICE))
            elif a.type is not None and getattr(a.type, "__name__", "") not in ("json_object", "str"):
                for v in BAD_NUMBERS + (MORE_BAD_NUMBERS if extra else ()):
                    if v == "1,5" and _is_list_type(a.type):
                        continue  # a legitimate list of two values for list options (--severities 1,5)
                    if v not in ALLOWED.get((verb, opt), set()):
                        cases.append((verb, opt, v))
    return cases


def _swap(args: list[str], opt: str, value: str, nargs) -> list[str]:
    width = nargs if isinstance(nargs, int) else 1
    vals = [value] * width
    if opt in args:
        i = args.index(opt)
        return args[:i] + [opt, *vals] + args[i + 1 + 1:] if width == 1 else \
            args[:i] + [opt, *vals] + args[i + 1 + width:]
    return [*args, opt, *vals]


def test_every_verb_has_a_base_invocation(files, tmp_path) -> None:
    missing = [v for v in _verbs() if base_args(v, files, tmp_path) is None]
    assert not missing, f"add a base invocation for {missing}"


def _check(verb: str, opt: str, value: str, files, tmp_path, capsys) -> None:
    out = tmp_path / f"{verb}-{opt.strip('-')}"
    args = base_args(verb, files, out)
    sp = _verbs()[verb]
    action = next(a for a in sp._actions if opt in a.option_strings)
    argv = [verb, *_swap(args, opt, value, action.nargs), "--no-progress"] if verb not in ("info", "select") \
        else [verb, *_swap(args, opt, value, action.nargs)]
    t0 = time.perf_counter()
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert rc == 2, f"{verb} {opt} {value!r}: exit {rc}, stderr {err!r}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, f"{verb} {opt} {value!r}: {err!r}"
    assert verb in lines[0], f"the error names the verb: {lines[0]!r}"
    written = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert not written, f"{verb} {opt} {value!r} wrote {written}"
    assert elapsed < 10, f"{verb} {opt} {value!r} took {elapsed:.1f}s: the error must come before the work"


@pytest.mark.parametrize("verb, opt, value", _cases(extra=False))
def test_bad_value_is_one_line_exit_2_before_any_work(verb, opt, value, files, tmp_path, capsys) -> None:
    _check(verb, opt, value, files, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("verb, opt, value", [c for c in _cases(extra=True) if c[2] in MORE_BAD_NUMBERS])
def test_bad_value_sweep(verb, opt, value, files, tmp_path, capsys) -> None:
    _check(verb, opt, value, files, tmp_path, capsys)
