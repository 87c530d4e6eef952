"""robustest's standard ensemble against torchattacks' AutoAttack(version="standard") on the same model and images:
our robust accuracy must not exceed theirs by more than one point (slow; skipped without torchattacks or MNIST).
benchmarks/bench_eval.py measures the same on more images and times both."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from robustest import evaluate as ev

N = 40
SHARED = Path(os.environ.get("ROBUSTEST_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
SETTINGS = [("linf", 0.1), ("linf", 0.3), ("l2", 2.0)]


pytestmark = pytest.mark.usefixtures("one_thread")  # two shared cores: one intra-op thread


@pytest.fixture(scope="module")
def mnist_lenet():
    path = SHARED / "mnist.npz"
    if not path.is_file():
        pytest.skip(f"real MNIST not found at {path}")
    from robustest import data, models
    from robustest.train import fit

    tr = data.load("mnist", root=path.parent, split="train")
    te = data.load("mnist", root=path.parent, split="test")
    torch.manual_seed(0)
    model = models.create("lenet5", mean=[0.1307], std=[0.3081])
    x, y = tr.tensors
    fit(model, (x[:5000], y[:5000]), epochs=1, seed=0, progress=False)
    return model.eval(), te.tensors[0][:N].clone(), te.tensors[1][:N].clone()


def _theirs(model, x, y, norm, eps):
    torchattacks = pytest.importorskip("torchattacks")
    atk = torchattacks.AutoAttack(model, norm="Linf" if norm == "linf" else "L2", eps=eps, version="standard",
                                  n_classes=10, seed=0)
    adv = atk(x, y).detach()
    d = (adv - x).flatten(1)
    size = d.abs().amax(1) if norm == "linf" else d.norm(dim=1)
    assert float(size.max()) <= eps * (1 + 1e-5) + 1e-6
    with torch.no_grad():
        return float((model(adv).argmax(1) == y).double().mean())


@pytest.mark.slow
@pytest.mark.parametrize(("norm", "eps"), SETTINGS)
def test_standard_at_least_as_strong_as_torchattacks_lenet5_mnist(mnist_lenet, norm, eps):
    pytest.importorskip("torchattacks")
    model, x, y = mnist_lenet
    ours = ev.evaluate(model, (x, y), eps, norm=norm, version="standard", seed=0)
    theirs = _theirs(model, x, y, norm, eps)
    assert ours.robust_accuracy <= theirs + 0.01, (ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize(("norm", "eps"), [("linf", 0.1)])
def test_standard_at_least_as_strong_as_torchattacks_digits(trained_digits_model, digits_test, norm, eps):
    pytest.importorskip("torchattacks")
    x, y = (t[:N].clone() for t in digits_test.tensors)
    ours = ev.evaluate(trained_digits_model, (x, y), eps, norm=norm, version="standard", seed=0)
    theirs = _theirs(trained_digits_model, x, y, norm, eps)
    assert ours.robust_accuracy <= theirs + 0.01, (ours, theirs)
