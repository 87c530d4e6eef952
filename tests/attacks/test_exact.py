"""Exact behaviour of the AutoAttack attacks, not only "at least as strong": APGD's checkpoint rule and step-size
schedule against a transcription of the reference rule (fra31/auto-attack, ``attack_single_run``), the order of
APGD-T's and FAB-T's target classes (the runner-up first, never the true class), and Square's p schedule against
the reference table; PGD's per-sample options (a stopping rule shrinks the active set and the per-sample step
sizes with it, ``track_success`` counts the final point)."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from robustest import attacks
from robustest.attacks.apgd import _halve_at_checkpoint
from robustest.attacks.square import _p_at
from robustest.core.modelcall import eval_mode, frozen_params
from robustest.core.seeding import make_generator

# the modules (robustest.attacks re-exports functions of the same names)
apgd_mod = importlib.import_module("robustest.attacks.apgd")
fab_mod = importlib.import_module("robustest.attacks.fab")

pytestmark = pytest.mark.usefixtures("one_thread")  # two shared cores: one intra-op thread

RHO = 0.75


# ------------------------------------------------------------------------------- APGD: the checkpoint rule
@pytest.mark.parametrize("losses, halved_last, best_last, best, halves", [
    # condition 1: the loss increased in at most rho of the k = 4 steps (<= 3 of 4, as the reference counts)
    ((0, 1, 2, 3, 4), True, 4.0, 4.0, False),     # 4 of 4 increases and halved last: keep the step size
    ((0, 1, 2, 3, 3), True, 3.0, 3.0, True),      # 3 of 4 = rho: halve (<=, not <)
    ((9, 0, 1, 2, 3), True, 9.0, 9.0, True),      # the drop 9 -> 0 is no increase: 3 of 4
    ((0, 1, 0, 1, 0), True, 0.0, 1.0, True),      # oscillating: 2 of 4
    ((5, 5, 5, 5, 5), True, 5.0, 5.0, True),      # flat: 0 of 4
    # condition 2: the step size was not halved at the last checkpoint and the best loss has not improved since
    ((0, 1, 2, 3, 4), False, 10.0, 10.0, True),   # 4 of 4 increases, but the best stays at 10
    ((0, 1, 2, 3, 4), False, 3.0, 4.0, False),    # ... the best improved
    ((0, 1, 2, 3, 4), True, 10.0, 10.0, False),   # ... halved at the last checkpoint
])
def test_apgd_checkpoint_rule_is_the_reference_rule(losses, halved_last, best_last, best, halves):
    window = torch.tensor(losses, dtype=torch.float32).view(-1, 1)  # (k + 1) x 1: the last checkpoint and k steps
    got = _halve_at_checkpoint(window, RHO, torch.tensor([halved_last]), torch.tensor([best_last]),
                               torch.tensor([best]))
    assert got.dtype == torch.bool and got.tolist() == [halves]


def _reference_checkpoints(losses: torch.Tensor, steps: int, rho: float) -> list[tuple[int, list[bool]]]:
    """AutoAttack's checkpoint bookkeeping, transcribed: ``losses`` is (steps + 1) x N (the starting point, then
    one row per step; the first window compares the first step with the starting point, the paper's definition).
    Returns (step index i, which samples halve) at each checkpoint."""
    n_iter_2, n_iter_min, size_decr = max(int(0.22 * steps), 1), max(int(0.06 * steps), 1), max(int(0.03 * steps), 1)
    k, counter = n_iter_2, 0
    best = losses[0].clone()
    best_last = best.clone()
    reduced_last = [True] * losses.shape[1]  # torch.ones_like(loss_best) in the reference
    out = []
    for i in range(steps):
        best = torch.maximum(best, losses[i + 1])
        counter += 1
        if counter == k:
            decisions = []
            for s in range(losses.shape[1]):
                t = sum(int(losses[i + 1 - c, s] > losses[i - c, s]) for c in range(k))  # check_oscillation
                oscillation = t <= k * rho
                no_improvement = (not reduced_last[s]) and bool(best_last[s] >= best[s])
                decisions.append(oscillation or no_improvement)
            out.append((i, decisions))
            reduced_last = decisions
            best_last = best.clone()
            k, counter = max(k - size_decr, n_iter_min), 0
    return out


def _scripted_losses(steps: int) -> torch.Tensor:
    """(steps + 1) x 5 loss sequences: rising, flat, an early peak then a slow rise below it (halves by condition
    2 at every other checkpoint), oscillating, random."""
    i = torch.arange(steps + 1, dtype=torch.float32)
    peak = torch.where(i <= 5, 20.0 * i, 0.01 * i)
    rand = torch.rand(steps + 1, generator=torch.Generator().manual_seed(3))
    return torch.stack([i, torch.ones_like(i), peak, (i % 2) * 0.5, rand], dim=1)


def test_apgd_halving_schedule_on_a_fixed_loss_sequence(monkeypatch):
    """_apgd_run with scripted losses halves at the reference checkpoints (22 % of the steps, then intervals
    shrinking by 3 % down to 6 %) exactly the samples the reference rule halves."""
    steps = 100
    script = _scripted_losses(steps)
    n = script.shape[1]
    calls: list[int] = []
    seen: list[tuple[int, list[bool]]] = []

    def scripted_loss_grad(model, x, y, loss, target, hit_target):
        cur = script[len(calls)].clone()
        calls.append(1)
        return torch.zeros_like(x), F.one_hot(y, 3).float(), cur  # never misclassified: every step runs

    def spy(losses, rho, halved_last, best_last, best):
        out = _halve_at_checkpoint(losses, rho, halved_last, best_last, best)
        seen.append((len(calls) - 2, out.tolist()))
        return out

    monkeypatch.setattr(apgd_mod, "_loss_grad", scripted_loss_grad)
    monkeypatch.setattr(apgd_mod, "_halve_at_checkpoint", spy)
    x = torch.full((n, 1, 2, 2), 0.5)
    apgd_mod._apgd_run(torch.nn.Identity(), x, torch.zeros(n, dtype=torch.long), torch.Generator().manual_seed(0),
                       eps=0.1, steps=steps, norm="linf", rho=RHO)
    expected = _reference_checkpoints(script, steps, RHO)
    assert [i for i, _ in seen] == [21, 40, 56, 69, 79, 86, 92, 98] == [i for i, _ in expected]
    assert seen == expected
    halvings = torch.tensor([d for _, d in seen]).sum(0).tolist()
    assert halvings[:4] == [0, 8, 4, 8]  # rising never halves; flat always; the early peak every other time


# ------------------------------------------------------------------------- APGD-T and FAB-T: the targets
def _xy(ds, n=60):
    x, y = ds.tensors
    return x[:n].clone(), y[:n].clone()


def _ranked(model, x):
    with torch.no_grad():
        return model(x).argsort(dim=1, descending=True)


@pytest.mark.parametrize("name, module, run, target_at", [("apgd_t", apgd_mod, "_apgd_run", "target"),
                                                          ("fab_t", fab_mod, "_fab_run", 3)])
def test_targets_start_at_the_runner_up_and_never_are_the_true_class(trained_digits_model, digits_test, monkeypatch,
                                                                      name, module, run, target_at):
    m = trained_digits_model
    x, y = _xy(digits_test)
    order = _ranked(m, x)
    real = getattr(module, run)
    plans: list[tuple[torch.Tensor, torch.Tensor]] = []

    def spy(*args, **kw):
        t = kw["target"] if target_at == "target" else args[target_at]
        plans.append((args[2].clone(), t.clone()))
        return real(*args, **kw)

    monkeypatch.setattr(module, run, spy)
    getattr(attacks, name)(m, x, y, eps=0.05, steps=3, n_targets=3, seed=0)
    assert 1 <= len(plans) <= 3
    clean_ok = order[:, 0] == y
    for yy, t in plans:
        assert bool((t != yy).all()), f"{name}: a target is the true class"
    # the first run attacks every correctly classified image towards its runner-up, the j-th towards rank j + 1
    y1, t1 = plans[0]
    assert torch.equal(y1, y[clean_ok]) and torch.equal(t1, order[clean_ok, 1])
    for j, (_, t) in enumerate(plans[1:], start=2):
        assert bool(torch.isin(t, order[:, j]).all())


def test_apgd_t_with_one_target_is_targeted_dlr_at_the_runner_up(trained_digits_model, digits_test):
    """apgd_t(n_targets=1) breaks exactly the images that one APGD run of the targeted DLR loss towards the
    runner-up breaks (same seed), and that is many of them (towards the true class it would break almost none)."""
    m = trained_digits_model
    x, y = _xy(digits_test)
    r = attacks.attack("apgd_t", m, x, y, eps=0.08, steps=10, n_targets=1, seed=0)
    order = _ranked(m, x)
    idx = (order[:, 0] == y).nonzero().flatten()
    with eval_mode(m), frozen_params(m):
        _, _, succ = apgd_mod._apgd_run(m, x[idx], y[idx], make_generator(0, torch.device("cpu")), eps=0.08,
                                        steps=10, norm="linf", rho=RHO, loss="dlr_t", target=order[idx, 1])
    assert torch.equal(r.fooled[idx], succ)
    assert int(succ.sum()) >= 10, int(succ.sum())


def test_fab_t_with_one_target_is_fab_at_the_runner_up(trained_digits_model, digits_test):
    m = trained_digits_model
    x, y = _xy(digits_test)
    eps = 0.15
    r = attacks.attack("fab_t", m, x, y, eps=eps, steps=10, n_targets=1, seed=0)
    order = _ranked(m, x)
    idx = (order[:, 0] == y).nonzero().flatten()
    with eval_mode(m), frozen_params(m):
        _, norms = fab_mod._fab_run(m, x[idx], y[idx], order[idx, 1], make_generator(0, torch.device("cpu")),
                                    eps=eps, steps=10, norm="linf", alpha_max=0.1, eta=1.05, beta=0.9,
                                    random_start=False, hit_target=False)
    succ = norms <= eps + eps * 1e-6 + 1e-7
    assert torch.equal(r.fooled[idx], succ)
    assert int(succ.sum()) >= 10, int(succ.sum())


# ------------------------------------------------------------------------------------ Square: p schedule
def _reference_p(it: int, p_init: float, n_queries: int, rescale: bool) -> float:
    """Square's ``p_selection``, transcribed from the reference table."""
    if rescale:
        it = int(it / n_queries * 10000)
    for hi, div in ((10, 1), (50, 2), (200, 4), (500, 8), (1000, 16), (2000, 32), (4000, 64), (6000, 128),
                    (8000, 256)):
        if it <= hi:
            return p_init / div
    return p_init / 512


@pytest.mark.parametrize("queries, rescale", [(10000, False), (5000, False), (5000, True), (1000, True)])
def test_square_p_schedule_is_the_reference_schedule(queries, rescale):
    got = [_p_at(it, 0.8, queries, rescale) for it in range(queries)]
    assert got == [_reference_p(it, 0.8, queries, rescale) for it in range(queries)]
    if queries == 10000:  # the halvings fall right after iterations 10, 50, 200, ..., 8000
        drops = [it for it in range(1, queries) if got[it] < got[it - 1]]
        assert drops == [11, 51, 201, 501, 1001, 2001, 4001, 6001, 8001]
        assert got[-1] == pytest.approx(0.8 / 512)


# ------------------------------------------------------------------ PGD: per-sample options, exactly

def boundary_model() -> nn.Module:
    """logits = [s - 2, 2 - s] with s the sum of the 4 pixels: class 0 exactly when s > 2."""
    m = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    with torch.no_grad():
        m[1].weight.copy_(torch.tensor([[1.0] * 4, [-1.0] * 4]))
        m[1].bias.copy_(torch.tensor([-2.0, 2.0]))
    return m.eval()


def test_success_counts_the_final_point():
    # s = 2.04: class 0, right; one step of 0.05 per pixel down (s = 1.84) crosses the boundary, and only the final
    # point is misclassified
    x, y = torch.full((1, 1, 2, 2), 0.51), torch.tensor([0])
    res = attacks.pgd(boundary_model(), x, y, 0.05, alpha=0.05, steps=1, random_start=False,
                      return_details=True, track_success=True)
    assert torch.allclose(res.adv, torch.full_like(x, 0.46)) and res.evals.tolist() == [1]
    assert res.success.tolist() == [True]
    small = attacks.pgd(boundary_model(), x, y, 0.005, alpha=0.005, steps=1, random_start=False,
                        return_details=True, track_success=True)
    assert small.success.tolist() == [False]  # s = 2.02: still right


def test_success_is_judged_sample_by_sample_in_a_batch():
    # s = 2.04 crosses the boundary with one step of 0.05 down (s = 1.84); s = 2.4 does not (s = 2.2): the logits of
    # the second sample hold the batch's largest value, so a prediction taken over the whole batch would be wrong
    x, y = torch.cat([torch.full((1, 1, 2, 2), 0.51), torch.full((1, 1, 2, 2), 0.6)]), torch.tensor([0, 0])
    res = attacks.pgd(boundary_model(), x, y, 0.05, alpha=0.05, steps=1, random_start=False,
                      return_details=True, track_success=True)
    assert res.success.tolist() == [True, False]


def test_a_stopped_sample_keeps_its_point_and_the_others_their_own_step_sizes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).eval()
    x, y = torch.rand(4, 1, 4, 4), torch.tensor([0, 1, 2, 0])
    eps = torch.tensor([0.1, 0.2, 0.05, 0.15])
    alpha = torch.tensor([0.01, 0.03, 0.02, 0.04])

    def run(stop=None):
        return attacks.pgd(model, x, y, eps, alpha=alpha, steps=4, generator=torch.Generator().manual_seed(3),
                           stop=stop, return_details=True)

    free = run()
    first = run(lambda k, xa, g, logits, index: index == 0)  # sample 0 stops at its first evaluation
    start = run(lambda k, xa, g, logits, index: torch.ones_like(index, dtype=torch.bool))
    assert start.evals.tolist() == [1, 1, 1, 1]
    assert first.evals.tolist() == [1, 4, 4, 4] and free.evals.tolist() == [4, 4, 4, 4]
    assert torch.equal(first.adv[0], start.adv[0])  # stopped: its (random) start point
    assert torch.equal(first.adv[1:], free.adv[1:])  # the others moved by their own alpha, as without the rule
    # each moved sample lies in its own ball, and moved by at most steps x its alpha from the start
    moved = (free.adv - start.adv).flatten(1).abs().amax(1)
    assert bool((moved <= 4 * alpha + 1e-6).all()) and bool((moved > 0).all())
    assert bool(((free.adv - x).flatten(1).abs().amax(1) <= eps + 1e-6).all())


def test_stop_from_delays_the_rule():
    model = boundary_model()
    x, y = torch.rand(3, 1, 2, 2), torch.tensor([0, 1, 0])

    def always(k, xa, g, logits, index):
        return torch.ones_like(index, dtype=torch.bool)

    res = attacks.pgd(model, x, y, 0.1, steps=5, random_start=False, stop=always, stop_from=2, return_details=True)
    assert res.evals.tolist() == [3, 3, 3]
    with pytest.raises(Exception, match="stop must return a bool tensor of the 3 active samples"):
        attacks.pgd(model, x, y, 0.1, steps=2, stop=lambda *a: torch.ones(2, dtype=torch.bool), return_details=True)


def test_apgd_variants_share_the_reference_defaults_and_check_their_counts():
    import inspect

    from robustest.core.errors import ConfigError

    for fn in (attacks.apgd, attacks.apgd_dlr, attacks.apgd_t):
        params = inspect.signature(fn).parameters
        assert params["rho"].default == RHO and params["restarts"].default == 1, fn.__name__
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3)).eval()
    x, y = torch.rand(2, 1, 2, 2), torch.tensor([0, 1])
    for kw, name in (({"restarts": 0}, "restarts"), ({"eot_iter": 0}, "eot_iter"), ({"steps": 0}, "steps")):
        with pytest.raises(ConfigError, match=name):
            attacks.apgd_dlr(model, x, y, 0.1, **kw)


@pytest.mark.parametrize("target", [None, torch.tensor([2, 2, 0, 1, 0, 1])])
def test_pgd_restarts_keep_per_sample_the_stronger_run(target):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3)).eval()
    x, y = torch.rand(6, 1, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2])
    kw = {"steps": 2, "alpha": 0.02, "target": target}
    both = attacks.pgd(model, x, y, 0.05, restarts=2, generator=torch.Generator().manual_seed(4), **kw)
    gen = torch.Generator().manual_seed(4)
    runs = [attacks.pgd(model, x, y, 0.05, generator=gen, **kw) for _ in range(2)]
    with torch.no_grad():
        logits = [model(r) for r in runs]
    if target is None:
        loss = [F.cross_entropy(lg, y, reduction="none") for lg in logits]
        succ = [lg.argmax(1) != y for lg in logits]
    else:
        loss = [-F.cross_entropy(lg, target, reduction="none") for lg in logits]
        succ = [lg.argmax(1) == target for lg in logits]
    second = (succ[1] & ~succ[0]) | ((succ[1] == succ[0]) & (loss[1] > loss[0]))
    assert 0 < int(second.sum()) < 6  # each run wins somewhere: the choice is per sample
    want = torch.where(second.view(-1, 1, 1, 1), runs[1], runs[0])
    assert torch.equal(both, want)


@pytest.mark.parametrize("kw, message", [
    ({"restarts": 0}, "restarts must be a positive integer, got 0"),
    ({"alpha": -1.0}, "alpha must be a finite number >= 0, got -1.0"),
    ({"steps": 0}, "steps must be a positive integer, got 0"),
    ({"stop_from": -1}, "stop_from must be an integer >= 0, got -1"),
    ({"eps": 2.0}, "eps must lie in (0, 1] for the L-inf threat model"),
])
def test_pgd_refusals_name_the_argument(kw, message):
    from robustest.core.errors import ConfigError

    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3)).eval()
    x, y = torch.rand(2, 1, 2, 2), torch.tensor([0, 1])
    with pytest.raises(ConfigError) as err:
        attacks.pgd(model, x, y, **{"eps": 0.1, **kw})
    assert str(err.value).startswith(message)


def test_random_start_is_inside_the_ball_and_the_pixel_range():
    from robustest.attacks._core import random_point

    x = torch.tensor([0.0, 0.02, 0.5, 0.98, 1.0]).repeat(200).reshape(200, 1, 1, 5)
    p = random_point(x, 0.1, "linf", torch.Generator().manual_seed(0))
    d = p - x
    assert float(p.min()) == 0.0 and float(p.max()) == 1.0  # clipped at both ends, reached at both ends
    assert float(d.abs().max()) <= 0.1 + 1e-7
    mid = d[..., 2].flatten()  # unclipped: uniform on [-0.1, 0.1]
    assert -0.1 <= float(mid.min()) < -0.08 and 0.08 < float(mid.max()) <= 0.1 and abs(float(mid.mean())) < 0.02
    q = random_point(x, 0.5, "l2", torch.Generator().manual_seed(0))  # L2: a scaled random direction, clipped
    assert float(q.min()) == 0.0 and float(q.max()) == 1.0 and float(q.std()) > 0.1
    assert float((q - x).flatten(1).norm(dim=1).max()) <= 0.5 + 1e-6


def test_targeted_success_is_prediction_of_the_target_not_any_other_class():
    # three classes: logits [s - 2, 2 - s, 0]; from s = 2.04 one step of 0.05 down lands on class 1, not class 2
    m = nn.Sequential(nn.Flatten(), nn.Linear(4, 3)).eval()
    with torch.no_grad():
        m[1].weight.copy_(torch.tensor([[1.0] * 4, [-1.0] * 4, [0.0] * 4]))
        m[1].bias.copy_(torch.tensor([-2.0, 2.0, 0.0]))
    x, y = torch.full((1, 1, 2, 2), 0.51), torch.tensor([0])
    for target, hit in ((1, True), (2, False)):
        res = attacks.pgd(m, x, y, 0.05, alpha=0.05, steps=1, random_start=False, target=target,
                          return_details=True, track_success=True)
        assert res.success.tolist() == [hit], target
        two = attacks.pgd(m, x, y, 0.05, alpha=0.025, steps=2, random_start=False, target=target,
                          return_details=True, track_success=True)
        assert two.success.tolist() == [hit], target  # the evaluated points and the final one alike


def test_targeted_success_is_prediction_of_the_target():
    x, y = torch.full((1, 1, 2, 2), 0.51), torch.tensor([0])
    # class 1 is the target: reached at the final point, as the untargeted attack's success
    res = attacks.pgd(boundary_model(), x, y, 0.05, alpha=0.05, steps=1, random_start=False, target=1,
                      return_details=True, track_success=True)
    assert res.success.tolist() == [True]
    start = attacks.pgd(boundary_model(), x, y, 0.005, alpha=0.005, steps=1, random_start=False, target=1,
                        return_details=True, track_success=True)
    assert start.success.tolist() == [False]


def test_apgd_t_does_not_stop_on_success_by_default():
    import inspect

    for fn in (attacks.apgd, attacks.apgd_dlr, attacks.apgd_t):
        assert inspect.signature(fn).parameters["stop_on_success"].default is False, fn.__name__


@pytest.mark.parametrize("fn, expected", [
    (attacks.apgd, {"steps": 100, "norm": "linf", "restarts": 1, "rho": 0.75, "seed": None, "eot_iter": 1,
                    "return_trace": False}),
    (attacks.apgd_dlr, {"steps": 100, "norm": "linf", "restarts": 1, "rho": 0.75, "seed": None, "eot_iter": 1}),
    (attacks.apgd_t, {"steps": 100, "norm": "linf", "n_targets": 9, "restarts": 1, "rho": 0.75, "seed": None,
                      "target": None}),
])
def test_apgd_defaults_are_autoattacks(fn, expected):
    import inspect

    from robustest.attacks._core import _DEFAULT_CHUNK

    params = inspect.signature(fn).parameters
    assert {k: params[k].default for k in expected} == expected
    assert params["batch_size"].default == _DEFAULT_CHUNK and params["generator"].default is None


@pytest.mark.parametrize("fn", [attacks.apgd, attacks.apgd_dlr, attacks.apgd_t])
@pytest.mark.parametrize("kw, message", [
    ({"steps": 0}, "steps must be a positive integer, got 0"),
    ({"restarts": 0}, "restarts must be a positive integer, got 0"),
    ({"rho": -0.5}, "rho must be a finite number >= 0, got -0.5"),
    ({"norm": "l7"}, "norm"),
    ({"eps": 2.0}, "eps must lie in (0, 1] for the L-inf threat model"),
])
def test_apgd_variants_name_each_bad_argument(fn, kw, message):
    from robustest.core.errors import ConfigError

    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 5)).eval()
    x, y = torch.rand(2, 1, 2, 2), torch.tensor([0, 1])
    kw = {"eps": 0.1, **kw}
    with pytest.raises(ConfigError) as exc:
        fn(model, x, y, **kw)
    assert message in str(exc.value)


def test_apgd_eot_iter_and_n_targets_are_checked_by_name():
    from robustest.core.errors import ConfigError

    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 5)).eval()
    x, y = torch.rand(2, 1, 2, 2), torch.tensor([0, 1])
    for fn in (attacks.apgd, attacks.apgd_dlr):
        with pytest.raises(ConfigError, match="^eot_iter must be a positive integer, got 0$"):
            fn(model, x, y, 0.1, eot_iter=0)
    with pytest.raises(ConfigError, match="^n_targets must be a positive integer, got 0$"):
        attacks.apgd_t(model, x, y, 0.1, n_targets=0)
    with pytest.raises(ConfigError, match="^n_targets=5 but the model returns 5 classes: use at most 4 target"):
        attacks.apgd_t(model, x, y, 0.1, n_targets=5)
    attacks.apgd_t(model, x, y, 0.1, n_targets=4, steps=1)  # the bound itself is fine


def test_apgd_dlr_needs_three_classes_and_apgd_t_four():
    from robustest.core.errors import ConfigError

    x = torch.rand(2, 1, 2, 2)
    two = nn.Sequential(nn.Flatten(), nn.Linear(4, 2)).eval()
    with pytest.raises(ConfigError, match="APGD-DLR"):
        attacks.apgd_dlr(two, x, torch.tensor([0, 1]), 0.1, steps=1)
    three = nn.Sequential(nn.Flatten(), nn.Linear(4, 3)).eval()
    attacks.apgd_dlr(three, x, torch.tensor([0, 1]), 0.1, steps=1)
    with pytest.raises(ConfigError, match=r"APGD-T \(targeted DLR loss\)"):
        attacks.apgd_t(three, x, torch.tensor([0, 1]), 0.1, steps=1, n_targets=1)
    four = nn.Sequential(nn.Flatten(), nn.Linear(4, 4)).eval()
    attacks.apgd_t(four, x, torch.tensor([0, 1]), 0.1, steps=1, n_targets=1)


@pytest.mark.parametrize("name, expected", [
    ("apgd", {"steps": 100, "norm": "linf", "restarts": 1, "rho": 0.75, "stop_on_success": False, "eot_iter": 1,
              "return_trace": False}),
    ("apgd_dlr", {"steps": 100, "norm": "linf", "restarts": 1, "rho": 0.75, "stop_on_success": False,
                  "eot_iter": 1}),
    ("apgd_t", {"steps": 100, "norm": "linf", "restarts": 1, "rho": 0.75, "n_targets": 9, "stop_on_success": False}),
])
def test_apgd_defaults_are_what_the_attack_runs_with(name, expected, monkeypatch):
    """The defaults as the attack receives them (a signature can show one value while the body uses another)."""
    import importlib

    from robustest.attacks._core import _DEFAULT_CHUNK

    apgd_mod = importlib.import_module("robustest.attacks.apgd")  # the module (the package's name is the function)
    seen = {}

    def record(core, model, x, y, seed, batch_size, generator, **kw):
        seen.update(kw, seed=seed, batch_size=batch_size, generator=generator)
        return x

    monkeypatch.setattr(apgd_mod, "_run", record)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 10)).eval()
    getattr(apgd_mod, name)(model, torch.rand(2, 1, 2, 2), torch.tensor([0, 1]), 0.1)
    assert {k: seen[k] for k in expected} == expected
    assert (seen["seed"], seen["batch_size"], seen["generator"]) == (None, _DEFAULT_CHUNK, None)
    if name == "apgd_t":
        assert seen["per_sample"] == {"target": None}


# ------------------------------------------------------------------------------- APGD: its start and its trace
def _still(monkeypatch, logits_row=(1.0, 0.0, 0.0)):
    """_loss_grad with a zero gradient and fixed logits (class 0 on top): APGD never moves off its start."""
    def still(model, x, y, loss, target, hit_target):
        row = torch.tensor(logits_row, dtype=x.dtype)
        return torch.zeros_like(x), row.expand(x.shape[0], 3).clone(), torch.zeros(x.shape[0], dtype=x.dtype)

    monkeypatch.setattr(apgd_mod, "_loss_grad", still)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_apgd_linf_start_is_a_uniform_draw_scaled_to_the_ball_surface(dtype, monkeypatch):
    """The reference's start: x + eps * t / max|t| with t uniform in [-1, 1], clamped to [0, 1]."""
    _still(monkeypatch)
    x = torch.full((2, 1, 3, 3), 0.5, dtype=dtype)
    out, _, _ = apgd_mod._apgd_run(nn.Identity(), x, torch.zeros(2, dtype=torch.long),
                                   torch.Generator().manual_seed(4), eps=0.1, steps=3, norm="linf", rho=RHO)
    t = torch.rand(x.shape, generator=torch.Generator().manual_seed(4), dtype=dtype) * 2 - 1
    want = x + 0.1 * t / t.abs().amax(dim=(1, 2, 3), keepdim=True)
    assert out.dtype == dtype
    assert torch.allclose(out, want, atol=1e-6 if dtype == torch.float32 else 1e-12)
    assert (out - x).abs().amax(dim=(1, 2, 3)).tolist() == pytest.approx([0.1, 0.1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_apgd_l2_start_is_a_gaussian_draw_of_the_input_dtype_scaled_to_the_sphere(dtype, monkeypatch):
    _still(monkeypatch)
    x = torch.full((2, 1, 3, 3), 0.5, dtype=dtype)
    out, _, _ = apgd_mod._apgd_run(nn.Identity(), x, torch.zeros(2, dtype=torch.long),
                                   torch.Generator().manual_seed(4), eps=0.3, steps=3, norm="l2", rho=RHO)
    t = torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=dtype)
    want = x + 0.3 * t / t.flatten(1).norm(dim=1).view(2, 1, 1, 1)
    assert out.dtype == dtype
    assert torch.allclose(out, want, atol=1e-6 if dtype == torch.float32 else 1e-12)


def test_apgd_stop_on_success_leaves_the_last_unbroken_sample_its_whole_run():
    """With stop_on_success, sample 0 is misclassified from the start and leaves at once; sample 1 (never broken)
    is then the only one left and must still take every step: its point is the one of the run without
    stop_on_success (the runs are per sample), not its start."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.5, -0.5, 0.2, 0.0], [0.0, 0.3, -0.2, 0.4]]))
        model[1].bias.copy_(torch.tensor([3.0, 0.0, 0.0]))
    model.eval()
    x = torch.tensor([[0.2, 0.4, 0.6, 0.8], [0.5, 0.5, 0.5, 0.5]]).reshape(2, 1, 2, 2)
    y = torch.tensor([1, 0])  # sample 0 is predicted 0 (wrong from the start); sample 1 keeps class 0 by a wide margin
    runs = {}
    for stop in (False, True):
        runs[stop] = apgd_mod._apgd_run(model, x, y, torch.Generator().manual_seed(0), eps=0.05, steps=10,
                                        norm="linf", rho=RHO, stop_on_success=stop)
    out_free, loss_free, succ_free = runs[False]
    out_stop, loss_stop, succ_stop = runs[True]
    assert succ_free.tolist() == succ_stop.tolist() == [True, False]
    assert torch.equal(out_stop[1], out_free[1])
    assert float(loss_stop[1]) == pytest.approx(float(loss_free[1]))
    start = torch.rand(x.shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
    start = x + 0.05 * start / start.abs().amax(dim=(1, 2, 3), keepdim=True)
    assert not torch.allclose(out_stop[1], start[1])  # the run moved it


def test_apgd_trace_measures_the_tail_gain_against_the_rise_from_the_start(monkeypatch):
    """``improving``: the best loss rose in the last tenth by more than 1e-3 of its rise since the START (loss
    0 -> 100 at the first step, then flat, then +0.05 at the last step: 0.05 < 1e-3 * 100.05, not improving;
    measured from the first step instead, it would be)."""
    script = [0.0, 100.0] + [100.0] * 8 + [100.05]  # 10 steps: the tail is the last step

    def scripted(model, x, y, loss, target, hit_target):
        k = len(calls)
        calls.append(k)
        return torch.ones_like(x), F.one_hot(y, 3).float(), torch.full((x.shape[0],), script[k])

    calls: list[int] = []
    monkeypatch.setattr(apgd_mod, "_loss_grad", scripted)
    trace: dict = {}
    apgd_mod._apgd_run(nn.Identity(), torch.full((1, 1, 2, 2), 0.5), torch.zeros(1, dtype=torch.long),
                       torch.Generator().manual_seed(0), eps=0.1, steps=10, norm="linf", rho=RHO, trace=trace)
    assert len(calls) == 11
    assert trace["improving"].tolist() == [False]
    script[-1] = 100.2  # 0.2 > 0.10005: improving
    calls.clear()
    apgd_mod._apgd_run(nn.Identity(), torch.full((1, 1, 2, 2), 0.5), torch.zeros(1, dtype=torch.long),
                       torch.Generator().manual_seed(0), eps=0.1, steps=10, norm="linf", rho=RHO, trace=trace)
    assert trace["improving"].tolist() == [True]


def test_apgd_improving_is_any_restart_still_improving(monkeypatch):
    """Over restarts a sample is reported improving when any restart was (and no restart broke it)."""
    flags = iter([[True, False, True], [False, True, False]])

    def run(model, x, y, gen, *, trace, **kw):
        trace["improving"] = torch.tensor(next(flags))
        return x.clone(), torch.zeros(3), torch.tensor([False, False, True])

    monkeypatch.setattr(apgd_mod, "_apgd_run", run)
    _, improving = apgd_mod._apgd_core(nn.Identity(), torch.zeros(3, 1, 2, 2), torch.zeros(3, dtype=torch.long),
                                       torch.Generator(), eps=0.1, steps=5, norm="linf", restarts=2, rho=RHO,
                                       eot_iter=1, stop_on_success=False, return_trace=True)
    assert improving.tolist() == [True, True, False]  # sample 2 was broken: not "improving"


def test_apgd_second_step_mixes_in_a_quarter_of_the_momentum(monkeypatch):
    """x_2 = P(x_1 + 0.75 (z_2 - x_1) + 0.25 (x_1 - x_0)) (Croce & Hein's alpha = 0.75): with the gradient's sign +
    then -, from the start x_0 = x + d_0, the first step lands on x + eps and the second on x - eps/4 - d_0/4."""
    signs, losses = [1.0, -1.0, 1.0], [0.0, 1.0, 2.0]  # rising losses: the last point is the best, and returned

    def scripted(model, x, y, loss, target, hit_target):
        k = len(calls)
        calls.append(k)
        return torch.full_like(x, signs[k]), F.one_hot(y, 3).float(), torch.full((x.shape[0],), losses[k])

    calls: list[int] = []
    monkeypatch.setattr(apgd_mod, "_loss_grad", scripted)
    x, eps = torch.full((1, 1, 2, 2), 0.5), 0.1
    out, _, _ = apgd_mod._apgd_run(nn.Identity(), x, torch.zeros(1, dtype=torch.long),
                                   torch.Generator().manual_seed(2), eps=eps, steps=2, norm="linf", rho=RHO)
    t = torch.rand(x.shape, generator=torch.Generator().manual_seed(2)) * 2 - 1
    d0 = eps * t / t.abs().amax()
    assert len(calls) == 3
    assert torch.allclose(out, x - eps / 4 - d0 / 4, atol=1e-6)


@pytest.mark.parametrize("fn, extra", [(attacks.bim, {}), (attacks.rfgsm, {}), (attacks.mifgsm, {})])
def test_the_iterative_fgsm_variants_name_a_bad_step_size(fn, extra):
    from robustest.core.errors import ConfigError

    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3)).eval()
    x, y = torch.rand(2, 1, 2, 2), torch.tensor([0, 1])
    with pytest.raises(ConfigError) as err:
        fn(model, x, y, 0.1, alpha=-1.0, **extra)
    assert str(err.value).startswith("alpha must be a finite number >= 0, got -1.0")


def test_fgsm_draws_its_random_start_from_the_generator_given():
    """The same generator state gives the same point, another state another point (the start is random)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).eval()
    x, y = torch.rand(4, 1, 4, 4), torch.tensor([0, 1, 2, 0])
    a, b, c = (attacks.fgsm(model, x, y, 0.1, random_start=True, generator=torch.Generator().manual_seed(s))
               for s in (7, 7, 8))
    torch.manual_seed(1)  # the global generator plays no part
    d = attacks.fgsm(model, x, y, 0.1, random_start=True, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and torch.equal(a, d) and not torch.equal(a, c)


def test_mifgsm_decays_its_momentum_by_one_by_default():
    """MI-FGSM's default decay is Dong et al.'s mu = 1.0: the same points as decay=1.0 given, not as 2.0."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3)).eval()
    x, y = torch.rand(6, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    kw = {"eps": 0.3, "alpha": 0.05, "steps": 6}
    default = attacks.mifgsm(model, x, y, **kw)
    assert torch.equal(default, attacks.mifgsm(model, x, y, decay=1.0, **kw))
    assert not torch.equal(default, attacks.mifgsm(model, x, y, decay=2.0, **kw))


def test_random_point_l2_adds_the_scaled_direction():
    """L2: x + d / ||d|| * r * eps with d ~ N(0, I) and r ~ U[0, 1) per image, drawn in that order."""
    from robustest.attacks._core import random_point

    x = torch.full((3, 1, 2, 2), 0.5)
    p = random_point(x, 0.2, "l2", torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)
    d, r = torch.randn(x.shape, generator=g), torch.rand((3, 1, 1, 1), generator=g)
    d = d / d.flatten(1).norm(dim=1).view(-1, 1, 1, 1) * r * 0.2
    assert torch.allclose(p, (x + d).clamp(0, 1), atol=1e-7) and not torch.allclose(p, (x - d).clamp(0, 1))
