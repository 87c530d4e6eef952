"""The AutoAttack-style ensemble (robustest.evaluate.evaluate) as a measurement of run and compare: config
``autoattack``, the ``autoattack_accuracy`` figure in every measurement, its columns and paired rows, the
``--autoattack`` flag and the resume fingerprint (tiny digits settings)."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from robustest import robot
from robustest.cli import main
from robustest.core.errors import ConfigError

TINY = {
    "dataset": "digits", "train_limit": 300, "test_limit": 60, "eps": 0.15, "epochs": 1, "batch_size": 64,
    "whitebox_limit": 60, "whitebox_pgd_steps": 3, "whitebox_restarts": 1, "apgd_steps": 3,
    "convergence_probe": 40, "pool_pgd_steps": 5, "verbose": False,
}
TINY_FLAGS = ["--dataset", "digits", "--train-limit", "300", "--test-limit", "60", "--eps", "0.15", "--epochs", "1",
              "--whitebox-limit", "20", "--no-progress"]
TINY_YAML = "whitebox_pgd_steps: 3\nwhitebox_restarts: 1\napgd_steps: 3\nconvergence_probe: 30\npool_pgd_steps: 5\n"
AA_KEYS = ("before_autoattack_accuracy", "autoattack_accuracy_mean", "autoattack_accuracy_std")


@pytest.fixture(scope="module")
def checkpoint(mlp_digits_checkpoint):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield mlp_digits_checkpoint
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("bad, pattern", [
    ({"autoattack": "slow"}, "unknown autoattack 'slow': use fast or standard"),
    ({"autoattack": True}, "autoattack"),
    ({"autoattack": "fast", "whitebox": False}, "autoattack runs on the white-box images"),
    ({"target_metric": "autoattack_accuracy", "target": 0.5}, "needs autoattack set"),
])
def test_config_refuses_bad_autoattack_settings_in_one_line(bad, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        robot.RobotConfig.from_dict(bad)
    assert "\n" not in str(info.value)
    for ok in (None, "fast", "standard"):
        assert robot.RobotConfig.from_dict({"autoattack": ok}).autoattack == ok
    assert robot.RobotConfig.from_dict({"autoattack": "fast", "target_metric": "autoattack_accuracy",
                                        "target": 0.5}).target == 0.5


def test_fingerprint_holds_autoattack_only_when_set():
    from robustest.robot.setup import config_fingerprint

    cfg = robot.RobotConfig.from_dict({})
    # the fingerprints as computed before the key existed (the loop's with its strategy of then, best): runs
    # started then still resume
    assert config_fingerprint(cfg, "compare") == "6d3a74903bf0d919931f1cfd591070f6019a4e7600166a6f63d5a0cd7ffbeba7"
    assert config_fingerprint(robot.RobotConfig.from_dict({"strategy": "best"}), "loop") == \
        "83ecdce8d676183f7d5a3775d26dbbd154086f5b8b59b119a61685575b59047b"
    fast = robot.RobotConfig.from_dict({"autoattack": "fast"})
    std = robot.RobotConfig.from_dict({"autoattack": "standard"})
    assert len({config_fingerprint(c, "compare") for c in (cfg, fast, std)}) == 3


def test_comparison_table_has_no_autoattack_columns_when_not_measured():
    base = {"clean_accuracy": 0.9, "fixed_set_accuracy": 0.0, "whitebox_accuracy": 0.2, "autoattack_accuracy": None}
    cells = [{"strategy": "random", "budget": 5, "seed": s, "n": 5, "compute": None,
              "robustness": {**base, "fixed_set_accuracy": 0.3}, "robustness_last_epoch": base} for s in (0, 1)]
    row = robot.comparison_table(cells, base)[0]
    assert not set(AA_KEYS) & set(row) and row["whitebox_accuracy_mean"] == pytest.approx(0.2)
    cells[1]["robustness"] = {**cells[1]["robustness"], "autoattack_accuracy": 0.1}
    row = robot.comparison_table(cells, base)[0]
    assert row["autoattack_accuracy_mean"] == pytest.approx(0.1) and row["before_autoattack_accuracy"] is None


# ----------------------------------------------------------------------------------- compare end to end
def test_compare_with_autoattack_records_it_everywhere(checkpoint, tmp_path, results_contract):
    from robustest import data as datasets
    from robustest.core.seeding import derive_seed
    from robustest.evaluate import evaluate
    from robustest.models.checkpoints import load_model

    out = tmp_path / "cmp"
    cfg = {**TINY, "model": checkpoint, "budgets": [15], "seeds": [0, 1], "out": str(out),
           "strategies": ["best", "random"], "autoattack": "fast"}
    res = robot.compare(cfg)
    results_contract(out, "compare")
    assert res["settings"]["autoattack"] == "fast"
    base = res["baseline"]
    for rob in [base] + [c["robustness"] for c in res["cells"]]:
        aa = rob["autoattack_accuracy"]
        # the same 60 images for clean and white-box accuracy: robust accuracy cannot exceed clean accuracy
        assert rob["num_whitebox"] == rob["num_eval"] == 60
        assert 0.0 <= aa <= rob["clean_accuracy"] and rob["settings"]["autoattack_version"] == "fast"
    # the baseline's figure is robustest.evaluate's fast ensemble on those images, with the measurement's seed
    test = datasets.load("digits", split="test")
    x, y = test.tensors
    want = evaluate(load_model(checkpoint), (x[:60], y[:60]), 0.15, version="fast",
                    seed=derive_seed(0, "measure", "baseline")).robust_accuracy
    assert base["autoattack_accuracy"] == pytest.approx(want)
    for row in res["table"]:
        assert row["before_autoattack_accuracy"] == base["autoattack_accuracy"]
        vals = [c["robustness"]["autoattack_accuracy"] for c in res["cells"] if c["strategy"] == row["strategy"]]
        assert row["autoattack_accuracy_mean"] == pytest.approx(sum(vals) / 2)
    paired = [p for p in res["paired_vs_random"] if p["metric"] == "autoattack_accuracy"]
    assert [(p["strategy"], p["budget"], p["n_seeds"]) for p in paired] == [("best", 15, 2)]
    by = {(c["strategy"], c["seed"]): c["robustness"]["autoattack_accuracy"] for c in res["cells"]}
    assert paired[0]["mean_diff"] == pytest.approx(sum(by[("best", s)] - by[("random", s)] for s in (0, 1)) / 2)
    with open(out / "summary.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert "autoattack_accuracy_mean" in header
    html = (out / "report.html").read_text()
    assert "AutoAttack after" in html and "AutoAttack accuracy" in html
    # the setting is part of the resume fingerprint: the same folder without it is refused before any work
    with pytest.raises(ConfigError, match="different settings"):
        robot.compare({**cfg, "autoattack": None, "resume": True})
    again = robot.compare({**cfg, "resume": True})  # the same settings resume, every cell loaded
    assert again["table"] == res["table"]


# ------------------------------------------------------------------------------------------------- CLI
def test_cli_autoattack_flag_on_run_and_compare(checkpoint, tmp_path, capsys, results_contract):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY_YAML)
    out = tmp_path / "cmp"
    assert main(["compare", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--strategies",
                 "gini,random", "--budgets", "10", "--seeds", "0,1", "--autoattack", "fast", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    res = results_contract(out, "compare")
    assert res["settings"]["autoattack"] == "fast" and res["config"]["autoattack"] == "fast"
    assert "AutoAttack before" in text and "AutoAttack after" in text and "AutoAttack vs random" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("gini ") and "[" in ln)
    p = next(p for p in res["paired_vs_random"] if p["metric"] == "autoattack_accuracy")
    assert f"{p['mean_diff']:+.3f} [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]" in line
    out = tmp_path / "run"
    assert main(["run", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--strategy", "random",
                 "--budget", "10",
                 "--rounds", "1", "--autoattack", "fast", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    res = results_contract(out, "run")
    assert "AutoAttack accuracy" in text
    for rob in (res["baseline"], res["rounds"][0]["robustness"]):
        assert 0.0 <= rob["autoattack_accuracy"] <= 1.0
    with open(out / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [float(r["autoattack_accuracy"]) for r in rows] == pytest.approx(
        [res["baseline"]["autoattack_accuracy"], res["rounds"][0]["robustness"]["autoattack_accuracy"]])
    # without the flag nothing of it appears
    out = tmp_path / "off"
    assert main(["run", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--strategy", "random",
                 "--budget", "10",
                 "--rounds", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())
    assert "AutoAttack" not in text and "autoattack" not in res["settings"]
    assert res["baseline"]["autoattack_accuracy"] is None
    assert "autoattack_accuracy" not in (out / "summary.csv").read_text()


def test_cli_bad_autoattack_is_one_line(checkpoint, tmp_path, capsys):
    for verb in ("run", "compare"):
        with pytest.raises(SystemExit) as info:
            main([verb, "--checkpoint", checkpoint, "--autoattack", "slow", "--out", str(tmp_path / verb)])
        err = capsys.readouterr().err
        assert info.value.code == 2 and "autoattack" in err and err.count("\n") == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("autoattack: strong\n")
    assert main(["compare", "--config", str(bad), "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "unknown autoattack 'strong'" in err and err.count("\n") == 1
    assert main(["run", "--checkpoint", checkpoint, "--autoattack", "fast", "--no-whitebox",
                 "--out", str(tmp_path / "z")]) == 2
    err = capsys.readouterr().err
    assert "autoattack runs on the white-box images" in err and err.count("\n") == 1
    assert not (tmp_path / "y").exists() and not (tmp_path / "z").exists()
