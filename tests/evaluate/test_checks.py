"""The evaluation checks itself: model probes, per-sample gradient checks, flags, the auto and rand versions,
and gates that fail on an unreliable evaluation (robustest.evaluate.checks / flags / findings / plans / runner)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from masked_zoo import DetachedMedian, NoGradPath, Quantized, RandomShiftNoise, ScaledLogits, SoftmaxOutput
from robustest.cli import main
from robustest.core.errors import ConfigError
from robustest.evaluate import FLAGS, Flag, ensemble_plan, evaluate, probe_model
from robustest.evaluate.checks import (
    GRAD_NONFINITE,
    GRAD_OK,
    GRAD_ZERO,
    SATURATED_MARGIN,
    LogProbabilities,
    gradient_status,
)
from robustest.evaluate.findings import GRADIENT_FREE_SHARE
from robustest.evaluate.flags import blocking, check_accepted, flag_lines
from robustest.evaluate.plans import PROBE_SIZE, ensemble_steps
from robustest.evaluate.runner import judge
from robustest.testing import assert_robust

EPS = 0.2


@pytest.fixture
def sample(digits_test):
    x, y = digits_test.tensors
    return x[:48], y[:48]


def _names(result) -> dict[str, str]:
    return {f.name: f.severity for f in result.flags}


# ------------------------------------------------------------------------------------------------- flags
def test_flag_record_and_gate_rule():
    f = Flag("zero-gradient", "unreliable", "m", "r", (3, 5))
    assert f.to_dict() == {"name": "zero-gradient", "severity": "unreliable", "message": "m", "remedy": "r",
                           "num_samples": 2, "samples": [3, 5]}
    assert Flag.from_dict(f.to_dict()) == f
    assert f.line() == "unreliable zero-gradient: m (remedy: r)"
    assert flag_lines([f], "robustest eval") == ["robustest eval: flag unreliable zero-gradient: m (remedy: r)"]
    info = Flag("randomised", "warning", "m", "r")
    assert blocking([f, info]) == [f]
    assert blocking([f, info], ("zero-gradient",)) == []
    with pytest.raises(ValueError, match="unknown flag"):
        Flag("nope", "info", "m", "r")
    with pytest.raises(ValueError, match="unknown severity"):
        Flag("randomised", "fatal", "m", "r")


def test_accepted_flags_are_checked():
    assert check_accepted("zero_gradient, randomised") == ("zero-gradient", "randomised")
    assert check_accepted(["zero-gradient", "zero-gradient"]) == ("zero-gradient",)
    assert check_accepted(None) == ()
    with pytest.raises(ConfigError, match="unknown flag 'masked' to accept: use one of randomised"):
        check_accepted("masked")
    assert set(FLAGS) >= {"randomised", "probability-output", "zero-gradient", "no-gradient-path",
                          "gradient-free-breaks", "dynamic-defence", "saturated-logits", "non-finite-gradient",
                          "unstable-predictions"}


# ------------------------------------------------------------------------------------------------- probes
class _BufferCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 10)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.lin(x.flatten(1))


class _GradInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 10)

    def forward(self, x):
        with torch.enable_grad():
            z = x.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(self.lin(z.flatten(1)).sum(), z)
        return self.lin((x - 0.01 * g.sign()).flatten(1))


def test_probe_of_plain_and_masked_models(trained_digits_model, sample):
    x, y = sample
    plain = probe_model(trained_digits_model, x, y)
    assert (plain.randomised, plain.probability_output, plain.dynamic, plain.gradient_path) == (False, False, False,
                                                                                                True)
    assert plain.max_output_diff == 0.0 and plain.prediction_changes == 0
    torch.manual_seed(0)
    rnd = probe_model(RandomShiftNoise(trained_digits_model, 1, 0.1).eval(), x, y)
    assert rnd.randomised and rnd.max_output_diff > 1e-4 and rnd.prediction_changes >= 1
    assert probe_model(SoftmaxOutput(trained_digits_model), x, y).probability_output
    nog = probe_model(NoGradPath(trained_digits_model), x, y)
    assert not nog.gradient_path and nog.gradient_error
    buf = probe_model(_BufferCounter(), x, y)
    assert buf.changed_state == ["buffer calls"] and buf.dynamic
    assert probe_model(_GradInForward(), x, y).autograd_calls == 1  # one traced forward, one call of autograd.grad


def test_gradient_status_codes_and_margins():
    x = torch.rand(4, 1, 8, 8)
    y = torch.tensor([0, 1, 2, 3])
    torch.manual_seed(0)
    lin = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    assert gradient_status(lin, x, y).tolist() == [GRAD_OK] * 4
    assert gradient_status(Quantized(lin, 3), x, y).tolist() == [GRAD_ZERO] * 4

    class Sqrt(nn.Module):  # d sqrt(t)/dt at t = 0 is infinite
        def forward(self, t):
            return lin(torch.sqrt(t - t + 0.0))

    assert gradient_status(Sqrt(), x, y, batch_size=3).tolist() == [GRAD_NONFINITE] * 4
    logits = torch.tensor([[3.0, 1.0, 2.0], [0.0, 5.0, 1.0]])
    from robustest.attacks import margin

    assert margin(logits, torch.tensor([0, 0])).tolist() == [1.0, -5.0]


def test_log_probabilities_keep_predictions(trained_digits_model, sample):
    x, _ = sample
    soft = SoftmaxOutput(trained_digits_model)
    with torch.no_grad():
        lp = LogProbabilities(soft)(x)
        torch.testing.assert_close(lp, torch.log_softmax(trained_digits_model(x), 1), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------- judging
class _Scripted(nn.Module):
    """Each forward returns the next row of ``preds`` as one-hot logits (a randomised model, scripted)."""

    def __init__(self, preds: list[list[int]], k: int = 3) -> None:
        super().__init__()
        self.preds, self.k, self.calls = preds, k, 0

    def forward(self, x):
        p = torch.tensor(self.preds[self.calls % len(self.preds)])
        self.calls += 1
        return torch.nn.functional.one_hot(p, self.k).float()


def test_judge_by_majority_exactly():
    y = torch.tensor([0, 0, 0, 0])
    model = _Scripted([[0, 1, 1, 2], [0, 1, 2, 0], [1, 1, 2, 0]])
    pred, wrong, unstable = judge(model, torch.zeros(4, 1), y, forwards=3)
    # sample 0: 0,0,1 -> right; 1: 1,1,1 -> wrong (1); 2: 1,2,2 -> wrong, class 2; 3: 2,0,0 -> right
    assert wrong.tolist() == [False, True, True, False]
    assert pred.tolist() == [0, 1, 2, 0]
    assert unstable.tolist() == [True, False, True, True]
    model = _Scripted([[1, 0, 0, 0], [2, 0, 0, 0]])
    pred, wrong, unstable = judge(model, torch.zeros(4, 1), y, forwards=2)  # 2 wrong votes of 2: wrong
    assert wrong.tolist() == [True, False, False, False] and pred.tolist()[0] in (1, 2)
    pred, wrong, unstable = judge(_Scripted([[1, 0, 0, 0]]), torch.zeros(4, 1), y, forwards=1)
    assert wrong.tolist() == [True, False, False, False] and not unstable.any()


# ------------------------------------------------------------------------------------------------- plans
def test_plans_of_the_new_versions():
    auto = ensemble_plan("auto", num_classes=10)
    assert [s[0] for s in auto] == ["apgd-ce", "apgd-t", "square-probe", "fab-t", "square", "square-long",
                                    "apgd-ce-long"]
    steps = ensemble_steps("auto", num_classes=10)
    assert [s.only for s in steps] == ["all", "all", "probe", "escalate", "escalate", "bad-gradient", "incomplete"]
    assert steps[2].params["queries"] == 1000 and steps[5].params["queries"] == 10000
    assert steps[1].params["n_targets"] == 3 and steps[3].params["n_targets"] == 9
    rand = ensemble_plan("rand", num_classes=10)
    assert [(s[0], s[2]["eot_iter"], s[2]["steps"]) for s in rand] == [("apgd-ce", 20, 100), ("apgd-dlr", 20, 100)]
    assert [s[0] for s in ensemble_plan("rand", num_classes=2)] == ["apgd-ce"]
    assert [s.name for s in ensemble_steps("gradient-free")] == ["square-long"]
    assert PROBE_SIZE == 100 and GRADIENT_FREE_SHARE == 0.01
    with pytest.raises(ConfigError, match="unknown version 'slow'"):
        ensemble_plan("slow")


def test_apgd_eot_of_a_deterministic_model_is_plain_apgd(trained_digits_model, sample):
    from robustest import attacks

    x, y = sample
    a = attacks.apgd(trained_digits_model, x[:16], y[:16], EPS, steps=10, seed=3)
    b = attacks.apgd(trained_digits_model, x[:16], y[:16], EPS, steps=10, seed=3, eot_iter=4)  # mean of 4 equal
    assert torch.equal(a, b)
    with pytest.raises(ConfigError, match="eot_iter must be a positive integer"):
        attacks.apgd(trained_digits_model, x[:2], y[:2], EPS, eot_iter=0)


# ------------------------------------------------------------------------------------------------- evaluate
def test_plain_model_raises_no_flag_and_auto_matches_fast(trained_digits_model, sample):
    fast = evaluate(trained_digits_model, sample, 0.05, version="fast")
    auto = evaluate(trained_digits_model, sample, 0.05)
    assert fast.flags == [] and auto.flags == [] and auto.reliable
    assert auto.version == "auto" and auto.plan == "auto" and auto.forwards == 1
    assert auto.robust_accuracy <= fast.robust_accuracy
    assert auto.settings["escalated_blocks"] in (0, 1)
    assert all(g == "ok" for g, c in zip(auto.gradient, auto.clean_correct.tolist()) if c)
    doc = auto.to_dict()
    assert doc["flags"] == [] and doc["reliable"] is True and doc["plan"] == "auto"


def test_shattered_gradients_are_flagged_and_auto_breaks_them(trained_digits_model, sample):
    model = Quantized(trained_digits_model, 3).eval()
    fast = evaluate(model, sample, 0.05, version="fast")  # small enough that many survive even Square's probe
    flags = _names(fast)
    assert flags["zero-gradient"] == "unreliable" and not fast.reliable and fast.robust_accuracy > 0.5
    zero = next(f for f in fast.flags if f.name == "zero-gradient")
    assert set(zero.samples) == set(fast.index[fast.robust].tolist())  # exactly the survivors
    assert fast.robustbench()["autoattack_acc"] is None
    fast = evaluate(model, sample, EPS, version="fast")
    assert _names(fast)["gradient-free-breaks"] == "unreliable"  # fast's probe broke what the gradients hid
    auto = evaluate(model, sample, EPS)
    assert auto.robust_accuracy <= 0.1  # Square broke what the zero gradients hid
    assert sum(v for k, v in auto.breaks.items() if k.startswith("square")) > 0
    assert auto.settings["escalated_blocks"] == 1  # the probe broke a sample: the standard rest was due
    assert auto.settings["blocks"] == 1  # 48 images, one block of the default size
    assert _names(auto)["gradient-free-breaks"] == "unreliable"
    assert all(g == "zero" for g, c in zip(auto.gradient, auto.clean_correct.tolist()) if c)
    rows = auto.rows()
    assert rows[0]["gradient"] in ("zero", "") and "flags" in rows[0]


def test_detached_denoiser_escalates_in_auto(trained_digits_model, sample):
    model = DetachedMedian(trained_digits_model, 3).eval()
    std = evaluate(model, sample, EPS, version="fast")
    assert "zero-gradient" in _names(std) and not std.reliable
    auto = evaluate(model, sample, EPS)
    assert auto.robust_accuracy <= std.robust_accuracy and "gradient-free-breaks" in _names(auto)


def test_randomised_model_gets_rand_and_majority(trained_digits_model, sample):
    torch.manual_seed(0)
    model = RandomShiftNoise(trained_digits_model, 1, 0.1).eval()
    fast = evaluate(model, sample, EPS, version="fast")
    assert _names(fast)["randomised"] == "unreliable" and fast.forwards == 11
    auto = evaluate(model, sample, EPS)
    assert auto.plan == "rand" and auto.forwards == 11 and _names(auto)["randomised"] == "warning"
    assert list(auto.attacks) == ["apgd-ce", "apgd-dlr"]
    assert auto.robustbench()["number_forward_passes"] == 11
    assert auto.settings["attacks"][0]["params"]["eot_iter"] == 20
    one = evaluate(model, sample, EPS, version="fast", forwards=1)
    assert one.forwards == 1
    for bad in (0, True, 2.0):  # a bool is no count, nor is a float
        with pytest.raises(ConfigError, match="forwards must be a positive integer"):
            evaluate(model, sample, EPS, forwards=bad)


def test_probability_outputs_are_attacked_as_log_probabilities(trained_digits_model, sample):
    plain = evaluate(trained_digits_model, sample, 0.1, version="fast")
    soft = evaluate(SoftmaxOutput(trained_digits_model), sample, 0.1, version="fast")
    assert _names(soft) == {"probability-output": "warning"} and soft.reliable
    assert abs(soft.robust_accuracy - plain.robust_accuracy) <= 2 / 48


def test_no_gradient_path_is_evaluated_gradient_free(trained_digits_model, sample):
    res = evaluate(NoGradPath(trained_digits_model), sample, EPS, version="fast")
    assert res.plan == "gradient-free" and list(res.attacks) == ["square-long"]
    assert _names(res) == {"no-gradient-path": "unreliable"}
    assert res.probe["gradient_path"] is False
    custom = evaluate(NoGradPath(trained_digits_model), sample, EPS, version="custom", attacks=["apgd-ce", "square"])
    assert custom.settings["skipped"]["apgd-ce"] == "the model has no gradient path to its input"
    assert custom.attacked["apgd-ce"] == 0


def test_saturated_logits_flag(trained_digits_model, sample):
    model = ScaledLogits(trained_digits_model, 1000.0).eval()
    ce_only = evaluate(model, sample, 0.02, version="custom", attacks=["apgd-ce"])
    sat = next(f for f in ce_only.flags if f.name == "saturated-logits")
    assert sat.severity == "unreliable" and sat.samples
    assert all(ce_only.robust[ce_only.index.tolist().index(i)] for i in sat.samples)
    assert f"above {SATURATED_MARGIN:g}" in sat.message
    fast = evaluate(model, sample, 0.02, version="fast")  # APGD-T is scale-invariant: no flag
    assert "saturated-logits" not in _names(fast)


def test_dynamic_defence_flag(sample):
    torch.manual_seed(0)
    res = evaluate(_BufferCounter(), sample, 0.05, version="fast")
    flag = next(f for f in res.flags if f.name == "dynamic-defence")
    assert flag.severity == "unreliable" and "buffer calls" in flag.message


def test_bpda_gives_a_cut_graph_its_gradient_path_back(sample):
    """A preprocessing step that cuts the graph leaves no input gradient: the evaluation falls back to gradient-free
    attacks and flags it; with BPDA over that step the probe finds the path and the gradient ensemble runs."""
    import collections

    class Detach(nn.Module):
        def forward(self, x):
            return x.detach()

    torch.manual_seed(0)
    model = nn.Sequential(collections.OrderedDict(pre=Detach(), net=nn.Sequential(nn.Flatten(),
                                                                                  nn.Linear(64, 10)))).eval()
    cut = evaluate(model, sample, EPS, version="fast", seed=0)
    assert (cut.plan, cut.probe["gradient_path"], list(_names(cut))) == ("gradient-free", False, ["no-gradient-path"])
    back = evaluate(model, sample, EPS, version="fast", seed=0, bpda="pre")
    assert (back.plan, back.probe["gradient_path"], back.flags) == ("fast", True, [])


def test_bpda_and_surrogate_break_the_quantised_model(trained_digits_model, sample):
    model = Quantized(trained_digits_model, 3).eval()
    bpda = evaluate(model, sample, EPS, version="fast", bpda="quant")
    assert bpda.flags == [] or "zero-gradient" not in _names(bpda)
    assert bpda.settings["bpda"] == "quant" and bpda.robust_accuracy < 0.3
    sur = evaluate(model, sample, EPS, version="fast", surrogate=trained_digits_model)
    assert "transfer" in sur.attacks and sur.breaks["transfer"] > 0
    assert _names(sur)["gradient-free-breaks"] == "unreliable"
    with pytest.raises(ConfigError, match="unknown submodule 'nope'"):
        evaluate(model, sample, EPS, bpda="nope")
    with pytest.raises(ConfigError, match="straight-through BPDA needs an output of the input's shape"):
        evaluate(trained_digits_model, sample, EPS, bpda="conv1", progress=True)  # refused before any attack


# ------------------------------------------------------------------------------------------------- gates
def test_assert_robust_fails_on_unreliable_unless_accepted(trained_digits_model, sample):
    model = Quantized(trained_digits_model, 3).eval()
    with pytest.raises(AssertionError, match="cannot be trusted: the evaluation is flagged unreliable "
                                             r"\(zero-gradient"):
        assert_robust(model, sample, eps=0.05, min_accuracy=0.0, attack="fast")
    accept = ["zero-gradient", "gradient-free-breaks"]
    res = assert_robust(model, sample, eps=0.05, min_accuracy=0.0, attack="fast", accept_flags=accept)
    assert not res.reliable


def _script(model: nn.Module, path: Path) -> str:
    torch.jit.script(model.eval()).save(str(path))
    return str(path)


def test_cli_gate_fails_on_a_masked_model(trained_digits_model, tmp_path: Path, capsys):
    ts = _script(Quantized(trained_digits_model, 3), tmp_path / "quant.ts")
    base = ["eval", "--torchscript", "--checkpoint", ts, "--dataset", "digits", "--limit", "48", "--eps", "0.05",
            "--version", "fast", "--fail-under", "0.5", "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err
    assert "robustest eval: flag unreliable zero-gradient:" in err
    assert "gate failed: the evaluation is flagged unreliable (zero-gradient" in err
    doc = json.loads((tmp_path / "a" / "results.json").read_text())
    assert doc["gate"]["passed"] is False and doc["gate"]["accuracy_passed"] is True
    assert doc["gate"]["blocking_flags"][0] == "zero-gradient" and doc["reliable"] is False
    assert doc["robust_accuracy"] >= 0.5  # the fooled figure, which the gate no longer passes
    accept = ",".join(doc["gate"]["blocking_flags"])
    assert main([*base, "--accept-flag", accept, "--out", str(tmp_path / "b")]) == 0
    doc = json.loads((tmp_path / "b" / "results.json").read_text())
    assert doc["gate"]["passed"] is True and doc["gate"]["accepted_flags"] == accept.split(",")
    assert doc["settings"]["accept_flag"] == accept.split(",")
    html = (tmp_path / "a" / "report.html").read_text()
    assert "flagged unreliable (zero-gradient" in html and "Checks" in html
    assert main([*base, "--accept-flag", "masked", "--out", str(tmp_path / "c")]) == 2
    assert "unknown flag 'masked'" in capsys.readouterr().err


def test_cli_no_gradient_path_is_not_an_internal_error(trained_digits_model, tmp_path: Path, capsys):
    ts = _script(NoGradPath(trained_digits_model), tmp_path / "nograd.ts")
    code = main(["eval", "--torchscript", "--checkpoint", ts, "--dataset", "digits", "--limit", "24", "--eps",
                 "0.1", "--out", str(tmp_path / "o"), "--no-progress"])
    assert code == 0
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    assert doc["plan"] == "gradient-free" and [f["name"] for f in doc["flags"]] == ["no-gradient-path"]
    assert "flag unreliable no-gradient-path" in capsys.readouterr().err


def test_progress_lines_when_stderr_is_not_a_terminal(mlp_digits_checkpoint, tmp_path: Path, capsys):
    assert main(["eval", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--limit", "20", "--eps",
                 "0.05", "--version", "fast", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "evaluate: apgd-ce on " in err and "evaluate: 20 of 20 samples done" in err
    assert main(["eval", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--limit", "20", "--eps",
                 "0.05", "--version", "fast", "--no-progress", "--out", str(tmp_path / "p")]) == 0
    assert "evaluate:" not in capsys.readouterr().err


def test_gradient_free_share_rule():
    from robustest.evaluate.findings import _gradient_free_flag
    from robustest.evaluate.runner import Tally

    steps = ensemble_steps("standard", num_classes=10)
    tally = Tally.start(steps)
    tally.attacked.update({"apgd-ce": 400, "apgd-t": 300, "fab-t": 300, "square": 300})
    code = torch.full((400,), -1)
    tally.breaks["square"] = 3  # 3 of 300 = 1 %: unreliable
    code[:3] = 3
    parts = {"code": code, "index": torch.arange(400)}
    (flag,) = _gradient_free_flag(parts, steps, tally)
    assert flag.severity == "unreliable" and flag.samples == (0, 1, 2) and "3 of the 300" in flag.message
    tally.breaks["square"] = 2  # 2 of 300 < 1 %: no flag (the breaks are in the per-attack table)
    code[2] = -1
    assert _gradient_free_flag({"code": code, "index": torch.arange(400)}, steps, tally) == []
    tally.attacked["square"], tally.breaks["square"] = 200, 1  # 1 of 200 = 0.5 %: no flag
    assert _gradient_free_flag({"code": code, "index": torch.arange(400)}, steps, tally) == []
    tally.attacked["square"], tally.breaks["square"] = 100, 1  # 1 of 100 = 1 % but a single break: no flag
    assert _gradient_free_flag({"code": code, "index": torch.arange(400)}, steps, tally) == []
    tally.attacked["square"], tally.breaks["square"] = 200, 2  # 2 of 200 = 1 % exactly: unreliable
    (flag,) = _gradient_free_flag({"code": code, "index": torch.arange(400)}, steps, tally)
    assert flag.severity == "unreliable" and math.isclose(2 / 200, GRADIENT_FREE_SHARE)


# ------------------------------------------------------------------------------------------------- curves
def test_robustness_curve_attacks_each_radius_on_the_survivors(trained_digits_model, sample):
    single = evaluate(trained_digits_model, sample, 0.05, version="fast")
    res = evaluate(trained_digits_model, sample, [0.1, 0.05], version="fast")  # sorted ascending
    assert [c["eps"] for c in res.curve] == [0.05, 0.1] and res.eps == 0.1
    assert res.curve[0]["robust_accuracy"] == single.robust_accuracy
    assert res.curve[1]["attacked"] == int(single.robust.sum())  # only the survivors of 0.05
    assert res.curve[1]["robust_accuracy"] <= res.curve[0]["robust_accuracy"]
    assert res.robust_accuracy == res.curve[-1]["robust_accuracy"] == float(res.robust.double().mean())
    assert not (res.robust & ~single.robust).any()  # robust at 0.1 implies robust at 0.05
    at = res.broken_at
    assert torch.equal(torch.isnan(at), res.robust)
    assert set(at[~torch.isnan(at)].tolist()) <= {0.0, 0.05, 0.1}
    assert int((at == 0.05).sum()) == int((single.clean_correct & ~single.robust).sum())
    assert res.settings["eps"] == [0.05, 0.1] and res.to_dict()["curve"][1]["eps"] == 0.1
    assert "broken_at_eps" in res.rows()[0]
    with pytest.raises(ConfigError, match="empty list"):
        evaluate(trained_digits_model, sample, [])


def test_cli_curve(mlp_digits_checkpoint, tmp_path: Path, results_contract):
    assert main(["eval", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--limit", "30", "--eps",
                 "0.1,0.05", "--version", "fast", "--no-progress", "--out", str(tmp_path / "o")]) == 0
    doc = results_contract(tmp_path / "o", "eval")
    assert [c["eps"] for c in doc["curve"]] == [0.05, 0.1] and doc["eps"] == 0.1
    assert doc["settings"]["eps"] == [0.05, 0.1]
    header = (tmp_path / "o" / "samples.csv").read_text().splitlines()[0]
    assert header.endswith("gradient,flags,broken_at_eps")
    assert "Robustness curve" in (tmp_path / "o" / "report.html").read_text()


def test_cli_bpda_and_surrogate(trained_digits_model, mlp_digits_checkpoint, tmp_path: Path, capsys):
    model = Quantized(trained_digits_model, 3).eval()
    weights = tmp_path / "q.pt"
    torch.save(model.state_dict(), weights)
    base = ["eval", "--model", "masked_zoo:quantized_digits_cnn", "--weights", str(weights), "--dataset", "digits",
            "--limit", "30", "--eps", "0.2", "--version", "fast", "--no-progress"]
    assert main([*base, "--bpda", "quant", "--out", str(tmp_path / "b")]) == 0
    doc = json.loads((tmp_path / "b" / "results.json").read_text())
    assert doc["settings"]["bpda"] == "quant" and "zero-gradient" not in [f["name"] for f in doc["flags"]]
    assert doc["robust_accuracy"] < 0.3
    assert main([*base, "--surrogate", mlp_digits_checkpoint, "--out", str(tmp_path / "s")]) == 0
    doc = json.loads((tmp_path / "s" / "results.json").read_text())
    assert "transfer" in doc["attacks"] and doc["settings"]["surrogate"] == mlp_digits_checkpoint
    assert main([*base, "--bpda", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown submodule 'nope'" in capsys.readouterr().err


def test_heartbeat_lines_during_a_long_step(monkeypatch, capsys):
    from robustest.evaluate import runner

    monkeypatch.setattr(runner, "HEARTBEAT_S", 0.05)
    status = runner._Status(True, 10)
    status.enabled = True
    with status.running("apgd-ce", 7):
        import time

        time.sleep(0.18)
    err = capsys.readouterr().err
    assert err.count("evaluate: apgd-ce still running on 7 samples") >= 2
    quiet = runner._Status(False, 10)
    with quiet.running("apgd-ce", 7):
        pass
    assert capsys.readouterr().err == ""


class _Decoy(nn.Module):
    """Forward: the trained model; backward: the gradient of an unrelated random network (a decoy backward pass:
    gradients neither zero nor useful)."""

    def __init__(self, real: nn.Module) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.real, self.decoy = real, nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

    def forward(self, x):
        d = self.decoy(x)
        return d + (self.real(x) - d).detach()


class _NoisyOffGrid(nn.Module):
    """Deterministic on images whose pixels are multiples of 1/16 (every digits image), random elsewhere: the
    probe on clean images sees no randomness, the adversarial points do."""

    def __init__(self, real: nn.Module) -> None:
        super().__init__()
        self.real = real

    def forward(self, x):
        z = self.real(x)
        off = ((x * 16 - torch.round(x * 16)).abs().flatten(1).amax(1) > 1e-4).float()[:, None]
        return z + off * 5 * torch.randn_like(z)


def test_decoy_gradients_are_caught_by_the_probe_in_fast(trained_digits_model, sample):
    model = _Decoy(trained_digits_model).eval()
    res = evaluate(model, sample, EPS, version="fast")
    assert "square-probe" in res.attacks and res.breaks["square-probe"] >= 2
    assert _names(res)["gradient-free-breaks"] == "unreliable" and not res.reliable
    assert "zero-gradient" not in _names(res)  # the decoy's gradients are neither zero nor useful
    plain = evaluate(trained_digits_model, sample, 0.05, version="fast")
    assert plain.flags == [] and plain.attacked.get("square-probe", 0) <= PROBE_SIZE


def test_randomness_off_the_data_is_caught_by_a_second_look(trained_digits_model, sample):
    torch.manual_seed(0)
    model = _NoisyOffGrid(trained_digits_model).eval()
    res = evaluate(model, sample, 0.1, version="fast")
    assert res.probe["randomised"] is False and res.forwards == 1
    flag = next(f for f in res.flags if f.name == "unstable-predictions")
    assert flag.severity == "unreliable" and flag.samples


def test_a_model_that_changes_while_attacked_is_dynamic(trained_digits_model, sample):
    class Drifting(nn.Module):
        def __init__(self, real):
            super().__init__()
            self.real = real
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x):
            if torch.is_grad_enabled():  # only attack passes move it, the probe's no-grad forwards do not
                self.seen += 1
            return self.real(x)

    res = evaluate(Drifting(trained_digits_model).eval(), sample, 0.05, version="fast")
    flag = next(f for f in res.flags if f.name == "dynamic-defence")
    assert flag.severity == "unreliable" and "(while attacked)" in flag.message


def test_measure_records_the_autoattack_flags(trained_digits_model, sample):
    from robustest.evaluate import measure

    plain = measure(trained_digits_model, sample, eps=0.05, autoattack=True, autoattack_version="fast",
                    whitebox_limit=24, pgd_steps=2, pgd_restarts=1, apgd_steps=2)
    assert plain.autoattack_flags == [] and plain.to_dict()["autoattack_flags"] == []
    masked = measure(Quantized(trained_digits_model, 3).eval(), sample, eps=EPS, autoattack=True,
                     autoattack_version="fast", whitebox_limit=24, pgd_steps=2, pgd_restarts=1, apgd_steps=2)
    assert [f["name"] for f in masked.autoattack_flags][:1] == ["zero-gradient"]
    assert measure(trained_digits_model, sample, eps=0.05, whitebox=False).autoattack_flags is None


# ------------------------------------------------------------------------------------------- incomplete runs
def test_apgd_trace_marks_losses_still_rising_at_the_end(monkeypatch):
    """Scripted losses over 20 steps (the tail is the last 2): sample 0 rises to the very end, sample 1 stops
    rising before the tail, sample 2 rises in the tail by less than 1e-3 of its whole rise, sample 3 by just
    more."""
    import importlib

    import torch.nn.functional as F

    apgd_mod = importlib.import_module("robustest.attacks.apgd")
    steps = 20
    t = torch.arange(steps + 1, dtype=torch.float32)
    script = torch.stack([t, torch.clamp(t, max=10.0), torch.clamp(t, max=18.0) + (t >= 19) * 0.005,
                          torch.clamp(t, max=18.0) + (t >= 19) * 0.05], dim=1)
    calls: list[int] = []

    def scripted(model, x, y, loss, target, hit_target):
        cur = script[len(calls)].clone()
        calls.append(1)
        return torch.zeros_like(x), F.one_hot(y, 3).float(), cur

    monkeypatch.setattr(apgd_mod, "_loss_grad", scripted)
    trace: dict = {}
    x = torch.full((4, 1, 2, 2), 0.5)
    apgd_mod._apgd_run(torch.nn.Identity(), x, torch.zeros(4, dtype=torch.long), torch.Generator().manual_seed(0),
                       eps=0.1, steps=steps, norm="linf", rho=0.75, trace=trace)
    # thresholds: 1e-3 * rise + 1e-6 = 0.020001 (sample 0), 0.010001, 0.018006, 0.018051
    assert trace["improving"].tolist() == [True, False, False, True]


def test_auto_reruns_apgd_ce_longer_where_its_loss_still_rose(trained_digits_model, sample):
    res = evaluate(trained_digits_model, sample, 0.1)
    steps = ensemble_steps("auto", num_classes=10)
    assert steps[0].params["return_trace"] is True and steps[-1].name == "apgd-ce-long"
    assert steps[-1].only == "incomplete" and steps[-1].params["steps"] == 300
    assert res.attacked.get("apgd-ce-long", 0) <= int(res.robust.sum()) + res.breaks.get("apgd-ce-long", 0)
    out = __import__("robustest").attacks.apgd(trained_digits_model, sample[0][:8], sample[1][:8], 0.1, steps=10,
                                               seed=0, return_trace=True)
    adv, improving = out
    assert adv.shape == sample[0][:8].shape and improving.dtype == torch.bool and improving.shape == (8,)


def test_incomplete_optimisation_flag_rule():
    from robustest.evaluate.findings import _incomplete_flag
    from robustest.evaluate.runner import Tally

    steps = ensemble_steps("auto", num_classes=10)
    k = [s.name for s in steps].index("apgd-ce-long")
    tally = Tally.start(steps)
    code = torch.full((300,), -1)
    parts = {"code": code, "index": torch.arange(300)}
    assert _incomplete_flag(parts, steps, tally) == []  # it never ran
    tally.attacked["apgd-ce-long"], tally.breaks["apgd-ce-long"] = 100, 1
    assert _incomplete_flag(parts, steps, tally) == []  # one break: no flag
    tally.breaks["apgd-ce-long"] = 2
    code[[4, 7]] = k
    (flag,) = _incomplete_flag(parts, steps, tally)
    assert flag.severity == "warning" and flag.samples == (4, 7) and "broke 2 of them" in flag.message
    tally.attacked["apgd-ce-long"] = 201  # 2 of 201 < 1 %
    assert _incomplete_flag(parts, steps, tally) == []


def test_flag_details_pinned(trained_digits_model, sample):
    """Exact texts and defaults a reader or a script relies on (survivors of a mutation run)."""
    assert Flag.from_dict({"name": "randomised", "severity": "info", "message": "m", "remedy": "r"}).samples == ()
    assert flag_lines([Flag("randomised", "info", "m", "r")]) == ["robustest: flag info randomised: m (remedy: r)"]
    with pytest.raises(ConfigError) as e:
        check_accepted("masked")
    assert str(e.value) == f"unknown flag 'masked' to accept: use one of {', '.join(FLAGS)}"
    quant = evaluate(Quantized(trained_digits_model, 3).eval(), sample, 0.05, version="fast")
    zero = next(f for f in quant.flags if f.name == "zero-gradient")
    n_zero = sum(1 for g in quant.gradient if g == "zero")
    assert zero.message == (f"the input gradient is exactly zero for {n_zero} samples, {int(quant.robust.sum())} of "
                            "which no attack broke")

    class NaNGradient(nn.Module):  # finite outputs, NaN input gradients (d sqrt(t)/dt at 0 times 0)
        def __init__(self, real):
            super().__init__()
            self.real = real

        def forward(self, x):
            return self.real(x) + torch.sqrt(x - x).sum((1, 2, 3))[:, None]

    res = evaluate(NaNGradient(trained_digits_model).eval(), sample, 0.02, version="fast")
    bad = next(f for f in res.flags if f.name == "non-finite-gradient")
    assert "the input gradient is NaN or infinite for" in bad.message
    assert set(res.gradient) <= {"non-finite", ""}


def test_a_two_class_model_is_evaluated():
    """Two logits are the fewest evaluate takes (one logit is refused)."""
    torch.manual_seed(0)
    x = torch.rand(8, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1] * 4)
    res = evaluate(nn.Sequential(nn.Flatten(), nn.Linear(16, 2)).eval(), (x, y), 0.05, version="fast")
    assert res.settings["num_classes"] == 2 and len(res.robust) == 8
    with pytest.raises(ConfigError, match="at least 2 classes"):
        evaluate(nn.Sequential(nn.Flatten(), nn.Linear(16, 1)).eval(), (x, y * 0), 0.05, version="fast")


def test_a_list_of_radii_hands_every_argument_to_the_curve(monkeypatch):
    import importlib

    ens = importlib.import_module("robustest.evaluate.ensemble")
    seen = {}

    def curve(model, data, radii, kw, extra):
        seen.update(kw, radii=radii, **extra)
        return "curve"

    monkeypatch.setattr(ens, "_evaluate_curve", curve)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3)).eval()
    sentinel = object()
    args = dict(norm="l2", version="standard", attacks=["apgd-ce"], n_targets=2, seed=5, batch_size=7, block_size=9,
                keep_adv=True, progress=True, amp="bf16", bpda={"0": "identity"}, surrogate=sentinel, forwards=3,
                corruptions=["fog"], severities=[2], baseline=sentinel)
    assert evaluate(model, (torch.zeros(2, 1, 2, 2), torch.tensor([0, 1])), [0.1, 0.2], **args) == "curve"
    assert seen == {**args, "radii": [0.1, 0.2]}
