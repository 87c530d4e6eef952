"""Surprise adequacy: LSA against scipy's per-class KDE, DSA against a brute-force formula, variance
filtering, edge cases, the image-level API, serialisation, and agreement with dnn-tip."""

from __future__ import annotations

import warnings
from collections import OrderedDict

import numpy as np
import pytest
import torch
from scipy.stats import gaussian_kde
from torch import nn

from robustest.core.errors import ConfigError, DataError
from robustest.metrics import surprise as S
from robustest.metrics.surprise import SurpriseAdequacy, sa_scores


def _clusters(seed: int = 0, n_train: int = 400, n_test: int = 120, f: int = 6, classes: int = 3):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, f)) * 3
    ytr = rng.integers(0, classes, n_train)
    tr = (centers[ytr] + rng.normal(size=(n_train, f))).astype(np.float32)
    tr[:, 1] = 0.25  # a dead neuron: filtered out
    yte = rng.integers(0, classes, n_test)
    te = (centers[yte] + 1.5 * rng.normal(size=(n_test, f))).astype(np.float32)
    return tr, ytr, te, yte


def _sa(tr, ytr, **kw) -> SurpriseAdequacy:
    return SurpriseAdequacy(torch.from_numpy(tr), torch.from_numpy(ytr), ["l"], [tr.shape[1]], **kw)


def test_lsa_is_per_class_scipy_kde_with_variance_filtering() -> None:
    tr, ytr, te, yte = _clusters()
    tr[ytr == 2, 4] = 1.0  # neuron 4 is constant within class 2 only
    sa = _sa(tr, ytr, var_threshold=1e-5)
    ours = sa.lsa_from_activations(torch.from_numpy(te), torch.from_numpy(yte)).numpy()
    assert ours.dtype == np.float64 and ours.shape == (120,)
    for c in range(3):
        keep = [i for i in range(6) if i != 1 and not (c == 2 and i == 4)]
        kde = gaussian_kde(tr[ytr == c][:, keep].T)
        np.testing.assert_allclose(ours[yte == c], -np.log(kde.evaluate(te[yte == c][:, keep].T)), rtol=1e-13)
    # "union" drops neuron 4 from every class (Kim et al.'s SADL)
    union = _sa(tr, ytr, filter_scope="union").lsa_from_activations(torch.from_numpy(te), torch.from_numpy(yte))
    kde0 = gaussian_kde(tr[ytr == 0][:, [0, 2, 3, 5]].T)
    np.testing.assert_allclose(union.numpy()[yte == 0], -np.log(kde0.evaluate(te[yte == 0][:, [0, 2, 3, 5]].T)),
                               rtol=1e-13)


def test_lsa_max_features_keeps_highest_variance_neurons() -> None:
    tr, ytr, te, yte = _clusters(1)
    sa = _sa(tr, ytr, var_threshold=None, max_features=3)
    ours = sa.lsa_from_activations(torch.from_numpy(te), torch.from_numpy(yte)).numpy()
    c = 0
    keep = np.sort(np.argsort(np.var(tr[ytr == c], axis=0))[-3:])
    kde = gaussian_kde(tr[ytr == c][:, keep].T)
    np.testing.assert_allclose(ours[yte == c], -np.log(kde.evaluate(te[yte == c][:, keep].T)), rtol=1e-13)


def test_lsa_stays_finite_where_density_underflows_and_unseen_class_is_inf() -> None:
    tr, ytr, te, yte = _clusters(2)
    far = te[:4] + 80.0
    sa = _sa(tr, ytr)
    with np.errstate(divide="ignore"):
        vals = sa.lsa_from_activations(torch.from_numpy(far), torch.from_numpy(yte[:4])).numpy()
    assert np.isfinite(vals).all() and (vals > 1000).all()
    near = sa.lsa_from_activations(torch.from_numpy(te[:4]), torch.from_numpy(yte[:4])).numpy()
    assert (vals > near).all()
    unseen = sa.lsa_from_activations(torch.from_numpy(te[:2]), torch.tensor([7, 0]))
    assert torch.isinf(unseen[0]) and torch.isfinite(unseen[1])


def _brute_dsa(tr, ytr, te, yte) -> np.ndarray:
    out = []
    for a, c in zip(te.astype(np.float64), yte):
        same, other = tr[ytr == c].astype(np.float64), tr[ytr != c].astype(np.float64)
        d = np.linalg.norm(same - a, axis=1)
        xa = same[np.argmin(d)]
        out.append(d.min() / np.linalg.norm(other - xa, axis=1).min())
    return np.array(out)


def test_dsa_matches_brute_force_formula_and_chunking(monkeypatch) -> None:
    tr, ytr, te, yte = _clusters(3)
    sa = _sa(tr, ytr)
    ours = sa.dsa_from_activations(torch.from_numpy(te), torch.from_numpy(yte)).numpy()
    np.testing.assert_allclose(ours, _brute_dsa(tr, ytr, te, yte), rtol=1e-12)
    monkeypatch.setattr(S, "_MAX_BLOCK", 500)  # many tiny chunks: same values
    chunked = sa.dsa_from_activations(torch.from_numpy(te), torch.from_numpy(yte)).numpy()
    np.testing.assert_array_equal(chunked, ours)
    # a training trace itself is at distance 0 from its reference
    zero = sa.dsa_from_activations(torch.from_numpy(tr[:5]), torch.from_numpy(ytr[:5]))
    assert torch.equal(zero, torch.zeros(5, dtype=torch.float64))


def test_dsa_needs_two_classes_and_unseen_class_is_inf() -> None:
    tr, ytr, te, yte = _clusters(4)
    sa = _sa(tr, ytr)
    out = sa.dsa_from_activations(torch.from_numpy(te[:3]), torch.tensor([9, 0, 1]))
    assert torch.isinf(out[0]) and torch.isfinite(out[1:]).all()
    one = _sa(tr, np.zeros_like(ytr))
    with pytest.raises(DataError, match="two classes"):
        one.dsa_from_activations(torch.from_numpy(te), torch.from_numpy(yte))


def test_validation_errors() -> None:
    tr, ytr, te, yte = _clusters(5)
    with pytest.raises(ConfigError, match="filter_scope"):
        _sa(tr, ytr, filter_scope="all")
    with pytest.raises(ConfigError, match="max_features"):
        _sa(tr, ytr, max_features=0)
    sa = _sa(tr, ytr)
    with pytest.raises(DataError, match="shape"):
        sa.lsa_from_activations(torch.zeros(3, 2), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(DataError, match="one predicted class"):
        sa.dsa_from_activations(torch.from_numpy(te), torch.zeros(2, dtype=torch.int64))
    few = _sa(tr[:8], ytr[:8] * 0)  # 8 traces in 6 dims (5 after filtering) ... and a KDE that cannot be fitted
    few.train_acts[:, 2] = few.train_acts[:, 0]  # a linearly dependent neuron: singular covariance
    with pytest.raises(DataError, match="cannot be fitted"):
        few.lsa_from_activations(torch.from_numpy(te[:2]), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ConfigError, match="no model"):
        sa.lsa(torch.rand(2, 1, 8, 8))


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(OrderedDict([
            ("conv", nn.Conv2d(1, 4, 3)), ("relu1", nn.ReLU()), ("flat", nn.Flatten()),
            ("fc1", nn.Linear(4 * 6 * 6, 5)), ("relu2", nn.ReLU()), ("drop", nn.Dropout(0.3)), ("fc2", nn.Linear(5, 3)),
        ]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _small() -> Small:
    torch.manual_seed(2)
    m = Small()
    m.net.fc2.weight.data.mul_(30)  # an untrained net whose predictions spread over the three classes
    return m


def test_image_api_default_layer_modes_and_hooks() -> None:
    m = _small().train()
    train, test = torch.rand(300, 1, 8, 8), torch.rand(40, 1, 8, 8)
    sa = SurpriseAdequacy.build(m, train, batch_size=64)
    assert sa.layers == ["net.relu2"] and sa.sizes == [5]  # the deepest hidden activation
    assert m.training and all(not mod._forward_hooks for mod in m.modules())
    with torch.no_grad():
        m.eval()
        expect_pred = m(train).argmax(1)
        m.train()
    assert torch.equal(sa.train_pred, expect_pred)
    acts, pred = sa.activations(test)
    assert acts.shape == (40, 5)
    d = sa.dsa(test)
    assert d.shape == (40,) and torch.equal(d, sa.dsa_from_activations(acts, pred))
    conv = SurpriseAdequacy.build(m, train, "conv", var_threshold=0.0)
    assert conv.sizes == [4]  # one neuron per channel (spatial mean)
    lsa = conv.lsa(test)
    assert lsa.shape == (40,) and torch.isfinite(lsa).all()
    assert torch.equal(lsa, sa_scores(m, train, test, "lsa", layers="conv", var_threshold=0.0))
    assert torch.equal(sa_scores(m, train, test, "dsa"), d)  # deterministic
    from robustest import metrics

    assert torch.equal(metrics.compute("dsa", m, test, train=train), d)
    assert m.training and all(not mod._forward_hooks for mod in m.modules())
    with pytest.raises(ConfigError, match="unknown surprise"):
        sa_scores(m, train, test, "msa")
    with pytest.raises(ConfigError, match="takes options"):
        sa_scores(m, train, test, "lsa", k=3)


def test_to_dict_from_dict_roundtrip(tmp_path) -> None:
    m = _small()
    train, test = torch.rand(200, 1, 8, 8), torch.rand(10, 1, 8, 8)
    sa = SurpriseAdequacy.build(m, train, "conv")
    torch.save(sa.to_dict(), tmp_path / "sa.pt")
    back = SurpriseAdequacy.from_dict(torch.load(tmp_path / "sa.pt", weights_only=True), model=m)
    assert torch.equal(back.lsa(test), sa.lsa(test)) and torch.equal(back.dsa(test), sa.dsa(test))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dsa_cuda_matches_cpu() -> None:
    tr, ytr, te, yte = _clusters(6)
    sa = _sa(tr, ytr)
    cpu = sa.dsa_from_activations(torch.from_numpy(te), torch.from_numpy(yte))
    gpu = sa.dsa_from_activations(torch.from_numpy(te).cuda(), torch.from_numpy(yte).cuda())
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------------------- dnn-tip parity
def test_matches_dnn_tip_on_same_activations() -> None:
    tip = pytest.importorskip("dnn_tip.surprise")
    tr, ytr, te, yte = _clusters(7, n_train=600, n_test=200, f=10, classes=4)
    te[:3] += 60.0  # dnn-tip's density underflows to 0 here (inf); ours falls back to logpdf
    sa = _sa(tr, ytr, var_threshold=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(divide="ignore"):
            ref = tip.MultiModalSA.build_by_class(
                tr, ytr, lambda x, y: tip.LSA(x, var_threshold=1e-5, max_features=None))(te, yte)
            ref_mf = tip.MultiModalSA.build_by_class(tr, ytr, lambda x, y: tip.LSA(x, max_features=4))(te, yte)
        ref_dsa = tip.DSA(tr.astype(np.float64), ytr, badge_size=100)(te.astype(np.float64), yte)
    ours = sa.lsa_from_activations(torch.from_numpy(te), torch.from_numpy(yte)).numpy()
    fin = np.isfinite(ref)
    assert fin.sum() >= 190 and not fin[:3].any()
    np.testing.assert_array_equal(ours[fin], ref[fin])  # same scipy KDE, same arrays: identical values
    assert np.isfinite(ours).all()
    mf = _sa(tr, ytr, var_threshold=None, max_features=4)
    ours_mf = mf.lsa_from_activations(torch.from_numpy(te), torch.from_numpy(yte)).numpy()
    fin = np.isfinite(ref_mf)
    np.testing.assert_array_equal(ours_mf[fin], ref_mf[fin])
    ours_dsa = sa.dsa_from_activations(torch.from_numpy(te), torch.from_numpy(yte)).numpy()
    np.testing.assert_allclose(ours_dsa, ref_dsa, rtol=1e-12)  # dnn-tip in float64 on the same traces
