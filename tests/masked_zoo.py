"""Models that FAKE robustness by gradient masking, and the adaptive attack that breaks each (plain PyTorch).

Athalye, Carlini & Wagner (2018), "Obfuscated gradients give a false sense of security"; Tramer, Carlini, Brendel
& Madry (2020), "On adaptive attacks to adversarial example defenses". Each factory wraps any classifier
``base`` (images N x C x H x W in [0, 1] -> logits N x K) so that gradient-based attacks fail while the
classifier underneath is exactly as weak as ``base``: a robustness evaluation that reports much more than
:func:`adaptive_attack` does on such a model has been fooled.

* shattered gradients: :class:`Quantized` (round), :class:`Thermometer` (hard steps), :class:`DetachedMedian`
  (zero gradient through a detached filter), :class:`NoGradPath` (no graph to the input at all);
  broken by BPDA (Athalye et al. 2018): differentiate ``base`` at ``pre(x)`` and use the identity (or the true
  gradient of a differentiable ``pre``) for the masked preprocessing;
* stochastic gradients: :class:`RandomShiftNoise`; broken by EOT (the gradient averaged over the randomness);
* vanishing / exploding gradients: :class:`SoftmaxOutput` (probabilities returned as logits), :class:`ScaledLogits`
  (cross-entropy saturates in float32); broken by a loss on log-probabilities or by the scale-invariant margin.

The submodules keep fixed names so an adaptive tool can address them: ``base`` (the classifier), ``quant``
(Quantized, Thermometer), ``filter`` (DetachedMedian), ``pre`` (RandomShiftNoise, NoGradPath).

    from masked_zoo import Quantized, adaptive_attack, robust_accuracy_of
    m = Quantized(base, levels=4).eval()
    adv = adaptive_attack("quantized", m, x, y, eps=0.3)
    print(robust_accuracy_of(m, x, y, adv))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["KINDS", "DetachedMedian", "MedianFilter", "NoGradPath", "Quantize", "Quantized", "RandomShift",
           "RandomShiftNoise", "ScaledLogits", "Smooth", "SoftmaxOutput", "Thermometer", "ThermometerQuantize",
           "adaptive_attack", "kind_of", "margin", "predict_votes", "robust_accuracy_of"]


# ------------------------------------------------------------------------------------------ preprocessing
class Quantize(nn.Module):
    """``round(x * levels) / levels``: its gradient is zero almost everywhere."""

    def __init__(self, levels: int) -> None:
        super().__init__()
        self.levels = int(levels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x * self.levels) / self.levels

    def extra_repr(self) -> str:
        return f"levels={self.levels}"


class ThermometerQuantize(nn.Module):
    """Thermometer encoding ``[x > i / levels for i < levels]`` decoded to its mean (so ``base`` takes it): the
    hard comparisons build no autograd graph at all, the output does not depend on ``x`` for autograd."""

    def __init__(self, levels: int = 16) -> None:
        super().__init__()
        self.levels = int(levels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        thresholds = torch.arange(self.levels, device=x.device, dtype=x.dtype) / self.levels
        bits = (x.unsqueeze(-1) > thresholds).to(x.dtype)  # N x C x H x W x levels, no grad_fn
        return bits.sum(-1) / self.levels

    def extra_repr(self) -> str:
        return f"levels={self.levels}"


class MedianFilter(nn.Module):
    """k x k median filter (reflect padding, via unfold) of ``x.detach()`` plus ``0 * x``: the input gradient
    is exactly zero, but defined (autograd raises nothing)."""

    def __init__(self, k: int = 3) -> None:
        super().__init__()
        if k < 1 or k % 2 == 0:
            raise ValueError(f"the median filter needs an odd size, got {k}")
        self.k = int(k)

    def median(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        p = self.k // 2
        xp = F.pad(x, (p, p, p, p), mode="reflect") if p else x
        cols = F.unfold(xp, self.k).view(n, c, self.k * self.k, h * w)
        return cols.median(dim=2).values.view(n, c, h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.median(x.detach()) + 0 * x

    def extra_repr(self) -> str:
        return f"k={self.k}"


class RandomShift(nn.Module):
    """A fresh random integer shift of up to ``shift`` pixels per sample and axis (zero padding + crop) plus
    N(0, sigma) noise, clamped to [0, 1], at EVERY call, in train and eval mode; drawn from the global torch RNG
    (never reseeded). Differentiable, but each gradient is that of another function."""

    def __init__(self, shift: int = 3, sigma: float = 0.1) -> None:
        super().__init__()
        self.shift, self.sigma = int(shift), float(sigma)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        s = self.shift
        if s > 0:
            xp = F.pad(x, (s, s, s, s))
            dy = torch.randint(-s, s + 1, (n,), device=x.device)
            dx = torch.randint(-s, s + 1, (n,), device=x.device)
            rows = (torch.arange(h, device=x.device) + s)[None, :] + dy[:, None]  # N x H
            cols = (torch.arange(w, device=x.device) + s)[None, :] + dx[:, None]  # N x W
            ni = torch.arange(n, device=x.device)[:, None, None, None]
            ci = torch.arange(c, device=x.device)[None, :, None, None]
            x = xp[ni, ci, rows[:, None, :, None], cols[:, None, None, :]]
        if self.sigma > 0:
            x = x + self.sigma * torch.randn_like(x)
        return x.clamp(0.0, 1.0)

    def extra_repr(self) -> str:
        return f"shift={self.shift}, sigma={self.sigma}"


class Smooth(nn.Module):
    """k x k box blur with reflect padding (differentiable in itself)."""

    def __init__(self, k: int = 3) -> None:
        super().__init__()
        self.k = int(k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.k // 2
        xp = F.pad(x, (p, p, p, p), mode="reflect") if p else x
        return F.avg_pool2d(xp, self.k, stride=1)

    def extra_repr(self) -> str:
        return f"k={self.k}"


# ------------------------------------------------------------------------------------------ masked models
class Quantized(nn.Module):
    """``base(round(x * levels) / levels)``. Masks: shattered gradients (zero almost everywhere). Broken by:
    BPDA, straight-through on ``quant`` (the gradient of ``base`` at ``quant(x)``)."""

    def __init__(self, base: nn.Module, levels: int = 3) -> None:
        super().__init__()
        self.quant = Quantize(levels)
        self.base = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(self.quant(x))


class Thermometer(nn.Module):
    """Thermometer encoding with hard steps, decoded to its mean, then ``base``. Masks: non-differentiable
    preprocessing (the output has no autograd path to the input). Broken by: BPDA, straight-through on
    ``quant``."""

    def __init__(self, base: nn.Module, levels: int = 16) -> None:
        super().__init__()
        self.quant = ThermometerQuantize(levels)
        self.base = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(self.quant(x))


class DetachedMedian(nn.Module):
    """``base(median_k(x.detach()) + 0 * x)``. Masks: an input gradient that is exactly zero but defined (a
    detached denoiser). Broken by: BPDA, straight-through on ``filter``."""

    def __init__(self, base: nn.Module, k: int = 3) -> None:
        super().__init__()
        self.filter = MedianFilter(k)
        self.base = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(self.filter(x))


class RandomShiftNoise(nn.Module):
    """``base(clamp(shift(x) + noise))`` with a fresh random shift (up to ``shift`` px) and N(0, sigma) noise at
    every forward. Masks: stochastic gradients (and a random verdict on each call). Broken by: EOT, the gradient
    averaged over draws, success judged by a majority of forwards."""

    def __init__(self, base: nn.Module, shift: int = 3, sigma: float = 0.1) -> None:
        super().__init__()
        self.pre = RandomShift(shift, sigma)
        self.base = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(self.pre(x))


class SoftmaxOutput(nn.Module):
    """``softmax(base(x) / temperature)`` returned where logits are expected. Masks: vanishing gradients of a
    cross-entropy on probabilities (a loss on saturated probabilities is flat). Broken by: PGD on the log of
    the probabilities (the margin of log p is the margin of the logits)."""

    def __init__(self, base: nn.Module, temperature: float = 1.0) -> None:
        super().__init__()
        self.base = base
        self.temperature = float(temperature)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.base(x) / self.temperature, dim=1)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"


class NoGradPath(nn.Module):
    """``with torch.no_grad(): z = pre(x)``, then ``base(z)``: the output has no autograd path to ``x`` at all
    (``torch.autograd.grad`` w.r.t. ``x`` raises: the output does not require grad when the parameters do not,
    else ``x`` is unused in the graph). Masks: a cut graph. Broken by: BPDA (the gradient of ``base`` at
    ``pre(x)``, here through the differentiable ``pre`` itself)."""

    def __init__(self, base: nn.Module, k: int = 3) -> None:
        super().__init__()
        self.pre = Smooth(k)
        self.base = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            z = self.pre(x)
        return self.base(z)


class ScaledLogits(nn.Module):
    """``scale * base(x)``. Masks: exploding logits, so the cross-entropy of a confident sample is exactly 0 in
    float32 and so is its gradient. Broken by: PGD on the margin loss (z_y - max other), which is scale
    invariant under a sign step."""

    def __init__(self, base: nn.Module, scale: float = 1000.0) -> None:
        super().__init__()
        self.base = base
        self.scale = float(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) * self.scale

    def extra_repr(self) -> str:
        return f"scale={self.scale}"


KINDS: dict[str, type[nn.Module]] = {
    "quantized": Quantized, "thermometer": Thermometer, "median": DetachedMedian, "shift_noise": RandomShiftNoise,
    "softmax": SoftmaxOutput, "nograd": NoGradPath, "scaled": ScaledLogits,
}


def kind_of(model: nn.Module) -> str:
    """The KINDS key of a masked model, "plain" for anything else."""
    for k, cls in KINDS.items():
        if type(model) is cls:
            return k
    return "plain"


# ------------------------------------------------------------------------------------------ adaptive attack
def margin(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample ``z_y - max_{j != y} z_j`` (negative = misclassified)."""
    zy = logits.gather(1, y[:, None]).squeeze(1)
    other = logits.clone()
    other.scatter_(1, y[:, None], float("-inf"))
    return zy - other.amax(1)


def _log_probs(p: torch.Tensor) -> torch.Tensor:
    return torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))


@torch.no_grad()
def predict_votes(model: nn.Module, x: torch.Tensor, y: torch.Tensor, forwards: int = 1) -> torch.Tensor:
    """How many of ``forwards`` forward passes classify each sample correctly, int [N]."""
    correct = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    for _ in range(forwards):
        correct += (model(x).argmax(1) == y).long()
    return correct


def _correct(model: nn.Module, x: torch.Tensor, y: torch.Tensor, forwards: int) -> torch.Tensor:
    """Correct by a strict majority of ``forwards`` forwards, bool [N]."""
    return 2 * predict_votes(model, x, y, forwards) > forwards


def robust_accuracy_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor, adv: torch.Tensor,
                       forwards: int = 1, seed: int | None = None) -> float:
    """Fraction of samples classified correctly both clean and at ``adv``, each by a strict majority of
    ``forwards`` forward passes (1 for a deterministic model). With ``seed``, a random model draws from a forked
    RNG seeded with it (the same verdict on every call; the caller's RNG state is left as it was)."""
    if seed is None:
        ok = _correct(model, x, y, forwards) & _correct(model, adv, y, forwards)
        return float(ok.double().mean())
    with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
        torch.manual_seed(seed)
        return robust_accuracy_of(model, x, y, adv, forwards)


def _objective(out: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """Per-sample loss to descend: the margin ``z_y - max other``, or ``z_y - z_target`` with a target."""
    if target is None:
        return margin(out, y)
    return (out.gather(1, y[:, None]) - out.gather(1, target[:, None])).squeeze(1)


def _loss_grad(kind: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eot: int,
               target: torch.Tensor | None = None) -> torch.Tensor:
    """The adaptive gradient at ``x`` for ``kind`` of the per-sample margin (untargeted, or towards ``target``),
    to descend."""
    xr = x.detach().requires_grad_(True)
    with torch.enable_grad():
        if kind in ("quantized", "thermometer", "median"):  # BPDA straight-through: d base(pre(x)) ~ d base(z)
            sub = model.quant if kind in ("quantized", "thermometer") else model.filter
            with torch.no_grad():
                z = sub(x)
            zr = z.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(_objective(model.base(zr), y, target).sum(), zr)
            return g
        if kind == "nograd":  # BPDA: base at pre(x), through the (differentiable) smoothing itself
            loss = _objective(model.base(model.pre(xr)), y, target).sum()
        elif kind == "shift_noise":  # EOT over ``eot`` draws of the random model
            g = torch.zeros_like(x)
            for _ in range(eot):
                (gi,) = torch.autograd.grad(_objective(model(xr), y, target).sum(), xr)
                g += gi
            return g / eot
        elif kind == "softmax":  # log of the probabilities
            loss = _objective(_log_probs(model(xr)), y, target).sum()
        else:  # scaled, plain: the scale-invariant margin
            loss = _objective(model(xr), y, target).sum()
        (g,) = torch.autograd.grad(loss, xr)
    return g


@torch.no_grad()
def _ranked_others(model: nn.Module, x: torch.Tensor, y: torch.Tensor, forwards: int) -> torch.Tensor:
    """The classes other than y, most likely first (outputs averaged over ``forwards`` forwards), N x (K - 1)."""
    out = sum(model(x) for _ in range(forwards)) / forwards
    order = out.argsort(1, descending=True)
    return order[order != y[:, None]].view(x.shape[0], -1)


def _pgd_run(kind: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int,
             target: torch.Tensor | None, *, eot: int, forwards: int, check_every: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """One PGD run from a random start: (adversarial images, found bool [N]); each sample keeps the first point
    found misclassified, else the last."""
    stochastic = forwards > 1
    alpha = 2.5 * eps / steps
    lo, hi = (x - eps).clamp(0.0, 1.0), (x + eps).clamp(0.0, 1.0)
    adv = (x + torch.empty_like(x).uniform_(-eps, eps)).clamp(lo, hi)
    best = adv.clone()
    found = ~_correct(model, adv, y, forwards)
    for step in range(1, steps + 1):
        g = _loss_grad(kind, model, adv, y, eot, target)
        adv = (adv - alpha * g.sign()).clamp(lo, hi).detach()
        if not stochastic or step % check_every == 0 or step == steps:
            new = ~_correct(model, adv, y, forwards) & ~found
            best[new] = adv[new]
            found |= new
    best[~found] = adv[~found]
    return best, found


def adaptive_attack(kind: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int = 100,
                    seed: int = 0, *, targets: int = 3, eot: int = 20, votes: int = 11,
                    check_every: int = 10) -> torch.Tensor:
    """L-inf PGD with a random start, written for masked model ``kind`` (a KINDS key, or "plain"): BPDA for
    quantized / thermometer / median / nograd, EOT over ``eot`` draws for shift_noise (a point counts as adversarial
    when a majority of ``votes`` forwards misclassify it, checked every ``check_every`` steps), the margin of the
    log-probabilities for softmax, the margin loss for scaled and plain.

    One untargeted run of ``steps`` sign steps of 2.5 eps / steps descending the margin ``z_y - max other``, then,
    on the samples still not broken, one targeted run (``z_y - z_t``) for each of the ``targets`` most likely other
    classes (as APGD-T does; it closes most of the gap of plain PGD to AutoAttack). Each sample keeps the first point
    found misclassified (else the last). Returns the adversarial images (in the eps-ball and [0, 1]). Randomness:
    ``seed`` in a forked RNG (the caller's global RNG state is left as it was)."""
    if kind not in KINDS and kind != "plain":
        raise ValueError(f"unknown kind {kind!r}: use one of {', '.join([*KINDS, 'plain'])}")
    x, y = x.detach(), y.detach()
    forwards = votes if kind == "shift_noise" else 1
    kw = {"eot": eot, "forwards": forwards, "check_every": check_every}
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        best, found = _pgd_run(kind, model, x, y, eps, steps, None, **kw)
        others = _ranked_others(model, x, y, forwards) if targets > 0 else None
        for t in range(min(targets, others.shape[1]) if others is not None else 0):
            idx = (~found).nonzero().flatten()
            if idx.numel() == 0:
                break
            adv, hit = _pgd_run(kind, model, x[idx], y[idx], eps, steps, others[idx, t], **kw)
            best[idx] = torch.where(hit.view(-1, 1, 1, 1), adv, best[idx])
            found[idx] = hit
    return best


def quantized_digits_cnn(levels: int = 3) -> nn.Module:
    """A factory for ``--model masked_zoo:quantized_digits_cnn``: :class:`Quantized` around robustest's
    ``digits_cnn`` (weights from ``--weights``)."""
    from robustest import models

    return Quantized(models.create("digits_cnn", input_size=8), levels)
