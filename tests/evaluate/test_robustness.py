"""Robustness measurement: fixed adversarial set, clean and white-box accuracy, measure()."""

from __future__ import annotations

import json

import pytest
import torch

from robustest import data as datasets
from robustest import models as zoo
from robustest.core.errors import ConfigError, DataError
from robustest.evaluate import (
    FixedAdversarialSet,
    RobustnessReport,
    accuracy,
    adversarial_examples,
    build_fixed_set,
    clean_accuracy,
    fixed_set_accuracy,
    measure,
    whitebox_accuracy,
)
from robustest.train import fit

EPS = 0.15


@pytest.fixture(scope="module")
def tiny():
    """A small MLP trained briefly on digits, and a slice of the digits test split."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster, restored after the module
    tr = datasets.load("digits", split="train")
    te = datasets.load("digits", split="test")
    x, y = tr.tensors
    torch.manual_seed(0)
    model = zoo.create("mlp", num_classes=10, in_channels=1, input_size=8)
    fit(model, (x[:600], y[:600]), epochs=8, batch_size=64, seed=0, progress=False)
    yield model, (te.tensors[0][:120], te.tensors[1][:120])
    torch.set_num_threads(threads)


def test_fixed_set_scores_zero_for_the_original_model(tiny):
    model, test = tiny
    fixed = build_fixed_set(model, test, EPS, seed=3)
    assert len(fixed) > 0
    assert fixed_set_accuracy(model, fixed) == 0.0
    # examples stay in the eps-ball around their source image and keep its label
    x, y = test
    src = x[fixed.source_index]
    assert float((fixed.x - src).abs().max()) <= EPS + 1e-6
    assert float(fixed.x.min()) >= 0.0 and float(fixed.x.max()) <= 1.0
    assert torch.equal(fixed.y, y[fixed.source_index])
    assert set(fixed.method) <= {"fgsm", "pgd"} and "pgd" in fixed.method
    assert sum(fixed.counts().values()) == len(fixed)
    # a different model (fresh weights) is not at 0 on this set
    torch.manual_seed(1)
    other = zoo.create("mlp", num_classes=10, in_channels=1, input_size=8)
    fit(other, (x[:100], y[:100]), epochs=3, progress=False, seed=1)
    assert fixed_set_accuracy(other, fixed) > 0.0


def test_fixed_set_is_seeded_and_round_trips(tiny, tmp_path):
    model, test = tiny
    a = build_fixed_set(model, test, EPS, seed=5)
    b = build_fixed_set(model, test, EPS, seed=5)
    assert torch.equal(a.x, b.x) and torch.equal(a.source_index, b.source_index)
    path = a.save(tmp_path / "fixed.pt")
    c = FixedAdversarialSet.load(path)
    assert torch.equal(c.x, a.x) and c.method == a.method and c.eps == a.eps and c.num_source == 120
    (tmp_path / "bad.pt").write_bytes(b"not a tensor file")
    with pytest.raises(DataError, match="not a fixed adversarial set"):
        FixedAdversarialSet.load(tmp_path / "bad.pt")


def test_adversarial_examples_all_vs_successful(tiny):
    model, test = tiny
    xa, ya, idx, meth = adversarial_examples(model, test, EPS, successful_only=False, seed=0)
    assert xa.shape[0] == 2 * test[0].shape[0] and meth.count("fgsm") == meth.count("pgd")
    xs, _, _, _ = adversarial_examples(model, test, EPS, successful_only=True, seed=0)
    assert xs.shape[0] <= xa.shape[0]
    with pytest.raises(ConfigError, match="unknown pool attack"):
        adversarial_examples(model, test, EPS, attacks=("deepfool",))


def test_whitebox_worst_case_is_below_each_attack(tiny):
    model, test = tiny
    wb = whitebox_accuracy(model, test, EPS, pgd_steps=5, pgd_restarts=2, apgd_steps=5, seed=0)
    clean = clean_accuracy(model, test)
    assert 0.0 <= wb["worst"] <= min(wb["pgd"], wb["apgd"], clean)
    assert wb["pgd"] < clean  # the attack works on an undefended model
    assert clean == pytest.approx(accuracy(model, test))
    again = whitebox_accuracy(model, test, EPS, pgd_steps=5, pgd_restarts=2, apgd_steps=5, seed=0)
    assert again == wb


def test_measure_report_is_json_and_consistent(tiny):
    model, test = tiny
    fixed = build_fixed_set(model, test, EPS, seed=0)
    rep = measure(model, test, eps=EPS, fixed=fixed, whitebox_limit=50, pgd_steps=5, pgd_restarts=1,
                  apgd_steps=5, seed=0)
    assert isinstance(rep, RobustnessReport)
    d = rep.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["fixed_set_accuracy"] == 0.0 and d["fixed_set_size"] == len(fixed)
    assert d["num_whitebox"] == 50 and d["num_eval"] == 120
    assert d["whitebox_accuracy"] <= d["whitebox_pgd_accuracy"]
    no_wb = measure(model, test, eps=EPS, whitebox=False)
    assert no_wb.whitebox_accuracy is None and no_wb.fixed_set_accuracy is None
    assert no_wb.clean_accuracy == pytest.approx(rep.clean_accuracy)


def test_measure_rejects_bad_input(tiny):
    model, test = tiny
    with pytest.raises(ConfigError, match="eps"):
        measure(model, test, eps=0.0)
    with pytest.raises(DataError):
        measure(model, (test[0] * 300, test[1]), eps=EPS)
    with pytest.raises(DataError, match="labels"):
        clean_accuracy(model, test[0])


def test_measure_with_corruptions(tiny):
    model, test = tiny
    rep = measure(model, test, eps=EPS, whitebox=False, corruptions=["gaussian_noise", "defocus_blur"],
                  corruption_severities=(1, 5))
    d = rep.to_dict()
    json.dumps(d, allow_nan=False)
    assert set(d["corruption"]["accuracy"]) == {"gaussian_noise", "defocus_blur"}
    assert 0.0 <= d["corruption_accuracy"] <= 1.0
    assert d["corruption_accuracy"] == pytest.approx(d["corruption"]["mean_corruption_accuracy"])
    assert d["corruption"]["clean_accuracy"] == pytest.approx(rep.clean_accuracy)
