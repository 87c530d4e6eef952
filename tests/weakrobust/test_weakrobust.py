"""Weak-robust validation: score definitions on hand-made models, selection rules, determinism, validation,
the PGD radius and enhancement."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from robustest import weakrobust as wr
from robustest.core.errors import ConfigError, DataError
from robustest.weakrobust import analysis, augment


class Constant(nn.Module):
    """Logits independent of the input: probabilities (0.2, 0.5, 0.3)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.LazyLinear(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.lin, nn.LazyLinear):
            self.lin(x.flatten(1))  # materialise, then fix weights 0 and bias log p
            with torch.no_grad():
                self.lin.weight.zero_()
                self.lin.bias.copy_(torch.tensor([0.2, 0.5, 0.3]).log())
        return self.lin(x.flatten(1))


class Threshold(nn.Module):
    """Two classes on 1 x 1 x 2 images: class 1 iff pixel 0 > 0.5 (steep linear logit)."""

    def __init__(self, steep: float = 200.0) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor([[0.0, 0.0], [steep, 0.0]]))
            self.lin.bias.copy_(torch.tensor([0.0, -0.5 * steep]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.flatten(1))


def _pixels(v: list[float]) -> torch.Tensor:
    x = torch.zeros(len(v), 1, 1, 2)
    x[:, 0, 0, 0] = torch.tensor(v)
    x[:, 0, 0, 1] = 0.3
    return x


def test_scores_exact_on_constant_model():
    x = torch.rand(6, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2, 1, 0, 2])
    a = wr.analyze(Constant(), (x, y), n_neighbors=7, eps=0.3)
    exp = torch.tensor([0.5, 0.0, 0.5, 0.0, 0.5, 0.5])
    assert torch.allclose(a.score, exp, atol=1e-6)
    assert torch.allclose(a.clean_score, exp, atol=1e-6)
    assert torch.equal(a.frac_misclassified, (y != 1).float())
    assert torch.equal(a.clean_correct, y == 1)
    # top wrong class: largest mean probability among k != y
    assert torch.equal(a.top_wrong, torch.tensor([1, 2, 1, 2, 1, 1]))
    assert torch.equal(a.index, torch.arange(6)) and torch.equal(a.label, y)


def test_scores_match_recomputed_neighbours_on_linear_model():
    model = Threshold()
    x = _pixels([0.45, 0.52, 0.3, 0.6, 0.49, 0.51, 0.2, 0.58] * 3)
    y = (x[:, 0, 0, 0] > 0.5).long()
    y[::5] = 1 - y[::5]  # some clean mistakes
    q, eps = 9, 0.22
    a = wr.analyze(model, (x, y), n_neighbors=q, eps=eps, batch_size=40)
    noise = analysis._neighbour_noise(torch.arange(len(x)), q, (1, 1, 2), eps, "uniform", 0, torch.device("cpu"))
    xq = ((x[:, None] + noise).clamp(0, 1) * 255).round() / 255
    with torch.no_grad():
        p = model(xq.reshape(-1, 1, 1, 2)).softmax(1).reshape(len(x), q, 2)
    wrong = p.argmax(2) != y[:, None]
    ms = torch.where(wrong, p.gather(2, (1 - y)[:, None, None].expand(-1, q, 1)).squeeze(2), torch.zeros(()))
    assert torch.allclose(a.score, ms.mean(1), atol=1e-6)
    assert torch.allclose(a.frac_misclassified, wrong.float().mean(1))
    assert bool((noise.abs() <= eps / 2).all())


def test_fraction_misclassified_matches_noise_probability():
    t = torch.tensor([-0.08, -0.03, 0.0, 0.05, 0.1, 0.2])  # distance of pixel 0 below the 0.5 boundary
    x = _pixels((0.5 - t).tolist())
    y = torch.zeros(len(t), dtype=torch.long)  # label 0 = "pixel 0 <= 0.5"
    eps = 0.22
    a = wr.analyze(Threshold(steep=1e4), (x, y), n_neighbors=4000, eps=eps, quantize=False)
    expected = ((eps / 2 - t) / eps).clamp(0, 1)  # P(delta > t), delta ~ U[-eps/2, eps/2]
    assert torch.allclose(a.frac_misclassified, expected, atol=0.03)
    assert torch.allclose(a.score, a.frac_misclassified, atol=0.03)  # near one-hot: Ms ~ 1 when wrong


def test_neighbours_are_clipped_quantised_and_within_budget():
    seen = []

    class Rec(nn.Module):
        def forward(self, x):
            seen.append(x.clone())
            return torch.zeros(x.shape[0], 2)

    x = torch.rand(5, 1, 3, 3, generator=torch.Generator().manual_seed(1))
    x[0] = 0.0
    x[1] = 1.0
    wr.analyze(Rec(), (x, torch.zeros(5, dtype=torch.long)), n_neighbors=30, eps=0.4)
    xin = torch.cat(seen)
    neigh = xin[: 5 * 30].reshape(5, 30, 1, 3, 3)
    assert float(neigh.min()) >= 0 and float(neigh.max()) <= 1
    assert torch.allclose(neigh * 255, (neigh * 255).round(), atol=1e-3)
    assert float((neigh - x[:, None]).abs().max()) <= 0.2 + 1 / 255
    assert torch.equal(xin[5 * 30:], x)  # the clean samples go through the same forward pass


def test_gaussian_noise_has_the_uniform_noise_std():
    n = analysis._neighbour_noise(torch.arange(16), 200, (1, 8, 8), 0.22, "gaussian", 3, torch.device("cpu"))
    assert abs(float(n.std()) - 0.22 / (2 * math.sqrt(3))) < 0.002
    assert abs(float(n.mean())) < 0.002


@pytest.mark.parametrize("threads", [1, 2])
def test_neighbour_noise_blocks_drawn_on_threads_equal_serial_draws(threads, monkeypatch):
    """Regression: the noise blocks are drawn as independent tasks on several threads; every block still
    holds its generator's numbers, whatever the thread count or the order the tasks run in."""
    q, shape, eps, seed, B = 7, (1, 5, 5), 0.3, 11, analysis.NOISE_BLOCK
    blocks = [torch.empty((B, q, *shape)).uniform_(-eps / 2, eps / 2, generator=torch.Generator().manual_seed(
        analysis._block_seed(seed, b))) for b in range(8)]
    ref = torch.cat(blocks)
    cpu = torch.device("cpu")
    contiguous = torch.arange(5, 6 * B + 3)  # partial first and last blocks, 6 whole ones
    scattered = torch.tensor([7 * B + 1, 3, 2 * B, 5 * B + 9, 4, B + 15, 3 * B, 6 * B + 2])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for idx in (contiguous, scattered):
            assert torch.equal(analysis._neighbour_noise(idx, q, shape, eps, "uniform", seed, cpu), ref[idx])

        def reversed_order(count, task):
            return [task(i) for i in reversed(range(count))][::-1]

        monkeypatch.setattr(analysis, "run_tasks", reversed_order)
        for idx in (contiguous, scattered):
            assert torch.equal(analysis._neighbour_noise(idx, q, shape, eps, "uniform", seed, cpu), ref[idx])
    finally:
        torch.set_num_threads(before)


def test_determinism_and_batch_size_independence():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    x = torch.rand(70, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 3, (70,), generator=torch.Generator().manual_seed(3))
    runs = [wr.analyze(model, (x, y), n_neighbors=11, eps=0.5, batch_size=b, seed=5) for b in (1, 200, 100_000)]
    runs.append(wr.analyze(model, TensorDataset(x, y), n_neighbors=11, eps=0.5, batch_size=333, seed=5))
    for r in runs[1:]:
        assert torch.allclose(r.score, runs[0].score, atol=1e-6)
        assert torch.equal(r.frac_misclassified, runs[0].frac_misclassified)
        assert torch.equal(r.index, torch.arange(70))
    other = wr.analyze(model, (x, y), n_neighbors=11, eps=0.5, seed=6)
    assert not torch.equal(other.frac_misclassified, runs[0].frac_misclassified)
    # the model's mode is restored
    model.train()
    wr.analyze(model, (x, y), n_neighbors=2)
    assert model.training


def test_analyze_rejects_bad_input():
    m = Constant()
    with pytest.raises(DataError):
        wr.analyze(m, (torch.rand(3, 1, 2, 2) * 2, torch.zeros(3, dtype=torch.long)))
    with pytest.raises(DataError):
        wr.analyze(m, torch.rand(3, 1, 2, 2))  # no labels
    with pytest.raises(ConfigError):
        wr.analyze(m, (torch.rand(3, 1, 2, 2), torch.zeros(3, dtype=torch.long)), noise="laplace")
    with pytest.raises(ConfigError):
        wr.analyze(m, (torch.rand(3, 1, 2, 2), torch.zeros(3, dtype=torch.long)), n_neighbors=0)


def _analysis(scores, fracs, labels) -> wr.Analysis:
    n = len(scores)
    return wr.Analysis(score=torch.tensor(scores), frac_misclassified=torch.tensor(fracs),
                       clean_correct=torch.ones(n, dtype=torch.bool), clean_score=torch.zeros(n),
                       top_wrong=torch.zeros(n, dtype=torch.long), label=torch.tensor(labels),
                       index=torch.arange(100, 100 + n), params={"eps": 0.22})


def test_select_weak_rules(tmp_path):
    a = _analysis([0.1, 0.9, 0.5, 0.5, 0.0, 0.7, 0.3, 0.8], [0.2, 1.0, 0.6, 0.4, 0.0, 0.8, 0.3, 0.9],
                  [0, 0, 0, 0, 1, 1, 1, 2])
    assert a.order().tolist() == [1, 7, 5, 2, 3, 6, 0, 4]  # ties on score broken by fraction
    top = wr.select_weak(a, k=3)
    assert top.indices.tolist() == [101, 107, 105] and torch.allclose(top.scores, torch.tensor([0.9, 0.8, 0.7]))
    assert wr.select_weak(a, fraction=0.3).indices.tolist() == [101, 107, 105]  # ceil(0.3 * 8) = 3
    thr = wr.select_weak(a)  # default: more than half of the neighbours misclassified
    assert thr.indices.tolist() == [101, 107, 105, 102] and thr.rule["rule"] == "threshold"
    assert wr.select_weak(a, threshold=0.85).indices.tolist() == [101, 107]
    bal = wr.select_weak(a, k=3, per_class=True)  # one per class, weakest of each, in weakness order
    assert bal.indices.tolist() == [101, 107, 105] and sorted(bal.labels.tolist()) == [0, 1, 2]
    bal = wr.select_weak(a, k=5, per_class=True)
    assert sorted(bal.labels.tolist()) == [0, 0, 1, 1, 2]
    assert wr.select_weak(a, fraction=0.5, per_class=True).indices.tolist() == [101, 107, 105, 102, 106]
    a.clean_correct[[1, 5]] = False
    cor = wr.select_weak(a, k=3, correct_only=True)
    assert cor.indices.tolist() == [107, 102, 103] and cor.rule["correct_only"]
    a.clean_correct[:] = True
    with pytest.raises(ConfigError):
        wr.select_weak(a, k=2, threshold=0.5)
    with pytest.raises(ConfigError):
        wr.select_weak(a, fraction=1.5)
    for name in ("w.pt", "w.json"):
        top.save(tmp_path / name)
        back = wr.WeakSet.load(tmp_path / name)
        assert torch.equal(back.indices, top.indices) and torch.allclose(back.scores, top.scores)
        assert back.rule["k"] == 3
    with pytest.raises(DataError):
        wr.WeakSet.load(tmp_path / "missing.pt")


def test_analysis_save_load(tmp_path):
    a = _analysis([0.1, 0.2], [0.0, 0.5], [1, 0])
    a.save(tmp_path / "a.pt")
    b = wr.Analysis.load(tmp_path / "a.pt")
    assert torch.equal(b.score, a.score) and torch.equal(b.index, a.index) and b.params == a.params
    torch.save({"x": 1}, tmp_path / "bad.pt")
    with pytest.raises(DataError):
        wr.Analysis.load(tmp_path / "bad.pt")


def test_adversarial_radius_on_linear_model():
    t = torch.tensor([0.02, 0.05, 0.1, 0.15, 0.25, -0.05])
    x = _pixels((0.5 - t).tolist())
    y = torch.zeros(len(t), dtype=torch.long)
    r = wr.adversarial_radius(Threshold(steep=50.0), (x, y), eps_max=0.2, steps=10, bisection_steps=10)
    tol = 0.2 / 2**10 + 1e-4  # the final bracket's width
    assert torch.allclose(r[:4], t[:4], atol=tol)
    assert math.isinf(float(r[4]))  # beyond eps_max
    assert float(r[5]) == 0.0  # misclassified clean


def _result(rows, labels=None) -> wr.ValidationResult:
    keys = [k for k, _ in rows]
    wrong = torch.tensor([w for _, w in rows], dtype=torch.bool)
    n = wrong.shape[1]
    return wr.ValidationResult(keys=keys, wrong=wrong, indices=torch.arange(n),
                               labels_y=torch.zeros(n, dtype=torch.long))


def test_validation_result_aggregates_and_labels():
    res = _result([(("clean", "clean", 0.0), [0, 0, 0, 1]),
                   (("attack", "fgsm", 0.1), [1, 1, 0, 1]), (("attack", "fgsm", 0.2), [1, 1, 1, 1]),
                   (("attack", "pgd", 0.1), [1, 1, 1, 1]), (("attack", "pgd", 0.2), [1, 1, 1, 1]),
                   (("corruption", "fog", 1.0), [0, 0, 0, 1]), (("corruption", "fog", 2.0), [0, 1, 0, 1]),
                   (("corruption", "snow", 1.0), [0, 0, 0, 0])])
    pt = res.per_type()
    assert pt["fgsm"] == ("attack", 0.875) and pt["fog"] == ("corruption", 0.375) and pt["snow"][1] == 0.0
    assert res.clean_error == 0.25
    assert res.mean_adv_error == pytest.approx((0.875 + 1.0) / 2)
    assert res.mce == pytest.approx(0.375 / 2)
    assert res.labels() == {"fgsm": "strength", "pgd": "weakness", "fog": "weakness", "snow": "strength"}
    assert res.labels({"fgsm": 0.5, "pgd": 1.0, "fog": 0.5, "snow": 0.0}) == {
        "fgsm": "weakness", "pgd": "strength", "fog": "strength", "snow": "strength"}
    sub = res.subset([0, 2])
    assert sub.per_type()["fgsm"][1] == 0.75 and len(sub) == 2
    d = res.to_dict()
    assert d["per_type"]["pgd"]["label"] == "weakness" and len(d["rows"]) == 8


def test_validate_on_constant_model_counts_label_errors():
    x = torch.rand(10, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([1, 1, 0, 2, 1, 1, 1, 0, 1, 1])
    ws = wr.WeakSet(indices=torch.tensor([0, 2, 3, 5]), scores=torch.zeros(4), frac_misclassified=torch.zeros(4),
                    labels=y[[0, 2, 3, 5]])
    res = wr.validate(Constant(), (x, y), ws, perturbations=["fgsm", "pgd", "gaussian_noise", "contrast"],
                      eps=(0.1,), severities=(1, 3))
    # the prediction is always class 1: error = share of labels != 1 (= 0.5 on the weak set) for every type
    assert all(abs(e - 0.5) < 1e-9 for e in res.errors().values())
    assert [k for k in res.keys][:3] == [("clean", "clean", 0.0), ("attack", "fgsm", 0.1), ("attack", "pgd", 0.1)]
    assert len(res.keys) == 1 + 2 + 4 and torch.equal(res.indices, ws.indices)
    full = wr.validate(Constant(), (x, y), None, perturbations="contrast", severities=(2,))
    assert full.mce == pytest.approx(0.3)
    with pytest.raises(ConfigError):
        wr.validate(Constant(), (x, y), ws, perturbations=["nonsense"])
    with pytest.raises(DataError):
        wr.validate(Constant(), (x, y), torch.tensor([3, 99]), perturbations="contrast")
    with pytest.raises(DataError):
        wr.validate(Constant(), (x, y), torch.tensor([], dtype=torch.long), perturbations="contrast")


def test_validate_on_trained_model_weak_set_is_harder(trained_digits_model, digits_train):
    digits_model = trained_digits_model
    x, y = (t[:400] for t in digits_train.tensors)
    a = wr.analyze(digits_model, (x, y), n_neighbors=10, eps=0.8, seed=0)
    weak = wr.select_weak(a, k=30)
    strong = a.order()[-30:]
    res_w = wr.validate(digits_model, (x, y), weak, perturbations=["fgsm", "gaussian_noise"], eps=(0.1,),
                        severities=(3,))
    res_s = wr.validate(digits_model, (x, y), a.index[strong], perturbations=["fgsm", "gaussian_noise"],
                        eps=(0.1,), severities=(3,))
    assert res_w.mean_adv_error > res_s.mean_adv_error
    assert res_w.mce >= res_s.mce


def test_augmix_ops_keep_the_contract():
    x = torch.rand(12, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    for name, op in wr.AUGMIX_OPS.items():
        out = op(x, np.random.default_rng(0), 3.0)
        assert out.shape == x.shape and float(out.min()) >= 0 and float(out.max()) <= 1, name
    a = augment._augmix(x, list(wr.AUGMIX_OPS.values()), np.random.default_rng(1))
    b = augment._augmix(x, list(wr.AUGMIX_OPS.values()), np.random.default_rng(1))
    assert torch.equal(a, b) and not torch.equal(a, x)
    p = torch.softmax(torch.randn(5, 3), 1).log()
    assert float(augment._jsd([p, p, p])) < 1e-6 and float(augment._jsd([p, p.flip(0), p])) > 0


class _FixedLevel:
    """Stands in for the numpy Generator of an AugMix op: every sample gets level ``u`` (of 10), sign +."""

    def __init__(self, u: float) -> None:
        self.u = u

    def uniform(self, lo, hi, n):
        return np.full(n, self.u)

    def choice(self, options, n):
        return np.full(n, 1.0)


def _equalize_reference(x: torch.Tensor) -> torch.Tensor:
    """Per image and channel, with NumPy: each pixel -> fraction of the plane's pixels at or below its level."""
    out = np.empty(x.shape, dtype=np.float32)
    for i in range(x.shape[0]):
        for c in range(x.shape[1]):
            levels = np.round(x[i, c].numpy().astype(np.float64) * 255)
            ranked = np.sort(levels.ravel())
            out[i, c] = np.searchsorted(ranked, levels, side="right") / levels.size
    return torch.from_numpy(out)


def test_augmix_equalize_equals_per_image_reference():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(64, 3, 32, 32, generator=g)
    x[:8] = (x[:8] * 16).floor() / 16  # few levels: ties everywhere
    x[8:10] = 0.5  # a constant plane
    out = wr.AUGMIX_OPS["equalize"](x, np.random.default_rng(0), 3.0)
    assert out.dtype == x.dtype and torch.equal(out, _equalize_reference(x))
    big = torch.rand(2, 1, 40, 48, generator=g, dtype=torch.float64)  # another size and dtype, same path
    assert torch.allclose(wr.AUGMIX_OPS["equalize"](big, None, 3.0), _equalize_reference(big).double(), atol=1e-7)


def test_augmix_equalize_memory_does_not_grow_with_pixels_squared():
    from torch.profiler import ProfilerActivity, profile

    x = torch.rand(64, 3, 32, 32)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        wr.AUGMIX_OPS["equalize"](x, None, 3.0)
    largest = max(e.cpu_memory_usage for e in prof.events())
    # a P x P comparison would allocate 64 * 3 * 1024 * 1024 values (about 200 MB as bool); the histogram path's
    # largest buffer is the int64 level index, twice the size of the float32 input
    assert 0 < largest <= 4 * x.nbytes


def test_augmix_posterize_and_solarize_equal_their_formulas():
    x = torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    for u, bits in ((1.0, 4), (3.0, 3)):  # level u / 10: 4 - int(4 u / 10) bits
        shift = 2 ** (8 - bits)
        want = torch.floor(x * 255 / shift) * shift / 255
        assert torch.equal(wr.AUGMIX_OPS["posterize"](x, _FixedLevel(u), 3.0), want)
    out = wr.AUGMIX_OPS["solarize"](x, _FixedLevel(3.0), 3.0)  # threshold 1 - 0.3
    assert torch.equal(out, torch.where(x >= 0.7, 1 - x, x))


def test_augmix_geometric_ops_are_pixel_space_transforms():
    # translate: level 0.2 of a 30-pixel side is 2 pixels, an exact shift (zeros come in)
    x = torch.rand(2, 3, 30, 30, generator=torch.Generator().manual_seed(2))
    out = wr.AUGMIX_OPS["translate_x"](x, _FixedLevel(2.0), 3.0)
    assert torch.allclose(out[..., :-2], x[..., 2:], atol=1e-5) and float(out[..., -2:].abs().max()) < 1e-5
    out = wr.AUGMIX_OPS["translate_y"](x, _FixedLevel(2.0), 3.0)
    assert torch.allclose(out[..., :-2, :], x[..., 2:, :], atol=1e-5)

    def spot(h: int, w: int, row: int, col: int) -> torch.Tensor:
        img = torch.zeros(1, 1, h, w)
        img[0, 0, row, col] = 1.0
        return img

    def where(img: torch.Tensor) -> tuple[int, int]:
        k = int(img.flatten().argmax())
        assert float(img.flatten()[k]) > 0.99  # landed on a pixel centre, not smeared
        return divmod(k, img.shape[-1])

    # rotate 90 degrees (level 30 of 10 x 30 degrees) on a NON-square image: a true rotation about the centre
    # (row 5, column 10) takes the point 3 columns right of the centre to 3 rows above it
    assert where(wr.AUGMIX_OPS["rotate"](spot(11, 21, 5, 13), _FixedLevel(30.0), 3.0)) == (2, 10)
    # shear_x by 0.3 (level 10) about the centre row 10: a point 10 rows below the centre moves 3 columns left
    assert where(wr.AUGMIX_OPS["shear_x"](spot(21, 25, 20, 12), _FixedLevel(10.0), 3.0)) == (20, 9)
    assert where(wr.AUGMIX_OPS["shear_y"](spot(25, 21, 12, 20), _FixedLevel(10.0), 3.0)) == (9, 20)


def test_enhance_trains_and_extends_the_pool(digits_model, digits_train):
    import copy

    x, y = digits_train.tensors
    x, y = x[:128], y[:128]
    m = copy.deepcopy(digits_model)
    before = [p.clone() for p in m.parameters()]
    res = wr.enhance(m, (x, y), ["gaussian_noise", "pgd"], epochs=1, adv_steps=2, batch_size=64)
    assert "gaussian_noise" in res.pool and "pgd" not in res.pool and res.weaknesses == ["gaussian_noise", "pgd"]
    assert res.epochs[0]["jsd"] > 0 and res.epochs[0]["adv"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, m.parameters())) and not m.training
    with pytest.raises(ConfigError):
        wr.enhance(copy.deepcopy(digits_model), (x, y), ["not_a_corruption"], epochs=1)


def test_enhance_takes_the_optimiser_of_a_recipe_and_records_it() -> None:
    from robustest.train import Recipe

    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(32, 1, 8, 8, generator=g), torch.arange(32) % 2

    def net() -> nn.Module:
        torch.manual_seed(1)
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 2))

    kw = dict(epochs=1, augmix=False, adversarial=False, batch_size=16, seed=3)
    adam = wr.enhance(net(), (x, y), **kw)
    assert adam.config["lr"] == 1e-3 and "optimizer" not in adam.config  # the default records its rate only
    sgd_model = net()
    sgd = wr.enhance(sgd_model, (x, y), recipe=Recipe(optimizer="sgd", lr=0.5, weight_decay=1e-3), **kw)
    assert {k: sgd.config[k] for k in ("lr", "optimizer", "weight_decay", "decay_norm_bias", "momentum",
                                       "nesterov")} == {"lr": 0.5, "optimizer": "sgd", "weight_decay": 1e-3,
                                                        "decay_norm_bias": True, "momentum": 0.9, "nesterov": True}
    # plain training (no AugMix, no adversarial copy) with the recipe's SGD is fit's step: the same weights
    from robustest.train import fit

    ref = net()
    fit(ref, (x, y), 1, 16, Recipe(optimizer="sgd", lr=0.5, weight_decay=1e-3), seed=3, progress=False)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ref.state_dict().values(),
                                                              sgd_model.state_dict().values()))
    with pytest.raises(ConfigError, match=r"^enhance does not take the recipe option schedule \(it honours optimizer, "
                                          r"lr, weight_decay, momentum, nesterov, decay_norm_bias\): leave it unset$"):
        wr.enhance(net(), (x, y), recipe=Recipe(schedule="cosine"), **kw)
    with pytest.raises(ConfigError, match="lr must be"):
        wr.enhance(net(), (x, y), recipe=Recipe(lr=float("nan")), **kw)


@pytest.mark.slow
def test_mnist_weak_set_is_less_robust_than_a_random_subset(mnist_root):
    from robustest import data, models
    from robustest.train import fit

    tr = data.load("mnist", root=mnist_root, split="train")
    x, y = tr.tensors[0][:1500], tr.tensors[1][:1500]
    torch.manual_seed(0)
    m = models.create("lenet5", mean=[0.13], std=[0.31])
    fit(m, (x, y), epochs=2, progress=False)
    a = wr.analyze(m, (x, y), n_neighbors=10, eps=0.5)
    weak = wr.select_weak(a, k=50, correct_only=True)
    rand = torch.randperm(1500, generator=torch.Generator().manual_seed(0))[:50]
    kw = {"perturbations": ["fgsm", "gaussian_noise"], "eps": (0.05,), "severities": (3,)}
    rw, rr = wr.validate(m, (x, y), weak, **kw), wr.validate(m, (x, y), rand, **kw)
    assert rw.clean_error == 0.0  # correct_only
    assert rw.mean_adv_error > rr.mean_adv_error


def test_validation_result_save_load(tmp_path):
    res = _result([(("clean", "clean", 0.0), [0, 1, 0]), (("attack", "fgsm", 0.1), [1, 1, 0]),
                   (("corruption", "fog", 3.0), [0, 1, 1])])
    res.meta["seed"] = 3
    res.save(tmp_path / "v.pt")
    back = wr.ValidationResult.load(tmp_path / "v.pt")
    assert back.keys == res.keys and torch.equal(back.wrong, res.wrong) and back.meta == res.meta
    assert back.summary() == res.summary() and torch.equal(back.indices, res.indices)
    torch.save({"format": "robustest-analysis"}, tmp_path / "other.pt")
    with pytest.raises(DataError, match="not a robustest validation file"):
        wr.ValidationResult.load(tmp_path / "other.pt")


def test_jsd_gradient_stays_finite_when_a_softmax_underflows() -> None:
    # regression: with probabilities as the KL target, a class at exactly 0 probability gave NaN gradients
    # (log 0 * 0) and a REVa fine-tune of an untrained ResNet-50 ended with every weight NaN
    logits = [torch.tensor([[200.0, 0.0, -200.0]], requires_grad=True),
              torch.tensor([[0.0, 0.0, 0.0]], requires_grad=True),
              torch.tensor([[-300.0, 0.0, 300.0]], requires_grad=True)]
    j = augment._jsd(logits)
    j.backward()
    assert math.isfinite(float(j.detach())) and 0 < float(j.detach()) <= math.log(3)
    assert all(bool(torch.isfinite(lg.grad).all()) for lg in logits)


def test_jsd_matches_its_definition() -> None:
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(5, 4, generator=g) for _ in range(3)]
    ps = [lg.softmax(1) for lg in logits]
    m = sum(ps) / 3
    want = sum((p * (p.log() - m.log())).sum(1).mean() for p in ps) / 3
    assert torch.allclose(augment._jsd(logits), want, atol=1e-6)


def test_enhance_stops_with_one_line_when_the_loss_is_not_finite(exploding_model) -> None:
    from robustest.core.errors import TrainingDiverged

    x, y = torch.rand(16, 1, 8, 8), torch.arange(16) % 3
    with pytest.raises(TrainingDiverged, match=r"enhance diverged at epoch 1, step 1: .*lower the learning rate"):
        wr.enhance(exploding_model, (x, y), (), epochs=1, augmix=False, adversarial=False, progress=False)


def test_analyze_refuses_a_model_with_nan_outputs() -> None:
    m = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    with torch.no_grad():
        m[1].weight.fill_(float("nan"))
    with pytest.raises(DataError, match="NaN or infinite logits"):
        wr.analyze(m, (torch.rand(8, 1, 8, 8), torch.arange(8) % 3), n_neighbors=2, progress=False)


def test_analyze_under_bf16_autocast_follows_float32(trained_digits_model, digits_test) -> None:
    x, y = digits_test.tensors[0][:120], digits_test.tensors[1][:120]
    full = wr.analyze(trained_digits_model, (x, y), n_neighbors=8, progress=False)
    half = wr.analyze(trained_digits_model, (x, y), n_neighbors=8, progress=False, amp="bf16")
    assert half.params["amp"] == "bf16" and "amp" not in full.params
    assert torch.equal(full.index, half.index) and torch.equal(full.label, half.label)
    # logits rounded to bf16: the same samples are weak, scores within a few hundredths
    assert (full.score - half.score).abs().mean() < 0.02
    assert (full.clean_correct == half.clean_correct).float().mean() >= 0.97
    with pytest.raises(ConfigError, match="fp16' needs CUDA"):
        wr.analyze(trained_digits_model, (x, y), n_neighbors=2, progress=False, amp="fp16")
    with pytest.raises(ConfigError, match="unknown amp"):
        wr.analyze(trained_digits_model, (x, y), n_neighbors=2, progress=False, amp="int8")


def test_enhance_resumes_after_an_interruption_bit_exact(tmp_path, monkeypatch) -> None:
    import importlib

    state_mod = importlib.import_module("robustest.train.state")  # where the training state is written
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(48, 1, 8, 8, generator=g), torch.arange(48) % 3

    def net() -> nn.Module:
        torch.manual_seed(1)
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, 3))

    kw = dict(epochs=3, batch_size=16, adv_steps=2, seed=5, progress=False)
    whole = net()
    full = wr.enhance(whole, (x, y), ["fog"], **kw)
    real, calls = state_mod.atomic_save, []

    def save_then_stop(obj, path, **k):
        real(obj, path, **k)
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt  # killed right after epoch 1 was saved

    monkeypatch.setattr(state_mod, "atomic_save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        wr.enhance(net(), (x, y), ["fog"], state_dir=tmp_path, **kw)
    with pytest.raises(ConfigError, match="already holds the state of an interrupted enhance run"):
        wr.enhance(net(), (x, y), ["fog"], state_dir=tmp_path, **kw)
    monkeypatch.setattr(state_mod, "atomic_save", real)
    resumed = net()
    res = wr.enhance(resumed, (x, y), ["fog"], state_dir=tmp_path, resume=True, **kw)
    assert [e["epoch"] for e in res.epochs] == [1, 2, 3]
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()))
    assert [e["loss"] for e in res.epochs] == [e["loss"] for e in full.epochs]
    with pytest.raises(ConfigError, match="other settings, another starting model or other data"):
        wr.enhance(net(), (x, y), ["fog"], state_dir=tmp_path, resume=True, **{**kw, "seed": 6})
