"""White-box adversarial attacks, batched, seeded, behind one registry.

Every attack takes a classifier returning logits, images ``x`` (float N x C x H x W in [0, 1]) and labels ``y``
(int64 [N]) and returns the adversarial batch ``x_adv`` of the same shape, on ``x``'s device, inside the threat
model's ball around ``x`` (L-inf or L2 radius ``eps``) and inside [0, 1]:

=========  ==========================================================================================
fgsm       Fast Gradient Sign Method (Goodfellow et al. 2015), optional uniform random start.
pgd        Projected Gradient Descent (Madry et al. 2018), L-inf or L2, random start, restarts.
bim        Basic Iterative Method (Kurakin et al. 2017): L-inf PGD from the clean input.
rfgsm      R+FGSM (Tramer et al. 2018): a random sign step of ``alpha`` then gradient sign steps.
mifgsm     Momentum Iterative FGSM (Dong et al. 2018).
cw_l2      Carlini & Wagner L2 (2017) with a per-sample binary search over the constant c.
apgd       APGD-CE (Croce & Hein 2020): parameter-free step size schedule, L-inf or L2.
=========  ==========================================================================================

:func:`attack` runs any of them by name over a data set in batches and returns an :class:`AttackResult` with the
adversarial images, per-sample success (prediction on the adversarial image differs from the label), clean
correctness and perturbation norms, so callers never recompute them.

The model's train/eval mode and its parameters' ``requires_grad`` flags are restored after every call; attacks
run the model in eval mode and take gradients with respect to the input only. Randomness comes from a
``torch.Generator`` on the model's device seeded with ``seed``: the same seed (and batch size) gives the same
result. The loss is the summed per-sample cross-entropy, so a sample's gradient does not depend on the batch it
is in.

Float note: L-inf projections clamp to ``[max(x - eps, 0), min(x + eps, 1)]``, so ``|x_adv - x|`` may exceed
``eps`` by one float rounding (about 6e-8 for values in [0, 1]).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from robustest.errors import ConfigError, DataError
from robustest.runtime import (
    DataLike,
    as_tensors,
    check_images,
    check_labels,
    eval_mode,
    forward,
    frozen_params,
    make_generator,
    resolve_device,
)

__all__ = [
    "AttackResult",
    "apgd",
    "attack",
    "bim",
    "cw_l2",
    "describe",
    "fgsm",
    "mifgsm",
    "names",
    "pgd",
    "rfgsm",
]

NORMS = ("linf", "l2")
_DEFAULT_CHUNK = 512


# ------------------------------------------------------------------------------------------ validation
def _check_eps(eps: Any, name: str = "eps") -> float:
    try:
        v = float(eps)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {eps!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"{name} must be a finite number >= 0, got {eps!r}")
    return v


def _check_steps(steps: Any, name: str = "steps") -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"{name} must be a positive integer, got {steps!r}")
    return steps


def _check_norm(norm: str) -> str:
    n = str(norm).lower().replace("-", "")
    if n in ("inf", "linf"):
        return "linf"
    if n == "l2":
        return "l2"
    raise ConfigError(f"unknown norm {norm!r}: use 'linf' or 'l2'")


def _num_classes(model: nn.Module) -> int | None:
    spec = getattr(model, "robustest_spec", None)
    return spec.get("num_classes") if isinstance(spec, dict) else None


def _prepare(model: nn.Module, x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    x = check_images(x)
    if y is None:
        raise DataError("labels y are required: pass the true labels (or the model's predictions)")
    y = check_labels(y, x.shape[0], _num_classes(model))
    return x, y


# ------------------------------------------------------------------------------------------ primitives
def _flat_norm(t: torch.Tensor) -> torch.Tensor:
    """Per-sample L2 norm of t (N x ...), shaped N x 1 x 1 x 1 for broadcasting."""
    return t.flatten(1).norm(p=2, dim=1).view(-1, *([1] * (t.dim() - 1)))


def _grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x of the summed cross-entropy at x, logits at x (detached))."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = forward(model, x)
        loss = F.cross_entropy(logits, y, reduction="sum")
        (g,) = torch.autograd.grad(loss, x)
    # autograd may return an expanded (stride-0) gradient, e.g. when the output depends on x only through a
    # reduction; the attack loops update it in place, so make it dense (a no-op for ordinary gradients)
    return g.contiguous(), logits.detach()


def _project(x_adv: torch.Tensor, x: torch.Tensor, eps: float, norm: str,
             lo: torch.Tensor | None = None, hi: torch.Tensor | None = None) -> torch.Tensor:
    """Project x_adv into the eps-ball around x and into [0, 1]."""
    if norm == "linf":
        if lo is None or hi is None:
            lo, hi = (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)
        return x_adv.clamp(lo, hi)
    delta = x_adv - x
    n = _flat_norm(delta)
    delta = delta * torch.clamp(eps / n.clamp_min(1e-12), max=1.0)
    # clipping to [0, 1] moves every coordinate towards x, so the result stays inside the ball
    return (x + delta).clamp_(0.0, 1.0)


def _random_start(x: torch.Tensor, eps: float, norm: str, gen: torch.Generator) -> torch.Tensor:
    """A random point in the eps-ball around x (uniform per coordinate for L-inf; a uniformly scaled random
    direction for L2, as in torchattacks' PGDL2), clipped to [0, 1]."""
    if norm == "linf":
        noise = torch.rand(x.shape, generator=gen, device=x.device, dtype=x.dtype).mul_(2 * eps).sub_(eps)
        return (x + noise).clamp_(0.0, 1.0)
    d = torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype)
    r = torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), generator=gen, device=x.device, dtype=x.dtype)
    d = d / _flat_norm(d).clamp_min(1e-12) * r * eps
    return (x + d).clamp_(0.0, 1.0)


def _step_direction(g: torch.Tensor, norm: str) -> torch.Tensor:
    if norm == "linf":
        return g.sign()
    return g / _flat_norm(g).clamp_min(1e-12)


def _per_sample_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-sample cross-entropy, success = prediction != y) at x, one forward pass without gradients."""
    with torch.no_grad():
        logits = forward(model, x)
    return F.cross_entropy(logits, y, reduction="none"), logits.argmax(1) != y


def _keep_stronger(best: torch.Tensor, best_loss: torch.Tensor, best_succ: torch.Tensor,
                   cand: torch.Tensor, cand_loss: torch.Tensor, cand_succ: torch.Tensor) -> None:
    """In place: per sample, replace ``best`` by ``cand`` where the candidate is stronger
    (successful beats unsuccessful; otherwise the higher loss wins)."""
    better = (cand_succ & ~best_succ) | ((cand_succ == best_succ) & (cand_loss > best_loss))
    best[better] = cand[better]
    best_loss[better] = cand_loss[better]
    best_succ[better] = cand_succ[better]


# ------------------------------------------------------------------------------------------- core loops
def _fgsm_core(model, x, y, gen, *, eps, random_start):
    start = _random_start(x, eps, "linf", gen) if random_start else x
    g, _ = _grad(model, start, y)
    adv = start + eps * g.sign()
    if random_start:
        return _project(adv, x, eps, "linf")
    return adv.clamp_(0.0, 1.0)


def _pgd_core(model, x, y, gen, *, eps, alpha, steps, norm, random_start, restarts):
    lo = hi = None
    if norm == "linf":
        lo, hi = (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)
    best = best_loss = best_succ = None
    for _ in range(restarts):
        adv = _random_start(x, eps, norm, gen) if random_start else x.clone()
        for _ in range(steps):
            g, _ = _grad(model, adv, y)
            if norm == "linf":
                adv = adv.add_(g.sign_(), alpha=alpha).clamp_(lo, hi)
            else:
                adv = _project(adv.add_(_step_direction(g, norm), alpha=alpha), x, eps, norm)
        if restarts == 1:
            return adv
        loss, succ = _per_sample_loss(model, adv, y)
        if best is None:
            best, best_loss, best_succ = adv, loss, succ
        else:
            _keep_stronger(best, best_loss, best_succ, adv, loss, succ)
    return best


def _rfgsm_core(model, x, y, gen, *, eps, alpha, steps):
    lo, hi = (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)
    noise = torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype).sign_()
    adv = (x + alpha * noise).clamp_(0.0, 1.0)
    step = (eps - alpha) / steps if steps > 1 else (eps - alpha)
    for _ in range(steps):
        g, _ = _grad(model, adv, y)
        adv = adv.add_(g.sign_(), alpha=step).clamp_(lo, hi)
    return adv


def _mifgsm_core(model, x, y, gen, *, eps, alpha, steps, decay):
    lo, hi = (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)
    adv = x.clone()
    momentum = torch.zeros_like(x)
    dims = tuple(range(1, x.dim()))
    for _ in range(steps):
        g, _ = _grad(model, adv, y)
        g = g / g.abs().mean(dim=dims, keepdim=True).clamp_min(1e-12)
        momentum = momentum.mul_(decay).add_(g)
        adv = adv.add_(momentum.sign(), alpha=alpha).clamp_(lo, hi)
    return adv


def _apgd_core(model, x, y, gen, *, eps, steps, norm, restarts, rho):
    best = best_loss = best_succ = None
    for _ in range(restarts):
        adv, loss, succ = _apgd_run(model, x, y, gen, eps=eps, steps=steps, norm=norm, rho=rho)
        if best is None:
            best, best_loss, best_succ = adv, loss, succ
        else:
            _keep_stronger(best, best_loss, best_succ, adv, loss, succ)
    return best


def _apgd_run(model, x, y, gen, *, eps, steps, norm, rho):
    """One run of APGD-CE, following Croce & Hein (2020) and AutoAttack's reference ``attack_single_run``.

    Returns (x_out, loss_best, success): x_out is the last misclassified iterate for successful samples, else the
    highest-loss iterate. Difference from the reference code: the oscillation count of the first checkpoint
    compares the first step with the loss at the starting point (the paper's definition) instead of with an
    unfilled (zero) entry of the loss history.
    """
    n = x.shape[0]
    dims = tuple(range(1, x.dim()))
    bshape = (n,) + (1,) * (x.dim() - 1)
    n_iter_2, n_iter_min, size_decr = max(int(0.22 * steps), 1), max(int(0.06 * steps), 1), max(int(0.03 * steps), 1)
    lo = hi = None
    if norm == "linf":
        lo, hi = (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)
        t = torch.rand(x.shape, generator=gen, device=x.device, dtype=x.dtype).mul_(2).sub_(1)
        x_adv = x + eps * t / t.abs().amax(dim=dims, keepdim=True).clamp_min(1e-12)
    else:
        t = torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype)
        x_adv = x + eps * t / _flat_norm(t).clamp_min(1e-12)
    x_adv = x_adv.clamp_(0.0, 1.0)

    def proj(z: torch.Tensor) -> torch.Tensor:
        return z.clamp(lo, hi) if norm == "linf" else _project(z, x, eps, "l2")

    x_best = x_adv.clone()
    x_best_adv = x_adv.clone()
    loss_steps = torch.zeros(steps + 1, n, device=x.device)
    g, logits = _grad(model, x_adv, y)
    loss = F.cross_entropy(logits, y, reduction="none")
    loss_steps[0] = loss
    robust = logits.argmax(1) == y
    loss_best = loss.clone()
    grad_best = g.clone()
    step_size = torch.full(bshape, 2.0 * eps, device=x.device, dtype=x.dtype)
    x_adv_old = x_adv.clone()
    k = n_iter_2
    counter = 0
    loss_best_last_check = loss_best.clone()
    reduced_last_check = torch.ones(n, dtype=torch.bool, device=x.device)
    for i in range(steps):
        with torch.no_grad():
            momentum = x_adv - x_adv_old
            x_adv_old = x_adv
            a = 0.75 if i > 0 else 1.0
            z = proj(x_adv + step_size * _step_direction(g, norm))
            x_adv = proj(x_adv + (z - x_adv) * a + momentum * (1 - a))
        g, logits = _grad(model, x_adv, y)
        with torch.no_grad():
            loss = F.cross_entropy(logits, y, reduction="none")
            pred_ok = logits.argmax(1) == y
            x_best_adv = torch.where(pred_ok.view(bshape), x_best_adv, x_adv)
            robust &= pred_ok
            loss_steps[i + 1] = loss
            improved = loss > loss_best
            imp = improved.view(bshape)
            x_best = torch.where(imp, x_adv, x_best)
            grad_best = torch.where(imp, g, grad_best)
            loss_best = torch.where(improved, loss, loss_best)
            counter += 1
            if counter == k:
                increases = (loss_steps[i + 2 - k:i + 2] > loss_steps[i + 1 - k:i + 1]).sum(0)
                cond1 = increases <= k * rho
                cond2 = ~reduced_last_check & (loss_best_last_check >= loss_best)
                reduce = cond1 | cond2
                reduced_last_check = reduce
                loss_best_last_check = loss_best.clone()
                if bool(reduce.any()):
                    red = reduce.view(bshape)
                    step_size = torch.where(red, step_size / 2.0, step_size)
                    x_adv = torch.where(red, x_best, x_adv)
                    g = torch.where(red, grad_best, g)
                k = max(k - size_decr, n_iter_min)
                counter = 0
    success = ~robust
    out = torch.where(success.view(bshape), x_best_adv, x_best)
    return out, loss_best, success


def _cw_core(model, x, y, gen, *, eps, c, kappa, steps, lr, binary_steps, abort_early):
    n = x.shape[0]
    w0 = torch.atanh((x * 2 - 1).clamp(-1 + 1e-6, 1 - 1e-6))
    lower = torch.zeros(n, device=x.device)
    upper = torch.full((n,), 1e10, device=x.device)
    const = torch.full((n,), float(c), device=x.device)
    best_l2 = torch.full((n,), float("inf"), device=x.device)
    best_adv = x.clone()
    bound = float("inf") if eps is None else float(eps)
    check_every = max(steps // 10, 1)
    for _ in range(binary_steps):
        w = w0.clone().requires_grad_(True)
        opt = torch.optim.Adam([w], lr=lr)
        found = torch.zeros(n, dtype=torch.bool, device=x.device)
        prev = float("inf")
        for it in range(steps):
            with torch.enable_grad():
                adv = 0.5 * (torch.tanh(w) + 1)
                logits = forward(model, adv)
                l2sq = (adv - x).flatten(1).pow(2).sum(1)
                real = logits.gather(1, y[:, None]).squeeze(1)
                other = logits.scatter(1, y[:, None], float("-inf")).amax(1)
                f = torch.clamp(real - other, min=-kappa)
                loss = (l2sq + const * f).sum()
                (gw,) = torch.autograd.grad(loss, w)
            with torch.no_grad():
                succ = (other - real) > kappa if kappa > 0 else logits.argmax(1) != y
                l2 = l2sq.sqrt()
                improve = succ & (l2 < best_l2) & (l2 <= bound)
                best_l2[improve] = l2[improve]
                best_adv[improve] = adv.detach()[improve]
                found |= succ
            w.grad = gw
            opt.step()
            if abort_early and it % check_every == 0:
                cur = float(loss.detach())
                if cur > prev * 0.9999:
                    break
                prev = cur
        upper = torch.where(found, torch.minimum(upper, const), upper)
        lower = torch.where(found, lower, torch.maximum(lower, const))
        const = torch.where(upper < 1e9, (lower + upper) / 2, const * 10)
    return best_adv


# ------------------------------------------------------------------------------------------ chunked runner
def _run(core: Callable[..., torch.Tensor], model: nn.Module, x: torch.Tensor, y: torch.Tensor,
         seed: int | None, batch_size: int | None, gen: torch.Generator | None = None,
         **kw: Any) -> torch.Tensor:
    """Run ``core`` over x in chunks on the model's device, in eval mode with frozen parameters."""
    device = resolve_device(model)
    if gen is None:
        gen = make_generator(seed, device)
    elif gen.device.type != device.type:
        raise ConfigError(f"generator is on {gen.device} but the model is on {device}: create it with "
                          "robustest.runtime.make_generator(seed, device)")
    n = x.shape[0]
    if n == 0:
        return x.clone()
    bs = n if batch_size is None else int(batch_size)
    if bs < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    out = torch.empty_like(x)
    with eval_mode(model), frozen_params(model):
        for s in range(0, n, bs):
            e = min(s + bs, n)
            xb = x[s:e].to(device, torch.float32).detach()
            yb = y[s:e].to(device, torch.long)
            out[s:e] = core(model, xb, yb, gen, **kw).detach().to(out.device, out.dtype)
    return out


# ------------------------------------------------------------------------------------------ public attacks
def fgsm(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, random_start: bool = False,
         seed: int | None = None, *, batch_size: int | None = _DEFAULT_CHUNK,
        generator: torch.Generator | None = None) -> torch.Tensor:
    """Fast Gradient Sign Method: ``clip(x + eps * sign(grad_x CE(f(x), y)), 0, 1)``.

    With ``random_start`` the gradient is taken at a uniform random point of the L-inf eps-ball (the RobOT
    reference setting) and the step is projected back into the ball. x: N x C x H x W in [0, 1]; y: int64 [N].
    Returns N x C x H x W on x's device. ``batch_size`` bounds how many images go through the model at once.
    """
    x, y = _prepare(model, x, y)
    eps = _check_eps(eps)
    return _run(_fgsm_core, model, x, y, seed, batch_size, generator, eps=eps, random_start=bool(random_start))


def pgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, alpha: float | None = None,
        steps: int = 10, norm: str = "linf", random_start: bool = True, restarts: int = 1,
        seed: int | None = None, *, batch_size: int | None = _DEFAULT_CHUNK,
        generator: torch.Generator | None = None) -> torch.Tensor:
    """Projected Gradient Descent on the cross-entropy (Madry et al. 2018), L-inf or L2 threat model.

    Each step moves by ``alpha`` along sign(grad) (L-inf) or grad / ||grad||_2 (L2), then projects into the
    eps-ball around x and into [0, 1]. ``alpha`` defaults to ``2.5 * eps / steps`` (Madry et al.'s rule).
    ``random_start`` starts from a random point of the ball. With ``restarts > 1`` the attack runs that many
    times and keeps, per sample, the strongest final point: a successful one (prediction != y) if any, else the
    one with the highest loss (one extra forward pass per restart). x: N x C x H x W in [0, 1]; y: int64 [N].
    Returns N x C x H x W on x's device.
    """
    x, y = _prepare(model, x, y)
    eps = _check_eps(eps)
    steps = _check_steps(steps)
    restarts = _check_steps(restarts, "restarts")
    norm = _check_norm(norm)
    alpha = 2.5 * eps / steps if alpha is None else _check_eps(alpha, "alpha")
    return _run(_pgd_core, model, x, y, seed, batch_size, generator, eps=eps, alpha=alpha, steps=steps, norm=norm,
                random_start=bool(random_start), restarts=restarts)


def bim(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, alpha: float | None = None,
        steps: int = 10, seed: int | None = None, *, batch_size: int | None = _DEFAULT_CHUNK,
        generator: torch.Generator | None = None) -> torch.Tensor:
    """Basic Iterative Method (Kurakin et al. 2017): L-inf PGD started from the clean input (no random start).

    ``alpha`` defaults to ``eps / steps * 1.25`` (so the steps can reach the boundary of the ball with some
    slack, as in Kurakin et al.'s min(eps + 4/255, 1.25 eps) budget). Returns N x C x H x W on x's device.
    """
    x, y = _prepare(model, x, y)
    eps = _check_eps(eps)
    steps = _check_steps(steps)
    alpha = 1.25 * eps / steps if alpha is None else _check_eps(alpha, "alpha")
    return _run(_pgd_core, model, x, y, seed, batch_size, generator, eps=eps, alpha=alpha, steps=steps, norm="linf",
                random_start=False, restarts=1)


def rfgsm(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, alpha: float | None = None,
          steps: int = 1, seed: int | None = None, *, batch_size: int | None = _DEFAULT_CHUNK,
        generator: torch.Generator | None = None) -> torch.Tensor:
    """R+FGSM (Tramer et al. 2018): ``x' = clip(x + alpha * sign(N(0, I)))`` then ``steps`` gradient sign steps
    of ``(eps - alpha) / steps`` each, projected into the L-inf eps-ball and [0, 1].

    ``alpha`` defaults to ``eps / 2`` and must not exceed ``eps``. Returns N x C x H x W on x's device.
    """
    x, y = _prepare(model, x, y)
    eps = _check_eps(eps)
    steps = _check_steps(steps)
    alpha = eps / 2 if alpha is None else _check_eps(alpha, "alpha")
    if alpha > eps:
        raise ConfigError(f"rfgsm needs alpha <= eps, got alpha={alpha} > eps={eps}")
    return _run(_rfgsm_core, model, x, y, seed, batch_size, generator, eps=eps, alpha=alpha, steps=steps)


def mifgsm(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, alpha: float | None = None,
           steps: int = 10, decay: float = 1.0, seed: int | None = None, *,
           batch_size: int | None = _DEFAULT_CHUNK, generator: torch.Generator | None = None) -> torch.Tensor:
    """Momentum Iterative FGSM (Dong et al. 2018): ``g <- decay * g + grad / mean|grad|``, step ``alpha * sign(g)``,
    projected into the L-inf eps-ball and [0, 1], from the clean input. ``alpha`` defaults to ``eps / steps``
    (the paper's setting). Returns N x C x H x W on x's device.
    """
    x, y = _prepare(model, x, y)
    eps = _check_eps(eps)
    steps = _check_steps(steps)
    alpha = eps / steps if alpha is None else _check_eps(alpha, "alpha")
    decay = _check_eps(decay, "decay")
    return _run(_mifgsm_core, model, x, y, seed, batch_size, generator, eps=eps, alpha=alpha, steps=steps, decay=decay)


def cw_l2(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float | None = None, c: float = 1.0,
          kappa: float = 0.0, steps: int = 100, lr: float = 0.1, binary_steps: int = 5, abort_early: bool = True,
          seed: int | None = None, *, batch_size: int | None = _DEFAULT_CHUNK,
        generator: torch.Generator | None = None) -> torch.Tensor:
    """Carlini & Wagner L2 (2017): minimise ``||x' - x||_2^2 + c * max(Z_y - max_{i!=y} Z_i, -kappa)`` over
    ``x' = (tanh(w) + 1) / 2`` with Adam (``lr``, ``steps`` per search step), with a batched per-sample binary
    search over ``c`` (``binary_steps`` rounds, starting at ``c``; x10 while no upper bound is known).

    Returns, per sample, the smallest-L2 adversarial image found; samples where none was found are returned
    unchanged (CW is a minimal-norm attack, it has no eps-ball). With ``eps`` given, only adversarial images with
    ``||x' - x||_2 <= eps`` are kept. ``abort_early`` stops a search step when the total loss has not decreased
    by 0.01% over ``steps // 10`` iterations. x: N x C x H x W in [0, 1]; y: int64 [N]; returns N x C x H x W.

    ``lr`` defaults to 0.1, not the paper's 0.01: Adam moves ``w`` by about ``lr`` per step, and pixels at 0 or 1
    (most of MNIST) start at ``|w| ~ 7``, so with 0.01 and a few hundred steps they cannot move (measured on a
    LeNet-5/MNIST model, 100 steps: 60% success with 0.01, 100% with 0.1).
    """
    x, y = _prepare(model, x, y)
    eps = None if eps is None else _check_eps(eps)
    c = _check_eps(c, "c")
    if c == 0:
        raise ConfigError("c must be > 0")
    kappa = _check_eps(kappa, "kappa")
    steps = _check_steps(steps)
    binary_steps = _check_steps(binary_steps, "binary_steps")
    lr = _check_eps(lr, "lr")
    return _run(_cw_core, model, x, y, seed, batch_size, generator, eps=eps, c=c, kappa=kappa, steps=steps, lr=lr,
                binary_steps=binary_steps, abort_early=bool(abort_early))


def apgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int = 100, norm: str = "linf",
         restarts: int = 1, rho: float = 0.75, seed: int | None = None, *,
         batch_size: int | None = _DEFAULT_CHUNK, generator: torch.Generator | None = None) -> torch.Tensor:
    """APGD-CE (Croce & Hein 2020): PGD on the cross-entropy with momentum 0.75 and a step size that starts at
    ``2 * eps`` and is halved at checkpoints (after 22%, then shrinking intervals of at least 6% of the steps)
    where the loss increased in at most a fraction ``rho`` of the steps since the last checkpoint, or where the
    best loss did not improve and the step was not halved at the last checkpoint; a halving restarts from the
    best point. Follows AutoAttack's reference implementation; L-inf or L2.

    Returns, per sample, the last misclassified iterate if the attack succeeded, else the highest-loss iterate;
    with ``restarts > 1`` the strongest of the runs (successful first, else highest loss).
    x: N x C x H x W in [0, 1]; y: int64 [N]; returns N x C x H x W on x's device.
    """
    x, y = _prepare(model, x, y)
    eps = _check_eps(eps)
    steps = _check_steps(steps)
    restarts = _check_steps(restarts, "restarts")
    norm = _check_norm(norm)
    rho = _check_eps(rho, "rho")
    return _run(_apgd_core, model, x, y, seed, batch_size, generator, eps=eps, steps=steps, norm=norm,
                restarts=restarts, rho=rho)


# ------------------------------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class _Entry:
    fn: Callable[..., torch.Tensor]
    description: str
    norm_bounded: bool = True


_REGISTRY: dict[str, _Entry] = {
    "fgsm": _Entry(fgsm, "Fast Gradient Sign Method (L-inf, one step; optional random start)"),
    "pgd": _Entry(pgd, "Projected Gradient Descent (L-inf or L2; random start; restarts keep the strongest)"),
    "bim": _Entry(bim, "Basic Iterative Method (L-inf PGD from the clean input)"),
    "rfgsm": _Entry(rfgsm, "R+FGSM: random sign step then gradient sign steps (L-inf)"),
    "mifgsm": _Entry(mifgsm, "Momentum Iterative FGSM (L-inf)"),
    "cw_l2": _Entry(cw_l2, "Carlini & Wagner L2 with a binary search over c (minimal-norm; no eps-ball)", False),
    "apgd": _Entry(apgd, "APGD-CE: parameter-free step size schedule (L-inf or L2; restarts)"),
}


def names() -> list[str]:
    """Names of the registered attacks."""
    return sorted(_REGISTRY)


def describe(name: str) -> str:
    """One-line description of attack ``name``."""
    return _entry(name).description


def _entry(name: str) -> _Entry:
    key = str(name).lower().replace("-", "_")
    key = {"cw": "cw_l2", "apgd_ce": "apgd", "mi_fgsm": "mifgsm", "r_fgsm": "rfgsm"}.get(key, key)
    if key not in _REGISTRY:
        raise ConfigError(f"unknown attack {name!r}: choose one of {', '.join(names())}")
    return _REGISTRY[key]


# --------------------------------------------------------------------------------------------- attack()
@dataclass
class AttackResult:
    """Outcome of :func:`attack` on N samples (all per-sample tensors are 1-D of length N, on the CPU).

    adv: adversarial images N x C x H x W (the clipped, valid images; on the input's device).
    y: the labels attacked. clean_pred / adv_pred: the model's predictions on x and adv.
    success: adv_pred != y. clean_correct: clean_pred == y.
    linf / l2: per-sample L-inf and L2 norms of adv - x.
    """

    name: str
    adv: torch.Tensor
    y: torch.Tensor
    success: torch.Tensor
    clean_correct: torch.Tensor
    clean_pred: torch.Tensor
    adv_pred: torch.Tensor
    linf: torch.Tensor
    l2: torch.Tensor
    params: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def __len__(self) -> int:
        return int(self.success.shape[0])

    @property
    def success_rate(self) -> float:
        """Fraction of samples whose prediction on adv differs from y (misclassified clean samples count)."""
        return float(self.success.double().mean()) if len(self) else float("nan")

    @property
    def robust_accuracy(self) -> float:
        """Fraction of samples still classified correctly on adv."""
        return 1.0 - self.success_rate if len(self) else float("nan")

    @property
    def clean_accuracy(self) -> float:
        return float(self.clean_correct.double().mean()) if len(self) else float("nan")

    @property
    def fooled(self) -> torch.Tensor:
        """Samples classified correctly clean and wrongly on adv (BoolTensor[N])."""
        return self.success & self.clean_correct

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary (no tensors)."""
        def q(t: torch.Tensor) -> dict[str, float]:
            if t.numel() == 0:
                return {}
            t = t.float()
            return {"mean": float(t.mean()), "min": float(t.min()), "median": float(t.median()),
                    "max": float(t.max())}

        s = self.success
        return {
            "attack": self.name, "params": dict(self.params), "n": len(self),
            "clean_accuracy": self.clean_accuracy, "robust_accuracy": self.robust_accuracy,
            "success_rate": self.success_rate,
            "success_rate_on_correct": (float(self.fooled.sum()) / max(1, int(self.clean_correct.sum()))),
            "linf": q(self.linf), "l2": q(self.l2),
            "linf_successful": q(self.linf[s]), "l2_successful": q(self.l2[s]),
            "seconds": self.seconds,
        }


def attack(name: str, model: nn.Module, x_or_data: DataLike, y: torch.Tensor | None = None, *,
           batch_size: int = 256, seed: int | None = 0, progress: bool = False, **kw: Any) -> AttackResult:
    """Run attack ``name`` (see :func:`names`) on images or a data set, in batches of ``batch_size``.

    ``x_or_data``: an image tensor N x C x H x W in [0, 1] (then ``y`` int64 [N]; when ``y`` is None the model's
    own predictions are attacked), an ``(x, y)`` pair, a ``Dataset`` or a ``DataLoader``. ``kw`` are the attack's
    parameters (eps, steps, alpha, norm, restarts, ...). One random generator on the model's device seeded with
    ``seed`` serves all batches in order, so the result equals the attack function's with the same seed and
    ``batch_size``. ``progress`` shows a progress bar over batches. Returns an :class:`AttackResult`.
    """
    entry = _entry(name)
    if "generator" in kw or "batch_size" in kw:
        raise ConfigError("attack() takes seed and batch_size itself; do not pass generator")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    x, y_data = as_tensors(x_or_data)
    y = y if y is not None else y_data
    x = check_images(x)
    n = x.shape[0]
    device = resolve_device(model)
    if y is not None:
        if not isinstance(y, torch.Tensor):
            y = torch.as_tensor(y)
        y = check_labels(y, n, _num_classes(model))
    gen = make_generator(seed, device)
    t0 = time.perf_counter()
    advs, clean_preds, adv_preds, ys = [], [], [], []
    starts = range(0, n, batch_size)
    from robustest.runtime import progress as _progress

    for s in _progress(starts, enabled=progress, desc=_canonical_name(name), total=len(starts), unit="batch"):
        xb = x[s:s + batch_size].to(device)
        with eval_mode(model), torch.no_grad():
            cp = forward(model, xb).argmax(1)
        yb = cp if y is None else y[s:s + batch_size].to(device)
        adv = entry.fn(model, xb, yb, batch_size=None, generator=gen, **kw)
        with eval_mode(model), torch.no_grad():
            ap = forward(model, adv).argmax(1)
        advs.append(adv.to(x.device))
        clean_preds.append(cp.cpu())
        adv_preds.append(ap.cpu())
        ys.append(yb.cpu())
    if n == 0:
        empty = torch.empty(0, dtype=torch.long)
        advs, clean_preds, adv_preds, ys = [x.clone()], [empty], [empty], [empty]
    adv_all = torch.cat(advs)
    clean_pred, adv_pred, y_cpu = torch.cat(clean_preds), torch.cat(adv_preds), torch.cat(ys).long()
    delta = (adv_all.detach() - x.detach()).flatten(1).cpu()
    return AttackResult(
        name=_canonical_name(name), adv=adv_all, y=y_cpu, success=adv_pred != y_cpu,
        clean_correct=clean_pred == y_cpu, clean_pred=clean_pred, adv_pred=adv_pred,
        linf=delta.abs().amax(1) if delta.shape[1] else delta.sum(1), l2=delta.norm(p=2, dim=1),
        params={**kw, "seed": seed, "batch_size": batch_size}, seconds=time.perf_counter() - t0,
    )


def _canonical_name(name: str) -> str:
    entry = _entry(name)
    return next(k for k, v in _REGISTRY.items() if v is entry)
