"""The GPU hot-path switches, checked on the CPU: ``--amp`` for score's logit metrics and eval's clean pass,
channels_last in ``modelcall.forward`` (forced on the CPU: same values), and the ``--batch-size auto`` probe
(its logic with an injected try function that runs out of memory above a size). CUDA tests skip without
a GPU; ``benchmarks/gpu_checks.sh`` times the switches on one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from robustest import metrics
from robustest.cli import main
from robustest.core import batchsize, devices, modelcall
from robustest.core.errors import ConfigError
from robustest.evaluate import evaluate
from robustest.metrics.scoring import AMP_METRICS, score

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


pytestmark = pytest.mark.usefixtures("one_thread")  # two shared cores: one intra-op thread


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, _trained_digits_session) -> Path:
    from robustest.models.checkpoints import save_checkpoint

    path = tmp_path_factory.mktemp("model") / "model.pt"
    save_checkpoint(path, _trained_digits_session)
    return path


# ------------------------------------------------------------------------------------------------ amp
@pytest.mark.parametrize("metric", ["gini", "entropy", "margin", "max_prob", "zol"])
def test_score_bf16_follows_float32(trained_digits_model, digits_test, metric) -> None:
    x, y = digits_test.tensors[0][:200], digits_test.tensors[1][:200]
    full = score(trained_digits_model, (x, y), metric, batch_size=64)
    half = score(trained_digits_model, (x, y), metric, batch_size=64, amp="bf16")
    assert torch.equal(full.index, half.index) and half.scores.dtype == torch.float32
    assert not torch.equal(full.scores, half.scores)  # bf16 rounding did happen
    # the logits rounded to bf16 (8 bits of mantissa): scores within a few hundredths, the same ranking
    assert (full.scores - half.scores).abs().mean() < 0.02
    rank = torch.corrcoef(torch.stack([full.scores.argsort().argsort().float(),
                                       half.scores.argsort().argsort().float()]))[0, 1]
    assert rank > 0.98


def test_score_amp_refusals(trained_digits_model, digits_test) -> None:
    x, y = digits_test.tensors[0][:16], digits_test.tensors[1][:16]
    assert set(AMP_METRICS) == set(metrics.names("uncertainty")) | {"zol"}
    with pytest.raises(ConfigError, match="fol needs input gradients in float32: drop amp"):
        score(trained_digits_model, (x, y), "fol", amp="bf16")
    with pytest.raises(ConfigError, match="kmnc needs layer activations"):
        score(trained_digits_model, (x, y), "kmnc", train=(x, y), amp="bf16")
    with pytest.raises(ConfigError, match="fp16' needs CUDA"):
        score(trained_digits_model, (x, y), "gini", amp="fp16")
    with pytest.raises(ConfigError, match="unknown amp"):
        score(trained_digits_model, (x, y), "gini", amp="int8")


def test_evaluate_clean_pass_in_bf16(trained_digits_model, digits_test) -> None:
    x, y = digits_test.tensors[0][:150], digits_test.tensors[1][:150]
    kw = {"version": "custom", "attacks": ["fgsm"], "batch_size": 64}
    full = evaluate(trained_digits_model, (x, y), 0.1, **kw)
    half = evaluate(trained_digits_model, (x, y), 0.1, amp="bf16", **kw)
    assert half.settings["amp"] == "bf16" and "amp" not in full.settings
    # the clean predictions of bf16 logits agree with float32 but for samples on the decision boundary
    assert (full.clean_pred == half.clean_pred).float().mean() >= 0.97
    assert abs(full.clean_accuracy - half.clean_accuracy) <= 0.03
    assert abs(full.robust_accuracy - half.robust_accuracy) <= 0.03  # the attack itself runs in float32
    with pytest.raises(ConfigError, match="fp16' needs CUDA"):
        evaluate(trained_digits_model, (x, y), 0.1, amp="fp16", **kw)


@cuda
@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_score_and_eval_amp_on_cuda(trained_digits_model, digits_test, amp) -> None:
    if amp == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    x, y = digits_test.tensors[0][:200], digits_test.tensors[1][:200]
    model = trained_digits_model.cuda()
    full = score(model, (x, y), "entropy", batch_size=64)
    half = score(model, (x, y), "entropy", batch_size=64, amp=amp)
    assert half.scores.dtype == torch.float32 and (full.scores - half.scores).abs().mean() < 0.02
    kw = {"version": "custom", "attacks": ["fgsm"], "batch_size": 64}
    e_full = evaluate(model, (x, y), 0.1, **kw)
    e_half = evaluate(model, (x, y), 0.1, amp=amp, **kw)
    assert (e_full.clean_pred == e_half.clean_pred).float().mean() >= 0.97


def test_cli_score_amp(ckpt, tmp_path, capsys, results_contract) -> None:
    base = ["score", "--checkpoint", str(ckpt), "--dataset", "digits", "--limit", "120", "--no-progress",
            "--metric", "gini"]
    assert main([*base, "--out", str(tmp_path / "f")]) == 0
    assert main([*base, "--amp", "bf16", "--out", str(tmp_path / "h")]) == 0
    doc = results_contract(tmp_path / "h", "score")
    assert doc["settings"]["amp"] == "bf16" and "amp" not in results_contract(tmp_path / "f", "score")["settings"]
    f = torch.load(tmp_path / "f" / "scores.pt", weights_only=True)["scores"]
    h = torch.load(tmp_path / "h" / "scores.pt", weights_only=True)["scores"]
    assert (f - h).abs().mean() < 0.02
    capsys.readouterr()
    assert main([*base[:-1], "fol", "--amp", "bf16", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--metric fol needs input gradients in float32: drop --amp" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x" / "results.json").exists()
    assert main([*base, "--amp", "fp16", "--out", str(tmp_path / "y")]) == 2
    assert "fp16' needs CUDA" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse's choices
        main([*base, "--amp", "fp8", "--out", str(tmp_path / "z")])
    assert exc.value.code == 2 and "invalid choice: 'fp8'" in capsys.readouterr().err


def test_cli_eval_amp(ckpt, tmp_path, capsys, results_contract) -> None:
    base = ["eval", "--checkpoint", str(ckpt), "--dataset", "digits", "--eps", "0.1", "--version", "custom",
            "--attacks", "fgsm", "--limit", "60", "--no-progress"]
    assert main([*base, "--amp", "bf16", "--out", str(tmp_path / "e")]) == 0
    doc = results_contract(tmp_path / "e", "eval")
    assert doc["settings"]["amp"] == "bf16" and doc["attack_settings"]["amp"] == "bf16"
    capsys.readouterr()
    assert main([*base, "--amp", "fp16", "--out", str(tmp_path / "g")]) == 2
    assert "fp16' needs CUDA" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ channels_last
class _Dense(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def test_channels_last_decision(monkeypatch, digits_model) -> None:
    monkeypatch.delenv("ROBUSTEST_CHANNELS_LAST", raising=False)
    dense = _Dense()
    # auto: CUDA conv nets only (the decision itself needs no GPU)
    assert not devices.channels_last_wanted(digits_model, "cpu")
    assert not devices.channels_last_wanted(digits_model, "cpu", "off")
    assert not devices.channels_last_wanted(dense, "cuda", "on")  # no Conv2d: nothing to gain
    assert not devices.channels_last_wanted(digits_model, "cuda", "off")
    ddp_like = nn.parallel.DistributedDataParallel.__new__(nn.parallel.DistributedDataParallel)
    nn.Module.__init__(ddp_like)
    ddp_like.module = nn.Conv2d(1, 1, 3)
    assert not devices.channels_last_wanted(ddp_like, "cuda", "on")  # DDP's buckets keep their layout
    conv = digits_model.features[0] if hasattr(digits_model, "features") else next(
        m for m in digits_model.modules() if isinstance(m, nn.Conv2d))
    assert conv.weight.is_contiguous()
    assert devices.channels_last_wanted(digits_model, "cuda", "auto")  # converts the model once
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    monkeypatch.setenv("ROBUSTEST_CHANNELS_LAST", "sideways")
    with pytest.raises(ConfigError, match="unknown channels_last mode 'sideways'"):
        devices.channels_last_wanted(digits_model, "cpu")


def test_channels_last_forced_on_the_cpu_keeps_outputs(monkeypatch, trained_digits_model, digits_test) -> None:
    import copy

    x = digits_test.tensors[0][:64]
    plain = copy.deepcopy(trained_digits_model)
    monkeypatch.setenv("ROBUSTEST_CHANNELS_LAST", "off")
    with torch.no_grad():
        ref = modelcall.forward(plain, x)
    seen: list[bool] = []
    first = next(m for m in trained_digits_model.modules() if isinstance(m, nn.Conv2d))
    first.register_forward_pre_hook(lambda m, a: seen.append(a[0].is_contiguous(memory_format=torch.channels_last)))
    monkeypatch.setenv("ROBUSTEST_CHANNELS_LAST", "on")
    with torch.no_grad():
        out = modelcall.forward(trained_digits_model, x)
    assert seen == [True] and first.weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # gradients to the input (the attacks' hot path) are unchanged too
    xg = x.clone().requires_grad_(True)
    modelcall.forward(trained_digits_model, xg).logsumexp(1).sum().backward()
    xr = x.clone().requires_grad_(True)
    modelcall.forward(plain, xr).logsumexp(1).sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad, rtol=1e-4, atol=1e-6)
    # and a whole verb's results: the scores of score()
    monkeypatch.setenv("ROBUSTEST_CHANNELS_LAST", "on")
    on = score(trained_digits_model, (x, digits_test.tensors[1][:64]), "fol", batch_size=32)
    monkeypatch.setenv("ROBUSTEST_CHANNELS_LAST", "off")
    off = score(plain, (x, digits_test.tensors[1][:64]), "fol", batch_size=32)
    torch.testing.assert_close(on.scores, off.scores, rtol=1e-4, atol=1e-6)


def test_channels_last_conversion_under_inference_mode_keeps_autograd(monkeypatch, digits_model) -> None:
    monkeypatch.setenv("ROBUSTEST_CHANNELS_LAST", "on")
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():  # the first call, which converts the model, is an inference-mode one
        modelcall.forward(digits_model, x)
    xg = x.clone().requires_grad_(True)
    modelcall.forward(digits_model, xg).sum().backward()  # the weights are not inference tensors
    assert xg.grad is not None and torch.isfinite(xg.grad).all()


@cuda
def test_channels_last_is_automatic_on_cuda(monkeypatch, trained_digits_model, digits_test) -> None:
    monkeypatch.delenv("ROBUSTEST_CHANNELS_LAST", raising=False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # full float32 convolutions to compare
    x = digits_test.tensors[0][:64].cuda()
    model = trained_digits_model.cuda()
    with torch.no_grad():
        out = modelcall.forward(model, x)
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        ref = modelcall.forward(trained_digits_model.cpu(), digits_test.tensors[0][:64])
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-3, atol=1e-3)


# -------------------------------------------------------------------------------------------- probe
def _oom_above(limit: int, log: list[int]):
    def attempt(n: int) -> None:
        log.append(n)
        if n > limit:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} MiB")

    return attempt


def test_probe_doubles_until_out_of_memory() -> None:
    tried: list[int] = []
    freed: list[int] = []
    got = batchsize.probe_batch_size(_oom_above(1000, tried), 256, 1 << 20, free=lambda: freed.append(1))
    assert tried == [256, 512, 1024] and len(freed) == 3  # memory freed after every try, failed or not
    assert got == int(512 * batchsize.SAFETY) == 409


def test_probe_halves_when_the_start_does_not_fit_and_stops_at_the_cap() -> None:
    tried: list[int] = []
    assert batchsize.probe_batch_size(_oom_above(100, tried), 256, 4096) == 51  # 64 fitted: 0.8 x 64
    assert tried == [256, 128, 64]
    tried.clear()
    assert batchsize.probe_batch_size(_oom_above(10**9, tried), 256, 3000) == 3000  # the cap fits: kept whole
    assert tried == [256, 512, 1024, 2048, 3000]
    tried.clear()
    assert batchsize.probe_batch_size(_oom_above(10**9, tried), 256, 100) == 100 and tried == [100]
    assert batchsize.probe_batch_size(_oom_above(1, []), 8, 64) == 1  # max(1, 0.8)
    with pytest.raises(ConfigError, match="one image does not fit"):
        batchsize.probe_batch_size(_oom_above(0, []), 4, 64)


def test_probe_lets_other_errors_through() -> None:
    def broken(n: int) -> None:
        raise ValueError("shape mismatch")

    with pytest.raises(ValueError, match="shape mismatch"):
        batchsize.probe_batch_size(broken, 4, 64)
    assert batchsize.is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not batchsize.is_out_of_memory(RuntimeError("size mismatch"))
    with pytest.raises(ConfigError, match="safety"):
        batchsize.probe_batch_size(broken, 4, 64, safety=1.5)


def test_auto_batch_size_on_the_cpu_is_the_default(digits_model, digits_test) -> None:
    for grad in (False, True):
        assert batchsize.auto_batch_size("auto", digits_model, digits_test, default=256, grad=grad) == 256
    assert batchsize.auto_batch_size(64, digits_model, digits_test, default=256, grad=True) == 64
    assert batchsize.auto_batch_size(None, digits_model, digits_test, default=300, grad=True) == 300
    with pytest.raises(ConfigError, match="positive integer or 'auto'"):
        batchsize.auto_batch_size("big", digits_model, digits_test, default=256, grad=True)


def test_analysis_default_batch_size(digits_test) -> None:
    from robustest import weakrobust as wr

    assert wr.default_batch_size(digits_test) == 2**22 // 64
    assert wr.default_batch_size(torch.zeros(2, 1, 28, 28)) == 5349
    assert wr.default_batch_size(torch.zeros(2, 3, 64, 64)) == 341


@cuda
def test_auto_batch_size_on_cuda_fits(trained_digits_model, digits_test) -> None:
    model = trained_digits_model.cuda()
    cap = 1 << 14
    for grad in (False, True):
        got = batchsize.auto_batch_size("auto", model, digits_test, default=256, grad=grad, cap=cap)
        assert got == cap  # a tiny conv net on 8 x 8 images fits the cap either way
    torch.cuda.empty_cache()


@pytest.mark.parametrize("verb", ["score", "eval", "generate", "analyze"])
def test_cli_batch_size_auto(verb, ckpt, tmp_path, capsys, results_contract) -> None:
    common = ["--checkpoint", str(ckpt), "--dataset", "digits", "--limit", "40", "--no-progress",
              "--batch-size", "auto", "--out", str(tmp_path / verb)]
    extra = {"score": ["--metric", "fol"], "eval": ["--eps", "0.1", "--version", "custom", "--attacks", "fgsm"],
             "generate": ["--method", "fgsm", "--eps", "0.1"], "analyze": ["--neighbors", "2"]}[verb]
    assert main([verb, *common, *extra]) == 0
    assert "--batch-size auto: " in capsys.readouterr().out
    s = results_contract(tmp_path / verb, verb)["settings"]
    want = 2**22 // 64 if verb == "analyze" else 256  # the CPU's rule: the verb's default
    assert s["batch_size"] == want and s["batch_size_auto"] is True
    with pytest.raises(SystemExit) as exc:
        main([verb, *common[:-1], str(tmp_path / "bad"), *extra, "--batch-size", "lots"])
    assert exc.value.code == 2 and "expected a positive integer, got 'lots'" in capsys.readouterr().err


def test_cli_batch_size_number_is_not_auto(ckpt, tmp_path, results_contract) -> None:
    assert main(["score", "--checkpoint", str(ckpt), "--dataset", "digits", "--limit", "20", "--no-progress",
                 "--metric", "gini", "--batch-size", "8", "--out", str(tmp_path / "s")]) == 0
    s = json.loads((tmp_path / "s" / "results.json").read_text())["settings"]
    assert s["batch_size"] == 8 and "batch_size_auto" not in s
