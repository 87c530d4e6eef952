"""Nothing is lost: killed runs continue where they stopped, write failures are one line and keep what was
written, and the output folder is proved writable before any work."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from robustest.cli import main
from robustest.core import atomic, inputs, modelchecks, reading
from robustest.core.errors import ConfigError, OutputError


def _cli(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "robustest", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kw)


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 120.0) -> None:
    t0 = time.time()
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"finished before it could be killed: {proc.stderr.read()}")
        if time.time() - t0 > timeout:
            proc.kill()
            pytest.fail("never reached the kill point")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_analyze_killed_and_rerun_equals_an_uninterrupted_run(tmp_path, mlp_digits_checkpoint) -> None:
    args = ["analyze", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--split", "train",
            "--neighbors", "150", "--save-every", "128", "--no-progress"]
    out = tmp_path / "killed"
    steps = out / "state" / "steps"
    proc = _cli(*args, "--out", str(out))
    _kill_when(proc, lambda: len(list(steps.glob("analysis_*.pt"))) >= 2)
    (steps / ".analysis_00009.pt.abcd1234.tmp").write_bytes(b"half-written")  # as a kill mid-write leaves it
    done = _cli(*args, "--out", str(out))
    assert done.wait() == 0, done.stderr.read()
    assert "reused" in done.stderr.read()
    assert not list(out.rglob("*.tmp"))
    ref = _cli(*args, "--out", str(tmp_path / "whole"))
    assert ref.wait() == 0
    a = torch.load(out / "analysis.pt", weights_only=True)
    b = torch.load(tmp_path / "whole" / "analysis.pt", weights_only=True)
    for k in ("score", "frac_misclassified", "clean_correct", "top_wrong", "label", "index"):
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
def test_enhance_killed_and_rerun_equals_an_uninterrupted_run(tmp_path, mlp_digits_checkpoint) -> None:
    import json

    weak = tmp_path / "weak.json"
    weak.write_text(json.dumps({"weaknesses": ["fog", "pgd"]}))
    args = ["enhance", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--weaknesses", str(weak),
            "--epochs", "6", "--adv-steps", "3", "--eval-limit", "0", "--no-progress"]
    out = tmp_path / "killed"
    proc = _cli(*args, "--out", str(out))
    _kill_when(proc, lambda: bool(list((out / "state").glob("enhance_*/enhance_state.pt"))))  # after the first epoch
    done = _cli(*args, "--out", str(out))
    assert done.wait() == 0, done.stderr.read()
    assert "continuing the interrupted enhancement" in done.stderr.read()
    ref = _cli(*args, "--out", str(tmp_path / "whole"))
    assert ref.wait() == 0, ref.stderr.read()
    from robustest.models.checkpoints import load_model

    a, b = load_model(out / "model.pt").state_dict(), load_model(tmp_path / "whole" / "model.pt").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ra = json.loads((out / "results.json").read_text())["enhance"]["epochs"]
    rb = json.loads((tmp_path / "whole" / "results.json").read_text())["enhance"]["epochs"]
    assert [e["loss"] for e in ra] == [e["loss"] for e in rb]
    assert not list(out.rglob("*.tmp"))


@pytest.mark.slow
def test_corrupt_killed_and_rerun_writes_the_same_files(tmp_path) -> None:
    import json

    args = ["corrupt", "--dataset", "digits", "--limit", "600", "--corruptions", "all", "--severities", "1-5",
            "--no-progress"]
    out = tmp_path / "killed"
    proc = _cli(*args, "--out", str(out))
    _kill_when(proc, lambda: len(list(out.glob("*.npz"))) >= 3)
    assert main([*args, "--out", str(out)]) == 0
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    files = lambda p: json.loads((p / "results.json").read_text())["corruptions"]  # noqa: E731
    got, want = files(out), files(tmp_path / "whole")
    assert {k: v["sha256"] for k, v in got.items()} == {k: v["sha256"] for k, v in want.items()}
    assert not list(out.rglob("*.tmp"))


def test_analysis_with_other_settings_starts_afresh(tmp_path, mlp_digits_checkpoint, capsys) -> None:
    base = ["analyze", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--limit", "64",
            "--save-every", "32", "--no-progress", "--out", str(tmp_path)]
    assert main([*base, "--neighbors", "3"]) == 0
    assert main([*base, "--neighbors", "3"]) == 0
    assert "2 finished step(s) of an interrupted run reused" in capsys.readouterr().err
    assert main([*base, "--neighbors", "4"]) == 0
    err = capsys.readouterr().err
    assert "starting afresh" in err and "reused" not in err


def test_write_failure_is_one_line_and_keeps_no_temporary_file(tmp_path) -> None:
    def limit() -> None:  # a 6 KB file size limit: the first corruption file cannot be written
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))

    out = tmp_path / "o"
    proc = _cli("corrupt", "--dataset", "digits", "--limit", "200", "--corruptions", "fog", "--severities", "1-5",
                "--no-progress", "--out", str(out), preexec_fn=limit)
    err = proc.communicate()[1]
    assert proc.returncode == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "file size limit" in lines[0] and "rerun the same command" in lines[0], err
    assert not list(out.rglob("*.tmp"))


def test_unwritable_out_is_refused_before_any_work(tmp_path, capsys) -> None:
    t0 = time.perf_counter()
    rc = main(["corrupt", "--dataset", "digits", "--corruptions", "fog", "--out", "/proc/robustest-out"])
    err = capsys.readouterr().err
    assert rc == 2 and "not writable" in err and err.count("\n") == 1
    assert time.perf_counter() - t0 < 5
    f = tmp_path / "a-file"
    f.write_text("x")
    assert main(["corrupt", "--dataset", "digits", "--corruptions", "fog", "--out", str(f)]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_check_writable_and_stale_temporaries(tmp_path) -> None:
    target = tmp_path / "new" / "deeper"
    atomic.check_writable(target, create=False)
    assert not (tmp_path / "new").exists()  # probed without leaving anything behind
    atomic.check_writable(target)
    assert target.is_dir() and not list(target.iterdir())
    stale = target / ".results.json.k2j3h4g5.tmp"
    stale.write_text("half")
    keep = target / "notes.tmp"
    keep.write_text("a user's file")
    assert atomic.remove_stale_temporaries(target) == [stale] and keep.exists()
    with pytest.raises(OutputError, match="not writable"):
        atomic.check_writable("/proc/robustest-probe")


def test_atomic_write_failure_is_an_output_error(tmp_path) -> None:
    def small() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))

    code = ("import signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "from robustest.core.atomic import atomic_write_bytes\n"
            "from robustest.core.errors import OutputError\n"
            f"try:\n    atomic_write_bytes({str(tmp_path / 'big.bin')!r}, bytes(1000))\n"
            "except OutputError as e:\n    print('OUTPUT-ERROR', e)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=small)
    assert "OUTPUT-ERROR" in res.stdout and "file size limit" in res.stdout
    assert not list(Path(tmp_path).glob(".*.tmp")) and not (tmp_path / "big.bin").exists()


# --------------------------------------------------------------------- no wrong result with exit 0
def _run(capsys, *argv) -> tuple[int, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    return code, capsys.readouterr().err


def _one_line(code: int, err: str, match: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and match in err, err


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory, mlp_digits_checkpoint) -> str:
    """The mlp checkpoint with one NaN weight: every logit it computes is NaN."""
    from robustest.models.checkpoints import load_checkpoint, save_checkpoint

    model = load_checkpoint(mlp_digits_checkpoint)
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")
    path = tmp_path_factory.mktemp("nan_model") / "model.pt"
    save_checkpoint(path, model)
    return str(path)


@pytest.mark.parametrize("verb, extra", [
    ("score", ["--metric", "gini"]),
    ("generate", ["--method", "fgsm", "--eps", "0.1"]),
    ("eval", ["--eps", "0.1", "--version", "fast", "--fail-under", "0.05"]),
])
def test_nan_logits_are_refused_before_the_work(verb, extra, nan_checkpoint, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code, err = _run(capsys, verb, "--checkpoint", nan_checkpoint, "--dataset", "digits", "--limit", "40",
                     "--no-progress", "--out", out, *extra)
    _one_line(code, err, "NaN or infinite logits")
    assert not (out / "results.json").exists()


def test_check_logits_is_the_one_check_of_model_outputs() -> None:
    from robustest.core.errors import DataError

    ok = torch.zeros(3, 4)
    assert inputs.check_logits(ok) is ok
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = torch.zeros(3, 4)
        t[1, 2] = bad
        with pytest.raises(DataError, match="NaN or infinite logits"):
            inputs.check_logits(t)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    x, y = torch.rand(40, 1, 8, 8), torch.zeros(40, dtype=torch.long)
    modelchecks.check_finite_logits(model, (x, y))
    x[0, 0, 0, 0] = 1e38  # a finite input whose logits overflow
    with torch.no_grad():
        model[1].weight.fill_(1e38)
    with pytest.raises(DataError, match="NaN or infinite logits"):
        modelchecks.check_finite_logits(model, (x, y))


def test_internal_errors_have_their_own_exit_status(tmp_path, capsys, monkeypatch, mlp_digits_checkpoint) -> None:
    from robustest.cli import score as score_verb
    from robustest.core import errors

    def boom(*a, **k):
        raise RuntimeError("a bug")

    monkeypatch.setattr(score_verb, "load_data", boom)
    code, err = _run(capsys, "score", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--metric",
                     "gini", "--out", tmp_path / "o")
    assert code == errors.EXIT_INTERNAL == 3 and code not in (errors.EXIT_GATE, errors.EXIT_USAGE), err
    assert "internal error" in err and err.count("\n") == 1


def test_binary_yaml_config_is_bad_input(tmp_path, capsys, monkeypatch) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_bytes(b"eps: 0.1\n\xff\xfe\x00\x81binary\n")
    code, err = _run(capsys, "run", "--config", cfg, "--out", tmp_path / "o")
    _one_line(code, err, f"config file {cfg} is not text (a binary byte at offset 9)")
    from robustest.cli import score as score_verb  # any other text read with binary bytes: still bad input

    def binary(*a, **k):
        b"\xff".decode("utf-8")

    monkeypatch.setattr(score_verb, "load_model", binary)
    code, err = _run(capsys, "score", "--checkpoint", "m.pt", "--dataset", "digits", "--metric", "gini",
                     "--out", tmp_path / "s")
    _one_line(code, err, "binary bytes")


def test_path_over_the_file_system_limit_is_bad_input(tmp_path, capsys) -> None:
    long = tmp_path / ("x" * 300) / "model.pt"
    code, err = _run(capsys, "score", "--checkpoint", long, "--dataset", "digits", "--metric", "gini",
                     "--out", tmp_path / "o")
    _one_line(code, err, "File name too long")
    code, err = _run(capsys, "score", "--checkpoint", "x.pt", "--dataset", "digits", "--metric", "gini", "--out",
                     tmp_path / ("y" * 300))
    assert code == 2 and err.count("\n") == 1, err


# ------------------------------------------------------------------- one radius check everywhere
LINF_MESSAGE = "eps must lie in (0, 1] for the L-inf threat model"


@pytest.mark.parametrize("call", [
    lambda m, x, y: __import__("robustest").attacks.pgd(m, x, y, eps=8),
    lambda m, x, y: __import__("robustest").attacks.fgsm(m, x, y, eps=1.5),
    lambda m, x, y: __import__("robustest").attacks.apgd(m, x, y, eps=8, steps=2),
    lambda m, x, y: __import__("robustest").attacks.square(m, x, y, eps=2.0),
    lambda m, x, y: __import__("robustest").attacks.fab(m, x, y, eps=3.0),
    lambda m, x, y: __import__("robustest").attacks.attack("pgd", m, (x, y), eps=8),
    lambda m, x, y: __import__("robustest").metrics.fol(m, x, y, eps=8),
    lambda m, x, y: __import__("robustest").evaluate.whitebox_accuracy(m, (x, y), 8),
    lambda m, x, y: __import__("robustest").evaluate.evaluate(m, (x, y), eps=8, version="fast"),
    lambda m, x, y: __import__("robustest").fuzzing.fol_fuzz(m, x, y, eps=8),
    lambda m, x, y: __import__("robustest").weakrobust.adversarial_radius(m, (x, y), eps_max=8),
])
def test_an_linf_radius_above_one_is_refused_by_every_function(call, digits_model) -> None:
    from robustest.core.errors import ConfigError

    x, y = torch.rand(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    with pytest.raises(ConfigError, match=r"eps(_max)? must lie in \(0, 1\] for the L-inf threat model"):
        call(digits_model, x, y)


def test_radii_other_norms_and_the_run_config_use_the_same_check(digits_model) -> None:
    from robustest import attacks
    from robustest.core import validation
    from robustest.core.errors import ConfigError
    from robustest.robot import RobotConfig

    x, y = torch.rand(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    assert attacks.pgd(digits_model, x, y, eps=2.0, norm="l2", steps=1).shape == x.shape  # an L2 radius may pass 1
    for bad in (0, -0.1, float("nan"), float("inf"), "0.1", True):
        with pytest.raises(ConfigError, match="eps must"):
            validation.check_eps("eps", bad)
    with pytest.raises(ConfigError, match=re.escape(LINF_MESSAGE)):
        RobotConfig.from_dict({"eps": 5}).validate()
    with pytest.raises(ConfigError, match="unknown norm"):
        validation.check_eps("eps", 0.1, "l3")


@pytest.mark.parametrize("argv", [
    ["generate", "--method", "pgd", "--eps", "5"],
    ["generate", "--method", "fgsm", "--fol-eps", "2"],
    ["score", "--metric", "fol", "--eps", "5"],
    ["eval", "--eps", "5"],
    ["eval", "--eps", "8"],
])
def test_an_linf_radius_above_one_is_refused_by_every_verb(argv, mlp_digits_checkpoint, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code, err = _run(capsys, *argv, "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--out", out)
    _one_line(code, err, LINF_MESSAGE)
    assert not out.exists()


@pytest.mark.parametrize("verb, argv", [
    ("run", ["--eps", "5"]),
    ("validate", ["--attack-eps", "0.1,5"]),
    ("enhance", ["--eps", "5"]),
    ("generate", ["--method", "fol-fuzz", "--fuzz-eps", "5"]),
])
def test_an_linf_radius_flag_above_one_is_refused(verb, argv, tmp_path, capsys) -> None:
    code, err = _run(capsys, verb, *argv, "--out", tmp_path / "o")
    _one_line(code, err, LINF_MESSAGE)


def test_fractions_are_radii_in_every_verb(mlp_digits_checkpoint, tmp_path, capsys) -> None:
    import json

    from robustest.cli import build_parser

    parser = build_parser()
    ck = ["--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--out", str(tmp_path / "p")]
    for argv, key in ((["generate", "--method", "pgd", "--eps", "8/255", "--fol-eps", "1/10"], "eps"),
                      (["score", "--metric", "fol", "--eps", "8/255"], "eps"),
                      (["eval", "--eps", "8/255"], "eps"),
                      (["run", "--eps", "8/255"], "eps"),
                      (["compare", "--eps", "8/255"], "eps"),
                      (["validate", "--attack-eps", "4/255,8/255"], "attack_eps"),
                      (["enhance", "--eps", "8/255", "--epochs", "1"], "eps"),
                      (["analyze", "--radius-eps-max", "8/255"], "radius_eps_max"),
                      (["harden", "--eps", "8/255"], "eps")):
        args = parser.parse_args([*argv, *ck])
        got = getattr(args, key)
        assert (got == pytest.approx(8 / 255) or got == pytest.approx([4 / 255, 8 / 255])
                or got == pytest.approx([8 / 255])), argv  # eval's --eps is a list (a robustness curve)
    out = tmp_path / "gen"
    code, err = _run(capsys, "generate", "--method", "fgsm", "--eps", "8/255", "--checkpoint", mlp_digits_checkpoint,
                     "--dataset", "digits", "--limit", "20", "--no-progress", "--out", out)
    assert code == 0, err
    assert json.loads((out / "results.json").read_text())["settings"]["eps"] == pytest.approx(8 / 255)


# ------------------------------------------------------------------------ counts, paths and seeds
def test_select_n_zero_and_an_empty_out_are_refused(tmp_path, capsys, mlp_digits_checkpoint) -> None:
    scores = tmp_path / "scores.csv"
    scores.write_text("index,score\n0,0.5\n1,0.2\n")
    code, err = _run(capsys, "select", "--scores", scores, "--n", "0", "--strategy", "top", "--out", tmp_path / "s")
    _one_line(code, err, "positive integer")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, err = _run(capsys, "score", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--metric",
                         "gini", "--limit", "10", "--out", "")
    finally:
        os.chdir(cwd)
    _one_line(code, err, "--out is empty")
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("rows, match", [
    ("index,score\n0,0.5\n-3,0.2\n", "negative index"),
    ("index,score\n4,0.5\n4,0.2\n", "names an input twice"),
    ("index,score\n99999999999999999999999,0.5\n", "unreadable score or index"),
    ("index,score\n", "empty"),
])
def test_the_csv_scores_get_the_checks_of_the_pt_scores(rows, match, tmp_path, capsys) -> None:
    from robustest.core.errors import DataError
    from robustest.selection.scores_file import read_scores

    path = tmp_path / "scores.csv"
    path.write_text(rows)
    with pytest.raises(DataError, match=match):
        read_scores(path)
    code, err = _run(capsys, "select", "--scores", path, "--n", "1", "--strategy", "top", "--out", tmp_path / "s")
    assert code == 2 and err.count("\n") == 1, err
    assert not (tmp_path / "s").exists()


def test_seeds_follow_one_rule(tmp_path, capsys) -> None:
    from robustest.core.errors import ConfigError
    from robustest.robot import RobotConfig

    for argv in (["compare", "--seeds", "-1"], ["compare", "--seeds", "0,9223372036854775808"],
                 ["compare", "--seeds", "0-99999999999"], ["run", "--seed", "-1"]):
        code, err = _run(capsys, *argv, "--out", tmp_path / "o")
        assert code == 2 and err.count("\n") == 1 and "seed" in err, (argv, err)
    for cfg in ({"seed": 2**63}, {"seed": -1}, {"seeds": [0, -1]}, {"seeds": [2**64]}):
        with pytest.raises(ConfigError, match=r"must be a seed: an integer in \[0, 2\^63\)"):
            RobotConfig.from_dict(cfg).validate()
    with pytest.raises(ConfigError, match="seed must be an integer"):
        RobotConfig.from_dict({"seed": 1.0}).validate()
    yaml_cfg = tmp_path / "run.yaml"
    yaml_cfg.write_text("seed: 10000000000000000000000\n")
    code, err = _run(capsys, "run", "--config", yaml_cfg, "--out", tmp_path / "o")
    _one_line(code, err, "seed must be a seed")
    assert RobotConfig.from_dict({"seed": 2**63 - 1, "seeds": [0, 5]}).validate().seed == 2**63 - 1


# ------------------------------------------------------------------------ resources bounded up front
@pytest.mark.parametrize("ds", ["npz", "mnist", "folder"])
def test_a_data_path_that_is_no_file_or_folder_is_refused(ds, mlp_digits_checkpoint, tmp_path, capsys) -> None:
    t0 = time.perf_counter()
    code, err = _run(capsys, "score", "--metric", "gini", "--checkpoint", mlp_digits_checkpoint, "--dataset", ds,
                     "--data-dir", "/dev/zero", "--out", tmp_path / "o")
    _one_line(code, err, "neither a regular file nor a folder")
    assert time.perf_counter() - t0 < 10


def test_threads_are_bounded_by_the_cores(tmp_path, capsys, monkeypatch) -> None:
    from robustest.cli import args as cli_args

    cores = cli_args.available_cores()
    assert 1 <= cores <= (os.cpu_count() or cores)
    assert cli_args.thread_count(str(cores)) == cores
    for verb in ("corrupt", "run", "demo"):
        code, err = _run(capsys, verb, "--threads", str(cores + 1), "--out", tmp_path / "o")
        _one_line(code, err, f"at most {cores} threads")
    code, err = _run(capsys, "corrupt", "--threads", "100000", "--out", tmp_path / "o")
    _one_line(code, err, "the cores available")
    monkeypatch.setattr("robustest.cli.available_cores", lambda: 0)  # a verb's own flag is checked again by main
    code, err = _run(capsys, "corrupt", "--dataset", "digits", "--corruptions", "fog", "--threads", "1",
                     "--out", tmp_path / "o")
    assert code == 2 and "more than the 0 cores" in err, err
    assert not (tmp_path / "o").exists()


def _npz_of_headers(path: Path, members: dict) -> Path:
    """An npz whose members are .npy headers alone (declared shapes, no data): what a reader must refuse
    without decompressing anything."""
    import zipfile

    import numpy as np

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, (shape, descr) in members.items():
            with zf.open(f"{name}.npy", "w") as m:
                np.lib.format.write_array_header_1_0(m, {"descr": descr, "fortran_order": False, "shape": shape})
    return path


@pytest.mark.parametrize("members, match", [
    ({"x": ((50000, 256, 256), "|u1"), "y": ((50000,), "<i8")}, r"declares 3.05 GiB, more than the 1 GiB"),
    ({"x": ((100, 8, 8), "|u1"), "y": ((99,), "<i8")}, "100 images but 99 labels"),
    ({"x": ((100, 8, 8), "<U4"), "y": ((100,), "<i8")}, "not image data"),
    ({"x": ((100, 8, 8), "|u1"), "y": ((100,), "<U4")}, "integer class indices"),
    ({"x": ((100, 64), "|u1"), "y": ((100,), "<i8")}, "images must be N x H x W"),
    ({"x": ((100, 8, 8), "|u1"), "y": ((100, 10), "<f4")}, "one-hot"),
])
def test_npz_headers_are_checked_before_any_data_is_read(members, match, tmp_path, monkeypatch) -> None:
    from robustest import data
    from robustest.core.errors import DataError

    monkeypatch.delenv("ROBUSTEST_MAX_ARRAY_BYTES", raising=False)
    assert reading.MAX_ARRAY_BYTES == 2**30 and reading.max_array_bytes() <= 2**30
    f = _npz_of_headers(tmp_path / "h.npz", members)
    t0 = time.perf_counter()
    with pytest.raises(DataError, match=match) as exc:
        data.load("npz", f)
    assert "\n" not in str(exc.value) and time.perf_counter() - t0 < 2


def test_npz_declared_size_counts_the_rows_read_and_the_conversion(tmp_path, monkeypatch) -> None:
    import numpy as np

    from robustest import data
    from robustest.core.errors import DataError

    f = tmp_path / "f.npz"
    np.savez_compressed(f, x=np.zeros((1000, 16, 16), np.float64), y=np.zeros(1000, np.int64))  # 2 MB of float64
    monkeypatch.setenv("ROBUSTEST_MAX_ARRAY_BYTES", str(2_500_000))  # the float64 fits, not with its float32 copy
    with pytest.raises(DataError, match="declares"):
        data.load("npz", f)
    assert len(data.load("npz", f, limit=500)) == 500  # half the rows: 1.5 MB with the copy
    monkeypatch.setenv("ROBUSTEST_MAX_ARRAY_BYTES", str(4_000_000))
    assert data.load("npz", f).image_shape == (1, 16, 16)


def test_a_huge_image_set_is_refused_by_its_shape_before_any_forward(tmp_path, capsys) -> None:
    import numpy as np

    from robustest import models
    from robustest.core.errors import ConfigError
    from robustest.models.checkpoints import save_checkpoint

    calls = []
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(4, 3))  # takes any size: only the shape can refuse it
    net.register_forward_pre_hook(lambda m, a: calls.append(a[0].shape))
    x, y = torch.zeros(2, 1, 4000, 4000), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ConfigError, match="the images are 1x4000x4000 .* --resize"):
        modelchecks.check_model_fits(net, (x, y))
    with pytest.raises(ConfigError, match="the images are 1x4000x4000"):
        modelchecks.check_finite_logits(net, (x, y))
    assert calls == []
    assert modelchecks.check_model_fits(net, (torch.zeros(2, 1, 1024, 1024), y)) == 3
    calls.clear()
    modelchecks.check_finite_logits(net, (torch.zeros(40, 1, 512, 512), torch.zeros(40, dtype=torch.long)))
    assert [s[0] for s in calls] == [4]  # the first batch shrinks with the image size (2^20 values)

    f = tmp_path / "huge.npz"
    np.savez_compressed(f, x=np.zeros((2, 4000, 4000), np.uint8), y=np.zeros(2, np.int64))
    ck = tmp_path / "resnet20.pt"
    save_checkpoint(ck, models.create("resnet20", num_classes=10, in_channels=1))  # global pooling: any size
    t0 = time.perf_counter()
    code, err = _run(capsys, "score", "--metric", "gini", "--checkpoint", ck, "--dataset", "npz", "--data-dir", f,
                     "--out", tmp_path / "o")
    _one_line(code, err, "the images are 1x4000x4000")
    assert time.perf_counter() - t0 < 20


def test_evaluate_and_assert_robust_refuse_nan_logits(exploding_model) -> None:
    from robustest import testing
    from robustest.core.errors import DataError
    from robustest.evaluate import evaluate

    x, y = torch.rand(6, 1, 8, 8), torch.zeros(6, dtype=torch.long)
    with pytest.raises(DataError, match="NaN or infinite logits"):
        evaluate(exploding_model, (x, y), eps=0.1, version="fast")
    with pytest.raises(DataError, match="NaN or infinite logits"):  # never a passed gate on NaN logits
        testing.assert_robust(exploding_model, (x, y), eps=0.1, min_accuracy=0.0, attack="fast")


def _png_header(path: Path, width: int, height: int) -> Path:
    """A PNG of a few bytes whose header declares width x height grey pixels (no pixel data)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize("side", [9000, 20000])  # above robustest's limit; above PIL's own bomb limit too
def test_an_image_file_declaring_gigapixels_is_refused_before_decoding(side, tmp_path, capsys,
                                                                       mlp_digits_checkpoint) -> None:
    from robustest import data
    from robustest.core.errors import DataError

    for cls in ("a", "b"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        _png_header(tmp_path / "imgs" / cls / "0.png", side, side)
    with pytest.raises(DataError, match="8192 x 8192") as exc:
        data.load("folder", tmp_path / "imgs", resize=8)
    assert "\n" not in str(exc.value)
    code, err = _run(capsys, "score", "--metric", "gini", "--checkpoint", mlp_digits_checkpoint, "--dataset",
                     "folder", "--data-dir", tmp_path / "imgs", "--out", tmp_path / "o")
    _one_line(code, err, "8192 x 8192")


def _deflated_copy(src: Path, dst: Path, blow_up: int = 0) -> Path:
    """``src`` (a torch.save zip) rewritten with compressed members, plus a compressed member of ``blow_up``
    zero bytes (a deflate bomb: a few MB declaring gigabytes; torch.load decompresses such members)."""
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
        if blow_up:
            prefix = zin.infolist()[0].filename.split("/")[0]
            with zout.open(f"{prefix}/data/99", "w", force_zip64=True) as m:
                chunk = bytes(2**24)
                for _ in range(blow_up // len(chunk)):
                    m.write(chunk)
    return dst


def test_a_torch_file_whose_compressed_members_declare_gigabytes_is_refused(tmp_path, capsys, monkeypatch,
                                                                          mlp_digits_checkpoint) -> None:
    from robustest import data
    from robustest.core.errors import DataError

    monkeypatch.delenv("ROBUSTEST_MAX_ARRAY_BYTES", raising=False)
    small = _deflated_copy(Path(mlp_digits_checkpoint), tmp_path / "small.pt")
    reading.check_torch_file(small, "model file")  # compressed but small: torch.load reads it
    bomb = _deflated_copy(Path(mlp_digits_checkpoint), tmp_path / "bomb.pt", blow_up=2**30 + 2**26)
    assert bomb.stat().st_size < 10 * 2**20
    t0 = time.perf_counter()
    code, err = _run(capsys, "score", "--metric", "gini", "--checkpoint", bomb, "--dataset", "digits",
                     "--out", tmp_path / "o")
    _one_line(code, err, "compressed members declare 1.06 GiB, more than the 1 GiB")
    assert time.perf_counter() - t0 < 10
    monkeypatch.setenv("ROBUSTEST_MAX_ARRAY_BYTES", str(2**24))  # the other .pt readers, on smaller bombs
    scores = tmp_path / "scores.pt"
    torch.save({"scores": torch.rand(5), "index": torch.arange(5)}, scores)
    code, err = _run(capsys, "select", "--scores", _deflated_copy(scores, tmp_path / "sb.pt", blow_up=2**25),
                     "--n", "1", "--strategy", "top", "--out", tmp_path / "s")
    _one_line(code, err, "compressed members declare")
    tests = tmp_path / "tests.pt"
    data.save_tests(tests, torch.rand(3, 1, 8, 8), torch.zeros(3, dtype=torch.long), torch.arange(3), "pgd")
    assert len(data.load_tests(_deflated_copy(tests, tmp_path / "t.pt"))["x"]) == 3
    with pytest.raises(DataError, match="compressed members declare"):
        data.load_tests(_deflated_copy(tests, tmp_path / "tb.pt", blow_up=2**25))
    from robustest.suite.format import Suite  # the regression suite's file goes through the same check

    with pytest.raises(DataError, match="compressed members declare"):
        Suite.load(_deflated_copy(scores, tmp_path / "suite.pt", blow_up=2**25))
    lying = tmp_path / "lying.pt"  # a stored member that declares more bytes than the file holds
    raw = bytearray(scores.read_bytes())
    import zipfile

    with zipfile.ZipFile(scores) as zf:
        info = zf.infolist()[-1]
    at = raw.rfind(info.filename.encode()) - 46 + 24  # its central-directory entry's uncompressed size
    raw[at:at + 4] = (2**31).to_bytes(4, "little")
    lying.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="damaged"):
        reading.check_torch_file(lying, "scores file")


def test_other_os_errors_are_internal_errors_in_one_line(tmp_path, capsys, monkeypatch,
                                                         mlp_digits_checkpoint) -> None:
    import errno

    from robustest.cli import score as score_verb
    from robustest.core.errors import EXIT_INTERNAL

    def fails(*a, **k):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(score_verb, "load_data", fails)
    code, err = _run(capsys, "score", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--metric",
                     "gini", "--out", tmp_path / "o")
    assert code == EXIT_INTERNAL and err.count("\n") == 1 and "internal error: OSError" in err, err
    monkeypatch.undo()
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    code, err = _run(capsys, "score", "--checkpoint", mlp_digits_checkpoint, "--dataset", "npz", "--data-dir",
                     loop / "x.npz", "--metric", "gini", "--out", tmp_path / "o")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err


def test_positional_images_and_labels_name_the_signature(mlp_digits_checkpoint) -> None:
    """evaluate(model, x, y, eps) puts the labels where eps goes: a one-line error naming the signature."""
    from robustest.evaluate import evaluate
    from robustest.models.checkpoints import load_checkpoint

    model = load_checkpoint(mlp_digits_checkpoint)
    x, y = torch.rand(4, 1, 8, 8), torch.arange(4)
    with pytest.raises(ConfigError, match=r"ONE argument: call evaluate\(model, \(x, y\), eps\)") as info:
        evaluate(model, x, y, 0.1)
    assert "\n" not in str(info.value)


def test_channels_last_images_get_a_one_line_error_naming_the_layout() -> None:
    from robustest.core.errors import DataError

    with pytest.raises(DataError, match=r"N x H x W x C \(channels last\).*permute\(0, 3, 1, 2\)"):
        inputs.check_images(torch.rand(2, 28, 28, 1))
    with pytest.raises(DataError, match="channels last"):
        inputs.check_images(torch.rand(2, 32, 32, 3))
    assert inputs.check_images(torch.rand(2, 3, 32, 32)).shape == (2, 3, 32, 32)  # NCHW untouched
    assert inputs.check_images(torch.rand(2, 1, 28, 28)).shape == (2, 1, 28, 28)


def test_torchscript_and_exported_programs_with_bombs_are_refused_before_loading(tmp_path, monkeypatch) -> None:
    """TorchScript archives and .pt2 programs are zip files too: a member declaring more than the limit is refused
    before torch.jit.load / torch.export.load read it."""
    from robustest.core.errors import DataError
    from robustest.models.checkpoints import load_model

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3)).eval()
    torch.jit.script(net).save(str(tmp_path / "net.ts"))
    torch.export.save(torch.export.export(net, (torch.rand(2, 1, 8, 8),)), str(tmp_path / "net.pt2"))
    monkeypatch.setenv("ROBUSTEST_MAX_ARRAY_BYTES", str(2**24))
    for name, kw in (("net.ts", {"torchscript": True}), ("net.pt2", {})):
        assert load_model(tmp_path / name, **kw) is not None  # the genuine files load
        bomb = _deflated_copy(tmp_path / name, tmp_path / f"bomb-{name}", blow_up=2**25)
        with pytest.raises(DataError, match="compressed members declare"):
            load_model(bomb, **kw)
