"""robustest.evaluate.certification: the bracket (certified | undecided | broken, soundness errors) with exact
counts on hand-built inputs, run_certify on digits, and a suite that stores and compares certified outcomes."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from robustest import certify
from robustest.certify import Certificate
from robustest.core.errors import ConfigError, DataError
from robustest.evaluate.certification import (
    Bracket,
    bracket,
    bracket_eval,
    checked_breaks,
    run_certify,
)
from robustest.evaluate.flags import check_accepted

pytestmark = pytest.mark.usefixtures("one_thread")

EPS = 0.1


def _linear() -> nn.Module:
    """Two classes on 1 x 1 x 2 images: z0 = a - b, z1 = b - a (class 0 when a > b)."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False))
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor([[1.0, -1.0], [-1.0, 1.0]]))
    return model.eval()


def _img(a: float, b: float) -> torch.Tensor:
    return torch.tensor([a, b]).view(1, 1, 2)


# every sample's label is 0; (clean image, attack's point, certified by the hand-made certificate)
CASES = [
    (_img(0.8, 0.2), _img(0.8, 0.2), True),       # 0 certified, not broken
    (_img(0.55, 0.5), _img(0.45, 0.6), False),    # 1 broken by the attack (in the ball, in [0, 1], wrong)
    (_img(0.55, 0.5), _img(0.55, 0.5), False),    # 2 undecided
    (_img(0.2, 0.8), _img(0.2, 0.8), False),      # 3 misclassified clean: broken
    (_img(0.55, 0.5), _img(0.45, 0.6), True),     # 4 certified AND broken: a soundness error
    (_img(0.55, 0.5), _img(0.3, 0.8), False),     # 5 wrong but outside the ball: undecided, unverified
    (_img(0.05, 0.0), _img(-0.04, 0.05), False),  # 6 wrong, in the ball but outside [0, 1]: undecided, unverified
]


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Certificate]:
    x = torch.stack([c[0] for c in CASES])
    adv = torch.stack([c[1] for c in CASES])
    y = torch.zeros(len(CASES), dtype=torch.long)
    cert = torch.tensor([c[2] for c in CASES])
    margins = torch.stack([torch.full((len(CASES),), float("inf")), torch.where(cert, 1.0, -1.0)], dim=1)
    return x, y, adv, Certificate(margins=margins, certified=cert, method="ibp", eps=EPS, norm="linf")


def test_bracket_counts_on_hand_built_inputs(caplog):
    x, y, adv, cert = _inputs()
    claimed = torch.tensor([False, True, False, False, True, True, True])  # what an evaluation said it broke
    index = torch.arange(10, 17)
    with caplog.at_level("ERROR", logger="robustest.evaluate"):
        br = bracket(_linear(), x, y, cert, adv, index=index, claimed_broken=claimed)
    assert br.labels == ["certified", "broken", "undecided", "broken", "unsound", "undecided", "undecided"]
    assert br.counts() == {"certified": 1, "undecided": 3, "broken": 2, "unsound": 1, "broken_by_attack": 1,
                           "misclassified": 1}
    assert br.unverified == 2  # 5 and 6: the evaluation's points failed the check
    assert br.certified_accuracy == pytest.approx(1 / 7) and br.robust_accuracy == pytest.approx(4 / 7)
    assert br.clean_accuracy == pytest.approx(6 / 7)
    assert br.certified_accuracy <= br.robust_accuracy <= br.clean_accuracy
    # the soundness error is loud: logged, flagged (unreliable, naming the sample), in the dict, never accepted
    assert not br.sound and "SOUNDNESS ERROR" in caplog.text
    flag = br.flag()
    assert flag.name == "unsound-certificate" and flag.severity == "unreliable" and flag.samples == (14,)
    d = br.to_dict()
    assert d["sound"] is False and d["unsound_samples"] == [14] and d["counts"]["unsound"] == 1
    assert d["shares"]["undecided"] == pytest.approx(3 / 7) and d["unverified_breaks"] == 2
    with pytest.raises(ConfigError, match="cannot be accepted"):
        check_accepted(["unsound-certificate"])


def test_a_sound_bracket_has_no_flag():
    x, y, adv, cert = _inputs()
    keep = torch.tensor([0, 1, 2, 3, 5, 6])
    fixed = Certificate(cert.margins[keep], cert.certified[keep], "ibp", EPS, "linf")
    br = bracket(_linear(), x[keep], y[keep], fixed, adv[keep])
    assert br.sound and br.flag() is None and br.counts()["unsound"] == 0
    assert br.labels == ["certified", "broken", "undecided", "broken", "undecided", "undecided"]
    # the model's own IBP certificate: sound against the same points; without attack points only clean errors break
    real = certify.ibp(_linear(), x, y, EPS)
    assert bracket(_linear(), x, y, real, adv).sound
    assert bracket(_linear(), x, y, real).counts()["broken"] == 1


def test_from_outcomes_exact_counts_and_checks():
    br = Bracket.from_outcomes(certified=[1, 1, 0, 0, 0, 1], broken=[0, 1, 1, 0, 0, 0],
                               clean_correct=[1, 1, 1, 1, 0, 0], method="crown", eps=0.3, norm="l2")
    # 0 certified; 1 certified and broken; 2 broken by an attack; 3 undecided; 4 a clean error (broken whatever
    # `broken` says); 5 a certified clean error: unsound too
    assert br.labels == ["certified", "unsound", "broken", "undecided", "broken", "unsound"]
    assert br.counts() == {"certified": 1, "undecided": 1, "broken": 2, "unsound": 2, "broken_by_attack": 1,
                           "misclassified": 1}
    assert br.flag().samples == (1, 5) and "CROWN" in br.flag().message
    assert sum(br.counts()[k] for k in ("certified", "undecided", "broken", "unsound")) == br.num_samples
    with pytest.raises(ConfigError, match="one value per sample"):
        Bracket.from_outcomes([1, 0], [0], [1, 1])
    empty = Bracket.from_outcomes([], [], [])
    assert empty.counts()["certified"] == 0 and empty.robust_accuracy == 0.0 and empty.sound


def test_checked_breaks_and_refusals():
    x, y, adv, cert = _inputs()
    broken, correct = checked_breaks(_linear(), x, y, adv, EPS, "linf", batch_size=3)
    assert broken.tolist() == [False, True, False, True, True, False, False]
    assert correct.tolist() == [True, True, True, False, True, True, True]
    # the L2 ball of the same radius is smaller: sample 1's point (L2 distance 0.14) is no longer inside
    assert checked_breaks(_linear(), x, y, adv, EPS, "l2")[0].tolist()[1] is False
    with pytest.raises(ConfigError, match="shape"):
        checked_breaks(_linear(), x, y, adv[:3], EPS)
    smooth = certify.smooth_certify(_linear(), x, sigma=0.1, n0=5, n=20)
    with pytest.raises(ConfigError, match="smoothed classifier"):
        bracket(_linear(), x, y, smooth, adv)


def test_bracket_eval_adds_the_flag_to_the_evaluation(monkeypatch):
    from robustest.evaluate import evaluate

    x, y, _, _ = _inputs()
    res = evaluate(_linear(), (x, y), EPS, version="custom", attacks=["fgsm"], keep_adv=True)
    br = bracket_eval(_linear(), (x, y), res, "ibp")
    assert br.sound and "unsound-certificate" not in [f.name for f in res.flags]
    assert br.clean_accuracy == pytest.approx(res.clean_accuracy)
    assert br.robust_accuracy >= res.robust_accuracy and set(br.timings) == {"certify_s", "bracket_s"}
    with pytest.raises(ConfigError, match="smoothed classifier"):
        bracket_eval(_linear(), (x, y), res, "smoothing")
    with pytest.raises(DataError, match="labels differ"):
        bracket_eval(_linear(), (x, torch.ones_like(y)), res, "ibp")

    def everything_certified(model, xs, ys, eps, norm="linf", *, batch_size=None):
        n = xs.shape[0]
        return Certificate(torch.ones(n, 2), torch.ones(n, dtype=torch.bool), "ibp", eps, norm)

    monkeypatch.setattr(certify, "ibp", everything_certified)
    bad = bracket_eval(_linear(), (x, y), res, "ibp")
    assert not bad.sound and bad.counts()["unsound"] >= 1  # sample 3 is misclassified clean yet "certified"
    assert "unsound-certificate" in [f.name for f in res.blocking()] and not res.reliable


# --------------------------------------------------------------------------------------------- on digits
@pytest.fixture(scope="module")
def mlp(mlp_digits_checkpoint) -> nn.Module:
    from robustest.models.checkpoints import load_model

    return load_model(mlp_digits_checkpoint).eval()


@pytest.fixture(scope="module")
def digits40():
    from robustest import data

    x, y = data.load("digits", split="test").tensors
    return x[:40].clone(), y[:40].clone()


def test_run_certify_bounds(mlp, digits40):
    ibp = run_certify(mlp, digits40, 0.005, method="ibp")
    crown = run_certify(mlp, digits40, 0.005, method="crown", block_size=7)
    assert ibp.num_samples == crown.num_samples == 40 and torch.equal(ibp.index, torch.arange(40))
    assert ibp.clean_accuracy == crown.clean_accuracy > 0.5
    assert bool((crown.lower_margin >= ibp.lower_margin - 1e-5).all())  # CROWN is never looser than IBP
    assert bool((ibp.certified <= crown.certified).all()) and crown.certified_accuracy > ibp.certified_accuracy > 0
    assert not bool((crown.certified & ~crown.clean_correct).any())  # certified implies correct
    assert torch.equal(ibp.certified, ibp.lower_margin > 0)
    assert torch.equal(run_certify(mlp, digits40, 0.005, method="ibp", block_size=7).certified, ibp.certified)
    doc = crown.to_results()
    assert doc["counts"] == {"certified": int(crown.certified.sum()), "not_certified": 40 - int(crown.certified.sum()),
                             "clean_correct": int(crown.clean_correct.sum()),
                             "misclassified_clean": 40 - int(crown.clean_correct.sum())}
    assert set(doc["lower_margin"]) == {"mean", "median", "min", "max"} and "smoothing" not in doc
    row = crown.rows()[0]
    assert list(row) == ["index", "label", "clean_pred", "clean_correct", "certified", "lower_margin"]
    assert set(crown.timings) == {"clean_s", "certify_s", "total_s"} and crown.settings["batch_size"] == 64


def test_run_certify_smoothing(mlp, digits40):
    res = run_certify(mlp, digits40, 0.2, norm="l2", method="smoothing", sigma=0.25, n0=10, n=100, seed=1)
    assert torch.equal(res.certified, (res.prediction == res.y) & (res.radius >= 0.2))
    assert res.lower_margin is None and res.settings["n"] == 100 and res.settings["alpha"] == 0.001
    doc = res.to_results()["smoothing"]
    assert doc["sigma"] == 0.25 and doc["abstained"] == int((res.prediction == -1).sum())
    again = run_certify(mlp, digits40, 0.2, norm="l2", method="smoothing", sigma=0.25, n0=10, n=100, seed=1)
    assert torch.equal(again.radius, res.radius)  # seeded
    assert set(res.rows()[0]) >= {"certified", "smoothed_pred", "radius", "p_lower"}


@pytest.mark.parametrize("kwargs, message", [
    ({"method": "smoothing", "sigma": 0.25}, "L2 radius"),
    ({"method": "smoothing", "norm": "l2"}, "needs sigma"),
    ({"method": "ibp", "sigma": 0.25}, "smoothing only"),
    ({"method": "zonotope"}, "method"),
    ({"method": "ibp", "batch_size": 0}, "batch_size"),
])
def test_run_certify_refuses_bad_settings(mlp, digits40, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        run_certify(mlp, digits40, 0.1, **kwargs)


def test_run_certify_refuses_an_unsupported_layer_before_any_work(digits40):
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.Sigmoid(), nn.Linear(10, 10))
    with pytest.raises(ConfigError, match="Sigmoid|sigmoid"):
        run_certify(model, digits40, 0.01, method="crown")
    with pytest.raises(DataError, match="empty"):
        run_certify(model, (digits40[0][:0], digits40[1][:0]), 0.01, method="ibp")


# --------------------------------------------------------------------------------------------- suites
@pytest.fixture(scope="module")
def cert_suite(mlp):
    from robustest import data
    from robustest.suite import build_suite

    test = data.load("digits", split="test")
    x, y = test.tensors
    return build_suite(mlp, (x[:120], y[:120]), 0.005, k=30, version="fast", n_neighbors=4, certify="ibp",
                       dataset="digits", split="test")


def test_a_suite_stores_certified_outcomes(cert_suite, mlp, tmp_path):
    from robustest.evaluate.certification import certified_outcomes
    from robustest.suite import Suite

    s = cert_suite
    assert s.meta["certify"] == {"method": "ibp"} and s.certified.dtype == torch.bool and len(s.certified) == 30
    assert torch.equal(s.certified, certified_outcomes(mlp, s.images(), s.y, 0.005, "linf", "ibp"))
    assert "certified_accuracy" in s.meta["baseline"] and s.format_version == 2
    assert not bool((s.certified & ~s.clean).any())
    path = s.save(tmp_path / "s.pt")
    raw = torch.load(path, weights_only=True)
    assert raw["version"] == 2 and "certified" in raw["tensors"]
    back = Suite.load(path)
    assert torch.equal(back.certified, s.certified) and back.meta["certify"] == s.meta["certify"]
    bad = copy.deepcopy(raw)
    bad["tensors"]["certified"][0] = ~bad["tensors"]["certified"][0]
    torch.save(bad, tmp_path / "tampered.pt")
    with pytest.raises(DataError, match="SHA-256"):
        Suite.load(tmp_path / "tampered.pt")
    torch.save({**raw, "version": 1}, tmp_path / "v1.pt")  # a version-1 file has no certified outcomes
    with pytest.raises(DataError, match="damaged"):
        Suite.load(tmp_path / "v1.pt")
    plain = Suite(**{k: v for k, v in s.tensors().items() if k != "certified"},
                  meta={k: v for k, v in s.meta.items() if k != "certify"})
    assert plain.format_version == 1 and plain.to_dict()["version"] == 1  # earlier robustest still reads it


def test_a_check_compares_certified_outcomes(cert_suite, mlp, monkeypatch):
    from robustest.suite import check as check_mod
    from robustest.suite import check_suite

    same = check_suite(mlp, cert_suite)
    assert same.certified_regression is False and same.certified_comparison.b == same.certified_comparison.c == 0
    assert torch.equal(same.outcomes["certified"], cert_suite.certified) and not same.failed
    assert same.to_dict()["lost_certificates"] == 0 and "no certified regression" in same.message()
    # every certificate lost, the robust outcomes kept: a regression of the certified accuracy alone
    lost = torch.zeros_like(cert_suite.certified)
    fixed = {"clean": cert_suite.clean, "robust": cert_suite.robust, "corruption": cert_suite.corruption,
             "certified": lost, "seconds": {}}
    monkeypatch.setattr(check_mod, "evaluate_outcomes", lambda *a, **k: fixed)
    res = check_suite(mlp, cert_suite)
    n_cert = int(cert_suite.certified.sum())
    assert n_cert >= 6  # enough for the exact test to be significant
    assert res.regression is False and res.certified_regression is True and res.verdict == "regression"
    assert res.failed and res.certified_comparison.b == n_cert and res.certified_comparison.c == 0
    d = res.to_dict()
    assert d["lost_certificates"] == n_cert and d["certified"]["certified_accuracy"] == 0.0
    assert "CERTIFIED REGRESSION" in res.message() and f"{n_cert} samples certified by the baseline" in res.message()
    assert check_suite(mlp, cert_suite, max_drop=1.0).certified_regression is False
    assert check_suite(mlp, cert_suite, baseline=False).certified_regression is None


def test_a_suite_refuses_smoothing_and_unsupported_models(mlp, digits40):
    from robustest.suite import build_suite

    with pytest.raises(ConfigError, match="bound-propagation"):
        build_suite(mlp, digits40, 0.1, k=10, version="fast", certify="smoothing")
    sigmoid = nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.Sigmoid())
    with pytest.raises(ConfigError, match="Sigmoid|sigmoid"):
        build_suite(sigmoid, digits40, 0.1, k=10, version="fast", certify="ibp")
