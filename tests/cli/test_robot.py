"""CLI verbs of the RobOT loop: robustest run, compare, demo (tiny digits settings)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from robustest.cli import main

TINY_FLAGS = ["--dataset", "digits", "--train-limit", "300", "--test-limit", "60", "--eps", "0.15", "--epochs", "1",
              "--whitebox-limit", "20", "--no-progress"]
TINY_YAML = "whitebox_pgd_steps: 3\nwhitebox_restarts: 1\napgd_steps: 3\nconvergence_probe: 30\npool_pgd_steps: 5\n"


@pytest.fixture(scope="module")
def checkpoint(mlp_digits_checkpoint):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster, restored after the module
    yield mlp_digits_checkpoint
    torch.set_num_threads(threads)


def test_run_verb(checkpoint, tmp_path, capsys, results_contract):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(TINY_YAML + "strategy: kmst\nrounds: 5\n")
    out = tmp_path / "out"
    rc = main(["run", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--budget", "10%",
               "--threads", "1", "--rounds", "1", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "fixed-set" in text and "white-box" in text and "stopped: rounds after 1 round(s)" in text
    assert re.search(rf"^wrote results.json, summary.csv, report.html to {re.escape(str(out))} in \d+\.\ds$", text,
                     re.M)  # the closing line every verb that writes a run folder ends with
    res = results_contract(out, "run")
    assert res["settings"]["strategy"] == "kmst" and res["settings"]["whitebox_pgd_steps"] == 3
    assert not {"strategies", "budgets", "seeds", "coverage_metric", "fuzz_options",
                "train_model", "time_budget", "target_metric"} & set(res["settings"])
    assert res["settings"]["kmst_k"] == 4  # kmst is the strategy: its k is in effect
    assert res["config"]["strategy"] == "kmst"  # from the file
    assert res["config"]["rounds"] == 1  # the flag overrides the file
    assert res["rounds"][0]["selected"]["n"] == round(res["rounds"][0]["pool"]["size"] * 0.10)
    assert (out / "report.html").is_file() and (out / "summary.csv").is_file()
    # running again into the same folder needs --resume
    rc = main(["run", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--rounds", "1",
               "--budget", "10%", "--out", str(out)])
    assert rc == 2 and "--resume" in capsys.readouterr().err


def test_compare_verb(checkpoint, tmp_path, capsys, results_contract):
    from robustest.robot.report import paired_verdict

    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(TINY_YAML)
    out = tmp_path / "cmp"
    rc = main(["compare", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--strategies",
               "best,random", "--budgets", "10", "--seeds", "0,1", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "fixed-set before" in text and "best" in text and "random" in text and "±" in text
    res = results_contract(out, "compare")
    assert res["settings"]["strategies"] == ["best", "random"] and res["settings"]["seeds"] == [0, 1]
    assert res["settings"]["budgets"] == [10]
    assert not {"strategy", "budget", "rounds", "convergence_tol", "kmst_k", "coverage_metric"} & set(res["settings"])
    assert [r["strategy"] for r in res["table"]] == ["best", "random"]
    assert all(r["seeds"] == 2 for r in res["table"])
    # compute per cell and the paired comparison with random are printed
    assert "passes (k)" in text and "paired by seed, strategy minus random" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("best ") and "[" in ln)
    p = next(p for p in res["paired_vs_random"] if p["metric"] == "fixed_set_accuracy")
    assert f"{p['mean_diff']:+.3f} [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]" in line
    assert line.count("*") == sum(1 for q in res["paired_vs_random"] if q["ci_low"] > 0 or q["ci_high"] < 0)
    assert line.rstrip().endswith(paired_verdict(res["paired_vs_random"]))  # one verdict per strategy, in words


def test_run_and_compare_verbs_take_the_new_strategies(checkpoint, tmp_path, capsys, results_contract):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(TINY_YAML)
    out = tmp_path / "strat"
    assert main(["run", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--strategy", "stratified",
                 "--budget", "10", "--rounds", "1", "--out", str(out)]) == 0
    res = results_contract(out, "run")
    assert res["settings"]["stratified_bins"] == 4 and res["rounds"][0]["selected"]["n"] == 10
    assert res["rounds"][0]["compute"]["selection_scoring"] == res["rounds"][0]["pool"]["size"]  # the FOL passes
    capsys.readouterr()
    out = tmp_path / "cmp"
    assert main(["compare", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--strategies",
                 "fol-prop,adv-train,random", "--budgets", "10", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    res = results_contract(out, "compare")
    assert "adv-train  online (0)" in text and "fol-prop" in text
    assert [r["strategy"] for r in res["table"]] == ["fol-prop", "random", "adv-train"]
    rc = main(["compare", "--checkpoint", checkpoint, *TINY_FLAGS, "--strategies", "adv-train",
               "--finetune-options", '{"augment": "crop-flip"}', "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert rc == 2 and "adv-train fine-tunes with" in err and err.count("\n") == 1


def test_run_defaults_to_adversarial_training_and_refuses_a_budget_without_a_selection_strategy(
        checkpoint, tmp_path, capsys, results_contract):
    from robustest import robot

    cfg = tmp_path / "run.yaml"
    cfg.write_text(TINY_YAML)
    out = tmp_path / "adv"
    assert main(["run", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--rounds", "1",
                 "--out", str(out)]) == 0
    res = results_contract(out, "run")
    assert res["config"]["strategy"] == "adv-train" == robot.RobotConfig().strategy
    rec = res["rounds"][0]
    assert rec["pool"]["size"] == 0 and rec["selected"]["n"] == 0 and rec["compute"]["adversarial"] > 0
    capsys.readouterr()
    # a budget means the selection loop: without a selection strategy it is one line, before any work
    assert main(["run", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--budget", "10",
                 "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "--strategy random" in err and err.count("\n") == 1 and not (tmp_path / "b").exists()
    (tmp_path / "b.yaml").write_text(TINY_YAML + "budget: 10\n")
    assert main(["run", "--config", str(tmp_path / "b.yaml"), "--checkpoint", checkpoint, *TINY_FLAGS,
                 "--out", str(tmp_path / "b")]) == 2
    assert "--strategy random" in capsys.readouterr().err
    # a config file is validated with the flags in: its selection fine-tuning options go with --strategy random
    (tmp_path / "s.yaml").write_text(TINY_YAML + "finetune_options: {label_smoothing: 0.1}\n")
    assert main(["run", "--config", str(tmp_path / "s.yaml"), "--checkpoint", checkpoint, *TINY_FLAGS, "--rounds",
                 "1", "--strategy", "random", "--budget", "10", "--out", str(tmp_path / "s")]) == 0
    assert json.loads((tmp_path / "s" / "results.json").read_text())["config"]["finetune_options"] == \
        {"label_smoothing": 0.1}
    capsys.readouterr()
    assert main(["run", "--config", str(tmp_path / "s.yaml"), "--checkpoint", checkpoint, *TINY_FLAGS,
                 "--out", str(tmp_path / "s2")]) == 2
    assert "choose a selection strategy instead of adv-train" in capsys.readouterr().err
    # so is a fuzzing pool, which only selection strategies use
    assert main(["run", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--pool", "fol-fuzz",
                 "--out", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err
    assert "uses no pool" in err and err.count("\n") == 1 and not (tmp_path / "f").exists()


def test_paired_verdict_says_how_a_strategy_compares_with_random():
    from robustest.robot.report import paired_verdict

    def row(metric, mean, lo, hi):
        return {"metric": metric, "mean_diff": mean, "ci_low": lo, "ci_high": hi}

    wb, fs, cl = "whitebox_accuracy", "fixed_set_accuracy", "clean_accuracy"
    assert paired_verdict([row(fs, 0.1, 0.05, 0.15), row(wb, 0.2, 0.19, 0.21), row(cl, -0.01, -0.02, -0.001)]) == \
        "better than random on white-box, fixed-set; worse on clean"  # largest difference first
    assert paired_verdict([row(fs, -0.17, -0.26, -0.08), row(wb, 0.01, -0.1, 0.1)]) == "worse than random on fixed-set"
    assert paired_verdict([row(fs, 0.02, -0.1, 0.14), row(wb, 0.0, 0.0, 0.0)]) == "not distinguishable from random"
    assert paired_verdict([row(fs, 0.02, None, None)]) == "no interval (1 seed)"
    # the AutoAttack figure is named as in the tables (regression: it printed "autoattack_accuracy")
    assert paired_verdict([row("autoattack_accuracy", 0.2, 0.17, 0.23), row(wb, 0.21, 0.19, 0.23)]) == \
        "better than random on white-box, AutoAttack"


def test_bad_input_is_one_line(checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:  # argparse-level errors exit from the parser
        main(["run", "--checkpoint", checkpoint, "--budget", "150%", "--out", str(tmp_path / "x")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "budget" in err and err.count("\n") == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("epsilon: 0.3\n")
    rc = main(["run", "--config", str(bad), "--out", str(tmp_path / "y")])
    assert rc == 2 and "unknown config key 'epsilon'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["compare", "--strategies", "best,deepxplore", "--out", str(tmp_path / "z")])
    assert info.value.code == 2 and "unknown strategy" in capsys.readouterr().err
    rc = main(["run", "--checkpoint", str(tmp_path / "missing.pt"), *TINY_FLAGS, "--out", str(tmp_path / "w")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err


def test_demo_verb_wiring(tmp_path, capsys, monkeypatch, results_contract):
    """The demo verb end to end with its settings shrunk (the full demo is timed in
    benchmarks/results/2026-11-30-robot-demo.md)."""
    from robustest.cli import demo

    small = {**demo.DEMO_SETTINGS, "train_model": "mlp", "train_epochs": 3, "train_limit": 300, "test_limit": 60,
             "epochs": 1, "whitebox_limit": 20, "whitebox_pgd_steps": 3, "whitebox_restarts": 1, "apgd_steps": 3,
             "strategies": ["best", "gini", "coverage", "random"], "pool_pgd_steps": 5}
    monkeypatch.setattr(demo, "DEMO_SETTINGS", small)
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    for s in ("best", "gini", "coverage"):
        assert s in text
    assert "fixed-set before" in text and "white-box after" in text
    assert (out / "report.html").is_file() and (out / "state" / "original_model.pt").is_file()
    res = results_contract(out, "compare")  # the demo is a comparison with fixed settings
    assert res["settings"]["train_model"] == "mlp" and "coverage_metric" in res["settings"]
    assert res["baseline"]["fixed_set_accuracy"] == 0.0 and len(res["table"]) == 4
    # one line per strategy says in words how it compares with random
    from robustest.robot.report import paired_verdict

    paired = text[text.index("paired by seed"):].splitlines()
    for s in ("best", "gini", "coverage"):
        line = next(ln for ln in paired if ln.startswith(s + " "))
        assert line.rstrip().endswith(paired_verdict([p for p in res["paired_vs_random"] if p["strategy"] == s]))
    # a second demo into the same folder reuses the finished work and prints the same table
    assert main(["demo", "--out", str(out), "--no-progress"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert {k: v for k, v in again.items() if k != "timings"} == {k: v for k, v in res.items() if k != "timings"}
    # --autoattack adds the ensemble's column (a new folder: the setting is part of what a folder resumes)
    out = tmp_path / "demo-aa"
    assert main(["demo", "--out", str(out), "--no-progress", "--autoattack", "fast"]) == 0
    assert "AutoAttack" in capsys.readouterr().out
    res = results_contract(out, "compare")
    assert res["config"]["autoattack"] == "fast"
    assert all(0.0 <= c["robustness"]["autoattack_accuracy"] <= c["robustness"]["clean_accuracy"]
               for c in res["cells"])
    with pytest.raises(SystemExit) as info:
        main(["demo", "--out", str(out), "--autoattack", "bogus"])
    assert info.value.code == 2


def test_every_harden_method_is_a_retraining_strategy(tmp_path, checkpoint, capsys, results_contract):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(TINY_YAML)
    out = tmp_path / "cmp"
    assert main(["compare", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--strategies",
                 "random,fol-budget,fast-at,trades", "--budgets", "10", "--out", str(out)]) == 0
    res = results_contract(out, "compare")
    cells = {c["strategy"]: c for c in res["cells"]}
    for s, method in (("fol-budget", "fol-budget"), ("fast-at", "fast-at"), ("trades", "trades")):
        assert cells[s]["budget"] == "online" and cells[s]["n"] == 0 and cells[s]["train"]["method"] == method
        assert cells[s]["compute"]["adversarial"] > 0 and cells[s]["compute"]["pool_generation"] == 0
    assert cells["fast-at"]["train"]["settings"]["steps"] == 1  # FGSM with a random start: one step
    # fol-budget stops easy samples early: fewer attack passes than fast-at's one step per sample is impossible,
    # more than the full PGD budget is too
    full = cells["fast-at"]["compute"]["adversarial"] * 5  # pool_pgd_steps: 5 in TINY_YAML
    assert cells["fast-at"]["compute"]["adversarial"] <= cells["fol-budget"]["compute"]["adversarial"] <= full
    assert {r["strategy"] for r in res["paired_vs_random"]} >= {"fol-budget", "fast-at", "trades"}
    capsys.readouterr()
    run_out = tmp_path / "run"
    assert main(["run", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--strategy", "fosc",
                 "--rounds", "1", "--out", str(run_out)]) == 0
    run = results_contract(run_out, "run")
    assert run["rounds"][0]["compute"]["adversarial"] > 0


def test_workers_reach_the_data_loader_and_stay_out_of_the_results(checkpoint, tmp_path, monkeypatch,
                                                                   results_contract):
    from robustest import data as datasets
    from robustest import robot
    from robustest.core.errors import ConfigError
    from robustest.robot import setup

    seen = []
    real = datasets.load

    def load(*a, **kw):
        seen.append(kw.get("workers"))
        return real(*a, **kw)

    monkeypatch.setattr(setup.datasets, "load", load)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY_YAML)
    out = tmp_path / "cmp"
    assert main(["compare", "--config", str(cfg), "--checkpoint", checkpoint, *TINY_FLAGS, "--strategies", "random",
                 "--budgets", "10", "--workers", "2", "--out", str(out)]) == 0
    assert seen == [2, 2]  # the training and the test split
    res = results_contract(out, "compare")
    assert "workers" not in res["config"]  # how the data is decoded does not change the results
    with pytest.raises(ConfigError, match="workers"):
        robot.RobotConfig.from_dict({"workers": -1})


def test_run_offers_every_registered_strategy_and_objective():
    """--strategy's choices are read from the registries when the parser is built: a selection strategy or a
    training objective registered from outside is a run strategy, the built-in harden methods too."""
    import torch

    from robustest import cli, selection
    from robustest.robot.config import BUDGET_FREE, HARDEN_STRATEGIES
    from robustest.train import objectives

    def choices() -> list[str]:
        run = cli.build_parser()._subparsers._group_actions[0].choices["run"]
        return next(a.choices for a in run._actions if a.dest == "strategy")

    assert {"adv-train", "trades", "gaussian-noise", "ibp", "crown-ibp", "best", "all"} <= set(choices())
    mine = selection.Strategy("lowest-first", "the lowest scores", lambda req: torch.argsort(req.inputs)[:req.n])
    plain = objectives.Objective(name="plain-at", step=objectives.get("pgd-at").step)
    with selection.registered(mine), objectives.registered(plain):
        assert {"lowest-first", "plain-at"} <= set(choices())
        assert HARDEN_STRATEGIES["plain-at"] == "plain-at" and BUDGET_FREE["plain-at"] == "online"
    assert "lowest-first" not in choices() and "plain-at" not in HARDEN_STRATEGIES
