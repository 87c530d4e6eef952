"""The reproduction scripts' settings: bad input refused before any work (fast), and every setting's
--dry-run end to end on synthetic data of the setting's shape (slow)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from robustest.core.errors import ConfigError, DataError

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def script(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_robot_script_refuses_a_model_that_cannot_take_the_data(tmp_path):
    robot = script("reproduce_robot")
    with pytest.raises(ConfigError) as exc:
        robot.main(["--setting", "mnist-lenet5", "--dataset", "digits", "--out", str(tmp_path / "o")])
    msg = str(exc.value)
    assert "lenet5" in msg and "1x8x8" in msg and "digits_cnn" in msg and "\n" not in msg
    assert not list((tmp_path / "o").glob("original_*")) and not (tmp_path / "o" / "compare").exists()
    with pytest.raises(DataError, match="unknown data set 'svhn'"):
        robot.main(["--setting", "cifar10-resnet20", "--dataset", "svhn", "--data-dir", str(tmp_path),
                    "--out", str(tmp_path / "p")])


def test_robot_script_takes_any_data_set_and_model():
    robot = script("reproduce_robot")
    a = robot.parse_args(["--dataset", "digits"])
    assert (a.setting, a.model, a.eps, a.data_dir) == ("digits-cnn", "digits_cnn", 0.15, None)
    assert "adv-train" in a.strategies and "stratified" in a.strategies and a.seeds == "0,1,2,3,4"
    a = robot.parse_args(["--dataset", "fashion-mnist", "--model", "lenet1"])
    assert (a.setting, a.model, a.dataset) == ("mnist-lenet5", "lenet1", "fashion-mnist")
    assert robot.parse_args([]).setting == "mnist-lenet5"


def test_weakrobust_script_refuses_a_model_that_cannot_take_the_data(tmp_path):
    wr = script("reproduce_weakrobust")
    with pytest.raises(ConfigError) as exc:
        wr.main(["--setting", "imagenet100-resnet50", "--dataset", "digits", "--out", str(tmp_path / "o")])
    msg = str(exc.value)
    assert "resnet50" in msg and "1x8x8" in msg and "digits_cnn" in msg and "\n" not in msg
    assert not (tmp_path / "o" / "steps").exists() and not (tmp_path / "o" / "state").exists()


def _enh_seed(seed, values):
    """A per-seed enhancement result: variant -> (clean, pgd@0.1)."""
    wr = script("reproduce_weakrobust")
    rows = [{"variant": n, "clean": c, "held_out_corruption_acc": 0.8, "pgd@0.1": p, "autoattack@0.1": p - 0.01,
             "finetune_s": 1.0, "pool": []} for n, (c, p) in zip(wr.ENHANCE_VARIANTS, values)]
    return {"seed": seed, "rows": rows}


def test_enhance_aggregates_seeds_with_paired_intervals_to_the_plain_fine_tune():
    wr = script("reproduce_weakrobust")
    per_seed = [_enh_seed(0, [(0.90, 0.50), (0.90, 0.52), (0.91, 0.60), (0.90, 0.45)]),
                _enh_seed(1, [(0.80, 0.40), (0.81, 0.41), (0.82, 0.50), (0.80, 0.44)]),
                _enh_seed(2, [(0.85, 0.30), (0.85, 0.35), (0.86, 0.40), (0.85, 0.20)])]
    agg = wr.aggregate_enhance(per_seed)
    assert agg["seeds"] == [0, 1, 2] and [r["n_seeds"] for r in agg["rows"]] == [3, 3, 3, 3]
    std = agg["rows"][0]
    assert std["variant"] == wr.BASELINE_VARIANT and std["clean_mean"] == pytest.approx(0.85)
    assert std["pgd@0.1_sd"] == pytest.approx(0.1)  # sample sd of 0.5, 0.4, 0.3
    assert "finetune_s_mean" not in std and "autoattack@0.1_mean" in std
    paired = {(p["strategy"], p["metric"]): p for p in agg["paired"]}
    assert {s for s, _ in paired} == set(list(wr.ENHANCE_VARIANTS)[1:])  # the reference is not paired with itself
    adv = paired[("adversarial fine-tuning only", "pgd@0.1")]  # +0.10 on every seed: the interval is that point
    assert adv["mean_diff"] == pytest.approx(0.1) and adv["ci_low"] == pytest.approx(0.1) and adv["n_seeds"] == 3
    tgt = paired[("targeted (AugMix+JSD+PGD+weaknesses)", "pgd@0.1")]  # -0.05, +0.04, -0.10
    assert tgt["mean_diff"] == pytest.approx(-0.11 / 3) and tgt["ci_low"] < 0 < tgt["ci_high"]
    vs = {(p["baseline"], p["metric"]): p for p in agg["targeted_vs"]}
    assert {b for b, _ in vs} == set(list(wr.ENHANCE_VARIANTS)[:-1]) and {p["strategy"] for p in vs.values()} == {
        "targeted (AugMix+JSD+PGD+weaknesses)"}
    against_adv = vs[("adversarial fine-tuning only", "pgd@0.1")]  # -0.15, -0.06, -0.20
    assert against_adv["mean_diff"] == pytest.approx(-0.41 / 3) and against_adv["n_seeds"] == 3
    assert against_adv["ci_low"] < against_adv["mean_diff"] < against_adv["ci_high"]
    table = wr.markdown_enhance(agg)
    assert "0.400 ± 0.100" in table and "+0.100 [+0.100, +0.100]*" in table
    assert table.count("]*") == sum(1 for p in agg["paired"] + agg["targeted_vs"]
                                    if p["ci_low"] > 0 or p["ci_high"] < 0)
    one = wr.aggregate_enhance(per_seed[:1])  # one seed: means, sd 0, no interval
    assert one["rows"][0]["pgd@0.1_sd"] == 0.0 and all(p["ci_low"] is None for p in one["paired"])
    one_table = wr.markdown_enhance(one)
    assert "0.500 (n = 1)" in one_table and "± 0.000" not in one_table


def test_robot_table_says_n_for_one_seed():
    rr = script("reproduce_robot")
    row = {"seeds": 1, "clean_accuracy_mean": 1.0, "clean_accuracy_std": 0.0}
    assert rr.plus_minus(row, "clean_accuracy") == "100.00 (n = 1)"
    assert rr.plus_minus({**row, "seeds": 3, "clean_accuracy_std": 0.01}, "clean_accuracy") == "100.00 ± 1.00"
    assert rr.plus_minus({"seeds": 3}, "clean_accuracy") == "-"


def test_enhance_seeds_argument():
    wr = script("reproduce_weakrobust")
    assert wr.parse_seeds("0,1,2") == [0, 1, 2] and wr.parse_seeds("5") == [5]
    for bad in ("0,0", "a,1", "-1", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            wr.parse_seeds(bad)


def test_settings_record_the_papers_values():
    robot = script("reproduce_robot")
    wr = script("reproduce_weakrobust")
    cifar = robot.SETTINGS["cifar10-resnet20"]
    assert (cifar["eps"], cifar["model"], cifar["epochs"], cifar["lr"], cifar["batch_size"]) == \
        (0.01, "resnet20", 40, 1e-4, 64)
    assert cifar["budgets"] == "1000,2000,4000,6000,10000" and cifar["recipe"] == "robot-cifar"
    full = wr.full.FULL_SETTINGS
    assert (full["imagenet100-resnet50"]["neighbors"], full["imagenet100-resnet50"]["eps"]) == (20, 0.2)  # U[-.1, .1]
    assert (full["cifar10-wrn40-2"]["neighbors"], full["cifar10-wrn40-2"]["eps"]) == (50, 0.22)
    for s in full.values():
        assert s["attack_eps"] == [4 / 255, 8 / 255] and s["severities"] == [1, 2, 3, 4, 5]


def run_script(args: list[str], timeout: int = 600) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)
    return proc, time.perf_counter() - t0


def test_robot_script_takes_autoattack():
    robot = script("reproduce_robot")
    assert robot.parse_args(["--dataset", "digits"]).autoattack is None
    assert robot.parse_args(["--dataset", "digits", "--autoattack", "fast"]).autoattack == "fast"
    with pytest.raises(SystemExit):
        robot.parse_args(["--autoattack", "strong"])


@pytest.mark.slow
def test_robot_script_dry_run_with_the_autoattack_column(tmp_path):
    out = tmp_path / "out"
    proc, _ = run_script([str(BENCH / "reproduce_robot.py"), "--setting", "digits-cnn", "--dry-run", "--autoattack",
                          "fast", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads((out / "reproduction.json").read_text())
    assert all(0 <= r["autoattack_accuracy_mean"] <= 1 for r in rep["table"])
    assert "AutoAttack acc. (%)" in proc.stdout and "| fixed-set | white-box | AutoAttack | clean |" in proc.stdout
    res = json.loads((out / "compare" / "results.json").read_text())
    assert res["settings"]["autoattack"] == "fast"
    assert {p["metric"] for p in res["paired_vs_random"]} >= {"autoattack_accuracy"}


DRY_RUNS = [
    ("reproduce_robot.py", "mnist-lenet5"), ("reproduce_robot.py", "cifar10-resnet20"),
    ("reproduce_robot.py", "digits-cnn"),
    ("reproduce_weakrobust.py", "mnist"), ("reproduce_weakrobust.py", "cifar10-wrn40-2"),
    ("reproduce_weakrobust.py", "imagenet100-resnet50"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, setting", DRY_RUNS)
def test_every_setting_dry_run_end_to_end(tmp_path, name, setting):
    out = tmp_path / "out"
    args = [str(BENCH / name), "--setting", setting, "--dry-run", "--out", str(out)]
    proc, seconds = run_script(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"{name} --setting {setting} --dry-run: {seconds:.1f} s")
    if name == "reproduce_robot.py":
        rep = json.loads((out / "reproduction.json").read_text())
        assert rep["dry_run"] and rep["setting"] == setting
        # 4 strategies x 2 budgets; digits: 6 x 2 and the budget-free baselines all and adv-train once each
        assert len(rep["table"]) == (14 if setting == "digits-cnn" else 8)
        assert "DRY RUN" in proc.stdout and (out / "compare" / "results.json").is_file()
    elif setting == "mnist":
        assert (out / "family.json").is_file() and (out / "enhance.json").is_file()
        assert len(json.loads((out / "enhance.json").read_text())["rows"]) == 4

    else:
        res = json.loads((out / "results.json").read_text())
        assert res["dry_run"] and set(res["models"]) == {"standard", "augmix", "reva"}
        for m in res["models"].values():
            assert 0 <= m["evaluation"]["clean"] <= 1 and m["test_corruption"] is not None
        steps = sorted(p.name for p in (out / "steps").iterdir())
        assert len(steps) == 12 and "DRY RUN" in proc.stdout
        # resume: a rerun finds every step done and only summarises
        again, seconds2 = run_script(args)
        assert again.returncode == 0, again.stderr[-3000:]
        assert again.stdout.count("skipped") == 12
        assert json.loads((out / "results.json").read_text())["models"] == res["models"]
        # a step lost in a kill is redone, the others are reused
        (out / "steps" / "validation_reva.pt").unlink()
        third, _ = run_script(args)
        assert third.returncode == 0 and third.stdout.count("skipped") == 11
        assert json.loads((out / "results.json").read_text())["models"] == res["models"]


@pytest.mark.slow
def test_weakrobust_enhance_over_seeds_resumes_per_seed(tmp_path):
    """--seeds: one result file per seed, the aggregate with paired intervals; a rerun with one more seed
    reuses the finished seeds (skipped, same numbers) and runs only the new one."""
    out = tmp_path / "out"
    base = [str(BENCH / "reproduce_weakrobust.py"), "--part", "enhance", "--dry-run", "--out", str(out)]
    proc, _ = run_script([*base, "--seeds", "0,1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = json.loads((out / "enhance_seed1.json").read_text())
    agg = json.loads((out / "enhance.json").read_text())
    assert agg["seeds"] == [0, 1] and len(agg["rows"]) == 4 and all(r["n_seeds"] == 2 for r in agg["rows"])
    assert {"autoattack@0.1_mean", "pgd@0.1_mean"} <= set(agg["rows"][0])
    assert all(p["n_seeds"] == 2 and p["ci_low"] <= p["mean_diff"] <= p["ci_high"] for p in agg["paired"])
    proc, _ = run_script([*base, "--seeds", "0,1,2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "seed 0: done before, skipped" in proc.stdout and "seed 1: done before, skipped" in proc.stdout
    assert "seed 2: base" in proc.stdout and "seed 1: base" not in proc.stdout
    assert json.loads((out / "enhance_seed1.json").read_text()) == first
    assert json.loads((out / "enhance.json").read_text())["seeds"] == [0, 1, 2]


def test_settings_benchmark_counts_the_work_of_each_setting():
    bench = script("bench_settings")
    robot = bench.setting("robot-cifar10-resnet20")
    counts = bench.work(robot)
    # 100 epochs on 50,000 images, then 5 budgets x 4 strategies x 3 seeds cells of 40 epochs on 45,000 + budget
    assert counts["T"] == 100 * 50_000 + 40 * 12 * (5 * 45_000 + 1000 + 2000 + 4000 + 6000 + 10_000)
    wrn = bench.setting("weakrobust-cifar10-wrn40-2")
    c = bench.work(wrn)
    assert c["T"] == 100 * 50_000 and c["E_aug"] == 10 * 50_000
    assert c["F"] > 3 * 50_000 * 51  # three models' analyses with Q = 50 neighbours
    fl = bench.flops(bench.setting("weakrobust-imagenet100-resnet50"))
    assert fl["F"] == pytest.approx(2 * 4.1e9, rel=0.01) and fl["T"] == 3 * fl["F"]
    assert bench.estimate({"T": 100.0, "A": 50.0, "F": 0.0}, {"T": 10.0, "A": 5.0, "F": 1.0}) == 20.0


@pytest.mark.slow
def test_settings_benchmark_measures_on_the_cpu(tmp_path):
    proc, _ = run_script([str(BENCH / "bench_settings.py"), "--setting", "robot-cifar10-resnet20", "--steps", "2",
                          "--train-batch", "8", "--attack-batch", "8", "--threads", "1", "--json",
                          str(tmp_path / "b.json")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads((tmp_path / "b.json").read_text())["rows"][0]
    assert all(row["rates_per_s"][u] > 0 for u in ("T", "A", "F"))
    assert row["estimate_s_measured"] > row["estimate_s_at_assumed"] > 0


@pytest.mark.slow
def test_loop_vs_oneshot_end_to_end(tmp_path, capsys):
    """benchmarks/loop_vs_oneshot.py at a tiny size: equal tests and epochs in loop and one-shot, adv-train's
    epochs matched to the loop's compute, the paired rows from paired_vs_random."""
    bench = script("loop_vs_oneshot")
    out = tmp_path / "lvo"
    assert bench.main(["--out", str(out), "--seeds", "0,1", "--strategies", "random,kcenter", "--rounds", "2",
                       "--n", "6", "--epochs-per-round", "1", "--train-epochs", "2", "--whitebox-limit", "10",
                       "--pgd-steps", "1", "--apgd-steps", "1", "--autoattack", "fast"]) == 0
    res = json.loads((out / "loop_vs_oneshot.json").read_text())
    cells = res["cells"]
    assert all(0.0 <= c["robustness"]["autoattack_accuracy"] <= 1.0 for c in cells)  # the AutoAttack column
    loops = [c for c in cells if c["arm"] == "loop"]
    one = [c for c in cells if c["arm"] == "oneshot"]
    assert len(loops) == len(one) == 4 and all(c["n"] == 12 and c["epochs"] == 2 for c in loops + one)
    for c in loops:  # the loop's compute is the sum of its rounds'
        rounds = json.loads((out / "loop" / c["strategy"] / f"s{c['seed']}" / "results.json").read_text())["rounds"]
        assert c["compute"] == pytest.approx(sum(r["compute"]["total"] for r in rounds))
    adv = [c for c in cells if c["arm"] == "adv-train"]
    per_epoch = json.loads((out / "adv-calibration" / "results.json").read_text())["cells"][0]["compute"]["total"]
    loop_random = next(c["compute"] for c in loops if c["strategy"] == "random" and c["seed"] == 0)
    assert res["adv_epochs"] == max(1, round(loop_random / per_epoch)) and all(c["epochs"] == res["adv_epochs"]
                                                                                for c in adv)
    labels = [p["comparison"] for p in res["paired"]]
    assert "loop random - one-shot random" in labels and "loop kcenter - adv-train" in labels
    p = next(p for p in res["paired"] if p["comparison"] == "loop random - one-shot random")["whitebox_accuracy"]
    diffs = [next(c for c in loops if c["strategy"] == "random" and c["seed"] == s)["robustness"]["whitebox_accuracy"]
             - next(c for c in one if c["strategy"] == "random" and c["seed"] == s)["robustness"]["whitebox_accuracy"]
             for s in (0, 1)]
    assert p["mean_diff"] == pytest.approx(sum(diffs) / 2) and p["n_seeds"] == 2
    assert "autoattack_accuracy" in next(p for p in res["paired"] if p["comparison"] == "loop random - adv-train")
    text = capsys.readouterr().out
    assert "| loop | random | 12 | 2 |" in text and "| white-box | AutoAttack | clean |" in text


@pytest.mark.slow
def test_harden_benchmark_autoattack_column_and_resume(tmp_path, mlp_digits_checkpoint, one_thread, capsys):
    """benchmarks/bench_harden.py --autoattack: every run's final model (and the pretrained one) gets an
    AutoAttack accuracy, the table its column; a finished run without it is run again, to the same curve."""
    bench = script("bench_harden")
    common = ["--dataset", "digits", "--checkpoint", mlp_digits_checkpoint, "--eps", "0.2", "--epochs", "1",
              "--method-epochs", "fast-at=2", "--train-limit", "100", "--eval-limit", "20", "--methods",
              "pgd-at,fast-at", "--seeds", "0,1", "--steps", "2", "--pgd-steps", "2", "--restarts", "1",
              "--apgd-steps", "2", "--out", str(tmp_path / "h")]
    assert bench.main(common) == 0
    plain = {p.name: json.loads(p.read_text()) for p in (tmp_path / "h" / "runs").glob("*.json")}
    assert len(plain) == 4 and not any("autoattack" in c for r in plain.values() for c in r["curve"])
    assert "AutoAttack" not in (tmp_path / "h" / "summary.md").read_text()

    assert bench.main([*common, "--autoattack", "fast"]) == 0
    assert "run again for its final model's AutoAttack (fast) accuracy" in capsys.readouterr().out
    res = json.loads((tmp_path / "h" / "results.json").read_text())
    assert 0.0 <= res["before"]["autoattack"] <= 1.0
    for r in res["runs"]:
        old = plain[f"{r['method']}_s{r['seed']}.json"]["curve"]
        assert [(c["whitebox"], c["clean"]) for c in r["curve"]] == [(c["whitebox"], c["clean"]) for c in old]
        assert [("autoattack" in c) for c in r["curve"]] == [False] * (len(r["curve"]) - 1) + [True]
        assert 0.0 <= r["curve"][-1]["autoattack"] <= 1.0
        assert isinstance(r["curve"][-1]["autoattack_flags"], list)  # the evaluation's flags (an upper bound if any)
    for row in res["table"]:
        assert row["autoattack_flags"] == sorted({f for r in res["runs"] if r["method"] == row["method"]
                                                  for f in r["curve"][-1]["autoattack_flags"]})
        finals = [r["curve"][-1]["autoattack"] for r in res["runs"] if r["method"] == row["method"]]
        assert row["autoattack_mean"] == pytest.approx(sum(finals) / 2)
    summary = (tmp_path / "h" / "summary.md").read_text()
    assert "| white-box acc. | AutoAttack acc. | clean acc. |" in summary and "AutoAttack (fast)" in summary
    assert bench.main([*common, "--autoattack", "fast"]) == 0  # resumed: nothing to run again
    assert "run again" not in capsys.readouterr().out
    assert bench.main([*common, "--autoattack", "standard"]) == 0  # another version: every final model again
    assert capsys.readouterr().out.count("run again for its final model's AutoAttack (standard) accuracy") == 4
    assert json.loads((tmp_path / "h" / "before.json").read_text())["autoattack_version"] == "standard"


@pytest.mark.slow
def test_harden_benchmark_from_scratch_reference_is_the_same_recipe(tmp_path, one_thread):
    """benchmarks/bench_harden.py --model NAME --from-scratch: every method of a seed starts from the same random
    weights, and the plain-PyTorch reference with the eps ramp and the cosine rate, fed robustest's random numbers,
    ends with robustest pgd-at's weights exactly (the twin check), so 'within 1 point of the reference' compares
    implementations of one recipe."""
    bench = script("bench_harden")
    args = ["--dataset", "digits", "--model", "digits_cnn", "--from-scratch", "--eps", "0.2", "--epochs", "2",
            "--train-limit", "120", "--eval-limit", "20", "--methods", "pgd-at,reference", "--seeds", "0",
            "--steps", "3", "--pgd-steps", "2", "--restarts", "1", "--apgd-steps", "2", "--timing",
            "--schedule", "cosine", "--out", str(tmp_path / "s")]
    assert bench.main(args) == 0
    res = json.loads((tmp_path / "s" / "results.json").read_text())
    assert res["twin_check"]["max_abs_weight_difference"] == 0.0
    assert {r["method"] for r in res["runs"]} == {"pgd-at", "reference"}
    assert all(c["train_cpu_s"] > 0 for r in res["runs"] for c in r["curve"])
    assert res["runs"][0]["settings"]["eps_warmup"] == 0.3
    assert [r["settings"]["eps_train"] for r in res["runs"]] == [0.2, 0.2]  # default: --eps
    wide = [*args[:args.index("--timing")], "--schedule", "cosine", "--epochs", "1", "--eps-train", "0.3",
            "--out", str(tmp_path / "w")]
    assert bench.main(wide) == 0
    res = json.loads((tmp_path / "w" / "results.json").read_text())
    by = {r["method"]: r["settings"] for r in res["runs"]}
    assert (by["pgd-at"]["eps"], by["pgd-at"]["eps_train"], by["pgd-at"]["alpha"]) == (0.2, 0.3, pytest.approx(0.25))
    assert (by["reference"]["eps_train"], by["reference"]["alpha"]) == (0.3, pytest.approx(0.25))  # 2.5 * 0.3 / 3
    assert "training radius 0.3" in (tmp_path / "w" / "summary.md").read_text()
    cyclic = [*args[:args.index("--schedule")], "--schedule", "cyclic", "--out", str(tmp_path / "c")]
    assert bench.main(cyclic) == 0  # Wong et al.'s triangle, written twice: the same weights again
    res = json.loads((tmp_path / "c" / "results.json").read_text())
    assert res["twin_check"]["max_abs_weight_difference"] == 0.0
    assert {r["settings"].get("schedule") for r in res["runs"] if r["method"] == "reference"} == {"cyclic"}
    with pytest.raises(SystemExit, match="not both"):
        bench.main([*args[:2], "--checkpoint", "x.pt", *args[2:]])


def test_the_plain_reference_takes_the_constant_cosine_and_cyclic_schedules_and_refuses_the_step_one():
    bench = script("bench_harden")
    assert bench.reference_kw(SimpleNamespace(schedule="cyclic", eps_warmup=0.5)) == {"eps_warmup": 0.5,
                                                                                      "schedule": "cyclic"}
    with pytest.raises(SystemExit, match="the schedules none, cosine, cyclic, not 'step'"):
        bench.reference_kw(SimpleNamespace(schedule="step", eps_warmup=0.3))


def test_harden_benchmark_refuses_a_reference_schedule_and_missing_data_before_any_work(tmp_path):
    """Bad input to bench_harden: one line, exit before any data is read or any output folder made."""
    bench = script("bench_harden")
    common = ["--model", "mnist_small", "--from-scratch", "--eps", "0.3", "--epochs", "1", "--seeds", "0"]
    with pytest.raises(SystemExit, match="^the reference implements the schedules none, cosine, cyclic, not 'step'$"):
        bench.main(["--dataset", "digits", *common, "--methods", "pgd-at,reference-trades", "--schedule", "step",
                    "--out", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match=r"^data path '.*nope' does not exist: pass the mnist data"):
        bench.main(["--dataset", "mnist", "--data-dir", str(tmp_path / "nope"), *common, "--methods", "reference",
                    "--out", str(tmp_path / "b")])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_harden_benchmark_pairs_methods_with_pgd_at_by_seed_and_at_matched_compute(tmp_path):
    """bench_harden's paired comparison: per seed, the method's final AutoAttack minus pgd-at's, and its final
    white-box accuracy minus pgd-at's curve interpolated at the same passes per image; t-intervals over seeds."""
    bench = script("bench_harden")

    def run(method, seed, passes, whitebox, aa):
        curve = [{"passes_per_image": p, "whitebox": w} for p, w in zip(passes, whitebox)]
        curve[-1]["autoattack"] = aa
        return {"method": method, "seed": seed, "curve": curve}

    by = {"pgd-at": [run("pgd-at", s, [10, 20, 30], [0.2, 0.4, 0.6], 0.5 + s / 100) for s in (0, 1, 2)],
          "fol-budget": [run("fol-budget", s, [5, 15], [0.1, 0.35 + s / 100], 0.48 + 2 * s / 100) for s in (0, 1, 2)],
          "fast-at": [run("fast-at", 3, [2, 4], [0.1, 0.2], 0.1)]}  # no seed in common: not paired
    (row,) = bench.paired_against_pgd_at(by)
    assert row["method"] == "fol-budget" and row["seeds"] == 3 and row["compute_ratio"] == pytest.approx(0.5)
    # AutoAttack differences -0.02, -0.01, 0.00: mean -0.01, t-interval -0.01 +- 4.303 * 0.01 / sqrt(3)
    assert row["autoattack_diff"] == pytest.approx(-0.01)
    assert row["autoattack_ci_high"] - row["autoattack_diff"] == pytest.approx(4.302653 * 0.01 / 3 ** 0.5, rel=1e-5)
    # pgd-at's curve at 15 passes: 0.3; fol-budget's final white-box 0.35-0.37
    assert row["whitebox_matched_diff"] == pytest.approx(0.06)
    assert bench._whitebox_at(by["pgd-at"][0]["curve"], 40) is None  # beyond the curve: not extrapolated
    args = SimpleNamespace(dataset="digits", eps=0.2, train_limit=100, seeds_text="0,1,2", eval_limit=20, pgd_steps=2,
                           restarts=1, apgd_steps=2, aa_limit=20, schedule="none", eps_warmup=0.3, batch_size=64,
                           lr=1e-3, autoattack="fast", eps_train=None)
    text = bench.write_summary({"before": {"whitebox": 0.0, "clean": 0.1}, "table": [], "curves": {}, "paired": [row]},
                               tmp_path, args)
    assert "eps warm-up 0.3, training radius 0.2, batch 64" in text  # no --eps-train: the run's eps
    assert "| fol-budget | 3 | 0.50 | -1.00 [-3.48, +1.48] | +6.00 [" in text


def test_the_plain_trades_reference_computes_the_loss_robustest_trades_computes():
    """bench_harden's reference-trades (plain PyTorch) and robustest's trades objective, fed the same draws, give
    the same adversarial points and the same loss: the benchmark's pairing compares one recipe, two codes."""
    import torch

    from robustest.train.objectives import StepContext, trades

    bench = script("bench_harden")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4))
    x = torch.rand(6, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 1, 2, 3, 0, 1])
    ref = bench.reference_trades_batch(model, x, y, torch.Generator().manual_seed(5), e=0.1, a=0.03, steps=3,
                                       beta=2.0)
    ours = trades.step(model, x, y, torch.Generator().manual_seed(5),
                       StepContext(settings={"steps": 3, "beta": 2.0}, eps=0.1, alpha=0.03))
    assert float(ref) == pytest.approx(float(ours.loss), rel=1e-6)
