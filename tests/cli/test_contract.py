"""What every verb shares: the results contract (results.json header, one JSON Schema per verb), one list
syntax, --quiet and --no-progress, progress bars only on a terminal, plain-text help, errors naming the verb."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli_runner import run_cli
from robustest import cli, results
from robustest.cli import args as cli_args
from robustest.cli import output as cli_output
from robustest.core.errors import ConfigError, DataError

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"
NO_RESULTS = {"info", "demo"}  # info writes nothing; demo writes compare's results (compare.schema.json)


def verb_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def one_line_error(code: int, err: str, verb: str) -> str:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"robustest {verb}: error: "), lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------ list syntax
@pytest.mark.parametrize("text, expected", [
    ("1-5", [1, 2, 3, 4, 5]),
    ("1,3,5", [1, 3, 5]),
    ("1-3,5", [1, 2, 3, 5]),
    (" 2 , 4 - 5 ", [2, 4, 5]),
    ("3", [3]),
    ("5,1-2,2", [5, 1, 2]),  # order kept, duplicates dropped
    ("0-0", [0]),
])
def test_parse_list_integers_with_ranges(text, expected):
    assert cli_args.parse_list(text, int, ranges=True) == expected


def test_parse_list_names_floats_sorting_and_bounds():
    assert cli_args.parse_list("fgsm, pgd,fog") == ["fgsm", "pgd", "fog"]
    assert cli_args.parse_list("held-out,fol-fuzz") == ["held-out", "fol-fuzz"]  # names keep their dashes
    assert cli_args.parse_list("0.05,0.1", float) == [0.05, 0.1]
    assert cli_args.parse_list("5,1-2", int, ranges=True, sort=True) == [1, 2, 5]
    assert cli_args.parse_list("1-5", int, ranges=True, lo=1, hi=5) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("text, kwargs, message", [
    ("", {"ranges": True}, "empty list"),
    ("  ", {}, "empty list"),
    ("1,,3", {"ranges": True}, "empty item"),
    ("1,", {}, "empty item"),
    ("3-1", {"ranges": True}, "range '3-1' is empty"),
    ("x", {"ranges": True, "what": "severity"}, "severity 'x' is not a number or a range"),
    ("1-9", {"ranges": True, "what": "severity", "lo": 1, "hi": 5}, "severity 6 is outside 1-5"),
    ("0", {"ranges": True, "what": "seed", "lo": 1}, "seed 0 is outside >= 1"),
])
def test_parse_list_refuses_bad_input(text, kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cli_args.parse_list(text, int, **kwargs)
    with pytest.raises(argparse.ArgumentTypeError, match="empty|not a|outside"):
        cli_args.list_arg(int, **kwargs)(text)


BASE = {"score": ["--checkpoint", "m.pt", "--dataset", "digits", "--metric", "kmnc", "--out", "o"],
        "validate": ["--checkpoint", "m.pt", "--dataset", "digits", "--out", "o"],
        "enhance": ["--checkpoint", "m.pt", "--dataset", "digits", "--epochs", "1", "--out", "o"],
        "corrupt": ["--dataset", "digits", "--out", "o"], "compare": []}


@pytest.mark.parametrize("verb, option, text, dest, value", [
    ("corrupt", "--severities", "1-2,4", "severities", [1, 2, 4]),
    ("corrupt", "--corruptions", "noise,fog", "corruptions", ["noise", "fog"]),
    ("validate", "--severities", "1-3,5", "severities", [1, 2, 3, 5]),
    ("validate", "--perturbations", "fgsm,fog", "perturbations", ["fgsm", "fog"]),
    ("validate", "--attack-eps", "0.05,0.1", "attack_eps", [0.05, 0.1]),
    ("enhance", "--weaknesses", "fog,pgd", "weaknesses", ["fog", "pgd"]),
    ("score", "--layers", "conv1,fc", "layers", ["conv1", "fc"]),
    ("compare", "--strategies", "best,random", "strategies", ["best", "random"]),
    ("compare", "--budgets", "10,5%", "budgets", [10, "5%"]),
    ("compare", "--budgets", "10-12", "budgets", [10, 11, 12]),
    ("compare", "--seeds", "0-2", "seeds", [0, 1, 2]),
    ("compare", "--seeds", "0-1,7", "seeds", [0, 1, 7]),
])
def test_every_list_option_takes_the_same_syntax(verb, option, text, dest, value):
    args = cli.build_parser().parse_args([verb, *BASE[verb], option, text])
    assert getattr(args, dest) == value


@pytest.mark.parametrize("verb, argv, fragment", [
    ("corrupt", ["--severities", "0-3"], "argument --severities: severity 0 is outside 1-5"),
    ("corrupt", ["--severities", "1,,3"], "empty item"),
    ("validate", ["--severities", "2-1"], "range '2-1' is empty"),
    ("validate", ["--attack-eps", "0.1,big"], "argument --attack-eps: expected an L-inf radius in (0, 1]"),
    ("validate", ["--perturbations", "fgsm", "contrast"], "unrecognized arguments: contrast"),
    ("compare", ["--seeds", "0,x"], "argument --seeds: expected a seed: an integer in [0, 2^63), got 'x'"),
    ("compare", ["--seeds", "0,-1"], "argument --seeds: expected a seed: an integer in [0, 2^63), got -1"),
    ("compare", ["--strategies", "best,deepxplore"], "unknown strategy 'deepxplore'"),
    ("compare", ["--budgets", "5%,150%"], "budget"),
])
def test_bad_lists_are_one_line_naming_the_verb(capsys, verb, argv, fragment):
    code, out, err = run_cli(capsys, verb, *BASE[verb], *argv)
    line = one_line_error(code, err, verb)
    assert fragment in line and out == ""


def test_argparse_errors_name_the_verb(capsys):
    code, _, err = run_cli(capsys, "select", "--scores", "s.pt", "--n", "3", "--strategy", "top", "--out", "o",
                           "--frobnicate")
    assert "unrecognized arguments: --frobnicate" in one_line_error(code, err, "select")
    code, _, err = run_cli(capsys, "train", "--dataset", "digits")
    assert "required" in one_line_error(code, err, "train")


# ------------------------------------------------------------------------------- flags and help texts
def test_every_verb_has_quiet_no_progress_and_its_own_plain_help():
    parsers = verb_parsers()
    descriptions = {}
    for verb, p in parsers.items():
        assert {"--quiet", "--no-progress"} <= set(p._option_string_actions), verb
        text = p.format_help()
        assert "``" not in text and ":func:" not in text and ":class:" not in text, verb
        assert f"robustest {verb}" in (p.description or ""), verb  # each description names its verb
        descriptions[verb] = p.description
    assert len(set(descriptions.values())) == len(descriptions)  # one description per verb
    top = cli.build_parser().format_help()
    assert "``" not in top


def test_plain_strips_restructured_text():
    assert cli_output.plain("``robustest run`` calls :func:`robustest.robot.run` on `x`") == \
        "robustest run calls robustest.robot.run on x"
    assert cli_output.plain(None) is None


def test_select_has_no_progress_and_quiet(tmp_path):
    args = cli.build_parser().parse_args(["select", "--scores", "s.pt", "--n", "1", "--strategy", "top", "--out",
                                          str(tmp_path), "--no-progress", "--quiet"])
    assert args.no_progress and args.quiet


# ------------------------------------------------------------------------------------ quiet, progress
@pytest.fixture
def scores_file(tmp_path) -> Path:
    torch.save({"scores": torch.linspace(0, 1, 20), "metric": "fol"}, tmp_path / "s.pt")
    return tmp_path / "s.pt"


def test_quiet_prints_nothing_but_errors(tmp_path, capsys, scores_file):
    argv = ["select", "--scores", scores_file, "--n", "50", "--strategy", "random"]  # n > pool: a warning
    code, out, err = run_cli(capsys, *argv, "--out", tmp_path / "a")
    assert code == 0 and "selected 20 of 20" in out and "warning" in err  # the control: it does print
    code, out, err = run_cli(capsys, *argv, "--out", tmp_path / "b", "--quiet")
    assert code == 0 and out == "" and err == ""
    assert (tmp_path / "b" / "results.json").is_file()
    code, out, err = run_cli(capsys, "select", "--scores", tmp_path / "missing.pt", "--n", "1", "--strategy", "top",
                             "--out", tmp_path / "c", "--quiet")
    assert "does not exist" in one_line_error(code, err, "select") and out == ""


def test_quiet_silences_python_warnings_too(tmp_path, capsys, monkeypatch, scores_file):
    import warnings

    from robustest.cli import select as select_verb

    real = select_verb.read_scores

    def noisy(path):
        warnings.warn("something the library wants to say", UserWarning, stacklevel=1)
        warnings.warn("an API of a library is deprecated", DeprecationWarning, stacklevel=1)
        return real(path)

    monkeypatch.setattr(select_verb, "read_scores", noisy)
    argv = ["select", "--scores", scores_file, "--n", "3", "--strategy", "top"]
    code, _, err = run_cli(capsys, *argv, "--out", tmp_path / "a")
    assert code == 0 and "robustest select: warning: something the library wants to say (UserWarning)" in err
    assert "deprecated" not in err and err.count("\n") == 1  # one line; library deprecations stay hidden
    code, out, err = run_cli(capsys, *argv, "--out", tmp_path / "b", "--quiet")
    assert code == 0 and out == "" and err == ""


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2] / "src"), os.environ.get("PYTHONPATH", "")])}


def _corrupt_cmd(out: Path) -> list[str]:
    return [sys.executable, "-m", "robustest", "corrupt", "--dataset", "digits", "--limit", "4", "--corruptions",
            "fog,contrast,brightness", "--severities", "1", "--out", str(out)]


def test_no_carriage_return_frames_when_stderr_is_not_a_terminal(tmp_path):
    proc = subprocess.run(_corrupt_cmd(tmp_path / "a"), capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr and "\r" not in proc.stdout and "%|" not in proc.stderr
    assert "3 corruption file(s) x" in proc.stdout and "wrote results.json, report.html, " in proc.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="needs a pseudo-terminal")
def test_progress_bars_are_drawn_on_a_terminal(tmp_path):
    """The control of the test above: the same command with stderr on a terminal draws its bar."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    proc = subprocess.Popen(_corrupt_cmd(tmp_path / "a"), stdout=subprocess.DEVNULL, stderr=slave, env=_env())
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=300)
    os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0
    assert "\r" in text and "corrupt" in text  # tqdm frames


def test_progress_is_off_for_no_progress_quiet_and_non_terminals(monkeypatch):
    class Tty:
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Tty())
    assert cli_output.progress_enabled(argparse.Namespace(no_progress=False, quiet=False))
    assert not cli_output.progress_enabled(argparse.Namespace(no_progress=True, quiet=False))
    assert not cli_output.progress_enabled(argparse.Namespace(no_progress=False, quiet=True))
    monkeypatch.setattr(sys, "stderr", object())  # no isatty at all
    assert not cli_output.progress_enabled(argparse.Namespace(no_progress=False, quiet=False))


# ------------------------------------------------------------------------------------ results contract
def test_document_header_and_json_safety(tmp_path):
    doc = results.write_results(tmp_path, "score", {"metric": "fol", "eps": 0.3},
                                {"mean": torch.tensor(0.5), "bad": float("nan"), "path": tmp_path},
                                {"score_s": 1.5, "total_s": 2})
    assert list(doc)[:5] == ["format", "version", "settings", "timings", "world_size"]
    assert doc["format"] == "robustest-score-results" and doc["version"] == results.RESULTS_VERSION == 1
    assert doc["world_size"] == 1 and doc["timings"] == {"score_s": 1.5, "total_s": 2.0}
    assert doc["mean"] == 0.5 and doc["bad"] is None and doc["path"] == str(tmp_path)
    assert json.loads((tmp_path / "results.json").read_text()) == doc
    assert results.read_results(tmp_path, "score") == doc == results.read_results(tmp_path / "results.json")
    assert results.document("run", {}, {}, {"total_s": 0.0}, world_size=4)["world_size"] == 4


@pytest.mark.parametrize("call, message", [
    (lambda: results.document("x", {}, {"settings": 1}, {"total_s": 1}), "header key"),
    (lambda: results.document("x", {}, {"rank_samples": [1]}, {"total_s": 1}), "header key"),
    (lambda: results.document("x", {}, {}, {"load_s": 1}), "total_s"),
    (lambda: results.document("x", {}, {}, {"total_s": math.nan}), "finite"),
    (lambda: results.document("x", {}, {}, {"total_s": "1"}), "finite"),
    (lambda: results.document("x", {}, {}, {"total_s": 1}, world_size=0), "world_size"),
    (lambda: results.document("bad verb!", {}, {}, {"total_s": 1}), "verb"),
])
def test_document_refuses_what_breaks_the_contract(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_read_results_refuses_other_files(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        results.read_results(tmp_path)
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(DataError, match="not a JSON file"):
        results.read_results(tmp_path)
    (tmp_path / "results.json").write_text('{"a": 1}')
    with pytest.raises(DataError, match="not a robustest results file"):
        results.read_results(tmp_path)
    results.write_results(tmp_path, "train", {}, {}, {"total_s": 1})
    with pytest.raises(DataError, match="not the results of 'robustest score'"):
        results.read_results(tmp_path, "score")


def _schemas() -> dict[str, dict]:
    return {p.name.split(".")[0]: json.loads(p.read_text()) for p in sorted(SCHEMAS.glob("*.schema.json"))}


def test_one_valid_schema_per_verb_with_the_same_header():
    jsonschema = pytest.importorskip("jsonschema")
    schemas = _schemas()
    assert set(schemas) == set(verb_parsers()) - NO_RESULTS  # every verb that writes results has its schema
    header = None
    for verb, spec in schemas.items():
        jsonschema.Draft202012Validator.check_schema(spec)
        assert spec["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        props = spec["properties"]
        assert props["format"] == {"const": f"robustest-{verb}-results"} and props["version"] == {"const": 1}
        assert set(spec["required"]) >= set(results.HEADER_KEYS)
        assert props["settings"]["additionalProperties"] is False  # settings: only the documented options
        assert not set(spec["required"]) & set(results.OPTIONAL_HEADER_KEYS)
        common = (props["timings"], props["world_size"], props["rank_samples"])
        header = header or common
        assert common == header, verb


def test_schemas_reject_what_the_contract_forbids():
    jsonschema = pytest.importorskip("jsonschema")
    spec = _schemas()["select"]
    good = results.document("select", {"scores": "s.pt", "strategy": "top", "n": 3},
                            {"metric": "fol", "description": "d", "requested": 3, "selected": 3, "pool_size": 9,
                             "warnings": [], "pool_scores": {"count": 9}, "selected_scores": {"count": 3},
                             "files": {}}, {"total_s": 0.1})
    jsonschema.validate(good, spec)
    for bad in ({**good, "settings": {**good["settings"], "func": "run"}},  # argparse's namespace leaking in
                {**good, "settings": {**good["settings"], "n": None}},
                {**good, "timings": {"select_s": 0.1}},  # no total_s
                {**good, "timings": {"total_s": 0.1, "when": 3}},  # not a duration
                {**good, "world_size": 0},
                {**good, "format": "robustest-score-results"},
                {k: v for k, v in good.items() if k != "settings"},
                {**good, "args": {}}):  # the old free-form block
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, spec)


def test_robot_settings_in_effect():
    from robustest.robot import RobotConfig
    from robustest.robot.report import settings_in_effect

    loop = settings_in_effect(RobotConfig(model="m.pt", strategy="kmst"), "loop", "cpu")
    assert loop["strategy"] == "kmst" and loop["kmst_k"] == 4 and loop["device"] == "cpu"
    assert not {"strategies", "budgets", "seeds", "train_model", "train_epochs", "coverage_metric", "fuzz_options",
                "target", "target_metric", "torchscript", "time_budget"} & set(loop)
    assert settings_in_effect(RobotConfig(target=0.5), "loop")["target_metric"] == "whitebox_accuracy"
    cmp = settings_in_effect(RobotConfig(strategies=["best", "coverage"], pool="fol-fuzz", whitebox=False), "compare")
    assert cmp["strategies"] == ["best", "coverage"] and cmp["budgets"] == ["5%"] and cmp["seeds"] == [0]
    assert cmp["coverage_metric"] == "kmnc" and cmp["train_model"] == "digits_cnn"
    assert not {"strategy", "budget", "rounds", "convergence_tol", "kmst_k", "pool_pgd_steps", "whitebox_limit",
                "apgd_steps"} & set(cmp)


@pytest.mark.parametrize("argv", [["score", "--metric", "gini"], ["analyze"], ["validate"],
                                  ["generate", "--method", "pgd"], ["enhance", "--epochs", "1"]])
def test_a_refused_model_leaves_no_output_folder(argv, tmp_path, capsys):
    from robustest.cli import main

    out = tmp_path / "never"
    assert main([*argv, "--checkpoint", str(tmp_path / "missing.pt"), "--dataset", "digits", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.pt' does not exist" in err and not out.exists()
