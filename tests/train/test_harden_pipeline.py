"""The harden pipeline from Python (robustest.train.harden_pipeline): what `robustest harden` runs, no CLI."""

from __future__ import annotations

import json

import pytest
import torch

from robustest import data, models
from robustest.models.checkpoints import load_checkpoint
from robustest.train import harden_pipeline as hp
from robustest.train.harden_report import harden_report


@pytest.fixture(scope="module")
def digits():
    x, y = data.load("digits", split="train").tensors
    xt, yt = data.load("digits", split="test").tensors
    return (x[:120], y[:120]), (x[120:140], y[120:140]), (xt[:40], yt[:40])


def _model():
    torch.manual_seed(0)
    return models.create("digits_cnn", input_size=8)


HKW = {"eps": 0.1, "epochs": 2, "steps": 2, "batch_size": 64, "seed": 0, "keep": "last"}


def test_measure_model_reports_the_figures_and_the_certificates_by_any(digits):
    _, _, test = digits
    m = hp.Measurement(eps=0.1, whitebox_limit=10, pgd_steps=2, pgd_restarts=1, apgd_steps=0, certify=("ibp",))
    d = hp.measure_model(_model(), test, m)
    assert d["num_eval"] == 40 and d["num_whitebox"] == 10
    assert "seconds" not in d and "fixed_set_accuracy" not in d
    assert d["certified_accuracy"] == d["certified_ibp_accuracy"]  # one certificate: "any" is that one
    assert d["whitebox_apgd_accuracy"] is None  # apgd_steps 0 skips APGD-CE
    assert "certified_accuracy" not in hp.measure_model(_model(), test, hp.Measurement(eps=0.1, whitebox_limit=0))


def test_the_pipeline_measures_hardens_and_writes_the_checkpoints(digits, tmp_path):
    train, val, test = digits
    m = hp.Measurement(eps=0.1, whitebox_limit=8, pgd_steps=2, pgd_restarts=1, apgd_steps=2)
    run = hp.harden_pipeline(_model(), train, test, "pgd-at", out=tmp_path, measurement=m,
                             options={**HKW, "keep": "best", "val_steps": 2}, val=val,
                             metadata={"dataset": "digits"})
    res = run.to_results()
    assert res["data"] == {"num_train": 140, "num_fit": 120, "num_val": 20, "num_test": 40,
                           "model": res["data"]["model"]}
    assert res["before"]["num_eval"] == 40 and res["after"]["num_whitebox"] == 8
    assert len(res["epochs"]) == run.final_epoch == 2
    assert res["kept_epoch"] == run.result.kept_epoch and res["training_cpu_s"] > 0
    assert list(res)[-2:] == ["peak_rss_mib", "files"] and res["files"] == run.files and res["peak_rss_mib"] > 0
    assert set(run.timings) == {"before_s", "harden_s", "after_s"}
    assert json.loads((tmp_path / "state" / "before.json").read_text()) == res["before"]
    meta = load_checkpoint(tmp_path / "model.pt").robustest_metadata["hardened"]
    assert meta["dataset"] == "digits" and meta["kept_epoch"] == res["kept_epoch"]
    rows = run.summary_rows()
    assert [r["model"] for r in rows] == ["before", f"after (epoch {run.result.kept_epoch})"] + (
        [] if run.last is None else ["last (epoch 2)"])
    assert rows[0]["clean accuracy (40 images)"] == res["before"]["clean_accuracy"]
    assert rows[1]["PGD accuracy (8 images)"] == res["after"]["whitebox_pgd_accuracy"]
    passes = run.result.compute["passes"]
    assert run.summary_line().startswith(f"pgd-at: 2 epochs on 120 images, {passes:.4g} forward+backward passes "
                                         f"({passes / 120:.2f} per image), ")
    assert run.summary_line().endswith(" CPU-seconds of training")
    if run.last is None:  # the last epoch was the best: one model, one file
        assert "last_model" not in run.files and not (tmp_path / "last.pt").exists()
    else:
        assert run.files["last_model"] == "last.pt"
        assert load_checkpoint(tmp_path / "last.pt").robustest_metadata["hardened"]["kept_epoch"] == 2


def test_a_resumed_pipeline_reads_the_measurement_before_back(digits, tmp_path):
    train, _, test = digits
    m = hp.Measurement(eps=0.1, whitebox_limit=0)
    (tmp_path / "state").mkdir()
    stored = {"clean_accuracy": 0.125, "num_eval": 40}
    (tmp_path / "state" / "before.json").write_text(json.dumps(stored))
    run = hp.harden_pipeline(_model(), train, test, "pgd-at", out=tmp_path, measurement=m, options=HKW, resume=True)
    assert run.before == stored  # not measured again
    fresh = hp.harden_pipeline(_model(), train, test, "pgd-at", out=tmp_path / "b", measurement=m, options=HKW)
    assert fresh.before["clean_accuracy"] != 0.125 and fresh.last is None  # keep last: model.pt is the last epoch


def test_the_report_of_a_pipeline_run_marks_the_kept_epoch(digits, tmp_path):
    from robustest.results import document

    train, val, test = digits
    m = hp.Measurement(eps=0.1, whitebox_limit=0)
    run = hp.harden_pipeline(_model(), train, test, "pgd-at", out=tmp_path, measurement=m,
                             options={**HKW, "val_steps": 2}, val=val)
    settings = {**run.result.settings, "dataset": "digits", "val_steps": 2}
    doc = document("harden", settings, run.to_results(), {**run.timings, "total_s": 1.0}, world_size=1)
    harden_report(doc).write(tmp_path / "report.html")
    html = (tmp_path / "report.html").read_text()
    assert "robustest harden: pgd-at on digits" in html and "The model written (model.pt) is epoch 2" in html


def test_claim_run_dir_refuses_another_run_unless_resumed_with_the_same_settings(tmp_path):
    from robustest.core.errors import ConfigError

    assert hp.claim_run_dir(tmp_path, {"eps": 0.3}, resume=False) == tmp_path
    assert json.loads((tmp_path / "state" / "run.json").read_text()) == {"args": {"eps": 0.3}}
    with pytest.raises(ConfigError, match="already holds a harden run: pass --resume"):
        hp.claim_run_dir(tmp_path, {"eps": 0.3}, resume=False)
    with pytest.raises(ConfigError, match="holds a run with other settings"):
        hp.claim_run_dir(tmp_path, {"eps": 0.2}, resume=True)
    assert hp.claim_run_dir(tmp_path, {"eps": 0.3}, resume=True) == tmp_path
    (tmp_path / "state" / "run.json").write_text("not json")  # a damaged marker is a run with other settings
    with pytest.raises(ConfigError, match="other settings"):
        hp.claim_run_dir(tmp_path, {"eps": 0.3}, resume=True)


def test_certificates_for_takes_the_methods_own_unless_told(digits):
    from robustest.core.errors import ConfigError

    test = digits[2]
    assert hp.certificates_for("pgd-at", None, _model(), test) is None
    assert hp.certificates_for("pgd-at", ["ibp"], _model(), test) == ["ibp"]
    assert hp.certificates_for("ibp", None, _model(), test) == ["ibp", "crown"]
    assert hp.certificates_for("ibp", ["none"], _model(), test) is None
    with pytest.raises(ConfigError, match="--certify none turns certification off"):
        hp.certificates_for("pgd-at", ["none", "ibp"], _model(), test)


def test_the_summary_line_names_one_epoch_and_the_guard_that_stopped_a_run(digits, tmp_path):
    import dataclasses

    train, _, test = digits
    m = hp.Measurement(eps=0.1, whitebox_limit=0)
    run = hp.harden_pipeline(_model(), train, test, "pgd-at", out=tmp_path, measurement=m,
                             options={**HKW, "epochs": 1})
    assert run.summary_line().startswith("pgd-at: 1 epoch on 120 images, ")
    assert [r["model"] for r in run.summary_rows()] == ["before", "after (epoch 1)"]
    epochs = [{**run.result.epochs[0], "val_pgd_accuracy": 0.5}, {**run.result.epochs[0], "val_pgd_accuracy": 0.1}]
    stopped = dataclasses.replace(run, result=dataclasses.replace(run.result, guard_epoch=2, epochs=epochs))
    assert "; stopped by the catastrophic-overfitting guard at epoch 2 (" in stopped.summary_line()
    assert stopped.summary_line().startswith("pgd-at: 2 epochs on 120 images, ")
