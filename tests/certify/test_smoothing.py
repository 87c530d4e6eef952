"""Randomised smoothing (robustest.certify.smoothing): Cohen et al.'s PREDICT and CERTIFY against exact values
(a constant model's counts, SciPy's beta and normal quantiles, SciPy's binomial test), a linear model whose
smoothed probability is analytic (Phi(margin / sigma): the certified radius is sound and close to the margin),
abstention on balanced classes, unclipped noise, seeded draws independent of the batch size, the model's mode,
validation and certified accuracy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from robustest.certify.smoothing import (
    ABSTAIN,
    SmoothCertificate,
    block_draws,
    certified_accuracy,
    clopper_pearson_lower,
    noisy_batches,
    smooth_certify,
    smooth_predict,
    two_sided_pvalue,
)
from robustest.core.errors import ConfigError, DataError


class Constant(nn.Module):
    """Logits favouring class ``c`` of ``k`` whatever the input."""

    def __init__(self, c: int, k: int = 5) -> None:
        super().__init__()
        self.register_buffer("logits", torch.arange(k, dtype=torch.float32).neg() + 10.0 * (torch.arange(k) == c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(x.shape[0], -1).clone()


class Linear2(nn.Module):
    """Two classes split by the hyperplane w.x + b = 0 (w of unit norm): class 0 where w.x + b > 0. Under
    N(0, sigma^2 I) noise class 0 has probability Phi((w.x + b) / sigma), and the smoothed classifier's exact L2
    robustness radius at x is |w.x + b|, the distance to the hyperplane."""

    def __init__(self, w: torch.Tensor, b: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(w / w.norm())
        self.b = b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x.flatten(1) @ self.weight + self.b
        return torch.stack([z, -z], dim=1)


class Recorder(nn.Module):
    """Class 0 when every pixel of the image lies in [0, 1], else class 1; records its mode and the images."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 1)
        self.modes: list[bool] = []
        self.sizes: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes.append(self.training)
        self.sizes.append(int(x.shape[0]))
        outside = ((x < 0) | (x > 1)).flatten(1).any(dim=1).float()
        return torch.stack([1.0 - outside, outside], dim=1)


def _images(n: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(seed))


def _linear_setup(margins: list[float]) -> tuple[Linear2, torch.Tensor]:
    """A Linear2 model on 1 x 4 x 4 images and one image per margin (w.x + b = margin up to float32 rounding)."""
    w = torch.zeros(16)
    w[5] = 1.0
    model = Linear2(w, -0.35)
    x = torch.full((len(margins), 1, 4, 4), 0.3)
    x[:, 0, 1, 1] = torch.tensor(margins) + 0.35
    return model, x


# ------------------------------------------------------------------------------------------------ exact values
def test_a_constant_model_is_certified_with_scipy_s_exact_bound_and_radius():
    sigma, n, alpha = 0.5, 500, 0.001
    cert = smooth_certify(Constant(3), _images(), sigma=sigma, n0=20, n=n, alpha=alpha, batch_size=64)
    p = stats.beta.ppf(alpha, n, 1)  # Clopper-Pearson lower bound of n successes in n: alpha^(1/n)
    assert p == pytest.approx(alpha ** (1 / n), rel=1e-12)
    assert cert.prediction.tolist() == [3, 3, 3] and cert.prediction.dtype == torch.int64
    assert cert.p_lower.tolist() == [p, p, p] and cert.p_lower.dtype == torch.float64
    assert cert.radius.tolist() == [sigma * stats.norm.ppf(p)] * 3
    assert cert.counts.tolist() == [[0, 0, 0, n, 0]] * 3
    assert (cert.sigma, cert.n0, cert.n, cert.alpha) == (sigma, 20, n, alpha) and len(cert) == 3
    assert not cert.abstained.any()
    assert smooth_predict(Constant(3), _images(), sigma=sigma, n=50).tolist() == [3, 3, 3]


def test_the_bounds_are_scipy_s():
    k = np.array([0, 1, 37, 99, 100])
    assert clopper_pearson_lower(k, 100, 0.01).tolist() == [0.0, *(stats.beta.ppf(0.01, int(v), 100 - int(v) + 1)
                                                                   for v in k[1:])]
    for top, second in [(10, 0), (7, 3), (60, 40), (500, 450), (30, 30), (1, 0), (12, 11)]:
        ours = two_sided_pvalue(np.array([top]), np.array([second]))[0]
        assert ours == pytest.approx(stats.binomtest(top, top + second, 0.5).pvalue, rel=1e-9, abs=1e-300)


def test_predict_abstains_when_the_top_two_counts_do_not_differ_significantly():
    # a model that splits the noise exactly in half: the class is the sign of the noise at one pixel
    class Half(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            z = x[:, 0, 0, 0] - 0.5
            return torch.stack([z, -z, torch.full_like(z, -9.0)], dim=1)

    x = torch.full((4, 1, 3, 3), 0.5)
    assert smooth_predict(Half(), x, sigma=0.3, n=1000).tolist() == [ABSTAIN] * 4
    cert = smooth_certify(Half(), x, sigma=0.3, n0=50, n=2000)
    assert cert.prediction.tolist() == [ABSTAIN] * 4 and cert.radius.tolist() == [0.0] * 4
    assert bool((cert.p_lower < 0.5).all()) and cert.counts.sum(1).tolist() == [2000] * 4
    assert cert.abstained.all()
    # a clear majority is predicted
    x[:, 0, 0, 0] = 0.9
    assert smooth_predict(Half(), x, sigma=0.3, n=1000).tolist() == [0] * 4


# ------------------------------------------------------------------------------------------------ soundness
def test_the_linear_model_s_certified_radius_is_sound_and_close_to_the_exact_radius():
    margins = [0.05, 0.15, 0.3, 0.45, 0.6, -0.25]
    sigma, n = 0.25, 20_000
    model, x = _linear_setup(margins)
    cert = smooth_certify(model, x, sigma=sigma, n0=100, n=n, alpha=0.001, batch_size=4096)
    exact = torch.tensor(margins, dtype=torch.float64).abs()
    assert cert.prediction.tolist() == [0, 0, 0, 0, 0, 1]
    assert bool((cert.radius <= exact).all()), (cert.radius, exact)  # sound
    assert bool((cert.radius >= exact - 0.05).all()), (cert.radius, exact)  # and tight
    # the counts follow the analytic probability Phi(|margin| / sigma) of the predicted class
    p_true = stats.norm.cdf(exact.numpy() / sigma)
    freq = cert.counts.gather(1, cert.prediction[:, None])[:, 0].numpy() / n
    assert np.all(np.abs(freq - p_true) <= 5 * np.sqrt(p_true * (1 - p_true) / n) + 1e-9)
    assert bool((cert.p_lower.numpy() <= p_true).all())
    # the smoothed classifier agrees
    assert smooth_predict(model, x, sigma=sigma, n=1000).tolist() == [0, 0, 0, 0, 0, 1]


def test_the_radius_grows_with_the_draws_towards_the_exact_radius():
    model, x = _linear_setup([0.4])
    radii = [float(smooth_certify(model, x, sigma=0.25, n0=50, n=n).radius[0]) for n in (100, 1000, 30_000)]
    assert radii[0] < radii[1] < radii[2] <= 0.4 and radii[2] > 0.37


def test_the_noise_is_not_clipped_to_the_unit_box():
    model = Recorder()
    x = torch.zeros(2, 1, 4, 4)  # every noise draw takes some pixel below 0
    assert smooth_predict(model, x, sigma=0.1, n=200).tolist() == [1, 1]
    cert = smooth_certify(model, torch.full((1, 1, 4, 4), 0.5), sigma=0.02, n0=10, n=100)
    assert cert.counts.tolist() == [[100, 0]]  # far from the box's faces: no draw leaves it


# ------------------------------------------------------------------------------------------------ batching and seeds
def test_the_noisy_batches_repeat_every_sample_for_its_draws_in_order():
    x = _images(5)
    seen_idx, seen_x = [], []
    for idx, xb in noisy_batches(x, 7, 0.25, 4, seed=0, phase=1):
        assert xb.shape == (idx.shape[0], 1, 4, 4) and idx.shape[0] <= 4
        seen_idx.append(idx)
        seen_x.append(xb)
    assert [int(i.shape[0]) for i in seen_idx] == [4] * 8 + [3]
    idx = torch.cat(seen_idx)
    assert idx.tolist() == [i for i in range(5) for _ in range(7)]
    noise = (torch.cat(seen_x) - x[idx]) / 0.25
    assert abs(float(noise.mean())) < 0.2 and abs(float(noise.std()) - 1.0) < 0.15
    assert bool(((torch.cat(seen_x) < 0) | (torch.cat(seen_x) > 1)).any())  # not clipped


@pytest.mark.parametrize("n", [7, 1000])
def test_the_draws_do_not_depend_on_the_batch_size(n, monkeypatch):
    import robustest.certify.smoothing as sm

    x = _images(4)
    monkeypatch.setattr(sm, "BLOCK_VALUES", 16 * 300)  # blocks of 300 draws: n = 1000 spans four of them
    assert block_draws((1, 4, 4)) == 300
    ref = torch.cat([xb for _, xb in noisy_batches(x, n, 0.5, 10_000, seed=3, phase=2)])
    for bs in (1, 13, 300, 301):
        assert torch.equal(torch.cat([xb for _, xb in noisy_batches(x, n, 0.5, bs, seed=3, phase=2)]), ref)


def test_certify_and_predict_do_not_depend_on_the_batch_size():
    model, x = _linear_setup([0.02, 0.1, -0.05])
    ref = smooth_certify(model, x, sigma=0.5, n0=30, n=3000, batch_size=10_000)
    for bs in (1, 29, 512):
        c = smooth_certify(model, x, sigma=0.5, n0=30, n=3000, batch_size=bs)
        assert torch.equal(c.counts, ref.counts) and torch.equal(c.radius, ref.radius)
        assert torch.equal(c.prediction, ref.prediction) and torch.equal(c.p_lower, ref.p_lower)
    p = smooth_predict(model, x, sigma=0.5, n=500, batch_size=10_000)
    assert torch.equal(smooth_predict(model, x, sigma=0.5, n=500, batch_size=7), p)


def test_the_seed_fixes_the_draws():
    model, x = _linear_setup([0.02, 0.1])
    a = smooth_certify(model, x, sigma=0.5, n0=30, n=2000, seed=5)
    b = smooth_certify(model, x, sigma=0.5, n0=30, n=2000, seed=5)
    c = smooth_certify(model, x, sigma=0.5, n0=30, n=2000, seed=6)
    assert torch.equal(a.counts, b.counts) and torch.equal(a.radius, b.radius)
    assert not torch.equal(a.counts, c.counts)
    # two copies of one image draw different noise: every sample has its own draws
    same = smooth_certify(model, x[:1].expand(2, -1, -1, -1).clone(), sigma=0.5, n0=30, n=2000)
    assert not torch.equal(same.counts[0], same.counts[1])


def test_the_model_runs_in_eval_mode_on_full_batches_and_its_mode_is_restored():
    model = Recorder().train()
    smooth_certify(model, torch.full((3, 1, 4, 4), 0.5), sigma=0.01, n0=4, n=10, batch_size=8)
    assert model.training and model.lin.training
    assert not any(model.modes)
    assert model.sizes[1:] == [8, 4, 8, 8, 8, 6]  # one clean probe, then 12 selection and 30 estimation draws
    model.eval()
    smooth_predict(model, torch.full((1, 1, 4, 4), 0.5), sigma=0.01, n=5)
    assert not model.training


def test_an_empty_batch_gives_empty_results():
    cert = smooth_certify(Constant(1), torch.zeros(0, 1, 4, 4), sigma=0.1, n0=5, n=10)
    assert cert.prediction.shape == (0,) and cert.radius.shape == (0,) and cert.counts.shape == (0, 5)
    assert smooth_predict(Constant(1), torch.zeros(0, 1, 4, 4), sigma=0.1).shape == (0,)
    assert certified_accuracy(cert, torch.zeros(0, dtype=torch.long), [0.0]) == {0.0: 0.0}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_certify_runs_on_the_model_s_cuda_device():
    model, x = _linear_setup([0.1, 0.3, -0.2])
    model = model.cuda()
    cert = smooth_certify(model, x, sigma=0.25, n0=50, n=5000, batch_size=999)
    assert cert.prediction.device.type == "cpu" and cert.prediction.tolist() == [0, 0, 1]
    exact = torch.tensor([0.1, 0.3, 0.2], dtype=torch.float64)
    assert bool((cert.radius <= exact).all()) and bool((cert.radius >= exact - 0.1).all())
    again = smooth_certify(model, x.cuda(), sigma=0.25, n0=50, n=5000, batch_size=64)
    assert torch.equal(cert.counts, again.counts)
    assert smooth_predict(model, x, sigma=0.25, n=200).tolist() == [0, 0, 1]


# ------------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("kwargs, match", [
    ({"sigma": 0.0}, "sigma must be a number > 0"),
    ({"sigma": -0.5}, "sigma must be a number > 0"),
    ({"sigma": float("nan")}, "sigma must be a finite number"),
    ({"sigma": "0.25"}, "sigma must be a number"),
    ({"n0": 0}, r"n0 must be an integer >= 1"),
    ({"n": 0}, r"n must be an integer >= 1"),
    ({"n": 10.0}, r"n must be an integer >= 1"),
    ({"alpha": 0.0}, r"alpha must be a number in \(0, 1\)"),
    ({"alpha": 1.0}, r"alpha must be a number in \(0, 1\)"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1"),
    ({"seed": -1}, "seed must be a seed"),
])
def test_invalid_settings_are_one_line_config_errors(kwargs, match):
    args = {"sigma": 0.25, **kwargs}
    with pytest.raises(ConfigError, match=match) as info:
        smooth_certify(Constant(0), _images(), **args)
    assert "\n" not in str(info.value)
    if "n0" not in kwargs:
        args.pop("n0", None)
        with pytest.raises(ConfigError, match=match):
            smooth_predict(Constant(0), _images(), **args)


@pytest.mark.parametrize("x, match", [
    (torch.rand(1, 4, 4), "N x C x H x W"),
    (torch.zeros(2, 1, 4, 4, dtype=torch.long), "floating point"),
    (torch.full((2, 1, 4, 4), 1.5), r"must lie in \[0, 1\]"),
    (torch.full((2, 1, 4, 4), float("nan")), "NaN"),
    (np.zeros((2, 1, 4, 4), dtype=np.float32), "torch.Tensor"),
])
def test_invalid_images_are_data_errors(x, match):
    with pytest.raises(DataError, match=match):
        smooth_certify(Constant(0), x, sigma=0.25)
    with pytest.raises(DataError, match=match):
        smooth_predict(Constant(0), x, sigma=0.25)


def test_models_that_are_no_classifiers_are_refused():
    with pytest.raises(ConfigError, match="at least 2 classes"):
        smooth_predict(Constant(0, k=1), _images(), sigma=0.1)
    with pytest.raises(ConfigError, match="N x K logits"):
        smooth_certify(nn.Flatten(0), _images(), sigma=0.1)
    with pytest.raises(ConfigError, match="torch.nn.Module"):
        smooth_certify(lambda t: t, _images(), sigma=0.1)  # type: ignore[arg-type]

    class Nan(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.stack([x.flatten(1).sum(1), torch.full_like(x[:, 0, 0, 0], float("nan"))], 1)

    with pytest.raises(DataError, match="NaN or infinite logits"):
        smooth_certify(Nan(), _images(), sigma=0.1, n=10)


# ------------------------------------------------------------------------------------------------ certified accuracy
def _hand_built() -> SmoothCertificate:
    return SmoothCertificate(
        prediction=torch.tensor([0, 1, ABSTAIN, 2, 1]), radius=torch.tensor([0.1, 0.6, 0.0, 0.3, 0.25]).double(),
        p_lower=torch.tensor([0.6, 0.99, 0.4, 0.88, 0.84]).double(), counts=torch.zeros(5, 3, dtype=torch.long),
        sigma=0.5, n0=10, n=100, alpha=0.001)


def test_certified_accuracy_counts_correct_samples_certified_at_each_radius():
    cert = _hand_built()
    y = torch.tensor([0, 1, 2, 0, 1])  # sample 2 abstains, sample 3 is wrong
    acc = certified_accuracy(cert, y, [0, 0.1, 0.25, 0.5, 0.75])
    assert acc == {0.0: 0.6, 0.1: 0.6, 0.25: 0.4, 0.5: 0.2, 0.75: 0.0}
    assert list(acc) == [0.0, 0.1, 0.25, 0.5, 0.75]
    assert certified_accuracy(cert, y, 0.25) == {0.25: 0.4}
    assert certified_accuracy(cert, torch.tensor([2, 0, 1, 2, 2]), [0.0]) == {0.0: 0.2}
    assert repr(cert).startswith("SmoothCertificate(n=5, certified=4,") and "\n" not in repr(cert)


def test_certified_accuracy_checks_its_arguments():
    cert = _hand_built()
    with pytest.raises(DataError, match=r"y must have shape \[5\]"):
        certified_accuracy(cert, torch.zeros(4, dtype=torch.long), [0.0])
    with pytest.raises(ConfigError, match="radius must be a number >= 0"):
        certified_accuracy(cert, torch.zeros(5, dtype=torch.long), [0.5, -0.1])
    with pytest.raises(ConfigError, match="at least one radius"):
        certified_accuracy(cert, torch.zeros(5, dtype=torch.long), [])
    with pytest.raises(ConfigError, match="SmoothCertificate"):
        certified_accuracy({"prediction": cert.prediction}, torch.zeros(5, dtype=torch.long), [0.0])  # type: ignore


def test_the_largest_certifiable_radius_is_sigma_phi_inverse_of_alpha_to_the_one_over_n():
    cert = smooth_certify(Constant(0), _images(1), sigma=1.0, n0=1, n=10_000, alpha=0.001)
    assert float(cert.radius[0]) == pytest.approx(stats.norm.ppf(0.001 ** (1 / 10_000)), rel=1e-12)
    assert 3.1 < float(cert.radius[0]) < 3.3 and math.isfinite(float(cert.radius[0]))
