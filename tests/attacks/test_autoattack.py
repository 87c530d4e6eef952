"""Tests of the AutoAttack attacks (APGD-DLR, APGD-T, FAB(-T), Square) and the targeted gradient attacks:
success on a trained model, eps-ball and [0, 1], seeding, batch-size independence, targets hit, the losses and
the FAB projection against a generic solver."""

from __future__ import annotations

import pytest
import torch

from robustest import attacks
from robustest.attacks import _core
from robustest.attacks.fab import _project_hyperplane_box
from robustest.attacks.square import _eta, _p_at
from robustest.core.errors import ConfigError, DataError

EPS = {"linf": 0.1, "l2": 0.5}
TOL = 1e-5
FAST = {"apgd_dlr": {"steps": 10}, "apgd_t": {"steps": 10, "n_targets": 3}, "fab_t": {"steps": 10, "n_targets": 3},
        "fab": {"steps": 10}, "square": {"queries": 400}}


pytestmark = pytest.mark.usefixtures("one_thread")  # two shared cores: one intra-op thread


def _xy(ds, n=60):
    x, y = ds.tensors
    return x[:n].clone(), y[:n].clone()


@pytest.mark.parametrize("norm", ["linf", "l2"])
@pytest.mark.parametrize("name", sorted(FAST))
def test_succeeds_inside_ball_and_box(trained_digits_model, digits_test, name, norm):
    x, y = _xy(digits_test)
    r = attacks.attack(name, trained_digits_model, x, y, eps=EPS[norm], norm=norm, seed=0, **FAST[name])
    assert r.adv.shape == x.shape and r.adv.dtype == x.dtype
    assert float(r.adv.min()) >= 0.0 and float(r.adv.max()) <= 1.0
    size = r.linf if norm == "linf" else r.l2
    assert float(size.max()) <= EPS[norm] + TOL
    # a real attack: at least a quarter of the correctly classified images broken (clean ~95 %)
    assert int(r.fooled.sum()) >= 0.25 * int(r.clean_correct.sum()), (name, norm, r.robust_accuracy)


def test_apgd_t_and_fab_t_at_least_as_strong_as_their_first_target(trained_digits_model, digits_test):
    x, y = _xy(digits_test)
    m = trained_digits_model
    for name in ("apgd_t", "fab_t"):
        one = attacks.attack(name, m, x, y, eps=0.08, steps=10, n_targets=1, seed=0)
        three = attacks.attack(name, m, x, y, eps=0.08, steps=10, n_targets=3, seed=0)
        # later targets only run on samples the first left robust, so nothing already broken is lost
        assert bool((three.success | ~one.success).all()), name
        assert three.robust_accuracy <= one.robust_accuracy


@pytest.mark.parametrize("name", ["apgd_dlr", "apgd_t", "square", "fab_t"])
def test_seeded(trained_digits_model, digits_test, name):
    x, y = _xy(digits_test, 40)
    kw = {**FAST[name], "eps": 0.1}
    if name == "square":
        kw["queries"] = 50
    f = getattr(attacks, name)
    a = f(trained_digits_model, x, y, seed=3, **kw)
    b = f(trained_digits_model, x, y, seed=3, **kw)
    c = f(trained_digits_model, x, y, seed=4, **kw)
    assert torch.equal(a, b)
    if name == "fab_t":  # one run per target from the clean input: nothing random
        assert torch.equal(a, c)
    else:
        assert not torch.equal(a, c)


@pytest.mark.parametrize("name", ["fab_t", "bim", "mifgsm"])
def test_deterministic_attacks_do_not_depend_on_the_batch_size(trained_digits_model, digits_test, name):
    x, y = _xy(digits_test, 40)
    kw = {"eps": 0.1, "steps": 5}
    if name == "fab_t":
        kw["n_targets"] = 2
    t = (y + 1) % 10 if name != "fab_t" else None
    if t is not None:
        kw["target"] = t
    f = getattr(attacks, name)
    a = f(trained_digits_model, x, y, batch_size=None, **kw)
    b = f(trained_digits_model, x, y, batch_size=16, **kw)
    # a convolution's last bits may depend on the batch shape; the attacks themselves do not
    assert float((a - b).abs().max()) <= 1e-4


@pytest.mark.parametrize("name", ["pgd", "bim", "mifgsm", "rfgsm", "fgsm", "apgd_t", "fab_t"])
def test_targeted_attacks_hit_their_target(trained_digits_model, digits_test, name):
    x, y = _xy(digits_test, 60)
    t = (y + 3) % 10
    kw = {"eps": 0.3}
    if name in ("pgd", "bim", "mifgsm"):
        kw["steps"] = 20
    if name == "rfgsm":
        kw["steps"] = 10
    if name in ("apgd_t", "fab_t"):
        kw["steps"] = 20
    r = attacks.attack(name, trained_digits_model, x, y, target=t, seed=0, **kw)
    assert r.target is not None and torch.equal(r.target, t)
    hit = r.target_success
    assert r.to_dict()["target_success_rate"] == pytest.approx(float(hit.double().mean()))
    rate = float(hit.double().mean())
    if name in ("fgsm", "rfgsm", "mifgsm"):  # fewer or smaller steps: compare with where the untargeted attack lands
        untargeted = attacks.attack(name, trained_digits_model, x, y, seed=0, **kw)
        by_chance = float((untargeted.adv_pred == t).double().mean())
        assert rate >= max(0.3, 2 * by_chance), (name, rate, by_chance)
        return
    assert rate >= 0.8, (name, rate)
    if name == "fab_t":  # FAB only ever returns points predicted as the target (or the clean input)
        moved = (r.adv - x).flatten(1).abs().amax(1) > 0
        assert bool(hit[moved].all())


def test_target_validation(trained_digits_model, digits_test):
    x, y = _xy(digits_test, 8)
    m = trained_digits_model
    with pytest.raises(DataError, match="target equals the label"):
        attacks.pgd(m, x, y, eps=0.1, target=y)
    with pytest.raises(DataError, match="target"):
        attacks.pgd(m, x, y, eps=0.1, target=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ConfigError, match="n_targets"):
        attacks.apgd_t(m, x, y, eps=0.1, n_targets=10)
    with pytest.raises(ConfigError, match="n_targets"):
        attacks.fab_t(m, x, y, eps=0.1, n_targets=12)
    with pytest.raises(ConfigError, match="p_init"):
        attacks.square(m, x, y, eps=0.1, p_init=0)
    with pytest.raises(ConfigError, match="target"):
        attacks.attack("pgd", m, x, y, eps=0.1, target="cat")


class _ThreeClass(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 3)

    def forward(self, x):
        return self.fc(x.flatten(1))


def test_class_count_requirements():
    torch.manual_seed(0)
    x = torch.rand(6, 1, 8, 8)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    m = _ThreeClass()
    with pytest.raises(ConfigError, match="at least 4 classes"):
        attacks.apgd_t(m, x, y, eps=0.1, n_targets=2)
    attacks.apgd_dlr(m, x, y, eps=0.1, steps=2)  # 3 classes are enough for DLR
    attacks.fab_t(m, x, y, eps=0.1, steps=2, n_targets=2)


def test_dlr_losses():
    torch.manual_seed(0)
    z = torch.randn(20, 10)
    y = torch.randint(0, 10, (20,))
    t = (y + 1) % 10
    d = _core._dlr_loss(z, y)
    # shift and scale invariant
    assert torch.allclose(_core._dlr_loss(3 * z + 7, y), d, atol=1e-5)
    # the formula, written out
    zs = z.sort(1, descending=True).values
    other = torch.stack([z[i][torch.arange(10) != y[i]].max() for i in range(20)])
    expected = -(z[torch.arange(20), y] - other) / (zs[:, 0] - zs[:, 2] + 1e-12)
    assert torch.allclose(d, expected, atol=1e-6)
    dt = _core._dlr_targeted_loss(z, y, t)
    expected_t = -(z[torch.arange(20), y] - z[torch.arange(20), t]) / (zs[:, 0] - 0.5 * (zs[:, 2] + zs[:, 3]) + 1e-12)
    assert torch.allclose(dt, expected_t, atol=1e-6)
    assert torch.allclose(_core._dlr_targeted_loss(2 * z - 1, y, t), dt, atol=1e-5)
    m = _core.margin(z, y)
    assert bool(((m <= 0) == (z.argmax(1) != y)).all())


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_fab_projection_is_the_minimum_norm_point(norm):
    scipy_opt = pytest.importorskip("scipy.optimize")  # linprog: the L-inf reference
    gen = torch.Generator().manual_seed(1)
    n, dim = 12, 6
    t = torch.rand(n, dim, generator=gen, dtype=torch.float64)
    w = torch.randn(n, dim, generator=gen, dtype=torch.float64)
    w[0, :3] = 0  # zero weights must not move
    c = torch.randn(n, generator=gen, dtype=torch.float64) * 0.5
    c[1] = 0.0
    c[2] = 1e3  # unreachable inside the box
    d = _project_hyperplane_box(t, w, c, norm)
    import numpy as np

    for i in range(n):
        ti, wi, ci = t[i].numpy(), w[i].numpy(), float(c[i])
        di = d[i].numpy()
        assert np.all(ti + di >= -1e-9) and np.all(ti + di <= 1 + 1e-9)
        if i == 2:  # infeasible: every coordinate at the bound that moves <w, d> towards c
            assert np.allclose(ti + di, np.where(wi > 0, 1.0, np.where(wi < 0, 0.0, ti)))
            continue
        assert abs(wi @ di - ci) < 1e-8
        if i == 0:
            assert np.all(di[:3] == 0)
        bounds = [(-ti[j], 1 - ti[j]) for j in range(dim)]
        if norm == "linf":  # LP: minimise s subject to |d_j| <= s, <w, d> = c, box
            cost = np.r_[np.zeros(dim), 1.0]
            a_ub = np.r_[np.c_[np.eye(dim), -np.ones(dim)], np.c_[-np.eye(dim), -np.ones(dim)]]
            res = scipy_opt.linprog(cost, A_ub=a_ub, b_ub=np.zeros(2 * dim), A_eq=np.r_[wi, 0.0][None],
                                    b_eq=[ci], bounds=bounds + [(0, None)])
            assert res.status == 0
            assert np.abs(di).max() <= res.fun + 1e-7
        else:  # KKT conditions of this convex QP (sufficient): d = clip(mu * w, -t, 1 - t) for one scalar mu
            lo, hi = -ti, 1 - ti
            free = (np.abs(wi) > 1e-12) & (di > lo + 1e-9) & (di < hi - 1e-9)
            assert free.any()
            mu = np.median(di[free] / wi[free])
            assert np.allclose(di, np.clip(mu * wi, lo, hi), atol=1e-8)


def test_square_pattern_and_schedule():
    e = _eta(7, torch.device("cpu"))
    assert e.shape == (7, 7) and abs(float(e.norm()) - 1) < 1e-6
    assert bool((e[:3] > 0).all()) and bool((e[3:] < 0).all())
    assert float(e[1, 3]) == float(e[:3].max())  # peak at the centre of the top half
    assert _p_at(0, 0.8, 5000, False) == 0.8
    assert _p_at(11, 0.8, 5000, False) == 0.4
    assert _p_at(4500, 0.8, 5000, False) == pytest.approx(0.8 / 128)
    assert _p_at(4500, 0.8, 5000, True) == pytest.approx(0.8 / 512)  # 9000 of 10000


def test_square_uses_no_gradients(trained_digits_model, digits_test):
    class NoGrad(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            assert not torch.is_grad_enabled(), "square must only run forward passes"
            return self.m(x)

    x, y = _xy(digits_test, 20)
    adv = attacks.square(NoGrad(trained_digits_model), x, y, eps=0.1, queries=20, seed=0)
    assert adv.shape == x.shape


@pytest.mark.parametrize("name", ["apgd", "apgd_t", "fab_t"])
def test_stop_on_success_breaks_the_same_samples(trained_digits_model, digits_test, name):
    x, y = _xy(digits_test, 60)
    m = trained_digits_model
    kw = {"eps": 0.08, "steps": 15, "seed": 2}
    if name != "apgd":
        kw["n_targets"] = 2
    full = attacks.attack(name, m, x, y, **kw)
    early = attacks.attack(name, m, x, y, stop_on_success=True, **kw)
    # each sample's run is independent of the others': leaving the batch changes no one's outcome
    assert torch.equal(full.success, early.success)
    assert float(early.linf.max()) <= 0.08 + TOL
    assert int(early.fooled.sum()) > 0
