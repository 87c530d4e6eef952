"""Tests of robustest.attacks.bpda: BPDA's value (module's, bit for bit) and gradient (approx's), the
straight-through case, with_bpda's copy (shared parameters, original untouched, refusals) and PGD through it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from robustest import attacks
from robustest.attacks import BPDA, straight_through, with_bpda
from robustest.core.errors import ConfigError


class Q(nn.Module):
    """Quantisation to thirds: piecewise constant, so its input gradient is zero everywhere."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.round(3 * x) / 3


class Scale(nn.Module):
    """x -> s * x with a learnable s (an approximation with a parameter)."""

    def __init__(self, s: float) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.tensor(s))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.s * x


def _xw(shape=(4, 1, 4, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g).requires_grad_(True)
    w = torch.randn(shape, generator=g)
    return x, w


def _grad(f, x, w):
    (g,) = torch.autograd.grad((w * f(x)).sum(), x)
    return g


def _qnet() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(Q(), nn.Flatten(), nn.Linear(16, 3)).eval()


# --------------------------------------------------------------------------------------------------- BPDA
def test_quantiser_has_zero_gradient():
    x, w = _xw()
    assert torch.equal(_grad(Q(), x, w), torch.zeros_like(x))


def test_straight_through_value_and_gradient_exact():
    x, w = _xw()
    st = straight_through(Q())
    assert isinstance(st, BPDA) and st.identity
    out = st(x)
    assert out.shape == (4, 1, 4, 4)
    assert torch.equal(out, torch.round(3 * x) / 3)
    assert torch.equal(_grad(st, x, w), w)
    assert torch.equal(_grad(BPDA(Q(), "identity"), x, w), w)
    assert torch.equal(_grad(BPDA(Q(), None), x, w), w)


def test_callable_approx_gives_its_gradient():
    x, w = _xw()
    b = BPDA(Q(), lambda t: 2 * t)
    assert torch.equal(b(x), torch.round(3 * x) / 3)
    assert torch.equal(_grad(b, x, w), 2 * w)


def test_module_approx_gives_its_gradient_and_gets_its_parameter_gradient():
    x, w = _xw()
    torch.manual_seed(0)
    conv = nn.Conv2d(1, 1, 3, padding=1)
    b = BPDA(Q(), conv)
    assert b.approx is conv and dict(b.named_modules())["approx"] is conv
    assert torch.equal(_grad(b, x, w), _grad(conv, x, w))
    scale = Scale(0.5)
    out = BPDA(Q(), scale)(x)
    (w * out).sum().backward()
    assert torch.equal(x.grad, 0.5 * w)
    assert torch.allclose(scale.s.grad, (w * x).sum())  # d/ds of sum(w * s * x)


def test_value_is_module_value_bit_for_bit_unlike_a_plus_detached_difference():
    x, w = _xw()
    approx = lambda t: 1e8 * t  # noqa: E731 - a surrogate of large magnitude: a + (m - a) loses m's low bits
    m = Q()(x)
    naive = approx(x) + (m - approx(x)).detach()
    assert not torch.equal(naive, m)
    b = BPDA(Q(), approx)
    assert torch.equal(b(x), m)
    assert torch.equal(_grad(b, x, w), 1e8 * w)


def test_module_parameters_untouched_and_get_no_gradient():
    torch.manual_seed(0)
    conv = nn.Conv2d(1, 1, 3, padding=1)
    before = [p.detach().clone() for p in conv.parameters()]
    x, w = _xw()
    out = straight_through(conv)(x)
    assert torch.equal(out, conv(x))
    (w * out).sum().backward()
    assert torch.equal(x.grad, w)
    for p, b in zip(conv.parameters(), before):
        assert p.requires_grad and p.grad is None and torch.equal(p, b)


def test_no_grad_and_no_input_gradient_run_the_module_only():
    x, _ = _xw()
    with torch.no_grad():
        out = straight_through(Q())(x)
    assert out.grad_fn is None and torch.equal(out, torch.round(3 * x) / 3)
    out = BPDA(Q(), lambda t: 2 * t)(x.detach())
    assert not out.requires_grad and torch.equal(out, torch.round(3 * x.detach()) / 3)


def test_inplace_layer_after_bpda_and_module_returning_its_input():
    x, w = _xw()
    net = nn.Sequential(straight_through(nn.Identity()), nn.ReLU(inplace=True))
    assert torch.equal(net(x), x)
    assert torch.equal(_grad(net, x, w), w)  # x > 0: ReLU passes the gradient


def test_shape_mismatch_is_a_config_error_naming_the_shapes():
    x, _ = _xw((2, 1, 4, 4))
    with pytest.raises(ConfigError, match=r"maps 2x1x4x4 to 2x16"):
        straight_through(nn.Flatten())(x)
    with pytest.raises(ConfigError, match=r"maps 2x1x4x4 to 2x16"):
        with torch.no_grad():
            straight_through(nn.Flatten())(x)
    with pytest.raises(ConfigError, match=r"module returns 2x1x4x4, approx returns 2x16"):
        BPDA(Q(), lambda t: t.flatten(1))(x)
    with pytest.raises(ConfigError, match="unknown BPDA approximation 'smooth'"):
        BPDA(Q(), "smooth")
    with pytest.raises(ConfigError, match="must be 'identity', an nn.Module or a callable"):
        BPDA(Q(), 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_value_and_gradient():
    x, w = (t.cuda() for t in _xw())
    x = x.detach().requires_grad_(True)
    b = BPDA(Q(), lambda t: 2 * t)
    out = b(x)
    assert out.device == x.device and torch.equal(out, torch.round(3 * x) / 3)
    assert torch.equal(_grad(b, x, w), 2 * w)
    net = with_bpda(_qnet().cuda(), "0")
    g = _grad(net, x, torch.ones(4, 3, device="cuda"))
    assert g.device == x.device and bool(g.abs().sum() > 0)


# ---------------------------------------------------------------------------------------------- with_bpda
def test_with_bpda_value_gradient_and_shared_parameters():
    model = _qnet()
    model.robustest_spec = {"num_classes": 3}
    q = model[0]
    new = with_bpda(model, "0")
    assert new is not model and isinstance(new[0], BPDA) and new[0].identity
    assert model[0] is q and isinstance(model[0], Q)  # the original is left unchanged
    assert new.robustest_spec == {"num_classes": 3}
    x, _ = _xw()
    w = torch.randn(4, 3, generator=torch.Generator().manual_seed(3))
    assert torch.equal(new(x), model(x))
    assert torch.equal(_grad(model, x, w), torch.zeros_like(x))
    g = _grad(new, x, w)
    assert bool(g.abs().sum() > 0)
    assert torch.equal(g, _grad(lambda t: model[2](model[1](t)), x, w))
    for p1, p2 in zip(model.parameters(), new.parameters(), strict=True):
        assert p1 is p2
    with torch.no_grad():
        model[2].weight.mul_(2)  # a weight change is seen by both
    assert torch.equal(new(x), model(x))
    new.train()
    assert not model.training and not model[2].training  # modes are the copy's own


def test_with_bpda_name_forms_and_approximations():
    model = nn.Sequential(nn.Sequential(Q(), Q()), nn.Flatten(), nn.Linear(16, 3))
    for parts in ("0.0,0.1", ["0.0", "0.1"], {"0.0": "identity", "0.1": "identity"}, " 0.0 , 0.1 "):
        new = with_bpda(model, parts)
        assert isinstance(new[0][0], BPDA) and isinstance(new[0][1], BPDA)
        assert isinstance(model[0][0], Q) and isinstance(model[0][1], Q)
    x, _ = _xw()
    w = torch.randn(4, 1, 4, 4, generator=torch.Generator().manual_seed(5))
    new = with_bpda(model, {"0": lambda t: 2 * t})
    assert torch.equal(_grad(new[0], x, w), 2 * w)
    nested = with_bpda(model, {"0": Scale(0.5), "0.1": "identity"})  # both apply, deepest first
    assert isinstance(nested[0], BPDA) and isinstance(nested[0].module[1], BPDA)
    assert torch.equal(_grad(nested[0], x, w), 0.5 * w)
    assert torch.equal(nested(x), model(x))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.script is deprecated in 2.13
def test_with_bpda_refusals():
    model = _qnet()
    with pytest.raises(ConfigError, match=r"unknown submodule 'quant' for BPDA: the model's submodules are 0, 1, 2$"):
        with_bpda(model, "quant")
    big = nn.Sequential(*[nn.Identity() for _ in range(12)])
    with pytest.raises(ConfigError, match=r"are 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 \(and 2 more\)"):
        with_bpda(big, ["12"])
    for whole in ("", {"": "identity"}, ["0", ""]):
        with pytest.raises(ConfigError, match="cannot wrap the whole model"):
            with_bpda(model, whole)
    with pytest.raises(ConfigError, match="at least one submodule"):
        with_bpda(model, [])
    with pytest.raises(ConfigError, match="unknown BPDA approximation 'smooth' for submodule '0'"):
        with_bpda(model, {"0": "smooth"})
    with pytest.raises(ConfigError, match=r"needs a Python nn.Module.*--model pkg.module:factory"):
        with_bpda(torch.jit.script(model), "0")
    inner = nn.Sequential(torch.jit.script(nn.Sequential(Q(), nn.Identity())), nn.Flatten())
    with pytest.raises(ConfigError, match="inside a TorchScript module"):
        with_bpda(inner, "0.0")
    assert isinstance(with_bpda(inner, "0")[0], BPDA)  # a TorchScript submodule itself can be wrapped


def test_pgd_breaks_more_with_bpda_than_on_the_quantised_model():
    model = _qnet()
    x = torch.rand(64, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = model(x).argmax(1)  # every sample correct clean
    adv0 = attacks.pgd(model, x, y, eps=0.3, steps=10, random_start=False)
    assert torch.equal(adv0, x)  # zero gradient: PGD does not move
    new = with_bpda(model, "0")

    def broken(m: nn.Module) -> int:
        adv = attacks.pgd(m, x, y, eps=0.3, steps=10, seed=0)
        assert float((adv - x).abs().max()) <= 0.3 + 1e-6
        with torch.no_grad():
            return int((model(adv).argmax(1) != y).sum())

    b0, b1 = broken(model), broken(new)
    assert b0 == broken(model) and b1 == broken(new)  # deterministic with a seed
    assert b0 <= 8 and b1 >= 48 and b1 > b0, (b0, b1)
