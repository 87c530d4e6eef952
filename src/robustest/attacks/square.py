"""Square Attack (Andriushchenko, Croce, Flammarion & Hein, ECCV 2020): a score-based black-box attack (forward
passes only, no gradients), L-inf or L2, the last attack of AutoAttack's standard ensemble.

Random search on the margin loss ``z_y - max_{i != y} z_i`` (minimised; <= 0 means misclassified): each
iteration proposes a change of one random s x s window per image and keeps it when the loss decreases (or the
image becomes misclassified). The window side follows the paper's schedule ``s = round(sqrt(p * H * W))`` with
p = ``p_init`` halved after iterations 10, 50, 200, 500, 1000, 2000, 4000, 6000 and 8000 (of 10,000;
``rescale_schedule`` stretches it to ``queries``).

* L-inf: starts from vertical stripes ``x + eps * s`` (one random sign per channel and column); a proposal sets
  the window to ``x +- eps`` (one random sign per channel), clipped to [0, 1].
* L2: starts from a grid of s x s windows (s = H // 5) each holding the paper's pseudo-Gaussian pattern eta
  (two halves of opposite sign, rings of weight sum 1/(k+1)^2) with a random sign per channel, scaled to norm
  eps. A proposal moves the perturbation mass of a second random window into the first one, adds a fresh eta
  pattern there (randomly transposed) and rescales so that the total budget eps is used; windows have odd side
  >= 3.

Settings of AutoAttack's standard version: 5000 queries, p_init 0.8, one restart, no rescaling.
Differences from the reference implementation (fra31/auto-attack): every image draws its own window position,
signs and pattern orientation (the reference draws one window for the whole batch per iteration, the paper's
code one per image, as here); positions are uniform over all H - s + 1 offsets (the reference never draws the
last one); randomness comes from a ``torch.Generator``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from robustest.attacks._core import (
    _DEFAULT_CHUNK,
    _check_steps,
    _prepare,
    _run,
    check_norm,
)
from robustest.attacks._core import margin as margin_of
from robustest.attacks.registry import Attack
from robustest.core.errors import ConfigError
from robustest.core.modelcall import forward
from robustest.core.validation import check_eps

__all__ = ["square"]

_SCHEDULE = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)


def _p_at(it: int, p_init: float, queries: int, rescale: bool) -> float:
    """The fraction of pixels changed at iteration ``it`` (the paper's piecewise constant schedule)."""
    if rescale:
        it = int(it / queries * 10000)
    halvings = sum(1 for t in _SCHEDULE if it > t)
    return p_init / 2 ** halvings


def _rings(a: int, b: int, device: torch.device) -> torch.Tensor:
    """a x b block whose entry at Chebyshev distance d from the centre (a // 2, b // 2) is
    sum_{k = d}^{K - 1} 1 / (k + 1)^2, K = max(a // 2, b // 2) + 1; unit L2 norm (empty for a = 0)."""
    if a == 0:
        return torch.zeros(0, b, device=device)
    i = torch.arange(a, device=device)[:, None] - a // 2
    j = torch.arange(b, device=device)[None, :] - b // 2
    d = torch.maximum(i.abs(), j.abs())
    big_k = max(a // 2, b // 2) + 1
    w = 1.0 / torch.arange(1, big_k + 1, device=device, dtype=torch.float32) ** 2
    tail = w.flip(0).cumsum(0).flip(0)  # tail[d] = sum_{k >= d} w[k]
    block = tail[d.clamp(max=big_k - 1)]
    return block / block.norm().clamp_min(1e-12)


def _eta(s: int, device: torch.device) -> torch.Tensor:
    """The paper's s x s L2 pattern: the top half rings, the bottom half minus rings; unit L2 norm."""
    e = torch.cat([_rings(s // 2, s, device), -_rings(s - s // 2, s, device)], 0)
    return e / e.norm().clamp_min(1e-12)


def _signs(shape: tuple[int, ...], gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    return torch.randint(0, 2, shape, generator=gen, device=like.device).to(like.dtype).mul_(2).sub_(1)


def _offsets(m: int, span: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.randint(0, span + 1, (m,), generator=gen, device=device)


def _window_mask(vh: torch.Tensor, vw: torch.Tensor, s: int, h: int, w: int) -> torch.Tensor:
    """m x 1 x h x w boolean mask of the s x s window at (vh, vw) of every image."""
    rows = torch.arange(h, device=vh.device)[None, :]
    cols = torch.arange(w, device=vh.device)[None, :]
    in_r = (rows >= vh[:, None]) & (rows < vh[:, None] + s)
    in_c = (cols >= vw[:, None]) & (cols < vw[:, None] + s)
    return (in_r[:, :, None] & in_c[:, None, :])[:, None]


def _window_index(vh: torch.Tensor, vw: torch.Tensor, s: int):
    """Index tensors selecting every image's s x s window: t[n, :, r, c] has shape m x s x s x C."""
    ar = torch.arange(s, device=vh.device)
    n = torch.arange(vh.shape[0], device=vh.device)[:, None, None]
    return n, (vh[:, None] + ar)[:, :, None], (vw[:, None] + ar)[:, None, :]


def _l2_init(x: torch.Tensor, eps: float, gen: torch.Generator) -> torch.Tensor:
    m, c, h, w = x.shape
    s = max(h // 5, 1)
    delta = torch.zeros_like(x)
    pattern = _eta(s, x.device).to(x.dtype)
    start = (h - 5 * s) // 2 if h >= 5 * s else 0
    for vh in range(start, h - s + 1, s):
        for vw in range(start, w - s + 1, s):
            delta[:, :, vh:vh + s, vw:vw + s] += pattern * _signs((m, c, 1, 1), gen, x)
    norm = delta.flatten(1).norm(dim=1).clamp_min(1e-12).view(m, 1, 1, 1)
    return (x + eps * delta / norm).clamp_(0.0, 1.0)


def _square_run(model, x, y, gen, *, eps, norm, queries, p_init, rescale):
    """One run of the Square Attack on one chunk (all samples attacked; successful ones stop)."""
    m, c, h, w = x.shape
    if norm == "linf":
        lo, hi = (x - eps).clamp(min=0.0), (x + eps).clamp(max=1.0)
        x_best = (x + eps * _signs((m, c, 1, w), gen, x)).clamp_(0.0, 1.0)
    else:
        x_best = _l2_init(x, eps, gen)
    with torch.no_grad():
        margin = margin_of(forward(model, x_best), y)
    n_features = c * h * w
    for it in range(queries):
        idx = (margin > 0).nonzero().flatten()
        k = idx.numel()
        if k == 0:
            break
        p = _p_at(it, p_init, queries, rescale)
        xc, xb, yc = x[idx], x_best[idx], y[idx]
        if norm == "linf":
            s = min(max(int(round(math.sqrt(p * n_features / c))), 1), h, w)
            vh, vw = _offsets(k, h - s, gen, x.device), _offsets(k, w - s, gen, x.device)
            mask = _window_mask(vh, vw, s, h, w)
            x_new = torch.where(mask, xb + 2.0 * eps * _signs((k, c, 1, 1), gen, x), xb)
            x_new = torch.minimum(torch.maximum(x_new, lo[idx]), hi[idx])
        else:
            s = max(int(round(math.sqrt(p * n_features / c))), 3)
            s = min(s + 1 if s % 2 == 0 else s, h, w)
            delta = xb - xc
            vh, vw = _offsets(k, h - s, gen, x.device), _offsets(k, w - s, gen, x.device)
            vh2, vw2 = _offsets(k, h - s, gen, x.device), _offsets(k, w - s, gen, x.device)
            i1 = _window_index(vh, vw, s)
            win1 = delta[i1[0], :, i1[1], i1[2]].permute(0, 3, 1, 2)  # k x C x s x s
            norm_w1 = win1.flatten(2).norm(dim=2)[:, :, None, None]
            norm_img = delta.flatten(1).norm(dim=1).view(k, 1, 1, 1)
            union = _window_mask(vh, vw, s, h, w) | _window_mask(vh2, vw2, s, h, w)
            norm_union = (delta * union).flatten(2).norm(dim=2)[:, :, None, None]
            pattern = _eta(s, x.device).to(x.dtype)
            flip = torch.randint(0, 2, (k, 1, 1, 1), generator=gen, device=x.device).bool()
            pattern = torch.where(flip, pattern.t(), pattern)
            new = pattern * _signs((k, c, 1, 1), gen, x) + win1 / (norm_w1 + 1e-12)
            budget = ((eps ** 2 - norm_img ** 2).clamp_min(0.0) / c + norm_union ** 2).sqrt()
            new = new / (new.flatten(2).norm(dim=2)[:, :, None, None] + 1e-12) * budget
            delta = delta.masked_fill(_window_mask(vh2, vw2, s, h, w), 0.0)
            delta[i1[0], :, i1[1], i1[2]] = new.permute(0, 2, 3, 1)
            total = delta.flatten(1).norm(dim=1).view(k, 1, 1, 1)
            x_new = (xc + eps * delta / (total + 1e-12)).clamp_(0.0, 1.0)
        with torch.no_grad():
            new_margin = margin_of(forward(model, x_new), yc)
        take = (new_margin < margin[idx]) | (new_margin <= 0)
        sel = idx[take]
        x_best[sel] = x_new[take]
        margin[sel] = new_margin[take]
    return x_best, margin <= 0


def _square_core(model, x, y, gen, *, eps, norm, queries, p_init, restarts, rescale):
    with torch.no_grad():
        logits = forward(model, x)
    if logits.shape[1] < 2:
        raise ConfigError(f"square needs a model with at least 2 classes, this one returns {logits.shape[1]}")
    active = logits.argmax(1) == y
    out = x.clone()
    for _ in range(restarts):
        idx = active.nonzero().flatten()
        if idx.numel() == 0:
            break
        adv, succ = _square_run(model, x[idx], y[idx], gen, eps=eps, norm=norm, queries=queries, p_init=p_init,
                                rescale=rescale)
        out[idx] = adv
        active[idx[succ]] = False
    return out


def square(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, norm: str = "linf",
           queries: int = 5000, p_init: float = 0.8, restarts: int = 1, rescale_schedule: bool = False,
           seed: int | None = None, *, batch_size: int | None = _DEFAULT_CHUNK,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Square Attack (Andriushchenko et al. 2020): score-based black-box random search on the margin loss, L-inf
    or L2, with at most ``queries`` iterations of one forward pass (on the images not yet misclassified) after
    the initial one. Defaults are AutoAttack's standard settings (p_init 0.8, 5000 queries, no rescaling of the
    p schedule; the paper tuned p_init per data set, e.g. 0.05 for L-inf on CIFAR-10 and ImageNet).

    Needs no gradients, so it also measures robustness of models whose gradients are masked or obfuscated.
    Returns, per sample, the lowest-margin point found (a misclassified one where the attack succeeded); clean
    points the model already gets wrong come back unchanged; restarts run only on the samples not yet broken.
    x: N x C x H x W in [0, 1]; y: int64 [N]; returns N x C x H x W on x's device.
    """
    x, y = _prepare(model, x, y)
    norm = check_norm(norm)
    eps = check_eps("eps", eps, norm)
    queries = _check_steps(queries, "queries")
    restarts = _check_steps(restarts, "restarts")
    p_init = float(p_init)
    if not 0 < p_init <= 1:
        raise ConfigError(f"p_init must lie in (0, 1], got {p_init}")
    return _run(_square_core, model, x, y, seed, batch_size, generator, eps=eps, norm=norm, queries=queries,
                p_init=p_init, restarts=restarts, rescale=bool(rescale_schedule))


#: the attack of this module, registered by :mod:`robustest.attacks`
RECORDS = (
    Attack("square", square, "Square Attack: score-based black-box random search (L-inf or L2; no gradients)",
           scale_free=True),
)
