"""Randomised smoothing (Cohen, Rosenfeld & Kolter, ICML 2019): an L2 certificate for the smoothed classifier

    g(x) = argmax_c P(f(x + e) = c),  e ~ N(0, sigma^2 I),

of any base classifier ``f`` (a model returning logits; ``f(x)`` is their argmax). If the top class has
probability at least ``pA > 1/2`` under the noise, ``g`` predicts it everywhere in the L2 ball of radius
``sigma * Phi^-1(pA)`` around ``x`` (Phi^-1: the standard normal quantile function).

* :func:`smooth_predict` is the paper's PREDICT: ``n`` noise draws, the two most frequent classes, a two-sided
  binomial test of their counts against 1/2; the top class when the p-value is at most ``alpha``, else abstain
  (-1). A prediction it returns differs from ``g(x)`` with probability at most ``alpha``.
* :func:`smooth_certify` is the paper's CERTIFY: ``n0`` selection draws pick the class ``cA``; ``n`` fresh
  estimation draws count it, ``nA``; ``pA_lower`` is the one-sided Clopper-Pearson lower confidence bound at
  level ``1 - alpha`` (``beta.ppf(alpha, nA, n - nA + 1)``, 0 for ``nA = 0``); the certificate is ``cA`` with
  L2 radius ``sigma * Phi^-1(pA_lower)``, or abstain when ``pA_lower <= 1/2``. With probability at least
  ``1 - alpha`` a certified radius is sound (``g`` predicts ``cA`` in the whole ball).
* :func:`certified_accuracy`: the share of samples certified correct at each L2 radius.

Noise: added in pixel space (the model holds its own normalisation, as the data contract says) and NOT clipped to
[0, 1], as Cohen et al. do: the certificate is about the Gaussian measure around ``x``, and a clipped draw is
not Gaussian. The noisy images are batched: every pass through the model holds ``batch_size`` noisy copies of
one or several samples (each sample repeated as many times as it has draws in the pass); the predicted classes
are counted per sample with one ``index_add_``. Statistics (binomial p-values, beta quantiles, normal quantiles)
are computed in float64 with SciPy: ``p_lower`` and ``radius`` are SciPy's ``beta.ppf`` and ``sigma * norm.ppf``
to the last bit.

Randomness: the draws of sample ``i`` come in fixed blocks of :func:`block_draws` draws (a number that depends on
the image size only); block ``b`` of sample ``i`` in phase ``p`` (selection, estimation, prediction) is drawn by
a generator on the model's device seeded with a hash of ``(seed, p, i, b)`` (i: the sample's position in x, so
copies of one image at two positions draw different noise). The noise of every sample is therefore the same
whatever ``batch_size`` and whatever the other images of x are, and so are the counts as long as the model's
outputs for an image do not depend on the other images of its batch (batch-norm in eval mode, convolutions and
linear layers; only a bit-level difference between batch sizes could move an exact tie). CPU and CUDA draw
different numbers for the same seed. Per-sample results are 1-D tensors of length N, in
input order, on the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from torch import nn

from robustest.core.devices import model_device
from robustest.core.errors import ConfigError
from robustest.core.inputs import check_images, check_labels, check_logits
from robustest.core.modelcall import eval_mode, forward
from robustest.core.modelchecks import check_model_fits
from robustest.core.reprs import one_line, shape
from robustest.core.seeding import make_generator
from robustest.core.validation import check_float, check_int, check_seed

__all__ = [
    "ABSTAIN",
    "DEFAULT_BATCH_SIZE",
    "SmoothCertificate",
    "block_draws",
    "certified_accuracy",
    "class_counts",
    "clopper_pearson_lower",
    "draw_seed",
    "noisy_batches",
    "smooth_certify",
    "smooth_predict",
    "two_sided_pvalue",
]

#: the prediction of a sample on which the smoothed classifier abstains
ABSTAIN = -1
#: noisy images per forward pass when ``batch_size`` is not given
DEFAULT_BATCH_SIZE = 1000
#: values (draws x C x H x W) of one seeded block of noise: 2^22 float32 values are 16 MiB
BLOCK_VALUES = 2**22

# the phases of the draws: each has its own noise, so CERTIFY's estimation is independent of its selection
_SELECTION, _ESTIMATION, _PREDICTION = 1, 2, 3
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SmoothCertificate:
    """The result of :func:`smooth_certify` on N samples (tensors on the CPU).

    ``prediction``: int64 [N], the class ``cA`` chosen on the selection draws, :data:`ABSTAIN` (-1) where
    ``p_lower <= 0.5``; ``radius``: float64 [N], the certified L2 radius ``sigma * Phi^-1(p_lower)`` in pixel
    scale, 0 where the sample abstains; ``p_lower``: float64 [N], the one-sided Clopper-Pearson lower bound at
    level ``1 - alpha`` on the probability of ``cA`` under the noise (kept where the sample abstains too);
    ``counts``: int64 [N x K], the class counts of the ``n`` estimation draws. ``sigma``, ``n0``, ``n``, ``alpha``:
    the settings it was computed with.
    """

    prediction: torch.Tensor
    radius: torch.Tensor
    p_lower: torch.Tensor
    counts: torch.Tensor
    sigma: float
    n0: int
    n: int
    alpha: float

    def __len__(self) -> int:
        return int(self.prediction.shape[0])

    @property
    def abstained(self) -> torch.Tensor:
        """bool [N]: the samples on which the smoothed classifier abstains."""
        return self.prediction == ABSTAIN

    def __repr__(self) -> str:
        n = len(self)
        certified = int((~self.abstained).sum())
        mean_radius = float(self.radius.mean()) if n else 0.0
        return one_line(self, n=n, certified=certified, mean_radius=mean_radius, sigma=self.sigma, n0=self.n0,
                        draws=self.n, alpha=self.alpha, counts=shape(self.counts))


# ------------------------------------------------------------------------------------------------ checks
def _check_settings(sigma: float, alpha: float, batch_size: int, seed: int, **draws: int) -> tuple[float, float]:
    """sigma in (0, inf), alpha in (0, 1), batch_size and every count of ``draws`` >= 1, a seed; one-line
    ConfigErrors. Returns (sigma, alpha) as floats."""
    sigma_f = float(check_float("sigma", sigma, 0.0, lo_open=True))
    alpha_f = float(check_float("alpha", alpha, 0.0, 1.0, lo_open=True, hi_open=True))
    for name, value in draws.items():
        check_int(name, value, 1)
    check_int("batch_size", batch_size, 1)
    check_seed("seed", seed)
    return sigma_f, alpha_f


def _prepare(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Check the model and the images (N x C x H x W float in [0, 1]) before any noise is drawn; returns the images
    on the model's device and the model's number of classes K (from one clean forward pass)."""
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    x = check_images(x)
    k = check_model_fits(model, x)  # the image size, one forward pass, N x K logits with K >= 2
    return x.to(model_device(model)), k


# ------------------------------------------------------------------------------------------------ noise
def _splitmix64(z: int) -> int:
    """One step of SplitMix64 (Steele, Lea & Flood 2014) on a 64-bit integer."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def draw_seed(seed: int, phase: int, index: int, block: int) -> int:
    """The seed of block ``block`` of the draws of sample ``index`` in ``phase``: a SplitMix64 hash of the four
    integers, in [0, 2^63) (what ``torch.Generator.manual_seed`` takes)."""
    h = _splitmix64(int(seed))
    for key in (phase, index, block):
        h = _splitmix64(h ^ _splitmix64(int(key)))
    return h >> 1


def block_draws(image_shape: tuple[int, ...]) -> int:
    """Draws per seeded block of noise for images of ``image_shape`` (C x H x W): as many as fit in
    :data:`BLOCK_VALUES` values, at least 1 (5,349 for MNIST, 1,365 for CIFAR-10, 27 for ImageNet at 224)."""
    return max(1, BLOCK_VALUES // max(1, math.prod(int(d) for d in image_shape)))


def _noise_blocks(x: torch.Tensor, num: int, sigma: float, seed: int, phase: int
                  ) -> Iterator[tuple[int, torch.Tensor]]:
    """(sample index, ``sigma`` x standard normal noise of one block: m x C x H x W, x's dtype and device) for every
    block of ``num`` draws of every sample of x, in order; block b of sample i drawn from its own seed."""
    per_block = block_draws(tuple(x.shape[1:]))
    gen = make_generator(0, x.device)
    for i in range(int(x.shape[0])):
        for b, start in enumerate(range(0, num, per_block)):
            gen.manual_seed(draw_seed(seed, phase, i, b))
            m = min(per_block, num - start)
            yield i, torch.randn((m, *x.shape[1:]), generator=gen, dtype=x.dtype, device=x.device).mul_(sigma)


def noisy_batches(x: torch.Tensor, num: int, sigma: float, batch_size: int, seed: int, phase: int
                  ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(idx int64 [B], noisy images B x C x H x W) with B <= ``batch_size``: ``num`` noisy copies
    ``x[i] + sigma * e`` of every sample i of x (N x C x H x W), e ~ N(0, I) and not clipped, in sample order;
    a batch holds the copies of one or several samples (``idx`` says whose: each sample repeated as many times
    as it has draws there). Every batch but the last holds exactly ``batch_size`` images."""
    idx_parts: list[torch.Tensor] = []
    noise_parts: list[torch.Tensor] = []
    held = 0
    for i, noise in _noise_blocks(x, num, sigma, seed, phase):
        idx_parts.append(torch.full((noise.shape[0],), i, dtype=torch.long, device=x.device))
        noise_parts.append(noise)
        held += int(noise.shape[0])
        if held < batch_size:
            continue
        idx_all, noise_all = torch.cat(idx_parts), torch.cat(noise_parts)
        full = held // batch_size * batch_size
        for s in range(0, full, batch_size):
            idx = idx_all[s:s + batch_size]
            yield idx, x.index_select(0, idx).add_(noise_all[s:s + batch_size])
        idx_parts, noise_parts, held = [idx_all[full:]], [noise_all[full:]], held - full
    if held:
        idx_all, noise_all = torch.cat(idx_parts), torch.cat(noise_parts)
        yield idx_all, x.index_select(0, idx_all).add_(noise_all)


def class_counts(model: nn.Module, x: torch.Tensor, num_classes: int, num: int, sigma: float, *,
                 batch_size: int, seed: int, phase: int) -> torch.Tensor:
    """int64 [N x K] on x's device: how often ``model`` (in its current mode) predicts each class on ``num`` noisy
    copies of each sample of x (N x C x H x W, on the model's device); see :func:`noisy_batches`."""
    n_img = int(x.shape[0])
    counts = torch.zeros(n_img * num_classes, dtype=torch.long, device=x.device)
    with torch.no_grad():
        for idx, xb in noisy_batches(x, num, sigma, batch_size, seed, phase):
            logits = check_logits(forward(model, xb))
            if logits.dim() != 2 or logits.shape != (idx.shape[0], num_classes):
                raise ConfigError(f"the model returned outputs of shape {tuple(logits.shape)} for "
                                  f"{idx.shape[0]} images: expected {idx.shape[0]} x {num_classes} logits")
            flat = idx * num_classes + logits.argmax(dim=1)
            counts.index_add_(0, flat, torch.ones_like(flat))
    return counts.view(n_img, num_classes)


# ------------------------------------------------------------------------------------------------ statistics
def two_sided_pvalue(top: np.ndarray, second: np.ndarray) -> np.ndarray:
    """float64 [N]: the two-sided binomial test p-value of ``top`` successes in ``top + second`` trials against
    probability 1/2 (``top >= second``): ``min(1, 2 * P(X >= top))``, X ~ Bin(top + second, 1/2); for p = 1/2
    the distribution is symmetric, so this is ``scipy.stats.binomtest(top, top + second).pvalue``."""
    top = np.asarray(top, dtype=np.int64)
    trials = top + np.asarray(second, dtype=np.int64)
    return np.minimum(1.0, 2.0 * stats.binom.sf(top - 1, trials, 0.5))


def clopper_pearson_lower(successes: np.ndarray, trials: int, alpha: float) -> np.ndarray:
    """float64 [N]: the one-sided Clopper-Pearson lower confidence bound at level ``1 - alpha`` on a binomial
    probability from ``successes`` out of ``trials``: ``beta.ppf(alpha, k, trials - k + 1)``, 0 where k = 0."""
    k = np.asarray(successes, dtype=np.int64)
    out = np.zeros(k.shape, dtype=np.float64)
    pos = k > 0
    if pos.any():
        out[pos] = stats.beta.ppf(alpha, k[pos], trials - k[pos] + 1)
    return out


# ------------------------------------------------------------------------------------------------ PREDICT / CERTIFY
def smooth_predict(model: nn.Module, x: torch.Tensor, *, sigma: float, n: int = 100, alpha: float = 0.001,
                   batch_size: int = DEFAULT_BATCH_SIZE, seed: int = 0) -> torch.Tensor:
    """Cohen et al.'s PREDICT: the smoothed classifier's class for every image of x, or :data:`ABSTAIN` (-1).

    x: N x C x H x W float in [0, 1] (moved to the model's device); ``sigma`` > 0: the noise's standard deviation
    in pixel scale (the noisy images are not clipped to [0, 1]); ``n`` >= 1 noise draws per image; ``alpha`` in
    (0, 1): the test's level (the two-sided binomial test of the top two classes' counts against 1/2; abstain when
    its p-value exceeds ``alpha``, so on ties); ``batch_size``: noisy images per forward pass; ``seed``: the
    draws' seed (the result does not depend on ``batch_size``; see the module docstring). The model runs in eval
    mode, restored afterwards. Returns int64 [N] on the CPU. Raises ConfigError / DataError (one line) for
    invalid settings or images.
    """
    _check_settings(sigma, alpha, batch_size, seed, n=n)
    x, k = _prepare(model, x)
    with eval_mode(model):
        counts = class_counts(model, x, k, n, float(sigma), batch_size=batch_size, seed=seed, phase=_PREDICTION)
    counts = counts.cpu()
    ranked, order = torch.sort(counts, dim=1, descending=True, stable=True)  # ties: the lower class first
    pvalue = two_sided_pvalue(ranked[:, 0].numpy(), ranked[:, 1].numpy())
    keep = torch.from_numpy(pvalue <= float(alpha))
    return torch.where(keep, order[:, 0], torch.full_like(order[:, 0], ABSTAIN))


def smooth_certify(model: nn.Module, x: torch.Tensor, *, sigma: float, n0: int = 100, n: int = 100_000,
                   alpha: float = 0.001, batch_size: int = DEFAULT_BATCH_SIZE, seed: int = 0) -> SmoothCertificate:
    """Cohen et al.'s CERTIFY: the smoothed classifier's class and a certified L2 radius for every image of x.

    ``n0`` >= 1 selection draws per image pick the most frequent class ``cA`` (ties: the lower class); ``n`` >= 1
    fresh estimation draws count it; ``p_lower`` is the one-sided Clopper-Pearson lower bound at level
    ``1 - alpha`` on its probability; the sample is certified with radius ``sigma * Phi^-1(p_lower)`` when
    ``p_lower > 0.5``, else it abstains (prediction -1, radius 0). The paper's settings: n0 = 100, n = 100,000,
    alpha = 0.001 (the largest radius ``n`` draws can certify is ``sigma * Phi^-1(alpha^(1/n))``: 3.8 sigma
    for n = 100,000, 3.2 sigma for 10,000).

    x: N x C x H x W float in [0, 1] (moved to the model's device); ``sigma`` > 0: the noise's standard deviation
    in pixel scale (noisy images are not clipped to [0, 1]); ``batch_size``: noisy images per forward pass;
    ``seed``: the draws' seed (the result does not depend on ``batch_size``; see the module docstring). The model
    runs in eval mode, restored afterwards. Returns a :class:`SmoothCertificate` (tensors on the CPU). Raises
    ConfigError / DataError (one line) for invalid settings or images.
    """
    sigma_f, alpha_f = _check_settings(sigma, alpha, batch_size, seed, n0=n0, n=n)
    x, k = _prepare(model, x)
    with eval_mode(model):
        selection = class_counts(model, x, k, n0, sigma_f, batch_size=batch_size, seed=seed, phase=_SELECTION)
        counts = class_counts(model, x, k, n, sigma_f, batch_size=batch_size, seed=seed, phase=_ESTIMATION)
    selection, counts = selection.cpu(), counts.cpu()
    top = torch.sort(selection, dim=1, descending=True, stable=True).indices[:, 0]
    n_a = counts.gather(1, top[:, None])[:, 0].numpy()
    p_lower = clopper_pearson_lower(n_a, n, alpha_f)
    certified = p_lower > 0.5
    radius = np.zeros_like(p_lower)
    radius[certified] = sigma_f * stats.norm.ppf(p_lower[certified])
    prediction = torch.where(torch.from_numpy(certified), top, torch.full_like(top, ABSTAIN))
    return SmoothCertificate(prediction=prediction, radius=torch.from_numpy(radius),
                             p_lower=torch.from_numpy(p_lower), counts=counts, sigma=sigma_f, n0=int(n0), n=int(n),
                             alpha=alpha_f)


def certified_accuracy(cert: SmoothCertificate, y: torch.Tensor, radii: Iterable[float] | float
                       ) -> dict[float, float]:
    """The certified accuracy at each L2 radius r of ``radii`` (pixel scale, >= 0): the share of the N samples
    whose prediction is their label ``y`` (int [N]) and whose certified radius is at least r. At r = 0 it is the
    smoothed classifier's accuracy with abstentions counted wrong. Returns {r: share} in the order of ``radii``
    (0.0 for every r when N = 0)."""
    if not isinstance(cert, SmoothCertificate):
        raise ConfigError(f"cert must be a SmoothCertificate (from smooth_certify), got {type(cert).__name__}")
    y = check_labels(y, len(cert)).detach().cpu()
    values = [radii] if isinstance(radii, (int, float)) else list(radii)
    if not values:
        raise ConfigError("radii must hold at least one radius (an L2 radius in pixel scale, >= 0)")
    correct = cert.prediction == y.long()
    out: dict[float, float] = {}
    for r in values:
        r_f = float(check_float("radius", r, 0.0))
        hits = int((correct & (cert.radius >= r_f)).sum())
        out[r_f] = hits / len(cert) if len(cert) else 0.0
    return out

