"""Tests of robustest.attacks: validity (eps-ball, [0, 1]), agreement with torchattacks, strength ordering,
seeding, restarts, mode restoration and the attack() result."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from robustest import attacks
from robustest.core.errors import ConfigError, DataError

EPS = {"linf": 0.1, "l2": 0.5}
TOL = 1e-5
SHARED = Path(os.environ.get("ROBUSTEST_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
MNIST_NPZ = SHARED / "mnist.npz"


pytestmark = pytest.mark.usefixtures("one_thread")  # two shared cores: one intra-op thread


def _digits_xy(ds, n=120):
    x, y = ds.tensors
    return x[:n].clone(), y[:n].clone()


def _call(name, model, x, y, norm, seed=0):
    eps = EPS[norm]
    if name in ("pgd", "apgd"):
        return getattr(attacks, name)(model, x, y, eps=eps, steps=5, norm=norm, seed=seed)
    if name == "cw_l2":
        return attacks.cw_l2(model, x, y, eps=eps if norm == "l2" else None, steps=10, binary_steps=2, seed=seed)
    if name == "fgsm":
        return attacks.fgsm(model, x, y, eps=eps, random_start=True, seed=seed)
    if name in ("bim", "mifgsm"):
        return getattr(attacks, name)(model, x, y, eps=eps, steps=5, seed=seed)
    return getattr(attacks, name)(model, x, y, eps=eps, seed=seed)


CASES = [(n, "linf") for n in ("fgsm", "pgd", "bim", "rfgsm", "mifgsm", "apgd")] + [
    ("pgd", "l2"), ("apgd", "l2"), ("cw_l2", "l2")]


@pytest.mark.parametrize(("name", "norm"), CASES)
def test_inside_ball_and_unit_range(trained_digits_model, digits_test, name, norm):
    x, y = _digits_xy(digits_test)
    adv = _call(name, trained_digits_model, x, y, norm)
    assert adv.shape == x.shape and adv.dtype == x.dtype and adv.device == x.device
    assert float(adv.min()) >= 0.0 and float(adv.max()) <= 1.0
    delta = (adv - x).flatten(1)
    if norm == "linf":
        assert float(delta.abs().max()) <= EPS[norm] + TOL
    else:
        assert float(delta.norm(dim=1).max()) <= EPS[norm] + TOL
    if name != "cw_l2":  # every gradient attack moves the images
        assert float(delta.abs().sum()) > 0


def test_registry_names_and_describe():
    assert set(attacks.names()) == {"fgsm", "pgd", "bim", "rfgsm", "mifgsm", "cw_l2", "apgd", "apgd_dlr", "apgd_t",
                                    "fab", "fab_t", "square"}
    for n in attacks.names():
        assert isinstance(attacks.describe(n), str) and attacks.describe(n)
    assert attacks.describe("cw") == attacks.describe("cw_l2")
    with pytest.raises(ConfigError, match="unknown attack"):
        attacks.describe("deepfool")


@pytest.mark.parametrize("name", ["fgsm", "pgd", "apgd", "cw_l2", "mifgsm"])
def test_mode_and_requires_grad_restored(trained_digits_model, digits_test, name):
    model = trained_digits_model.train()
    params = list(model.parameters())
    params[0].requires_grad_(False)  # a frozen layer stays frozen, the others stay trainable
    x, y = _digits_xy(digits_test, 16)
    _call(name, model, x, y, "linf" if name != "cw_l2" else "l2")
    assert model.training and all(m.training for m in model.modules())
    assert params[0].requires_grad is False
    assert all(p.requires_grad for p in params[1:])
    assert all(p.grad is None for p in params)


def test_fgsm_formula(trained_digits_model, digits_test):
    x, y = _digits_xy(digits_test, 50)
    xr = x.clone().requires_grad_(True)
    F.cross_entropy(trained_digits_model(xr), y).backward()
    expected = (x + 0.2 * xr.grad.sign()).clamp(0, 1)
    assert torch.equal(attacks.fgsm(trained_digits_model, x, y, eps=0.2), expected)


def test_fgsm_same_as_torchattacks_on_digits(trained_digits_model, digits_test):
    torchattacks = pytest.importorskip("torchattacks")
    x, y = digits_test.tensors
    ours = attacks.fgsm(trained_digits_model, x, y, eps=0.15)
    theirs = torchattacks.FGSM(trained_digits_model, eps=0.15)(x, y)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("name", ["pgd", "apgd", "rfgsm", "fgsm"])
def test_seeded_determinism(trained_digits_model, digits_test, name):
    x, y = _digits_xy(digits_test, 40)
    kw = {"eps": 0.1}
    if name == "fgsm":
        kw["random_start"] = True
    if name in ("pgd", "apgd"):
        kw["steps"] = 3
    a = getattr(attacks, name)(trained_digits_model, x, y, seed=3, **kw)
    b = getattr(attacks, name)(trained_digits_model, x, y, seed=3, **kw)
    c = getattr(attacks, name)(trained_digits_model, x, y, seed=4, **kw)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_chunking_does_not_change_deterministic_attacks(trained_digits_model, digits_test):
    x, y = _digits_xy(digits_test, 40)
    a = attacks.bim(trained_digits_model, x, y, eps=0.1, steps=2, batch_size=None)
    b = attacks.bim(trained_digits_model, x, y, eps=0.1, steps=2, batch_size=16)
    assert torch.allclose(a, b, atol=1e-6)


def _loss_and_success(model, x, y):
    with torch.no_grad():
        logits = model(x)
    return F.cross_entropy(logits, y, reduction="none"), logits.argmax(1) != y


@pytest.mark.parametrize("name", ["pgd", "apgd"])
def test_restarts_keep_per_sample_strongest(trained_digits_model, digits_test, name):
    model = trained_digits_model
    x, y = _digits_xy(digits_test, 150)
    fn = getattr(attacks, name)
    # the first restart of a seeded multi-restart run is exactly the single run with the same seed
    one = fn(model, x, y, eps=0.06, steps=2, restarts=1, seed=7)
    many = fn(model, x, y, eps=0.06, steps=2, restarts=4, seed=7)
    l1, s1 = _loss_and_success(model, one, y)
    lm, sm = _loss_and_success(model, many, y)
    assert bool((sm | ~s1).all()), "a restart lost a successful example"
    both_fail = ~s1 & ~sm
    assert bool((lm[both_fail] >= l1[both_fail] - 1e-5).all()), "a restart kept a weaker example"
    assert int(sm.sum()) > int(s1.sum()) or bool((lm[both_fail] > l1[both_fail] + 1e-6).any())


def test_keep_stronger_rule():
    best = torch.zeros(4, 1, 1, 1)
    best_loss = torch.tensor([1.0, 1.0, 5.0, 2.0])
    best_succ = torch.tensor([False, True, False, True])
    cand = torch.ones(4, 1, 1, 1)
    cand_loss = torch.tensor([0.5, 9.0, 6.0, 0.1])
    cand_succ = torch.tensor([True, False, False, True])
    attacks._keep_stronger(best, best_loss, best_succ, cand, cand_loss, cand_succ)
    # success beats failure; failure never replaces success; among equals, the higher loss wins
    assert best.flatten().tolist() == [1.0, 0.0, 1.0, 0.0]
    assert best_succ.tolist() == [True, True, False, True]
    assert best_loss.tolist() == [0.5, 1.0, 6.0, 2.0]


def test_apgd_at_least_as_strong_as_pgd_on_digits(trained_digits_model, digits_test):
    x, y = digits_test.tensors
    kw = {"eps": 0.08, "steps": 10, "batch_size": 512}
    r_pgd = attacks.attack("pgd", trained_digits_model, x, y, seed=0, **kw)
    r_apgd = attacks.attack("apgd", trained_digits_model, x, y, seed=0, **kw)
    assert 0.0 < r_pgd.robust_accuracy < r_pgd.clean_accuracy  # a non-trivial operating point
    assert r_apgd.robust_accuracy <= r_pgd.robust_accuracy


def test_iterative_stronger_than_single_step(trained_digits_model, digits_test):
    x, y = digits_test.tensors
    r_fgsm = attacks.attack("fgsm", trained_digits_model, x, y, eps=0.08)
    r_pgd = attacks.attack("pgd", trained_digits_model, x, y, eps=0.08, steps=5)
    assert r_fgsm.robust_accuracy < r_fgsm.clean_accuracy
    assert r_pgd.robust_accuracy < r_fgsm.robust_accuracy


def test_cw_finds_small_l2_adversarials(trained_digits_model, digits_test):
    x, y = _digits_xy(digits_test, 30)
    r = attacks.attack("cw", trained_digits_model, x, y, steps=25, lr=0.1, binary_steps=2)
    assert r.name == "cw_l2"
    fooled = r.fooled
    assert int(fooled.sum()) >= 0.5 * int(r.clean_correct.sum())
    # failures come back unchanged
    failed = ~r.success
    assert torch.equal(r.adv[failed], x[failed])
    # with an L2 bound only adversarials inside it are kept
    bound = float(r.l2[fooled].median())
    adv_b = attacks.cw_l2(trained_digits_model, x, y, eps=bound, steps=25, lr=0.1, binary_steps=2)
    assert float((adv_b - x).flatten(1).norm(dim=1).max()) <= bound + TOL


def test_attack_result_fields(trained_digits_model, digits_test):
    x, y = _digits_xy(digits_test, 50)
    r = attacks.attack("pgd", trained_digits_model, (x, y), eps=0.1, steps=3, batch_size=16, seed=1)
    assert len(r) == 50 and r.adv.shape == x.shape
    with torch.no_grad():
        clean_pred = trained_digits_model(x).argmax(1)
        adv_pred = trained_digits_model(r.adv).argmax(1)
    assert torch.equal(r.clean_pred, clean_pred) and torch.equal(r.adv_pred, adv_pred)
    assert torch.equal(r.success, adv_pred != y) and torch.equal(r.clean_correct, clean_pred == y)
    d = (r.adv - x).flatten(1)
    assert torch.allclose(r.linf, d.abs().amax(1)) and torch.allclose(r.l2, d.norm(dim=1))
    assert r.success.dtype == torch.bool and r.success.shape == (50,)
    s = r.to_dict()
    assert s["n"] == 50 and abs(s["robust_accuracy"] + s["success_rate"] - 1) < 1e-9
    assert s["params"]["eps"] == 0.1
    # same seed and batch size -> same images; a TensorDataset works like a pair
    r2 = attacks.attack("pgd", trained_digits_model, torch.utils.data.TensorDataset(x, y), eps=0.1, steps=3,
                        batch_size=16, seed=1)
    assert torch.equal(r.adv, r2.adv)


def test_attack_equals_function_with_same_seed_and_batch_size(trained_digits_model, digits_test):
    x, y = _digits_xy(digits_test, 50)
    r = attacks.attack("pgd", trained_digits_model, x, y, eps=0.1, steps=2, batch_size=16, seed=5)
    direct = attacks.pgd(trained_digits_model, x, y, eps=0.1, steps=2, batch_size=16, seed=5)
    assert torch.equal(r.adv, direct)
    empty = attacks.attack("fgsm", trained_digits_model, x[:0], y[:0], eps=0.1)
    assert len(empty) == 0 and empty.adv.shape == (0, 1, 8, 8)


def test_attack_without_labels_uses_predictions(trained_digits_model, digits_test):
    x, _ = _digits_xy(digits_test, 30)
    r = attacks.attack("fgsm", trained_digits_model, x, eps=0.1)
    assert torch.equal(r.y, r.clean_pred) and bool(r.clean_correct.all())


def test_bad_inputs(trained_digits_model, digits_test):
    x, y = _digits_xy(digits_test, 8)
    m = trained_digits_model
    with pytest.raises(DataError):
        attacks.pgd(m, x * 2, y, eps=0.1)
    with pytest.raises(DataError):
        attacks.pgd(m, x, y.float(), eps=0.1)
    with pytest.raises(DataError):
        attacks.pgd(m, x, y[:4], eps=0.1)
    with pytest.raises(DataError):
        attacks.fgsm(m, x, y + 20, eps=0.1)
    with pytest.raises(ConfigError, match="eps"):
        attacks.pgd(m, x, y, eps=-1)
    with pytest.raises(ConfigError, match="norm"):
        attacks.pgd(m, x, y, eps=0.1, norm="l7")
    with pytest.raises(ConfigError, match="steps"):
        attacks.apgd(m, x, y, eps=0.1, steps=0)
    with pytest.raises(ConfigError, match="alpha"):
        attacks.rfgsm(m, x, y, eps=0.1, alpha=0.2)
    with pytest.raises(ConfigError, match="unknown attack"):
        attacks.attack("nope", m, x, y, eps=0.1)
    empty = attacks.pgd(m, x[:0], y[:0], eps=0.1)
    assert empty.shape == (0, 1, 8, 8)


# ------------------------------------------------------------------------------ LeNet-5 / MNIST comparisons
@pytest.fixture(scope="module")
def mnist_lenet():
    if not MNIST_NPZ.is_file():
        pytest.skip(f"real MNIST not found at {MNIST_NPZ}")
    from robustest import data, models
    from robustest.train import fit

    tr = data.load("mnist", root=MNIST_NPZ.parent, split="train")
    te = data.load("mnist", root=MNIST_NPZ.parent, split="test")
    torch.manual_seed(0)
    model = models.create("lenet5", mean=[0.1307], std=[0.3081])
    x, y = tr.tensors
    fit(model, (x[:3000], y[:3000]), epochs=1, seed=0, progress=False)
    return model.eval(), te.tensors[0][:400].clone(), te.tensors[1][:400].clone()


@pytest.mark.slow
def test_fgsm_same_images_as_torchattacks_mnist(mnist_lenet):
    torchattacks = pytest.importorskip("torchattacks")
    model, x, y = mnist_lenet
    assert torch.equal(attacks.fgsm(model, x, y, eps=0.3), torchattacks.FGSM(model, eps=0.3)(x, y))


@pytest.mark.slow
@pytest.mark.parametrize("eps", [0.3, 0.1])
def test_pgd_robust_accuracy_matches_torchattacks_mnist(mnist_lenet, eps):
    torchattacks = pytest.importorskip("torchattacks")
    model, x, y = mnist_lenet
    steps, alpha = 40, 2.5 * eps / 40
    ours = attacks.attack("pgd", model, x, y, eps=eps, steps=steps, alpha=alpha, seed=0).robust_accuracy
    torch.manual_seed(0)
    adv = torchattacks.PGD(model, eps=eps, alpha=alpha, steps=steps, random_start=True)(x, y)
    with torch.no_grad():
        theirs = float((model(adv).argmax(1) == y).float().mean())
    assert abs(ours - theirs) <= 0.01, (ours, theirs)


@pytest.mark.slow
def test_apgd_at_least_as_strong_as_pgd_mnist(mnist_lenet):
    model, x, y = mnist_lenet
    r_pgd = attacks.attack("pgd", model, x, y, eps=0.1, steps=20, seed=0)
    r_apgd = attacks.attack("apgd", model, x, y, eps=0.1, steps=20, seed=0)
    assert r_apgd.robust_accuracy <= r_pgd.robust_accuracy


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_model_cpu_inputs(trained_digits_model, digits_test):
    model = trained_digits_model.cuda()
    x, y = _digits_xy(digits_test, 32)
    for name in ("pgd", "apgd", "cw_l2", "fgsm"):
        adv = _call(name, model, x, y, "l2" if name == "cw_l2" else "linf")
        assert adv.device == x.device
    r = attacks.attack("pgd", model, x.cuda(), y.cuda(), eps=0.1, steps=3, seed=0)
    assert r.adv.is_cuda and r.success.shape == (32,)
    again = attacks.attack("pgd", model, x.cuda(), y.cuda(), eps=0.1, steps=3, seed=0)
    assert torch.equal(r.adv, again.adv)


class _InputBlindModel(torch.nn.Module):
    """Logits depend on the input only through a reduction, so autograd returns an expanded gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.tensor([0.5, -0.5, 0.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bias.expand(x.shape[0], 3) + 0.0 * x.sum()


@pytest.mark.parametrize("name", ["pgd", "bim", "rfgsm", "mifgsm", "apgd"])
def test_expanded_input_gradient_does_not_break_in_place_steps(name):
    # regression: the L-inf step updated the gradient with sign_() in place, which fails on a stride-0 gradient
    x = torch.rand(4, 1, 5, 5, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2, 0])
    adv = getattr(attacks, name)(_InputBlindModel(), x, y, eps=0.1)
    assert adv.shape == x.shape
    assert float((adv - x).abs().max()) <= 0.1 + 1e-6


def test_attack_streams_a_shuffled_loader_and_says_which_sample_each_row_is(trained_digits_model, digits_test):
    from torch.utils.data import DataLoader, TensorDataset

    x, y = _digits_xy(digits_test, 40)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(3))
    r = attacks.attack("fgsm", trained_digits_model, loader, eps=0.1)
    assert sorted(r.index.tolist()) == list(range(40)) and r.index.tolist() != list(range(40))
    direct = attacks.fgsm(trained_digits_model, x, y, eps=0.1)  # FGSM is deterministic: compare per sample
    assert torch.allclose(r.adv, direct[r.index], atol=1e-6) and torch.equal(r.y, y[r.index])
    plain = attacks.attack("fgsm", trained_digits_model, x, y, eps=0.1)
    assert torch.equal(plain.index, torch.arange(40))
    with pytest.raises(ConfigError, match="labels y only with an image tensor"):
        attacks.attack("fgsm", trained_digits_model, TensorDataset(x, y), y, eps=0.1)


def test_attack_batches_draw_their_own_random_numbers(trained_digits_model, digits_test):
    # batch k's random start depends on its position only: attacking the second half alone (a data set of its
    # own, one batch) differs from the whole run's second batch, while the whole run is reproducible
    x, y = _digits_xy(digits_test, 32)
    a = attacks.attack("pgd", trained_digits_model, x, y, eps=0.1, steps=1, batch_size=16, seed=2)
    b = attacks.attack("pgd", trained_digits_model, x, y, eps=0.1, steps=1, batch_size=16, seed=2)
    first = attacks.attack("pgd", trained_digits_model, x[:16], y[:16], eps=0.1, steps=1, batch_size=16, seed=2)
    assert torch.equal(a.adv, b.adv) and torch.equal(a.adv[:16], first.adv)
    swapped = attacks.attack("pgd", trained_digits_model, x[16:], y[16:], eps=0.1, steps=1, batch_size=16, seed=2)
    assert not torch.equal(a.adv[16:], swapped.adv)


# ------------------------------------------------------------------ PGD: stopping rule, per-sample eps, details
def test_pgd_stop_shrinks_the_active_set_and_counts_evaluations(trained_digits_model, digits_test):
    # the even positions stop at gradient evaluation 1: they keep the point of their first step, and from the
    # third evaluation on only the odd half goes through the model; the rule sees positions in x, chunks too
    x, y = _digits_xy(digits_test, 32)
    m, seen, sizes = trained_digits_model, [], []

    def even(k, xa, g, logits, index):
        seen.append((k, index.clone()))
        assert xa.shape[0] == g.shape[0] == logits.shape[0] == index.shape[0]
        return index % 2 == 0

    hook = m.register_forward_hook(lambda mod, inp, out: sizes.append(inp[0].shape[0]))
    res = attacks.pgd(m, x, y, eps=0.1, alpha=0.02, steps=5, seed=3, batch_size=16, stop=even, stop_from=1,
                      return_details=True)
    hook.remove()
    assert isinstance(res, attacks.PGDDetails) and res.success is None
    assert res.evals.tolist() == [2 if i % 2 == 0 else 5 for i in range(32)]
    assert sizes == [16, 16, 8, 8, 8] * 2
    assert [k for k, _ in seen] == [1, 2, 3, 4] * 2 and torch.equal(seen[0][1], torch.arange(16))
    assert torch.equal(seen[1][1], torch.arange(1, 16, 2)) and torch.equal(seen[4][1], torch.arange(16, 32))
    one_step = attacks.pgd(m, x, y, eps=0.1, alpha=0.02, steps=1, seed=3, batch_size=16)
    assert torch.equal(res.adv[0::2], one_step[0::2])
    plain = attacks.pgd(m, x, y, eps=0.1, alpha=0.02, steps=5, seed=3, batch_size=16)
    assert torch.allclose(res.adv[1::2], plain[1::2], atol=1e-6)
    everyone = attacks.pgd(m, x, y, eps=0.1, steps=5, seed=3, stop=lambda k, *a: torch.ones_like(a[-1]).bool(),
                           return_details=True)
    assert bool((everyone.evals == 1).all())  # all stop at the first evaluation: the random start is kept


@pytest.mark.parametrize(("norm", "target"), [("linf", None), ("l2", None), ("linf", "shift")])
def test_pgd_with_a_rule_that_never_fires_is_the_plain_pgd(trained_digits_model, digits_test, norm, target):
    x, y = _digits_xy(digits_test, 40)
    t = None if target is None else (y + 1) % 10
    kw = dict(eps=EPS[norm], steps=4, norm=norm, seed=5, batch_size=16, target=t)
    plain = attacks.pgd(trained_digits_model, x, y, **kw)
    never = attacks.pgd(trained_digits_model, x, y, **kw, stop=lambda k, xa, *a: torch.zeros(len(xa), dtype=bool),
                        return_details=True)
    details = attacks.pgd(trained_digits_model, x, y, **kw, return_details=True)
    assert torch.equal(never.adv, plain) and torch.equal(details.adv, plain)
    assert never.evals.tolist() == details.evals.tolist() == [4] * 40


def test_pgd_per_sample_eps_stays_inside_each_ball(trained_digits_model, digits_test):
    x, y = _digits_xy(digits_test, 40)
    m = trained_digits_model
    for norm, top in (("linf", 0.2), ("l2", 1.0)):
        eps = torch.linspace(top / 10, top, 40)
        adv = attacks.pgd(m, x, y, eps=eps, steps=10, norm=norm, seed=1, batch_size=16)
        size = attacks.lp_norm(adv - x, norm)
        assert bool((size <= eps + TOL).all()) and float(adv.min()) >= 0 and float(adv.max()) <= 1
        assert bool((size[20:] > eps[:20].max()).any())  # the larger balls are used
    # the same radius for everyone (an exact binary fraction, so alpha = 2.5 eps / steps rounds alike) is the
    # plain call; a per-sample alpha too
    same = attacks.pgd(m, x, y, eps=torch.full((40,), 0.125), steps=5, seed=2)
    assert torch.equal(same, attacks.pgd(m, x, y, eps=0.125, steps=5, seed=2))
    stepped = attacks.pgd(m, x, y, eps=0.125, alpha=torch.full((40,), 0.0625), steps=5, seed=2)
    assert torch.equal(stepped, same)


def test_pgd_tracks_success_and_draws_the_unit_start(trained_digits_model, digits_test):
    x, y = _digits_xy(digits_test, 40)
    m = trained_digits_model
    res = attacks.pgd(m, x, y, eps=0.15, steps=5, seed=4, return_details=True, track_success=True)
    with torch.no_grad():
        wrong = m(res.adv).argmax(1) != y
    assert bool(res.success[wrong].all()) and res.success.dtype == torch.bool
    # alpha 0 keeps the random start: with start_draw="unit" it is clip(x + (2u - 1) eps)
    gen = torch.Generator().manual_seed(7)
    start = attacks.pgd(m, x, y, eps=0.1, alpha=0.0, steps=1, start_draw="unit", generator=gen, batch_size=None)
    u = torch.rand(x.shape, generator=torch.Generator().manual_seed(7))
    assert torch.equal(start, (x + (u * 2 - 1) * 0.1).clamp(0, 1))


def test_pgd_bad_stopping_and_per_sample_options(trained_digits_model, digits_test):
    x, y = _digits_xy(digits_test, 8)
    m = trained_digits_model
    never = lambda k, xa, *a: torch.zeros(len(xa), dtype=bool)  # noqa: E731
    for kw, match in [({"stop": never, "restarts": 2}, "restarts=1"), ({"start_draw": "unit", "norm": "l2"}, "unit"),
                      ({"track_success": True}, "return_details"), ({"stop": 3}, "callable"),
                      ({"stop_from": -1}, "stop_from"), ({"eps": torch.full((7,), 0.1)}, "8 radii"),
                      ({"eps": torch.zeros(8)}, r"\(0, 1\]"), ({"alpha": torch.full((8,), -1.0)}, "alpha"),
                      ({"stop": lambda *a: torch.zeros(3, dtype=bool)}, "active samples")]:
        with pytest.raises(ConfigError, match=match):
            attacks.pgd(m, x, y, **{"eps": 0.1, **kw})
    with pytest.raises(ConfigError, match="per-sample"):
        attacks.attack("pgd", m, x, y, eps=torch.full((8,), 0.1))
    with pytest.raises(ConfigError, match="per-sample"):
        attacks.attack("pgd", m, x, y, eps=0.1, stop=never)
    empty = attacks.pgd(m, x[:0], y[:0], eps=0.1, return_details=True, track_success=True)
    assert empty.adv.shape == (0, 1, 8, 8) and empty.evals.shape == empty.success.shape == (0,)
