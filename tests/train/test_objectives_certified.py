"""Certified training (``ibp``: Gowal et al. 2018; ``crown-ibp``: Zhang et al. 2020): the ramp's exact values at
chosen epochs and steps, the loss against its hand-computed form (plain cross-entropy in the warm-up, the clean
cross-entropy again at radius 0 by shift invariance), gradients and a few optimiser steps that tighten the bounds,
the graph traced once per model, the options, harden's records, compute and resume, and ``robustest harden
--method ibp`` writing certified accuracy into results.json."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from robustest.certify import crown, ibp, margin_bounds
from robustest.cli import main
from robustest.core.errors import ConfigError
from robustest.train import harden, harden_settings, objectives, schedules
from robustest.train.objectives import StepContext
from robustest.train.objectives import ibp as ibp_module
from robustest.train.recipes import Recipe

EPS = 0.1


def _mlp(seed: int = 0) -> nn.Module:
    """A tiny MLP over 1 x 4 x 4 images (no dropout: every forward is deterministic)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))


def _bright_side(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random 4 x 4 images whose label says which half (left columns 0, right 1) is brighter, by at least 0.4."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = torch.rand(n, 1, 4, 4, generator=g) * 0.3
    bright = 0.7 + torch.rand(n, 1, 4, 2, generator=g) * 0.3
    x[y == 0, :, :, :2] = bright[y == 0]
    x[y == 1, :, :, 2:] = bright[y == 1]
    return x, y


def _settings(method: str, **kw) -> dict:
    return harden_settings(method, eps=EPS, **kw)


def _ctx(s: dict, epoch: int, step: int, per_epoch: int) -> StepContext:
    return StepContext(s, epoch_number=epoch, step=step, steps_per_epoch=per_epoch)


def _step(method: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, ctx: StepContext):
    return objectives.get(method).step(model, x, y, None, ctx)


# ------------------------------------------------------------------------------------------------- the ramp
def test_ramp_schedule_values_by_hand():
    # 100 steps, 10 of warm-up (S = 10), 40 of ramp (L = 40): (step + 1 - S) / L after the warm-up
    r = [schedules.ramp_schedule(t, 100, 0.1, 0.4) for t in (0, 9, 10, 11, 29, 48, 49, 50, 99)]
    assert r == [0.0, 0.0, 1 / 40, 2 / 40, 0.5, 39 / 40, 1.0, 1.0, 1.0]
    assert schedules.ramp_schedule(0, 100, 0.0, 0.5) == 1 / 50  # no warm-up: the first step is the ramp's first
    assert schedules.ramp_schedule(5, 10, 0.5, 0.05) == 1.0  # a ramp shorter than one step is a jump
    assert schedules.ramp_schedule(4, 10, 0.5, 0.05) == 0.0
    # fractional warm-up: S = 2.5, L = 5
    assert [schedules.ramp_schedule(t, 10, 0.25, 0.5) for t in (1, 2, 3)] == [0.0, 0.5 / 5, 1.5 / 5]


@pytest.mark.parametrize("epoch, step, expected", [
    (1, 0, 0.0),     # global step 0: the warm-up
    (1, 24, 0.0),    # global step 24, the warm-up's last (S = 25)
    (2, 0, 1 / 50),  # global step 25: the ramp's first
    (2, 24, 0.5),    # global step 49: (50 - 25) / 50
    (3, 24, 1.0),    # global step 74: the ramp's last
    (4, 10, 1.0),    # after the ramp
])
def test_the_schedule_follows_epoch_and_step(epoch, step, expected):
    # 4 epochs of 25 steps: 100 steps, warm-up 25, ramp 50
    s = _settings("crown-ibp", epochs=4, eps_train=0.2, ramp_warmup=0.25, ramp_length=0.5, kappa_end=0.5,
                  beta_end=0.25)
    assert ibp_module.ramp(_ctx(s, epoch, step, 25), "crown-ibp") == expected
    out = _step("crown-ibp", _mlp(), *_bright_side(8), _ctx(s, epoch, step, 25))
    assert out.values["eps"] == pytest.approx(0.2 * expected, abs=1e-15)
    assert out.values["kappa"] == pytest.approx(1 - 0.5 * expected, abs=1e-15)
    assert out.values.get("beta", 1.0) == pytest.approx(1 - 0.75 * expected, abs=1e-15)  # no bounds: no beta


def test_schedule_values_at_the_middle_of_the_ramp_are_exact():
    s = _settings("ibp", epochs=4, eps_train=0.2, ramp_warmup=0.25, ramp_length=0.5)
    out = _step("ibp", _mlp(), *_bright_side(8), _ctx(s, 2, 24, 25))  # r = 0.5
    assert out.values == {"eps": 0.1, "kappa": 0.75}  # eps_train * r, 1 - (1 - 0.5) * r
    s = _settings("crown-ibp", epochs=4, eps_train=0.2, ramp_warmup=0.25, ramp_length=0.5)
    out = _step("crown-ibp", _mlp(), *_bright_side(8), _ctx(s, 2, 24, 25))
    assert out.values == {"eps": 0.1, "kappa": 0.5, "beta": 0.5}  # kappa and beta 1 -> 0


# --------------------------------------------------------------------------------------------- the loss
@pytest.mark.parametrize("method", ["ibp", "crown-ibp"])
def test_in_the_warm_up_the_loss_is_exactly_the_cross_entropy(method):
    model, (x, y) = _mlp(), _bright_side(16)
    s = _settings(method, epochs=10, ramp_warmup=0.5)
    out = _step(method, model, x, y, _ctx(s, 2, 3, 4))  # global step 7 of 40, warm-up 20: eps 0, kappa 1
    assert out.values == {"eps": 0.0, "kappa": 1.0} and model.training
    logits = model(x)
    assert torch.equal(out.loss, F.cross_entropy(logits, y)) and torch.equal(out.logits, logits)
    assert out.compute.train_forward == out.compute.train_backward == 16 and out.compute.attack_forward == 0
    assert torch.equal(out.evals, torch.zeros(16, dtype=torch.long))


def test_cross_entropy_of_the_negated_margins_is_the_cross_entropy():
    model, (x, y) = _mlp(), _bright_side(32)
    z = model(x)
    m = z.gather(1, y[:, None]) - z  # z_y - z_j, column y is 0
    # CE(-m, y) = CE(z - z_y, y) = CE(z, y): the cross-entropy does not move when a sample's logits shift together
    torch.testing.assert_close(F.cross_entropy(-m, y), F.cross_entropy(z, y), rtol=0, atol=1e-6)
    # IBP at radius 0 gives those margins (its last layer is folded into the specification, so up to rounding)
    m0 = margin_bounds(model, x, y, 0.0, method="ibp")
    torch.testing.assert_close(m0, m, rtol=0, atol=1e-5)
    torch.testing.assert_close(F.cross_entropy(-m0, y), F.cross_entropy(z, y), rtol=0, atol=1e-6)


@pytest.mark.parametrize("method", ["ibp", "crown-ibp"])
def test_at_radius_zero_the_robust_loss_is_the_clean_cross_entropy(method):
    model, (x, y) = _mlp(), _bright_side(32)
    # the end of the ramp (kappa 0: the robust term alone) at a radius of 0
    s = {**_settings(method, epochs=1, ramp_warmup=0.0, ramp_length=1.0, kappa_end=0.0), "eps_train": 0.0}
    out = _step(method, model, x, y, _ctx(s, 1, 0, 1))
    assert out.values["eps"] == 0.0 and out.values["kappa"] == 0.0
    torch.testing.assert_close(out.loss, F.cross_entropy(model(x), y), rtol=0, atol=1e-6)
    # kappa 0: no clean backward; beta 0 at the end of crown-ibp's ramp: IBP's 2 passes only
    assert out.compute.train_forward == 32 * 3 and out.compute.train_backward == 32 * 2


def test_the_loss_mixes_the_terms_as_written():
    model, (x, y) = _mlp(), _bright_side(32)
    s = _settings("crown-ibp", epochs=1, eps_train=0.2, ramp_warmup=0.0, ramp_length=1.0, kappa_end=0.5,
                  beta_end=0.0)
    ctx = StepContext(s, epoch_number=1, step=1, steps_per_epoch=4)  # r = 2 / 4
    out = _step("crown-ibp", model, x, y, ctx)
    kappa, beta, eps = 0.75, 0.5, 0.1
    m = beta * margin_bounds(model, x, y, eps, method="crown-ibp") + (1 - beta) * margin_bounds(model, x, y, eps)
    expected = kappa * F.cross_entropy(model(x), y) + (1 - kappa) * F.cross_entropy(-m, y)
    torch.testing.assert_close(out.loss, expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out.logits, -m)
    # compute: clean B, IBP 2 B, CROWN-IBP (2 + K) B with K = 2 classes
    assert out.compute.train_forward == out.compute.train_backward == 32 * (1 + 2 + 4)
    s = _settings("ibp", epochs=1, eps_train=0.2, ramp_warmup=0.0, ramp_length=1.0)
    out = _step("ibp", model, x, y, StepContext(s, epoch_number=1, step=1, steps_per_epoch=4))
    expected = 0.75 * F.cross_entropy(model(x), y) + 0.25 * F.cross_entropy(-margin_bounds(model, x, y, eps), y)
    torch.testing.assert_close(out.loss, expected, rtol=1e-6, atol=1e-7)
    assert out.compute.train_forward == 32 * 3


@pytest.mark.parametrize("method", ["ibp", "crown-ibp"])
def test_a_few_optimiser_steps_tighten_the_bounds(method):
    model, (x, y) = _mlp(), _bright_side(128)
    s = _settings(method, epochs=1, eps_train=EPS, ramp_warmup=0.0, ramp_length=1.0, kappa_end=0.0)
    ctx = _ctx(s, 1, 0, 1)  # the end of the ramp: the robust loss alone

    def robust_loss() -> float:
        with torch.no_grad():
            return float(F.cross_entropy(-margin_bounds(model, x, y, EPS), y))

    before_loss, before_cert = robust_loss(), ibp(model, x, y, EPS).certified_accuracy
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(40):
        out = _step(method, model, x, y, ctx)
        opt.zero_grad()
        out.loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        assert any(float(p.grad.abs().sum()) > 0 for p in model.parameters())
        opt.step()
    model.eval()
    after_loss, after_cert = robust_loss(), ibp(model, x, y, EPS).certified_accuracy
    assert after_loss < 0.5 * before_loss, (before_loss, after_loss)
    assert after_cert >= before_cert + 0.3 and after_cert > 0.8, (before_cert, after_cert)
    assert crown(model, x, y, EPS).certified_accuracy >= after_cert  # CROWN is at least as tight


# ------------------------------------------------------------------------------------------ the graph cache
def test_the_graph_is_traced_once_per_model_and_image_shape(monkeypatch):
    calls = []
    real = ibp_module.check_certifiable
    monkeypatch.setattr(ibp_module, "check_certifiable", lambda m, shape: calls.append(shape) or real(m, shape))
    s = _settings("ibp", epochs=1, ramp_warmup=0.0, ramp_length=1.0)
    model, (x, y) = _mlp(), _bright_side(16)
    for i in range(3):
        _step("ibp", model, x, y, _ctx(s, 1, i, 3))
    assert calls == [(1, 4, 4)]
    _step("ibp", _mlp(1), x, y, _ctx(s, 1, 0, 3))  # another model: its own graph
    conv = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    conv(torch.zeros(1, 1, 5, 5))
    _step("ibp", conv, torch.rand(4, 1, 5, 5), y[:4], _ctx(s, 1, 0, 3))
    _step("ibp", conv, torch.rand(4, 1, 5, 5), y[:4], _ctx(s, 1, 1, 3))
    assert calls == [(1, 4, 4), (1, 4, 4), (1, 5, 5)]
    # the graph refers to the live parameters: after an update, the cached graph bounds the updated model
    with torch.no_grad():
        model[1].weight.mul_(2.0)
    graph = ibp_module.model_graph(model, x)
    torch.testing.assert_close(margin_bounds(model, x, y, EPS, graph=graph), margin_bounds(model, x, y, EPS))


def test_tracing_leaves_batchnorm_statistics_alone():
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).train()
    with torch.no_grad():
        model[2].running_mean.fill_(0.5)
    ibp_module.model_graph(model, torch.rand(4, 1, 4, 4))
    assert torch.equal(model[2].running_mean, torch.full((8,), 0.5)) and model.training


# ------------------------------------------------------------------------------------------------ options
def test_options_defaults_and_checks():
    assert {"ibp", "crown-ibp"} <= set(objectives.names())
    s = _settings("ibp")
    assert (s["eps_train"], s["ramp_warmup"], s["ramp_length"], s["kappa_end"]) == (EPS, 0.05, 0.5, 0.5)
    s = _settings("crown-ibp", eps_train=0.2)
    assert (s["eps_train"], s["kappa_end"], s["beta_end"]) == (0.2, 0.0, 0.0)
    assert objectives.get("ibp").certificates == objectives.get("crown-ibp").certificates == ("ibp", "crown")
    with pytest.raises(ConfigError, match=r"ramp_warmup \+ ramp_length must be at most 1"):
        _settings("ibp", ramp_warmup=0.6, ramp_length=0.5)
    with pytest.raises(ConfigError, match=r"^eps_train must lie in \(0, 1\] for the L-inf threat model"):
        _settings("ibp", eps_train=0.0)
    with pytest.raises(ConfigError, match=r"^kappa_end must be a number in \[0, 1\], got 1.5$"):
        _settings("crown-ibp", kappa_end=1.5)
    with pytest.raises(ConfigError, match="beta_end applies to method crown-ibp only, not 'ibp'"):
        _settings("ibp", beta_end=0.5)


def test_a_step_without_its_place_in_training_is_refused():
    s = _settings("ibp")
    with pytest.raises(ConfigError, match="ibp ramps its radius over training.*which harden gives"):
        _step("ibp", _mlp(), *_bright_side(4), StepContext(s))


# ------------------------------------------------------------------------------------------------ harden
def test_harden_records_the_schedule_and_counts_the_bounds():
    x, y = _bright_side(64)
    # 5 epochs of 4 steps: warm-up S = 5, ramp L = 10; the record keeps each epoch's last step (global 4 e - 1)
    res = harden(_mlp(), (x, y), "ibp", eps=EPS, epochs=5, batch_size=16, recipe=Recipe(lr=0.01), eps_train=0.2,
                 ramp_warmup=0.25, ramp_length=0.5, seed=0)
    assert [e["eps"] for e in res.epochs] == pytest.approx([0.0, 0.2 * 3 / 10, 0.2 * 7 / 10, 0.2, 0.2], abs=1e-12)
    assert [e["kappa"] for e in res.epochs] == pytest.approx([1.0, 0.85, 0.65, 0.5, 0.5], abs=1e-12)
    # steps 0-4 train on clean images (16 passes each), every later one 16 * (1 + 2)
    assert [e["compute"]["train_forward"] for e in res.epochs] == [64, 16 + 3 * 48, 4 * 48, 4 * 48, 4 * 48]
    assert res.compute["attack_passes"] == 0 and all(e["attack_evals_mean"] == 0 for e in res.epochs)
    assert res.epochs[-1]["adv_accuracy"] > 0.5  # the share of training images certified at eps_train


def test_harden_resumes_certified_training_to_the_same_model(tmp_path):
    x, y = _bright_side(64)
    kw = {"eps": EPS, "epochs": 3, "batch_size": 16, "ramp_warmup": 0.0, "ramp_length": 0.6, "seed": 1}
    full = _mlp()
    harden(full, (x, y), "crown-ibp", **kw)

    class Stop(Exception):
        pass

    def interrupt(epoch, model, record):
        if epoch == 2:
            raise Stop

    with pytest.raises(Stop):
        harden(_mlp(), (x, y), "crown-ibp", **kw, state_dir=tmp_path, on_epoch_end=interrupt)
    resumed = _mlp()
    res = harden(resumed, (x, y), "crown-ibp", **kw, state_dir=tmp_path, resume=True)
    assert res.resumed_epochs == 2 and [e["beta"] for e in res.epochs][-1] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(full.state_dict().values(), resumed.state_dict().values()))


# --------------------------------------------------------------------------------------------------- CLI
TINY = ["--dataset", "digits", "--limit", "200", "--eps", "0.1", "--epochs", "2", "--batch-size", "50",
        "--test-limit", "60", "--whitebox-limit", "30", "--whitebox-pgd-steps", "3", "--whitebox-restarts", "1",
        "--apgd-steps", "3", "--val-size", "20", "--val-steps", "2", "--no-progress"]


def test_harden_verb_with_ibp_writes_certified_accuracy(tmp_path, capsys, results_contract, one_thread):
    out = tmp_path / "ibp"
    args = ["harden", "--model", "mnist_small", "--from-scratch", *TINY, "--method", "ibp", "--eps-train", "0.15",
            "--ramp-warmup", "0", "--ramp-length", "0.5", "--keep", "last"]
    assert main([*args, "--out", str(out)]) == 0
    assert "certified" in capsys.readouterr().out
    res = results_contract(out, "harden")
    s = res["settings"]
    assert s["method"] == "ibp" and s["certify"] == ["ibp", "crown"] and s["eps_train"] == 0.15
    assert (s["ramp_warmup"], s["ramp_length"], s["kappa_end"]) == (0.0, 0.5, 0.5)
    for key in ("before", "after"):
        r = res[key]
        assert 0.0 <= r["certified_ibp_accuracy"] <= r["certified_crown_accuracy"] <= r["clean_accuracy"]
        assert r["certified_accuracy"] == r["certified_crown_accuracy"]  # CROWN's bound is never below IBP's
    assert res["certified_accuracy"] == res["after"]["certified_accuracy"]
    assert [e["eps"] for e in res["epochs"]] == [0.15, 0.15] and [e["kappa"] for e in res["epochs"]] == [0.5, 0.5]
    assert "certified accuracy" in (out / "report.html").read_text()
    # another method measures certified accuracy only when asked; --certify none switches it off
    assert main([*args[:-10], "--method", "pgd-at", "--steps", "2", "--certify", "ibp", "--keep", "last",
                 "--out", str(tmp_path / "pgd")]) == 0
    res = results_contract(tmp_path / "pgd", "harden")
    assert res["settings"]["certify"] == ["ibp"] and "certified_crown_accuracy" not in res["after"]
    assert 0.0 <= res["certified_accuracy"] == res["after"]["certified_ibp_accuracy"] <= 1.0
    assert main([*args, "--certify", "none", "--out", str(tmp_path / "none")]) == 0
    doc = json.loads((tmp_path / "none" / "results.json").read_text())
    assert "certify" not in doc["settings"] and doc["certified_accuracy"] is None
    assert "certified_accuracy" not in doc["after"]


@pytest.mark.parametrize("extra, match", [
    (["--certify", "lp"], "unknown certificate 'lp'"),
    (["--certify", "none,ibp"], "--certify none turns certification off"),
    (["--ramp-warmup", "0.7", "--ramp-length", "0.5"], "ramp_warmup \\+ ramp_length"),
    (["--beta-end", "0.5"], "beta_end applies to method crown-ibp only"),
])
def test_bad_certified_options_are_one_line_exit_2(extra, match, tmp_path, capsys):
    try:
        rc = main(["harden", "--model", "mnist_small", "--from-scratch", *TINY, "--method", "ibp", *extra,
                   "--out", str(tmp_path / "bad")])
    except SystemExit as exc:  # refused by the parser
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and re.search(match, err), err
    assert not (tmp_path / "bad" / "results.json").exists()


def test_a_model_bound_propagation_does_not_cover_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    from robustest.cli import harden as harden_cli

    def sigmoid_model(args, data):
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.Sigmoid())

    monkeypatch.setattr(harden_cli, "build_zoo_model", sigmoid_model)
    rc = main(["harden", "--model", "mnist_small", "--from-scratch", *TINY, "--method", "ibp",
               "--out", str(tmp_path / "sig")])
    err = capsys.readouterr().err
    assert rc == 2 and "Sigmoid" in err and err.count("\n") == 1
    assert not (tmp_path / "sig" / "state").exists()


def test_crown_ibp_through_harden_beats_the_untrained_model_on_certificates():
    x, y = _bright_side(128)
    xt, yt = _bright_side(64, seed=1)
    model = _mlp()
    before = crown(model, xt, yt, EPS).certified_accuracy
    trained = copy.deepcopy(model)
    harden(trained, (x, y), "crown-ibp", eps=EPS, epochs=6, batch_size=32, recipe=Recipe(lr=5e-3), ramp_warmup=0.0,
           ramp_length=0.5, seed=0)
    assert crown(trained, xt, yt, EPS).certified_accuracy >= max(before + 0.3, 0.8)
