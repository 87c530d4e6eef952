"""The RobOT loop and the strategy comparison (robustest.robot) on tiny digits settings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from robustest import robot
from robustest.core.errors import ConfigError

# tiny but complete settings: every stage runs, each in a fraction of a second
TINY = {
    "dataset": "digits", "train_limit": 300, "test_limit": 60, "eps": 0.15, "epochs": 1, "batch_size": 64,
    "whitebox_limit": 30, "whitebox_pgd_steps": 3, "whitebox_restarts": 1, "apgd_steps": 3,
    "convergence_probe": 40, "pool_pgd_steps": 5, "verbose": False,
}


@pytest.fixture(scope="module")
def checkpoint(mlp_digits_checkpoint):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster, restored after the module
    yield mlp_digits_checkpoint
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------------ config
def test_config_validation_errors_are_one_line(tmp_path):
    cases = [
        ({"epsilon": 0.3}, "unknown config key 'epsilon'"),
        ({"eps": 0}, "eps must lie in"),
        ({"eps": 8}, "eps must lie in"),
        ({"budget": "0%"}, "budget"),
        ({"budget": -3}, "budget"),
        ({"strategy": "deepgini"}, "unknown strategy"),
        ({"strategies": ["best", "best"]}, "twice"),
        ({"pool": "gan"}, "unknown pool"),
        ({"rounds": 0}, "rounds must be"),
        ({"target": 1.5}, "target must be"),
        ({"seeds": []}, "seeds must be"),
        ({"dataset": "imagenet"}, "unknown dataset"),
        ({"target_metric": "speed"}, "target_metric"),
    ]
    for d, msg in cases:
        with pytest.raises(ConfigError, match=msg) as info:
            robot.RobotConfig.from_dict(d)
        assert "\n" not in str(info.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text("eps: [0.3\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        robot.RobotConfig.from_yaml(bad)
    good = tmp_path / "good.yaml"
    good.write_text("eps: 0.2\nbudget: 5%\nstrategies: [best, gini]\n")
    cfg = robot.RobotConfig.from_yaml(good)
    assert cfg.eps == 0.2 and cfg.budget == "5%" and cfg.strategies == ["best", "gini"]
    with pytest.raises(ConfigError, match="does not exist"):
        robot.RobotConfig.from_yaml(tmp_path / "missing.yaml")


def test_parse_budget_and_seeds():
    assert robot.parse_budget("5%", 200) == 10
    assert robot.parse_budget("0.5%", 100) == 1  # at least one test from a non-empty pool
    assert robot.parse_budget(7, 200) == 7
    assert robot.parse_budget(500, 200) == 200
    assert robot.parse_budget("12", 200) == 12
    for bad in ("abc", "150%", 0, True, 1.5):
        with pytest.raises(ConfigError):
            robot.parse_budget(bad, 100)
    from robustest.core.seeding import derive_seed

    assert derive_seed(0, "round", 1) == derive_seed(0, "round", 1)
    assert derive_seed(0, "round", 1) != derive_seed(0, "round", 2)


def test_convergence_rule():
    # relative changes: 0.5, 0.2, 0.04, 0.03 -> streak of 2 below tol 0.05
    hist = [1.0, 0.5, 0.4, 0.384, 0.37248]
    r = robot.convergence_update(hist, tol=0.05, patience=2)
    assert r["converged"] and r["streak"] == 2
    assert r["rel_change"] == pytest.approx(0.03)
    assert not robot.convergence_update(hist[:4], tol=0.05, patience=2)["converged"]
    # a jump resets the streak
    assert robot.convergence_update([1.0, 1.01, 2.0], tol=0.05, patience=1)["streak"] == 0
    first = robot.convergence_update([0.7], tol=0.05, patience=1)
    assert first["rel_change"] is None and not first["converged"]
    with pytest.raises(ConfigError):
        robot.convergence_update([], tol=0.1, patience=1)


def without_timings(doc: dict) -> dict:
    """A results document without its wall-clock ``timings`` (everything else is deterministic)."""
    return {k: v for k, v in doc.items() if k != "timings"}


def _bytes_without_timings(path: Path) -> bytes:
    text = path.read_text()
    start = text.index('  "timings": {')
    end = text.index("  },\n", start) + len("  },\n")
    return (text[:start] + text[end:]).encode()


# -------------------------------------------------------------------------------------------- the loop
def test_loop_on_digits(checkpoint, tmp_path):
    out = tmp_path / "loop"
    res = robot.run({**TINY, "model": checkpoint, "budget": 20, "strategy": "best", "rounds": 2,
                     "convergence_tol": 0.0, "out": str(out)})
    assert res["kind"] == "loop" and res["stop_reason"] == "rounds" and res["rounds_completed"] == 2
    assert res["baseline"]["fixed_set_accuracy"] == 0.0
    for rec in res["rounds"]:
        assert rec["selected"]["n"] == 20 and rec["pool"]["size"] > 20
        assert rec["train"]["num_train"] == res["data"]["num_fit"] + 20 * rec["round"]  # tests accumulate
        assert rec["convergence"]["statistic"] >= 0 and "median" in rec["convergence"]["fol"]
        assert rec["train"]["best_epoch"] == 1
    # retraining on adversarial tests moves the model off 0 on the fixed set
    assert res["rounds"][-1]["robustness"]["fixed_set_accuracy"] > 0.0
    saved = json.loads((out / "results.json").read_text())
    assert saved["rounds"][1]["robustness"] == res["rounds"][1]["robustness"]
    assert "seconds" not in json.dumps(saved["rounds"][0]["train"])  # wall time lives in timings.json
    assert (out / "timings.json").is_file() and (out / "report.html").stat().st_size > 1000
    assert "<h1>robustest run: RobOT loop of mlp on digits</h1>" in (out / "report.html").read_text()
    assert (out / "summary.csv").read_text().count("\n") == 4  # header + rounds 0, 1, 2
    assert (out / "state" / "round002" / "model.pt").is_file()
    # the same --out again without resume is refused; with resume nothing is redone
    with pytest.raises(ConfigError, match="--resume"):
        robot.run({**TINY, "model": checkpoint, "budget": 20, "strategy": "best", "rounds": 2, "convergence_tol": 0.0,
                   "out": str(out)})
    again = robot.run({**TINY, "model": checkpoint, "budget": 20, "strategy": "best", "rounds": 2,
                       "convergence_tol": 0.0, "out": str(out), "resume": True})
    assert without_timings(again) == without_timings(res)  # wall-clock timings are the only difference
    with pytest.raises(ConfigError, match="different settings"):
        robot.run({**TINY, "model": checkpoint, "budget": 30, "strategy": "best", "rounds": 2, "out": str(out),
                   "resume": True})


def test_loop_stops_on_requirement_and_convergence(checkpoint, tmp_path, results_contract):
    res = robot.run({**TINY, "model": checkpoint, "budget": 10, "rounds": 3, "target": 0.0,
                     "target_metric": "clean_accuracy", "out": str(tmp_path / "a")})
    assert res["stop_reason"] == "requirement" and res["rounds_completed"] == 1
    # the default strategy (adv-train) uses no pool and no budget: its settings and report leave them out
    doc = results_contract(tmp_path / "a", "run")
    assert doc["settings"]["strategy"] == "adv-train" and not {"budget", "pool"} & set(doc["settings"])
    html = (tmp_path / "a" / "report.html").read_text()
    assert "no pool and no budget" in html and "after 1 round." in html
    res = robot.run({**TINY, "model": checkpoint, "budget": 10, "rounds": 3, "convergence_tol": 1e9,
                     "convergence_patience": 1, "out": str(tmp_path / "b")})
    assert res["stop_reason"] == "converged" and res["rounds_completed"] == 1
    res = robot.run({**TINY, "model": checkpoint, "budget": 10, "rounds": 3, "time_budget": 1e-6,
                     "out": str(tmp_path / "c")})
    assert res["stop_reason"] == "time" and res["rounds_completed"] == 0 and res["rounds"] == []
    assert (tmp_path / "c" / "report.html").is_file()


def test_compare_on_digits(checkpoint, tmp_path):
    out = tmp_path / "cmp"
    res = robot.compare({**TINY, "model": checkpoint, "strategies": ["best", "gini", "random"],
                         "budgets": [15], "seeds": [0, 1], "out": str(out)})
    assert res["kind"] == "compare" and len(res["cells"]) == 6 and len(res["table"]) == 3
    for row in res["table"]:
        assert row["seeds"] == 2 and row["n"] == 15 and row["before_fixed_set_accuracy"] == 0.0
        assert row["fixed_set_accuracy_std"] is not None and row["fixed_set_accuracy_mean"] >= 0
    sel = {}
    for s in ("best", "gini", "random"):
        sel[s] = torch.load(out / "state" / "cells" / f"{s}_b15_s0" / "selected.pt", weights_only=True)["pool_index"]
    assert not torch.equal(torch.sort(sel["best"]).values, torch.sort(sel["gini"]).values)
    csv = (out / "summary.csv").read_text().splitlines()
    assert "<h1>robustest compare: selection strategies for mlp on digits</h1>" in \
        (out / "report.html").read_text()
    assert len(csv) == 4 and "fixed_set_accuracy_mean" in csv[0]
    # a second budget is added on resume; the finished cells are reused
    more = robot.compare({**TINY, "model": checkpoint, "strategies": ["best", "gini", "random"],
                          "budgets": [15, "20%"], "seeds": [0], "out": str(out), "resume": True})
    assert more["cells"][:2] == [res["cells"][0], res["cells"][2]] and len(more["table"]) == 6  # reused
    assert (out / "state" / "cells" / "gini_b20pct_s0" / "cell.json").is_file()


# ------------------------------------------------------------------------------- resume after SIGKILL
@pytest.mark.slow
def test_resume_after_sigkill_matches_uninterrupted_run(checkpoint, tmp_path):
    args = ["--checkpoint", checkpoint, "--dataset", "digits", "--train-limit", "300", "--test-limit", "60",
            "--eps", "0.15", "--epochs", "2", "--strategy", "best", "--budget", "20", "--rounds", "3",
            "--whitebox-limit", "30", "--convergence-tol", "0", "--seed", "3", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "robustest", "run", *args]
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run([*cmd, "--out", str(full)], check=True, env=env, capture_output=True, timeout=600)
    proc = subprocess.Popen([*cmd, "--out", str(killed)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    marker = killed / "state" / "round001" / "round.json"
    t0 = time.time()
    while not marker.exists() and proc.poll() is None and time.time() - t0 < 600:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "results.json").exists()
    done = subprocess.run([*cmd, "--out", str(killed), "--resume"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    a = json.loads((full / "results.json").read_text())
    b = json.loads((killed / "results.json").read_text())
    assert without_timings(a) == without_timings(b) and set(a["timings"]) >= {"total_s"}
    # the same bytes once the timings are left out; summary.csv holds no timing at all
    assert _bytes_without_timings(full / "results.json") == _bytes_without_timings(killed / "results.json")
    assert (full / "summary.csv").read_bytes() == (killed / "summary.csv").read_bytes()


def test_fuzzing_pools_and_coverage_strategy(checkpoint, tmp_path):
    res = robot.run({**TINY, "model": checkpoint, "pool": "fol-fuzz", "pool_limit": 30, "budget": 5,
                     "strategy": "coverage", "rounds": 1, "fuzz_options": {"steps": 3, "max_tests_per_seed": 3},
                     "out": str(tmp_path / "fol")})
    rec = res["rounds"][0]
    assert set(rec["pool"]["by_method"]) == {"fol-fuzz"} and rec["selected"]["n"] == min(5, rec["pool"]["size"])
    res = robot.run({**TINY, "model": checkpoint, "pool": "cov-fuzz", "pool_limit": 30, "budget": 5,
                     "strategy": "gini", "rounds": 1, "fuzz_options": {"iterations": 3},
                     "out": str(tmp_path / "cov")})
    assert set(res["rounds"][0]["pool"]["by_method"]) <= {"cov-fuzz"}


# ---------------------------------------------------------------------------------- typed config (YAML)
@pytest.mark.parametrize("bad, pattern", [
    ({"whitebox": "no"}, "whitebox must be true or false, got 'no'"),
    ({"data_dir": 5}, "data_dir must be a string"),
    ({"pool": "fol-fuzz", "fuzz_options": {"stepz": 3}}, "unknown key 'stepz' in fuzz_options: valid keys are"),
    ({"fuzz_options": {"steps": 3}}, "fuzz_options apply to pool fol-fuzz or cov-fuzz"),
    ({"coverage_options": {"kk": 3}}, "unknown key 'kk' in coverage_options"),
    ({"eps": float("nan")}, "eps must be a finite number"),
    ({"lr": float("inf")}, "lr must be a finite number"),
    ({"epochs": 3.0}, "epochs must be an integer"),
    ({"seeds": [0, "1"]}, r"seeds\[1\] must be an integer"),
    ({"train_epochs": None}, "train_epochs must be set"),
    ({"corruptions": 7}, "corruptions must be a list"),
])
def test_config_values_are_type_checked(bad, pattern) -> None:
    from robustest.core.errors import ConfigError

    with pytest.raises(ConfigError, match=pattern):
        robot.RobotConfig.from_dict(bad)


def test_run_config_json_schema_is_current_and_matches_the_defaults() -> None:
    import json
    from pathlib import Path

    schema = robot.RobotConfig.json_schema()
    on_disk = json.loads((Path(__file__).resolve().parents[2] / "docs/schemas/config/run.schema.json").read_text())
    assert on_disk == json.loads(json.dumps(schema)), "regenerate docs/schemas/config/run.schema.json"
    assert set(schema["properties"]) == set(robot.RobotConfig().to_dict())
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(robot.RobotConfig().to_dict(), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**robot.RobotConfig().to_dict(), "whitebox": "no"}, schema)


# ------------------------------------------------------------------------------- report wording
def test_adv_train_loop_settings_leave_out_the_pool_and_the_budget():
    from robustest.robot.report import settings_in_effect

    adv = settings_in_effect(robot.RobotConfig(), "loop")  # the default strategy: adversarial training, no pool
    assert adv["strategy"] == "adv-train"
    assert not {"budget", "pool", "pool_limit", "fuzz_options", "examples"} & set(adv)
    assert adv["pool_pgd_steps"] == 10  # the convergence probe attacks with it
    sel = settings_in_effect(robot.RobotConfig(strategy="random", pool_limit=50), "loop")
    assert sel["budget"] == "5%" and sel["pool"] == "attack" and sel["pool_limit"] == 50 and "examples" in sel


def test_report_titles_name_the_verb_the_model_and_the_data():
    from robustest.robot.report import report_title

    data = {"dataset": "digits", "model": {"kind": "zoo", "name": "digits_cnn"}}
    assert report_title({"kind": "loop", "data": data}) == "robustest run: RobOT loop of digits_cnn on digits"
    assert report_title({"kind": "compare", "data": data}) == \
        "robustest compare: selection strategies for digits_cnn on digits"
    fac = {"dataset": "mnist", "model": {"kind": "factory", "factory": "pkg.mod:net", "args": {}}}
    assert report_title({"kind": "loop", "data": fac}) == "robustest run: RobOT loop of pkg.mod:net on mnist"


def test_train_and_test_limits_of_a_folder_take_every_class(tmp_path):
    """train_limit/test_limit on a class-per-folder set keep a class-stratified subset, not the first class."""
    import numpy as np
    from PIL import Image

    from robustest import models
    from robustest.robot.setup import prepare_out, prepare_setup

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in range(3):
            (tmp_path / "d" / split / f"c{c}").mkdir(parents=True)
            for i in range(20):
                Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(
                    tmp_path / "d" / split / f"c{c}" / f"{i:02d}.png")
    cfg = robot.RobotConfig(dataset="folder", data_dir=str(tmp_path / "d"), train_limit=30, test_limit=12,
                            whitebox=False, eps=0.1, verbose=False, out=str(tmp_path / "o"))
    torch.manual_seed(0)
    model = models.create("mlp", num_classes=3, in_channels=1, input_size=8)
    s = prepare_setup(cfg, prepare_out(cfg, "loop"), model, "loop")
    assert torch.bincount(s.test[1]).tolist() == [4, 4, 4]
    assert len(s.y_fit) + s.info["num_val_clean"] == 30
    assert torch.bincount(s.y_fit, minlength=3).min() >= 7  # 10 per class before the validation split
