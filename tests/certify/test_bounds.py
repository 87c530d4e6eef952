"""Bound propagation (robustest.certify: ibp, crown, margin_bounds): exact values on hand-built nets, soundness
against sampled points and attacks on random nets of every supported layer, the patch form against the dense
propagation, and the refusals."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import robustest.certify.backward as backward_module
from robustest import models
from robustest.attacks import pgd
from robustest.certify import SUPPORTED, Certificate, check_certifiable, crown, ibp, margin_bounds, margin_spec
from robustest.core.errors import ConfigError, DataError


def _two_layer(relu: bool) -> nn.Module:
    """x (1 x 1 x 2) -> h = (x1 + x2, x1 - x2) -> [relu] -> z = (h1 + h2, 0)."""
    first = nn.Linear(2, 2)
    second = nn.Linear(2, 2)
    with torch.no_grad():
        first.weight.copy_(torch.tensor([[1.0, 1.0], [1.0, -1.0]]))
        first.bias.zero_()
        second.weight.copy_(torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
        second.bias.zero_()
    layers = [nn.Flatten(), first] + ([nn.ReLU()] if relu else []) + [second]
    return nn.Sequential(*layers).eval()


X_HALF = torch.full((1, 1, 1, 2), 0.5)


def test_linear_chain_crown_is_exact_and_ibp_loses_the_dependency():
    # z0 - z1 = 2 x1 over x in [0.25, 0.75]^2: the true minimum is 0.5. IBP: h1 in [0.5, 1.5], h2 in [-0.5, 0.5],
    # folded spec (1, 1) gives 0.5 - 0.5 = 0; CROWN is exact.
    net = _two_layer(relu=False)
    y = torch.tensor([0])
    assert margin_bounds(net, X_HALF, y, 0.25, method="ibp")[0, 1].item() == pytest.approx(0.0, abs=1e-6)
    assert margin_bounds(net, X_HALF, y, 0.25, method="crown")[0, 1].item() == pytest.approx(0.5, abs=1e-6)
    assert margin_bounds(net, X_HALF, y, 0.25, method="crown-ibp")[0, 1].item() == pytest.approx(0.5, abs=1e-6)


def test_relu_relaxation_hand_computed():
    # margin z1 - z0 = -(relu(h1) + relu(h2)); h1 in [0.5, 1.5] is active, h2 in [-0.5, 0.5] unstable: upper line
    # 0.5 h2 + 0.25, so CROWN bounds relu(h1) + relu(h2) by 1.5 x1 + 0.5 x2 + 0.25 <= 1.75; IBP by 1.5 + 0.5 = 2.
    net = _two_layer(relu=True)
    y = torch.tensor([1])
    assert margin_bounds(net, X_HALF, y, 0.25, method="crown")[0, 0].item() == pytest.approx(-1.75, abs=1e-6)
    assert margin_bounds(net, X_HALF, y, 0.25, method="ibp")[0, 0].item() == pytest.approx(-2.0, abs=1e-6)
    # the other side: the lower slope of the unstable h2 is 0 (u = -l), so relu(h1) + relu(h2) >= x1 + x2 >= 0.5
    y0 = torch.tensor([0])
    assert margin_bounds(net, X_HALF, y0, 0.25, method="crown")[0, 1].item() == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_one_linear_layer_is_exact_for_both_norms(norm):
    torch.manual_seed(0)
    lin = nn.Linear(12, 4)
    net = nn.Sequential(nn.Flatten(), lin).eval()
    x = torch.rand(5, 1, 3, 4) * 0.5 + 0.25  # eps 0.1 stays inside [0, 1]: no clipping
    y = torch.tensor([0, 1, 2, 3, 0])
    w, b = lin.weight.detach(), lin.bias.detach()
    diff = w[y].unsqueeze(1) - w.unsqueeze(0)  # N x K x 12
    dual = diff.abs().sum(-1) if norm == "linf" else diff.norm(dim=-1)
    exact = torch.einsum("nkd,nd->nk", diff, x.flatten(1)) + (b[y].unsqueeze(1) - b) - 0.1 * dual
    for method in ("ibp", "crown"):
        got = margin_bounds(net, x, y, 0.1, norm, method)
        torch.testing.assert_close(got, exact, atol=1e-5, rtol=0)


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bn(self.conv(x)))


def _nets() -> dict[str, nn.Module]:
    torch.manual_seed(1)
    residual = nn.Sequential(
        models.Normalize([0.4], [0.3]), nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), _Residual(),
        nn.AvgPool2d(2), nn.Conv2d(4, 6, 3, stride=2, padding="valid"), nn.BatchNorm2d(6), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5))
    for m in residual.modules():  # non-trivial running statistics
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
    pool = nn.Sequential(nn.Conv2d(1, 5, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(5, 6, 3), nn.ReLU(),
                         nn.Dropout(0.3), nn.Flatten(), nn.Linear(6 * 2 * 2, 16), nn.ReLU(), nn.Linear(16, 5))
    deep = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(4, 8, 3, padding=1),
                         nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 2 * 2, 5))
    # a grouped and a dilated convolution (the patch form leaves them to the dense propagation) and a strided
    # one whose windows hang over the top-left border more than over the bottom-right
    grouped = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1, groups=2),
                            nn.ReLU(), nn.Conv2d(4, 4, 3, padding=2, dilation=2), nn.ReLU(),
                            nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 5))
    strided = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(),
                            nn.Conv2d(4, 4, (5, 3), stride=(4, 2), padding=(2, 1)), nn.ReLU(), nn.Flatten(),
                            nn.Linear(4 * 2 * 4, 5))
    return {"residual": residual.eval(), "maxpool": pool.eval(), "conv-chain": deep.eval(), "grouped": grouped.eval(),
            "strided": strided.eval()}


def _sampled_margins(net: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, norm: str, draws: int
                     ) -> torch.Tensor:
    """The smallest margin z_y - z_j seen over random corners / sphere points of the ball (N x K)."""
    g = torch.Generator().manual_seed(5)
    best = torch.full((x.shape[0], 5), float("inf"))
    for _ in range(draws):
        if norm == "linf":
            delta = (torch.randint(0, 2, x.shape, generator=g).float() * 2 - 1) * eps
        else:
            d = torch.randn(x.shape, generator=g)
            delta = d / d.flatten(1).norm(dim=1).view(-1, 1, 1, 1) * eps
        xs = (x + delta).clamp(0, 1) if norm == "linf" else x + delta
        with torch.no_grad():
            z = net(xs)
        best = torch.minimum(best, z.gather(1, y[:, None]) - z)
    return best


@pytest.mark.parametrize("name", ["residual", "maxpool", "conv-chain", "grouped"])
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_bounds_are_sound_against_sampled_and_attacked_points(name, norm):
    net = _nets()[name]
    torch.manual_seed(2)
    x = torch.rand(6, 1, 8, 8)
    y = torch.randint(0, 5, (6,))
    eps = 0.05 if norm == "linf" else 0.3
    bounds = {m: margin_bounds(net, x, y, eps, norm, m).detach() for m in ("ibp", "crown-ibp", "crown")}
    seen = _sampled_margins(net, x, y, eps, norm, draws=64)
    for method, lower in bounds.items():
        assert bool((lower <= seen + 1e-5).all()), f"{method} bound above a sampled margin"
    # the tightest bound is not vacuous: it sits within the range the sampled margins show
    assert bool((bounds["crown"] >= bounds["ibp"] - 1e-6).all())
    if norm == "linf":
        adv = pgd(net, x, y, eps=eps, steps=20, seed=0)
        with torch.no_grad():
            z = net(adv)
        attacked = z.gather(1, y[:, None]) - z
        assert bool((bounds["crown"] <= attacked + 1e-5).all())


@pytest.mark.parametrize("name", ["residual", "maxpool", "conv-chain"])
def test_crown_is_usually_tighter_than_ibp_on_random_nets(name):
    net = _nets()[name]
    torch.manual_seed(3)
    x = torch.rand(4, 1, 8, 8)
    y = torch.randint(0, 5, (4,))
    ibp_m = margin_bounds(net, x, y, 0.02, "linf", "ibp")
    crown_m = margin_bounds(net, x, y, 0.02, "linf", "crown")
    off = margin_spec(y, 5).abs().sum(-1) > 0
    assert float((crown_m - ibp_m).detach()[off].mean()) > 0


@pytest.mark.parametrize("name", ["conv-chain", "maxpool", "grouped", "strided"])
def test_patch_form_equals_the_dense_propagation(monkeypatch, name):
    net = _nets()[name]
    torch.manual_seed(4)
    x = torch.rand(5, 1, 8, 8)
    y = torch.randint(0, 5, (5,))
    for norm, eps in (("linf", 0.03), ("l2", 0.4)):
        patched = margin_bounds(net, x, y, eps, norm, "crown")
        with monkeypatch.context() as m:
            m.setattr(backward_module, "chain", lambda graph, target: None)
            dense = margin_bounds(net, x, y, eps, norm, "crown")
        torch.testing.assert_close(patched, dense, atol=2e-5, rtol=1e-5)


def test_patches_through_a_transposed_convolution_equal_the_written_out_matrix(monkeypatch):
    import robustest.certify.patches as patches_module

    net = _nets()["conv-chain"]
    torch.manual_seed(10)
    x = torch.rand(3, 1, 8, 8)
    y = torch.randint(0, 5, (3,))
    matrix = margin_bounds(net, x, y, 0.03, "linf", "crown")
    monkeypatch.setattr(patches_module, "_MATRIX_LIMIT", 0)  # every patch through F.conv_transpose2d
    transposed = margin_bounds(net, x, y, 0.03, "linf", "crown")
    torch.testing.assert_close(matrix, transposed, atol=1e-5, rtol=1e-5)


def test_a_small_row_budget_gives_the_same_bounds():
    net = _nets()["maxpool"]
    torch.manual_seed(6)
    x = torch.rand(3, 1, 8, 8)
    y = torch.randint(0, 5, (3,))
    whole = margin_bounds(net, x, y, 0.03, "linf", "crown")
    prop = backward_module.Propagator(check_certifiable(net, (1, 8, 8)), x, 0.03, "linf", budget=7)
    chunked = prop.margins(margin_spec(y, 5))
    torch.testing.assert_close(whole, chunked, atol=1e-5, rtol=1e-5)


def test_certificate_flags_and_batching():
    net = _nets()["maxpool"]
    torch.manual_seed(7)
    x = torch.rand(7, 1, 8, 8)
    with torch.no_grad():
        y = net(x).argmax(1)
    net.train()
    cert = crown(net, x, y, 1e-4)
    assert net.training  # the mode is restored
    assert isinstance(cert, Certificate) and cert.method == "crown" and cert.norm == "linf" and cert.eps == 1e-4
    assert bool(torch.isinf(cert.margins[torch.arange(7), y]).all())
    assert torch.equal(cert.certified, cert.lower_margin > 0)
    assert cert.certified_accuracy == pytest.approx(float(cert.certified.float().mean()))
    assert cert.certified.all()  # a tiny ball around the model's own predictions
    wrong = (y + 1) % 5
    assert not crown(net, x, wrong, 1e-4).certified.any()  # a misclassified sample is never certified
    small = ibp(net, x, y, 0.05, batch_size=3)
    whole = ibp(net, x, y, 0.05)
    torch.testing.assert_close(small.margins, whole.margins)


def test_a_samples_crown_bounds_do_not_depend_on_its_batch():
    # conv -> relu -> conv -> relu -> max-pool: the second convolution's bounds are CROWN's, and the pool reads the
    # values of its stable neurons; bounding them for a sample because another sample needed them moved its
    # margins by up to 0.05 here (seed 3)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(6 * 16, 5)).eval()
    torch.manual_seed(3)
    x = torch.rand(6, 1, 8, 8)
    x[0] = 0.0
    x[1] *= 0.2
    with torch.no_grad():
        y = net(x).argmax(1)
    alone = crown(net, x, y, 0.05, batch_size=1)
    together = crown(net, x, y, 0.05)
    torch.testing.assert_close(alone.margins, together.margins, atol=1e-5, rtol=1e-5)


def test_zoo_models_trace_and_resnet_shortcut_slicing_is_refused():
    for name in ("mnist_small", "madry_cnn", "lenet5", "digits_cnn", "mlp", "lenet1"):
        c, s, _ = models.native(name)
        check_certifiable(models.create(name).eval(), (c, s, s))
    check_certifiable(models.create("lenet5", mean=[0.13], std=[0.31]).eval(), (1, 28, 28))
    check_certifiable(models.create("preact_resnet18").eval(), (3, 32, 32))
    with pytest.raises(ConfigError, match="indexing or slicing"):
        check_certifiable(models.create("resnet20").eval(), (3, 32, 32))


@pytest.mark.parametrize("layer, named", [
    (nn.Sigmoid(), r"layer '1' \(Sigmoid\)"),
    (nn.MaxPool2d(3, stride=1), "overlapping windows"),
    (nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"), "padding_mode 'reflect'"),
])
def test_unsupported_layers_are_refused_in_one_line(layer, named):
    net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), layer, nn.Flatten(), nn.LazyLinear(3))
    net(torch.zeros(1, 1, 6, 6))
    with pytest.raises(ConfigError, match=named) as info:
        ibp(net.eval(), torch.rand(2, 1, 6, 6), torch.tensor([0, 1]), 0.1)
    message = str(info.value)
    assert "\n" not in message and "supported layers: " + ", ".join(SUPPORTED) in message


def test_untraceable_forward_is_refused():
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # data-dependent control flow
                return self.fc(x.flatten(1))
            return -self.fc(x.flatten(1))

    with pytest.raises(ConfigError, match="cannot follow the model's forward"):
        check_certifiable(Branchy(), (1, 2, 2))


def test_a_torchscript_model_is_refused_with_the_python_route():
    """torch.fx cannot follow a ScriptModule: one line that names the way that works (the Python model)."""
    scripted = torch.jit.script(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)))
    with pytest.raises(ConfigError, match=r"^certify follows a model's Python forward, which a TorchScript archive "
                                          r"does not keep: certify the Python model \(--model pkg\.module:factory"):
        check_certifiable(scripted, (1, 2, 2))


def test_inputs_are_validated():
    net = _nets()["maxpool"]
    x = torch.rand(2, 1, 8, 8)
    y = torch.tensor([0, 1])
    with pytest.raises(ConfigError, match="eps"):
        ibp(net, x, y, 0.0)
    with pytest.raises(ConfigError, match="norm"):
        crown(net, x, y, 0.1, norm="l1")
    with pytest.raises(DataError, match=r"\[0, 1\]"):
        ibp(net, x * 2, y, 0.1)
    with pytest.raises(DataError, match="outside"):
        ibp(net, x, torch.tensor([0, 7]), 0.1)
    with pytest.raises(ConfigError, match="method"):
        margin_bounds(net, x, y, 0.1, method="lp")
    assert margin_bounds(net, x, y, 0.0).shape == (2, 5)  # eps 0 is a schedule's start


def test_eps_zero_bounds_equal_the_margins_and_are_differentiable():
    net = _nets()["residual"]
    torch.manual_seed(8)
    x = torch.rand(3, 1, 8, 8)
    y = torch.tensor([0, 2, 4])
    z = net(x)
    exact = z.gather(1, y[:, None]) - z
    for method in ("ibp", "crown-ibp", "crown"):
        got = margin_bounds(net, x, y, 0.0, method=method)
        torch.testing.assert_close(got, exact, atol=1e-5, rtol=1e-5)
    loss = torch.nn.functional.cross_entropy(-margin_bounds(net, x, y, 0.05, method="crown-ibp"), y)
    loss.backward()
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)


def test_relu_tie_takes_the_zero_lower_slope_and_a_dead_neuron_stays_finite():
    # margin z0 - z1 = relu(h2) with h2 = x1 - x2 in [-0.5, 0.5]: u = -l, so the lower slope is 0 (not 1), and
    # CROWN's bound is 0 (slope 1 would give -0.5); a neuron whose bounds are exactly [0, 0] gets slope 0, not NaN
    net = _two_layer(relu=True)
    with torch.no_grad():
        net[3].weight.copy_(torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
    y = torch.tensor([0])
    assert margin_bounds(net, X_HALF, y, 0.25, method="crown")[0, 1].item() == 0.0
    with torch.no_grad():
        net[1].weight[0].zero_()  # h1 = 0 exactly: bounds [0, 0]
        net[3].weight.copy_(torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    got = margin_bounds(net, X_HALF, y, 0.25, method="crown")
    assert bool(torch.isfinite(got).all()) and got[0, 1].item() == 0.0


def _dense_matrix(layer: nn.Module, shape: tuple[int, ...]) -> torch.Tensor:
    """The layer's linear part as a matrix (outputs x inputs), built from basis images."""
    numel = int(torch.tensor(shape).prod())
    basis = torch.eye(numel).view(numel, *shape)
    with torch.no_grad():
        out = layer(basis) - layer(torch.zeros(1, *shape))
    return out.flatten(1).T


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_l2_ibp_is_exact_at_the_first_weight_layer_behind_normalize(kind):
    from robustest.certify.interval import interval_bounds

    torch.manual_seed(9)
    layer = nn.Linear(16, 3) if kind == "linear" else nn.Conv2d(1, 2, 3, padding=1)
    front = [nn.Flatten()] if kind == "linear" else []
    net = nn.Sequential(models.Normalize([0.3], [0.5]), *front, layer, nn.ReLU(), nn.Flatten(),
                        nn.LazyLinear(4)).eval()
    net(torch.zeros(1, 1, 4, 4))
    x = torch.rand(2, 1, 4, 4)
    graph = check_certifiable(net, (1, 4, 4))
    bounds = interval_bounds(graph, x, 0.2, "l2")
    index = 2 if kind == "linear" else 1
    lo, hi = bounds[index + 1]
    matrix = _dense_matrix(layer, (16,) if kind == "linear" else (1, 4, 4)) / 0.5  # d layer / d x
    with torch.no_grad():
        centre = layer(((x - 0.3) / 0.5).flatten(1) if kind == "linear" else (x - 0.3) / 0.5).flatten(1)
    radius = 0.2 * matrix.norm(dim=1)  # each output's row norm: smaller at a convolution's border
    torch.testing.assert_close(lo.flatten(1), centre - radius, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hi.flatten(1), centre + radius, atol=1e-5, rtol=1e-5)


def test_crown_final_comparison_uses_the_tightened_boxes():
    # auto_LiRPA (compare_crown_with_ibp) on this net and ball gives 0.086261 and 0.121021 for the second and third
    # margins: its closing IBP pass starts from CROWN's intermediate boxes; IBP from its own boxes gives 0.0826 and
    # 0.1135, CROWN's backward pass -0.0023 and 0.0854
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 4, 3), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4, 5)).eval()
    x = torch.rand(1, 1, 12, 12)
    y = torch.randint(0, 5, (1,))
    got = margin_bounds(net, x, y, 0.5, "l2", "crown")[0]
    assert got[1].item() == pytest.approx(0.086261, abs=2e-6)
    assert got[2].item() == pytest.approx(0.121021, abs=2e-6)


def test_two_convolutions_without_a_relu_between_get_their_exact_box():
    # IBP's box after conv -> conv is loose (it forgets that both read the same pixels); the ReLU after the second
    # needs the exact one, which CROWN's backward pass gives: W2 W1 x + b -+ eps |W2 W1| 1 on an inner ball
    torch.manual_seed(11)
    conv1, conv2 = nn.Conv2d(1, 3, 3, padding=1), nn.Conv2d(3, 2, 3, padding=1)
    net = nn.Sequential(conv1, conv2, nn.ReLU(), nn.Flatten(), nn.Linear(2 * 36, 4)).eval()
    x = torch.rand(2, 1, 6, 6) * 0.6 + 0.2
    prop = backward_module.Propagator(check_certifiable(net, (1, 6, 6)), x, 0.1, "linf")
    lo, hi = prop.bounds_of(2)
    both = nn.Sequential(conv1, conv2)
    matrix = _dense_matrix(both, (1, 6, 6))
    with torch.no_grad():
        centre = both(x).flatten(1)
    radius = 0.1 * matrix.abs().sum(1)
    # the neurons IBP leaves unstable get the exact box; the ones it already decides keep IBP's (only their sign
    # matters to the ReLU)
    unstable = (prop.ibp[2][0] < 0).flatten(1) & (prop.ibp[2][1] > 0).flatten(1)
    assert int(unstable.sum()) > 10
    torch.testing.assert_close(lo.flatten(1)[unstable], (centre - radius)[unstable], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hi.flatten(1)[unstable], (centre + radius)[unstable], atol=1e-5, rtol=1e-5)
    assert bool((prop.ibp[2][0].flatten(1)[unstable] < (centre - radius)[unstable] - 1e-4).any())  # IBP: looser


def test_a_trailing_identity_keeps_ibps_folded_last_layer_and_a_relu_output_is_bounded_as_a_box():
    torch.manual_seed(12)
    body = [nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3)]
    plain = nn.Sequential(*body).eval()
    trailing = nn.Sequential(*body, nn.Dropout(0.5)).eval()
    x = torch.rand(3, 1, 4, 4)
    y = torch.tensor([0, 1, 2])
    for method in ("ibp", "crown"):
        torch.testing.assert_close(margin_bounds(trailing, x, y, 0.05, method=method),
                                   margin_bounds(plain, x, y, 0.05, method=method))
    from robustest.certify.interval import interval_bounds

    ending = nn.Sequential(*body, nn.ReLU()).eval()  # logits through a ReLU: no weight layer to fold
    boxes = interval_bounds(check_certifiable(ending, (1, 4, 4)), x, 0.05, "linf")
    lo, hi = boxes[-1]
    expected = lo.gather(1, y[:, None]) - hi  # z_y >= l_y, z_j <= u_j
    expected[torch.arange(3), y] = 0.0
    torch.testing.assert_close(margin_bounds(ending, x, y, 0.05, method="ibp"), expected)


def test_a_layer_mostly_unstable_is_bounded_whole(monkeypatch):
    # above 90 % unstable neurons a sample's layer is bounded whole (its stable neurons' values reach the max-pool)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(6 * 16, 5)).eval()
    torch.manual_seed(3)
    x = torch.rand(4, 1, 8, 8)
    y = torch.randint(0, 5, (4,))
    graph = check_certifiable(net, (1, 8, 8))
    prop = backward_module.Propagator(graph, x, 0.3, "linf")
    lo, hi = backward_module.step(graph.ops[3], {2: prop.bounds_of(2)})
    share = ((lo < 0) & (hi > 0)).flatten(1).float().mean(1)
    assert bool((share > 0.9).all())  # the IBP step leaves more than 90 % unstable for every sample
    default = margin_bounds(net, x, y, 0.3, method="crown")
    monkeypatch.setattr(backward_module, "SPARSE_SHARE", -1.0)  # every layer whole
    whole = margin_bounds(net, x, y, 0.3, method="crown")
    monkeypatch.setattr(backward_module, "SPARSE_SHARE", 2.0)  # never whole: unstable neurons only
    sparse = margin_bounds(net, x, y, 0.3, method="crown")
    torch.testing.assert_close(default, whole)
    assert not torch.allclose(default, sparse)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bounds_equal_the_cpu_ones():
    net = _nets()["maxpool"]
    torch.manual_seed(13)
    x = torch.rand(5, 1, 8, 8)
    y = torch.randint(0, 5, (5,))
    cpu = crown(net, x, y, 0.03).margins
    gpu = crown(net.cuda(), x, y, 0.03)  # x and y on the CPU: moved to the model's device
    torch.testing.assert_close(gpu.margins, cpu, atol=1e-4, rtol=1e-4)
    assert gpu.margins.device.type == "cpu"  # per-sample results come back on the CPU


def test_a_zero_margin_bound_is_not_certified_and_an_empty_batch_is_empty():
    net = _two_layer(relu=True)
    with torch.no_grad():
        net[3].weight.copy_(torch.tensor([[0.0, 1.0], [0.0, 0.0]]))  # z0 - z1 = relu(x1 - x2) >= 0: bound 0.0
    cert = crown(net, X_HALF, torch.tensor([0]), 0.25)
    assert cert.lower_margin.item() == 0.0 and not bool(cert.certified[0])  # certified means > 0
    empty = ibp(_nets()["conv-chain"], torch.rand(0, 1, 8, 8), torch.zeros(0, dtype=torch.long), 0.1)
    assert empty.margins.shape == (0, 5) and empty.certified.shape == (0,) and empty.certified_accuracy == 0.0


def test_certifying_a_training_model_leaves_its_batchnorm_statistics_alone():
    net = _nets()["residual"].train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    crown(net, torch.rand(2, 1, 8, 8), torch.tensor([0, 1]), 0.01)
    check_certifiable(net, (1, 8, 8))
    margin_bounds(net, torch.rand(2, 1, 8, 8), torch.tensor([0, 1]), 0.01, method="ibp")  # as training calls it
    assert net.training
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
