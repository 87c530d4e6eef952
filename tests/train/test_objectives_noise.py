"""The ``gaussian-noise`` objective (Cohen et al.'s training for randomised smoothing): its step is the
cross-entropy on ``x + sigma * e`` with e drawn from the step's generator (sigma 0: exactly the plain
cross-entropy), its option is checked and owned like the built-ins', and harden runs it without an attack."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from robustest.core.errors import ConfigError
from robustest.core.modelcall import forward
from robustest.core.seeding import make_generator
from robustest.train import harden, harden_settings, objectives
from robustest.train.objectives import StepContext


@pytest.fixture
def few_digits(digits_train):
    x, y = digits_train.tensors
    return x[:64], y[:64]


def _step(model, x, y, sigma, gen):
    return objectives.get("gaussian-noise").step(model, x, y, gen, StepContext({"sigma": sigma}))


def test_sigma_zero_is_exactly_the_cross_entropy(digits_model, few_digits):
    x, y = few_digits
    torch.manual_seed(7)  # the model's dropout draws from the global generator
    out = _step(digits_model, x, y, 0.0, make_generator(1))
    assert digits_model.training  # the update runs in train mode
    torch.manual_seed(7)
    logits = forward(digits_model, x)
    assert torch.equal(out.logits, logits) and torch.equal(out.loss, F.cross_entropy(logits, y))
    assert out.compute.train_forward == out.compute.train_backward == 64 and out.compute.attack_forward == 0
    assert out.evals.dtype == torch.int64 and torch.equal(out.evals, torch.zeros(64, dtype=torch.long))


def test_the_noise_comes_from_the_step_s_generator(digits_model, few_digits):
    x, y = few_digits
    model = digits_model.eval()
    model.dropout.p = 0.0  # deterministic forward passes: only the noise varies
    a = _step(model, x, y, 0.25, make_generator(3))
    b = _step(model, x, y, 0.25, make_generator(3))
    c = _step(model, x, y, 0.25, make_generator(4))
    assert torch.equal(a.loss, b.loss) and not torch.equal(a.loss, c.loss)
    # the loss is the cross-entropy on x + sigma * N(0, I), unclipped, the noise drawn in one call from the generator
    noise = torch.randn(x.shape, generator=make_generator(3))
    noisy = x + noise.mul_(0.25)
    assert float(noisy.min()) < 0.0  # not clipped to [0, 1]
    assert torch.equal(a.logits, forward(model, noisy)) and torch.equal(a.loss, F.cross_entropy(a.logits, y))
    a.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_the_method_and_its_sigma_option_are_registered(digits_model):
    assert "gaussian-noise" in objectives.names() and objectives.get("gaussian_noise").harden_method
    s = harden_settings("gaussian-noise", eps=0.1)
    assert s["sigma"] == 0.25 and s["method"] == "gaussian-noise"
    assert harden_settings("gaussian-noise", eps=0.1, sigma=0.5)["sigma"] == 0.5
    with pytest.raises(ConfigError, match=r"^sigma must be a number >= 0, got -0.1$"):
        harden_settings("gaussian-noise", eps=0.1, sigma=-0.1)
    with pytest.raises(ConfigError, match="sigma must be a finite number"):
        harden_settings("gaussian-noise", eps=0.1, sigma=float("inf"))
    with pytest.raises(ConfigError, match="sigma applies to method gaussian-noise only, not 'pgd-at'"):
        harden_settings("pgd-at", eps=0.1, sigma=0.5)


def test_harden_trains_with_gaussian_noise_without_an_attack(digits_model, few_digits):
    model = copy.deepcopy(digits_model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = harden(model, few_digits, "gaussian-noise", eps=0.1, epochs=2, batch_size=32, sigma=0.3, seed=2)
    assert res.method == "gaussian-noise" and res.settings["sigma"] == 0.3
    assert res.compute["passes"] == pytest.approx(2 * 64) and res.compute["attack_passes"] == 0
    assert all(e["attack_evals_mean"] == 0 for e in res.epochs) and not model.training
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    again = copy.deepcopy(digits_model)
    harden(again, few_digits, "gaussian-noise", eps=0.1, epochs=2, batch_size=32, sigma=0.3, seed=2)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    other = copy.deepcopy(digits_model)
    harden(other, few_digits, "gaussian-noise", eps=0.1, epochs=2, batch_size=32, sigma=0.0, seed=2)
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
