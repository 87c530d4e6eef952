"""FOL-guided fuzzing (RobOT A3) and coverage-guided fuzzing (DeepHunter-style) on digits and MNIST."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from robustest.core.errors import ConfigError, DataError
from robustest.fuzzing import coverage_fuzz, fol_fuzz
from robustest.fuzzing.fol import _grad_eval
from robustest.train.recipes import Recipe


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # one intra-op thread: on a shared, loaded machine this avoids oversubscription stalls
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def _fuzz_model(_one_thread, _digits_train_session):
    from robustest import models
    from robustest.train import fit

    torch.manual_seed(0)
    model = models.create("digits_cnn", num_classes=10, in_channels=1, input_size=8)
    fit(model, _digits_train_session, epochs=8, batch_size=64, recipe=Recipe(lr=2e-3), seed=0, progress=False)
    return model.eval()


@pytest.fixture
def trained_digits_model(_fuzz_model):
    """digits_cnn trained 8 epochs on digits (a copy per test)."""
    return copy.deepcopy(_fuzz_model).eval()


@pytest.fixture
def seeds(digits_test):
    x, y = digits_test.tensors
    return x[:48], y[:48]


def _pred(model, x):
    with torch.no_grad():
        return model(x).argmax(1)


def _grad_norm(model, x, c):
    """Independent per-sample ||grad_x CE(f(x), c)||_2, one sample at a time."""
    out = []
    for xi, ci in zip(x, c):
        xi = xi[None].clone().requires_grad_(True)
        (g,) = torch.autograd.grad(F.cross_entropy(model(xi), ci[None]), xi)
        out.append(g.flatten().norm())
    return torch.stack(out)


# --------------------------------------------------------------------------------------------- fol_fuzz
def test_fol_fuzz_tests_flip_the_prediction_respect_the_bound_and_carry_correct_fol(trained_digits_model, seeds):
    model = trained_digits_model
    x, y = seeds
    r = fol_fuzz(model, x, y, steps=12, seed=0, batch_size=16)
    assert len(r) > 0
    t = len(r)
    assert r.x.shape == (t, 1, 8, 8) and r.y.shape == r.seed_index.shape == r.fol.shape == r.step.shape == (t,)
    assert float(r.x.min()) >= 0 and float(r.x.max()) <= 1
    c = _pred(model, x)[r.seed_index]
    pred = _pred(model, r.x)
    assert bool((pred != c).all())
    assert torch.equal(pred, r.pred)
    assert torch.equal(r.y, y[r.seed_index])
    x0 = x[r.seed_index]
    rel = (r.x - x0).flatten(1).norm(dim=1) / x0.flatten(1).norm(dim=1)
    assert bool((rel < 0.5).all())
    assert bool(((r.step >= 1) & (r.step <= 12)).all())
    # FOL = ||grad_x CE(f(x), c)||_2 with c the seed's prediction, recomputed sample by sample
    torch.testing.assert_close(r.fol, _grad_norm(model, r.x, c), rtol=1e-4, atol=1e-6)
    from robustest.metrics import fol_gradnorm

    torch.testing.assert_close(r.fol, fol_gradnorm(model, r.x, c), rtol=1e-4, atol=1e-6)
    # ordered by (seed, step) and the statistics add up
    key = r.seed_index * 100 + r.step
    assert bool((key[1:] > key[:-1]).all())
    s = r.stats
    assert s["tests"] == t and s["seeds"] == 48
    assert s["seeds_tried"] + s["seeds_skipped"] + s["seeds_not_started"] == 48
    assert int(r.tests_per_seed().sum()) == t
    assert s["stopped"] == "completed" and s["fol_variant"] == "gradnorm"


def test_fol_fuzz_eps_ball_and_eps_fol_variant(trained_digits_model, seeds):
    model = trained_digits_model
    x, y = seeds
    r = fol_fuzz(model, x, None, steps=12, eps=0.15, fol_variant="linf", batch_size=48)
    assert len(r) > 0
    x0 = x[r.seed_index]
    assert float((r.x - x0).abs().max()) <= 0.15 + 1e-6
    c = _pred(model, x)[r.seed_index]
    assert torch.equal(r.y, c)  # no labels given: tests carry the seed's predicted class
    from robustest.metrics import fol

    expect = fol(model, r.x, c, x0=x0, eps=0.15, norm="linf")
    torch.testing.assert_close(r.fol, expect, rtol=1e-4, atol=1e-5)
    assert "norm=linf" in r.stats["fol_definition"]


def test_fol_fuzz_objective_gradient_matches_torch_func(trained_digits_model, seeds):
    from torch.func import grad

    model = trained_digits_model
    for p in model.parameters():
        p.requires_grad_(False)
    x = seeds[0][:6]
    c = _pred(model, x)

    def obj(xi, ci):
        g = grad(lambda z: F.cross_entropy(model(z[None]), ci[None]))(xi)
        return torch.linalg.vector_norm(g) - model(xi[None]).softmax(1)[0, ci]

    expect = torch.stack([grad(obj)(xi, ci) for xi, ci in zip(x, c)])
    _, g, fol_l2, d = _grad_eval(model, x, c, second=True)
    torch.testing.assert_close(d, expect, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fol_l2, _grad_norm(model, x, c), rtol=1e-5, atol=1e-7)


def test_fol_fuzz_is_deterministic_and_independent_of_batch_size(trained_digits_model, seeds):
    model = trained_digits_model.double()
    x, y = seeds[0][:16].double(), seeds[1][:16]
    a = fol_fuzz(model, x, y, steps=10, seed=5, batch_size=16)
    b = fol_fuzz(model, x, y, steps=10, seed=5, batch_size=16)
    one = fol_fuzz(model, x, y, steps=10, seed=5, batch_size=1)
    assert len(a) > 0
    assert torch.equal(a.x, b.x) and torch.equal(a.seed_index, b.seed_index) and torch.equal(a.fol, b.fol)
    assert torch.equal(a.seed_index, one.seed_index) and torch.equal(a.step, one.step)
    torch.testing.assert_close(a.x, one.x, rtol=0, atol=1e-9)
    other = fol_fuzz(model, x, y, steps=10, seed=6, batch_size=16)
    assert not (len(other) == len(a) and torch.equal(other.x, a.x))


def _reference_fol_fuzz(model, x, steps, lr=0.1, max_rel_l2=0.5, seed=0):
    """RobOT A3 written plainly, one seed at a time with a Python list as work list (float64 model)."""
    gen = torch.Generator().manual_seed(seed)
    u = (torch.rand(x.shape[0], steps, generator=gen, dtype=torch.float64) + 0.5).to(x.dtype)
    found = []
    for i in range(x.shape[0]):
        x0 = x[i:i + 1]
        c = model(x0).argmax(1)
        if float(_grad_norm(model, x0, c)[0]) <= 1e-3:
            continue
        work, fol_max, it, k = [x0], 0.0, 0, 0
        while work and it < steps // 2:
            cur, it = work.pop(0), it + 1
            for _ in range(2):
                xg = cur.clone().requires_grad_(True)
                logits = model(xg)
                (g,) = torch.autograd.grad(F.cross_entropy(logits, c), xg, create_graph=True)
                (d,) = torch.autograd.grad(g.norm() - logits.softmax(1)[0, c[0]], xg)
                cur = (cur + lr * u[i, k] * d).clamp(0, 1).detach()
                k += 1
                fol = float(_grad_norm(model, cur, c)[0])
                dist = float((cur - x0).norm() / x0.norm())
                if fol > fol_max and dist < max_rel_l2:
                    fol_max = fol
                    work.append(cur)
                if int(model(cur).argmax(1)) != int(c) and dist < max_rel_l2:
                    found.append((i, k, cur[0]))
    return found


def test_fol_fuzz_matches_a_plain_one_seed_at_a_time_implementation(trained_digits_model, seeds):
    model = trained_digits_model.double()
    x = seeds[0][:24].double()
    ref = _reference_fol_fuzz(model, x, steps=10)
    r = fol_fuzz(model, x, None, steps=10, batch_size=7)
    assert len(ref) > 0
    assert [(i, k) for i, k, _ in ref] == list(zip(r.seed_index.tolist(), r.step.tolist()))
    torch.testing.assert_close(r.x, torch.stack([t for _, _, t in ref]), rtol=0, atol=1e-9)


def test_fol_fuzz_budgets_skipping_and_restored_state(trained_digits_model, seeds):
    model = trained_digits_model.train()
    x, y = seeds
    capped = fol_fuzz(model, x, y, steps=12, max_tests_per_seed=2)
    assert int(capped.tests_per_seed().max()) <= 2
    assert model.training and all(p.requires_grad for p in model.parameters())
    skipped = fol_fuzz(model, x, y, steps=4, grad_threshold=1e9)
    assert len(skipped) == 0 and skipped.stats["seeds_skipped"] == 48 and skipped.stats["seeds_tried"] == 0
    timed = fol_fuzz(model, x, y, steps=4, time_budget=0.0)
    assert timed.stats["stopped"] == "time_budget" and timed.stats["seeds_tried"] == 0
    assert timed.stats["seeds_not_started"] == 48 - timed.stats["seeds_skipped"]


def test_fol_fuzz_validates_inputs(trained_digits_model, seeds):
    x, y = seeds
    with pytest.raises(ConfigError):
        fol_fuzz(trained_digits_model, x, y, steps=1)
    with pytest.raises(ConfigError):
        fol_fuzz(trained_digits_model, x, y, fol_variant="l3")
    with pytest.raises(ConfigError):
        fol_fuzz(trained_digits_model, x, y, eps=0.0)
    with pytest.raises(DataError):
        fol_fuzz(trained_digits_model, x * 3, y)
    with pytest.raises(DataError):
        fol_fuzz(trained_digits_model, x, y[:5])


@pytest.mark.slow
def test_fol_fuzz_mnist_lenet5(mnist_root):
    from robustest import data, models
    from robustest.train import fit

    train = data.load("mnist", root=mnist_root, split="train")
    test = data.load("mnist", root=mnist_root, split="test")
    xtr, ytr = train.tensors
    torch.manual_seed(0)
    model = models.create("lenet5", num_classes=10, in_channels=1, input_size=28)
    fit(model, (xtr[:12000], ytr[:12000]), epochs=1, batch_size=128, recipe=Recipe(lr=2e-3), seed=0, progress=False)
    model.eval()
    x, y = test.tensors
    x, y = x[:300], y[:300]
    r = fol_fuzz(model, x, y, steps=20, batch_size=128)
    assert r.stats["seeds_tried"] > 100 and len(r) > 100
    c = _pred(model, x)[r.seed_index]
    assert bool((_pred(model, r.x) != c).all())
    x0 = x[r.seed_index]
    assert bool(((r.x - x0).flatten(1).norm(dim=1) / x0.flatten(1).norm(dim=1) < 0.5).all())
    sub = torch.arange(0, len(r), max(1, len(r) // 50))
    torch.testing.assert_close(r.fol[sub], _grad_norm(model, r.x[sub], c[sub]), rtol=1e-3, atol=1e-6)


# ----------------------------------------------------------------------------------------- coverage_fuzz
@pytest.fixture
def profile(trained_digits_model, digits_train):
    from robustest.metrics.coverage import CoverageProfile

    return CoverageProfile.build(trained_digits_model, digits_train.tensors[0])


def test_coverage_fuzz_reproduces_and_increases_kmnc(trained_digits_model, seeds, profile):
    model = trained_digits_model
    x, y = seeds[0][:32], seeds[1][:32]
    a = coverage_fuzz(model, x, y, profile, metric="kmnc", iterations=12, batch_size=32, seed=1)
    b = coverage_fuzz(model, x, y, profile, metric="kmnc", iterations=12, batch_size=32, seed=1)
    assert len(a) > 0
    assert torch.equal(a.x, b.x) and torch.equal(a.seed_index, b.seed_index) and torch.equal(a.corpus, b.corpus)
    assert [h[2] for h in a.coverage_history] == [h[2] for h in b.coverage_history]
    c = coverage_fuzz(model, x, y, profile, metric="kmnc", iterations=12, batch_size=32, seed=2)
    assert not (len(c) == len(a) and torch.equal(c.x, a.x))
    # coverage grows over the seeds alone, monotonically, and matches an independent union
    cov = [h[2] for h in a.coverage_history]
    assert len(cov) == 13 and [h[0] for h in a.coverage_history] == list(range(13))
    assert all(later >= earlier for earlier, later in zip(cov, cov[1:]))
    assert cov[0] == pytest.approx(profile.set_coverage(x, "kmnc"))
    assert cov[-1] > cov[0]
    assert a.corpus is not None and a.corpus.shape[0] == a.stats["queue_added"] > 0
    union = profile.set_coverage(torch.cat([x, a.corpus, a.x]), "kmnc")
    assert union == pytest.approx(cov[-1])
    # failing tests: valid images the model gets wrong, labelled with their seed's label
    assert float(a.x.min()) >= 0 and float(a.x.max()) <= 1
    assert torch.equal(a.y, y[a.seed_index])
    assert bool((_pred(model, a.x) != a.y).all())
    assert bool((_pred(model, x[a.seed_index]) == a.y).all())  # seeds in the queue are classified correctly
    assert a.stats["mutants_generated"] == 12 * 32 and a.stats["tests"] == len(a)


def test_coverage_fuzz_nc_time_budget_and_validation(trained_digits_model, seeds, profile):
    model = trained_digits_model
    x, y = seeds
    r = coverage_fuzz(model, x, y, profile, metric="nc", metric_opts={"threshold": 0.25}, iterations=None,
                      time_budget=0.5, batch_size=16)
    assert r.stats["stopped"] == "time_budget" and r.stats["iterations"] >= 1
    assert r.coverage_history[-1][2] >= r.coverage_history[0][2]
    with pytest.raises(ConfigError):
        coverage_fuzz(model, x, None, profile)
    with pytest.raises(ConfigError):
        coverage_fuzz(model, x, y, profile, iterations=None)
    with pytest.raises(ConfigError):
        coverage_fuzz(model, x, y, object())
    with pytest.raises(DataError):
        coverage_fuzz(model, x - 1, y, profile)
