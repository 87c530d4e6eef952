"""The enhance pipeline from Python (robustest.weakrobust.enhance_pipeline) and its report."""

from __future__ import annotations

import json

import pytest
import torch

from robustest import corruptions, models
from robustest.core.errors import DataError
from robustest.models.checkpoints import load_checkpoint
from robustest.report import format_value
from robustest.results import document
from robustest.train import Recipe
from robustest.weakrobust.enhance_pipeline import (
    enhance_pipeline,
    held_out_corruptions,
    measure_enhancement,
    read_weaknesses,
)
from robustest.weakrobust.reports import enhance_report


def test_read_weaknesses_merges_names_and_validate_results_in_first_order(tmp_path):
    f = tmp_path / "results.json"
    f.write_text(json.dumps({"weaknesses": ["fog", "pgd"]}))
    assert read_weaknesses(["snow,fog", str(f), "snow"]) == ["snow", "fog", "pgd"]
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match="is not a JSON file"):
        read_weaknesses([str(tmp_path / "bad.json")])
    (tmp_path / "other.json").write_text(json.dumps({"weak": []}))
    with pytest.raises(DataError, match="has no 'weaknesses' list"):
        read_weaknesses([str(tmp_path / "other.json")])
    with pytest.raises(DataError, match="does not exist"):
        read_weaknesses([str(tmp_path / "none.json")])


def test_held_out_corruptions_are_the_first_registered_ones_not_targeted():
    first = corruptions.names()[0]
    assert held_out_corruptions([]) == corruptions.names()[:6]
    assert first not in held_out_corruptions([first]) and len(held_out_corruptions([first], 2)) == 2


def _setup():
    torch.manual_seed(0)
    model = models.create("digits_cnn", num_classes=3, input_size=8)
    x, y = torch.rand(24, 1, 8, 8), torch.randint(0, 3, (24,))
    return model, (x, y)


def test_measure_enhancement_is_empty_without_test_data_and_counts_the_limit():
    model, data = _setup()
    assert measure_enhancement(model, None, 10, [], 0) == {}
    m = measure_enhancement(model, data, 10, ["gaussian_noise"], 0)
    assert set(m) == {"clean_accuracy", "mean_adv_error", "mce_held_out", "per_type"}
    assert set(m["per_type"]) >= {"fgsm", "pgd", "gaussian_noise"}


def test_the_pipeline_measures_enhances_and_saves(tmp_path):
    model, data = _setup()
    run = enhance_pipeline(model, data, data, ["gaussian_noise"], out=tmp_path, eval_limit=8, epochs=1,
                           adversarial=False, batch_size=8)
    assert run.held_out == held_out_corruptions(["gaussian_noise"]) and run.before and run.after
    res = run.to_results()
    assert list(res) == ["enhance", "held_out_corruptions", "before", "after", "peak_rss_mib", "files"]
    assert "seconds" not in res["enhance"] and res["files"] == run.files and res["peak_rss_mib"] > 0
    assert run.train_seconds > 0 and len(res["enhance"]["epochs"]) == 1
    meta = load_checkpoint(tmp_path / "model.pt").robustest_metadata
    assert meta["weaknesses"] == ["gaussian_noise"] and meta["enhanced"] == run.result.config
    doc = document("enhance", {}, res, {"total_s": 1.0}, world_size=1)
    html = enhance_report(doc, run, 1).render()
    assert "1 epoch; pool:" in html and "weaknesses: gaussian_noise" in html and "Before and after" in html
    quiet = enhance_pipeline(model, data, None, [], out=tmp_path / "b", eval_limit=0, epochs=1, adversarial=False,
                             batch_size=8)
    assert quiet.before == {} and quiet.held_out == []
    assert "Before and after" not in enhance_report(doc, quiet, 1).render()
    assert run.settings == {"weaknesses": ["gaussian_noise"], "epochs": 1, "augmix": True, "adversarial": False,
                            "jsd_weight": 6.0, "lr": 1e-3, "batch_size": 8, "eval_limit": 8, "seed": 0,
                            "device": "cpu"}
    assert quiet.summary_line() is None
    b, a = run.before, run.after
    assert run.summary_line() == (
        f"test accuracy {format_value(b['clean_accuracy'], 'accuracy')} -> "
        f"{format_value(a['clean_accuracy'], 'accuracy')}; "
        f"mean adversarial error {format_value(b['mean_adv_error'], 'error')} -> "
        f"{format_value(a['mean_adv_error'], 'error')}; held-out mCE {format_value(b['mce_held_out'], 'mce')} -> "
        f"{format_value(a['mce_held_out'], 'mce')}")


def test_the_settings_name_the_adversarial_copy_only_when_it_runs(tmp_path):
    model, data = _setup()
    run = enhance_pipeline(model, data, None, [], out=tmp_path, eval_limit=0, epochs=1, augmix=False, eps=0.2,
                           adv_steps=2, adv_weight=0.25, recipe=Recipe(lr=5e-4), batch_size=12, seed=3)
    assert run.settings == {"weaknesses": [], "epochs": 1, "augmix": False, "adversarial": True, "adv_weight": 0.25,
                            "eps": 0.2, "adv_steps": 2, "adv_source": "offline", "lr": 5e-4, "batch_size": 12,
                            "eval_limit": 0, "seed": 3, "device": "cpu"}


def test_state_folder_is_named_by_the_run_and_drops_other_runs_state(tmp_path):
    from robustest.models import create
    from robustest.train.state import STATE_FILES
    from robustest.weakrobust.enhance_pipeline import state_folder

    model, train = create("digits_cnn", input_size=8), (torch.rand(4, 1, 8, 8), torch.arange(4))
    notes: list[str] = []
    a = state_folder(tmp_path, {"epochs": 1}, ["fog"], model, train, note=notes.append)
    assert a.parent == tmp_path / "state" and a.name.startswith("enhance_") and len(a.name) == len("enhance_") + 16
    assert state_folder(tmp_path, {"epochs": 1}, ["fog"], model, train) == a  # the same run, the same folder
    assert state_folder(tmp_path, {"epochs": 1}, ["snow", "fog"], model, train) == \
        state_folder(tmp_path, {"epochs": 1}, ["fog", "snow"], model, train) != a  # the weaknesses as a set
    a.mkdir(parents=True)
    (a / STATE_FILES["enhance"]).write_bytes(b"x")
    state_folder(tmp_path, {"epochs": 1}, ["fog"], model, train, note=notes.append)
    assert notes == [f"continuing the interrupted enhancement saved in {a}"]
    b = state_folder(tmp_path, {"epochs": 2}, ["fog"], model, train, note=notes.append)
    assert b != a and not a.exists() and notes[-1] == ("the enhancement state of an earlier run with other settings "
                                                       "was removed: starting afresh")
