"""ZOL / FOL / gradient-norm metrics against independent computations."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from robustest import metrics
from robustest.core.errors import ConfigError, DataError

SHARED_DATA = Path(os.environ.get("ROBUSTEST_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
MNIST = SHARED_DATA / "mnist.npz"
DUAL = {"linf": 1.0, "l2": 2.0, "l1": float("inf")}


def reference_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Independent per-sample input gradients in float64: one autograd call per input."""
    model = model.double().eval()
    out = []
    for i in range(x.shape[0]):
        xi = x[i : i + 1].double().clone().requires_grad_(True)
        loss = F.cross_entropy(model(xi), y[i : i + 1])
        (g,) = torch.autograd.grad(loss, xi)
        out.append(g.flatten())
    model.float()
    return torch.stack(out)


def reference_fol(g: torch.Tensor, x: torch.Tensor, x0: torch.Tensor, eps: float, norm: str) -> torch.Tensor:
    """The formula written out: eps * ||g||_q - <x - x0, g> with q dual to ``norm``."""
    if norm == "linf":
        gn = g.abs().sum(1)
    elif norm == "l2":
        gn = (g * g).sum(1).sqrt()
    else:
        gn = g.abs().max(1).values
    return eps * gn - ((x - x0).double().flatten(1) * g).sum(1)


@pytest.fixture(scope="module")
def mnist_lenet():
    if not MNIST.is_file():
        pytest.skip("real MNIST not available")
    from robustest import data, models
    from robustest.train import fit

    train = data.load("mnist", root=str(MNIST.parent), split="train")
    test = data.load("mnist", root=str(MNIST.parent), split="test")
    torch.manual_seed(0)
    model = models.create("lenet5")
    xt, yt = train.tensors
    fit(model, (xt[:1000], yt[:1000]), epochs=1, batch_size=50, seed=0, progress=False)
    x0, y = test.tensors[0][:200].clone(), test.tensors[1][:200].clone()
    # one test input per seed, L-inf distance 0.15 (inside every ball used below)
    g = torch.Generator().manual_seed(0)
    x = (x0 + (torch.rand(x0.shape, generator=g) * 2 - 1) * 0.15).clamp(0, 1)
    model.eval()
    return model, x0, x, y, reference_gradients(model, x0, y), reference_gradients(model, x, y)


@pytest.mark.parametrize("norm", ["linf", "l2", "l1"])
@pytest.mark.parametrize("own_seed", [True, False])
def test_fol_matches_independent_autograd_on_mnist_lenet5(mnist_lenet, norm, own_seed):
    model, x0, x, y, g0, gx = mnist_lenet
    eps = {"linf": 0.3, "l2": 5.0, "l1": 120.0}[norm]
    if own_seed:
        got = metrics.fol(model, x0, y, eps=eps, norm=norm, batch_size=128)
        ref = reference_fol(g0, x0, x0, eps, norm)
    else:
        got = metrics.fol(model, x, y, x0=x0, eps=eps, norm=norm, batch_size=128)
        ref = reference_fol(gx, x, x0, eps, norm)
        assert float((x - x0).abs().sum(dim=(1, 2, 3)).min()) > 1.0  # x0 really differs from x'
    assert got.shape == (200,) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=0.0)
    assert bool((got >= -1e-6).all())  # inside the ball FOL >= 0 (Hoelder)


def test_fol_own_seed_equals_eps_times_dual_norm(mnist_lenet):
    model, x, _, y, _, _ = mnist_lenet
    a = metrics.fol(model, x[:50], y[:50], eps=0.3, norm="linf")
    b = metrics.fol(model, x[:50], y[:50], x0=x[:50], eps=0.3, norm="linf")
    torch.testing.assert_close(a, b)
    gn = metrics.fol_gradnorm(model, x[:50], y[:50])
    l2 = metrics.fol(model, x[:50], y[:50], eps=1.0, norm="l2")
    torch.testing.assert_close(gn, l2, rtol=1e-6, atol=0)


class Linear(nn.Module):
    """f(x) = W flatten(x) + b: the input gradient of CE is W^T (softmax - onehot)."""

    def __init__(self, w: np.ndarray, b: np.ndarray) -> None:
        super().__init__()
        self.lin = nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor(w, dtype=torch.float32))
            self.lin.bias.copy_(torch.tensor(b, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.flatten(1))


def test_fol_hand_computed_gradient_on_linear_model():
    w = np.array([[1.0, -2.0, 0.5, 0.0], [0.0, 1.0, -1.0, 3.0]])
    b = np.array([0.1, -0.2])
    model = Linear(w, b)
    x = torch.tensor([[0.2, 0.4, 0.6, 0.8], [0.9, 0.1, 0.0, 0.5]], dtype=torch.float32).view(2, 1, 2, 2)
    x0 = torch.tensor([[0.25, 0.4, 0.5, 0.8], [0.9, 0.2, 0.0, 0.4]], dtype=torch.float32).view(2, 1, 2, 2)
    y = torch.tensor([0, 1])
    xn, x0n = x.view(2, 4).double().numpy(), x0.view(2, 4).double().numpy()
    logits = xn @ w.T + b
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    onehot = np.eye(2)[y.numpy()]
    g = (p - onehot) @ w  # [2, 4]
    dot = ((xn - x0n) * g).sum(1)
    expected = {
        "linf": 0.3 * np.abs(g).sum(1) - dot,
        "l2": 0.3 * np.sqrt((g**2).sum(1)) - dot,
        "l1": 0.3 * np.abs(g).max(1) - dot,
    }
    for norm, exp in expected.items():
        got = metrics.fol(model, x, y, x0=x0, eps=0.3, norm=norm)
        np.testing.assert_allclose(got.numpy(), exp, rtol=1e-5)
    zol = metrics.zol(model, x, y)
    np.testing.assert_allclose(zol.numpy(), -np.log(p[[0, 1], y.numpy()]), rtol=1e-5)
    np.testing.assert_allclose(metrics.fol_gradnorm(model, x, y).numpy(), np.sqrt((g**2).sum(1)), rtol=1e-5)


def test_label_pred_uses_prediction_on_seed():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    x0 = torch.rand(20, 1, 4, 4)
    x = (x0 + 0.05 * torch.randn_like(x0)).clamp(0, 1)
    pred0 = model(x0).argmax(1)
    predx = model(x).argmax(1)
    a = metrics.fol(model, x, None, x0=x0, label="pred")
    torch.testing.assert_close(a, metrics.fol(model, x, pred0, x0=x0))
    b = metrics.fol(model, x, None, label="pred", norm="l2")
    torch.testing.assert_close(b, metrics.fol(model, x, predx, norm="l2"))
    torch.testing.assert_close(metrics.fol_gradnorm(model, x, None, label="pred"),
                               metrics.fol_gradnorm(model, x, predx))


def test_zol_equals_cross_entropy_and_batching_is_invisible():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    x = torch.rand(37, 1, 8, 8)
    y = torch.randint(0, 5, (37,))
    torch.testing.assert_close(metrics.zol(model, x, y), F.cross_entropy(model(x), y, reduction="none"))
    torch.testing.assert_close(metrics.zol(model, x, y, batch_size=5), metrics.zol(model, x, y))
    torch.testing.assert_close(metrics.fol(model, x, y, batch_size=4), metrics.fol(model, x, y), rtol=1e-5, atol=1e-7)


def test_mode_and_requires_grad_are_restored():
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 3))
    model.train()
    model[1].weight.requires_grad_(False)
    x = torch.rand(10, 1, 4, 4)
    y = torch.randint(0, 3, (10,))
    a = metrics.fol(model, x, y)
    b = metrics.fol(model, x, y)
    torch.testing.assert_close(a, b)  # eval mode inside: dropout off, BN running stats
    assert model.training and all(m.training for m in model.modules())
    assert model[1].weight.requires_grad is False and model[1].bias.requires_grad is True
    assert model[4].weight.grad is None
    metrics.zol(model, x, y)
    metrics.fol_gradnorm(model, x, y)
    assert model.training


def test_compute_dispatches_by_name():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    x = torch.rand(6, 1, 4, 4)
    y = torch.randint(0, 3, (6,))
    torch.testing.assert_close(metrics.compute("fol", model, x, y, eps=0.1, norm="l1"),
                               metrics.fol(model, x, y, eps=0.1, norm="l1"))
    torch.testing.assert_close(metrics.compute("zol", model, x, y), metrics.zol(model, x, y))
    torch.testing.assert_close(metrics.compute("gini", model, x), metrics.gini(model, x))
    with pytest.raises(ConfigError, match="training data"):
        metrics.compute("kmnc", model, x)
    with pytest.raises(ConfigError, match="unknown metric"):
        metrics.compute("nope", model, x)


def test_registry_lists_every_metric():
    assert set(metrics.names()) == {"zol", "fol", "fol_gradnorm", "gini", "entropy", "margin", "max_prob",
                                    "nc", "kmnc", "nbc", "snac", "tknc", "lsa", "dsa"}
    assert metrics.names("loss") == ["zol", "fol", "fol_gradnorm"]
    for name in metrics.names():
        assert metrics.describe(name).startswith(name)
    with pytest.raises(ConfigError):
        metrics.describe("foo")


def test_input_errors():
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    x = torch.rand(4, 1, 4, 4)
    y = torch.tensor([0, 1, 2, 0])
    with pytest.raises(DataError, match="x0"):
        metrics.fol(model, x, y, x0=torch.rand(3, 1, 4, 4))
    with pytest.raises(DataError, match="label='pred'"):
        metrics.fol(model, x, None)
    with pytest.raises(ConfigError, match="norm"):
        metrics.fol(model, x, y, norm="l3")
    with pytest.raises(ConfigError, match="eps"):
        metrics.fol(model, x, y, eps=0)
    with pytest.raises(ConfigError, match="label"):
        metrics.fol(model, x, y, label="gold")
    with pytest.raises(DataError, match="shape"):
        metrics.zol(model, x, y[:3])
    with pytest.raises(DataError, match=r"\[0, 1\]"):
        metrics.zol(model, x * 3, y)
    with pytest.raises(ConfigError, match="batch_size"):
        metrics.zol(model, x, y, batch_size=0)
    with pytest.raises(DataError):
        metrics.fol(model, x, y, x0=x * 2)
    with pytest.raises(DataError, match="3 classes"):
        metrics.fol(model, x, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(DataError, match="3 classes"):
        metrics.zol(model, x, torch.tensor([0, 1, 7, 0]))


def test_empty_input_gives_empty_scores():
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    x = torch.rand(0, 1, 4, 4)
    y = torch.zeros(0, dtype=torch.long)
    assert metrics.fol(model, x, y).shape == (0,)
    assert metrics.zol(model, x, y).shape == (0,)


def test_input_gradients_are_per_sample_gradients():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4)).eval()
    x = torch.rand(5, 1, 6, 6)
    y = torch.tensor([0, 1, 2, 3, 0])
    g = metrics.input_gradients(model, x, y)
    for i in range(5):
        xi = x[i : i + 1].clone().requires_grad_(True)
        (gi,) = torch.autograd.grad(F.cross_entropy(model(xi), y[i : i + 1]), xi)
        torch.testing.assert_close(g[i : i + 1], gi)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_and_results_follow_x():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    x = torch.rand(40, 1, 8, 8)
    x0 = (x + 0.05).clamp(0, 1)
    y = torch.randint(0, 5, (40,))
    cpu = metrics.fol(model, x, y, x0=x0, norm="l2")
    model_cuda = model.cuda()
    on_cuda = metrics.fol(model_cuda, x.cuda(), y.cuda(), x0=x0.cuda(), norm="l2")
    assert on_cuda.device.type == "cuda"
    torch.testing.assert_close(on_cuda.cpu(), cpu, rtol=1e-4, atol=1e-6)
    mixed = metrics.fol(model_cuda, x, y, x0=x0, norm="l2")  # CPU tensors, CUDA model: result on CPU
    assert mixed.device.type == "cpu"
    assert metrics.gini(model_cuda, x).device.type == "cpu"


def test_coverage_and_surprise_load_lazily_from_the_package():
    cov = pytest.importorskip("robustest.metrics.coverage")
    sa = pytest.importorskip("robustest.metrics.surprise")
    assert metrics.coverage is cov and metrics.CoverageProfile is cov.CoverageProfile
    assert metrics.per_input_scores is cov.per_input_scores
    assert metrics.surprise is sa and metrics.sa_scores is sa.sa_scores
    with pytest.raises(AttributeError):
        metrics.no_such_metric  # noqa: B018
