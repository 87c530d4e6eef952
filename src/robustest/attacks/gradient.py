"""Fixed-step gradient attacks: FGSM, PGD (L-inf, L2), BIM, R+FGSM and MI-FGSM, untargeted or targeted.

Untargeted, every step ascends the cross-entropy with the label y; with ``target=`` (one class for all samples or
int64 [N]) it descends the cross-entropy with the target class instead (the targeted variants of Kurakin et al.
2017 and Madry et al. 2018), and success means "predicted as the target". x: N x C x H x W in [0, 1]; y: int64
[N]; every function returns N x C x H x W on x's device, inside the eps-ball around x and inside [0, 1].
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from robustest.attacks._core import (
    _DEFAULT_CHUNK,
    _check_non_negative,
    _check_steps,
    _check_target,
    _keep_stronger,
    _per_sample_loss,
    _prepare,
    _run,
    _step_direction,
    check_norm,
    input_gradient,
    project,
    random_point,
)
from robustest.core.errors import ConfigError
from robustest.core.validation import check_eps

__all__ = ["bim", "fgsm", "mifgsm", "pgd", "rfgsm"]


# ------------------------------------------------------------------------------------------- core loops
def _fgsm_core(model, x, y, gen, *, eps, random_start, target=None):
    start = random_point(x, eps, "linf", gen) if random_start else x
    g, _ = input_gradient(model, start, y, target)
    adv = start + eps * g.sign()
    if random_start:
        return project(adv, x, eps, "linf")
    return adv.clamp_(0.0, 1.0)


def _pgd_core(model, x, y, gen, *, eps, alpha, steps, norm, random_start, restarts, target=None):
    lo = hi = None
    if norm == "linf":
        lo, hi = (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)
    best = best_loss = best_succ = None
    for _ in range(restarts):
        adv = random_point(x, eps, norm, gen) if random_start else x.clone()
        for _ in range(steps):
            g, _ = input_gradient(model, adv, y, target)
            if norm == "linf":
                adv = adv.add_(g.sign_(), alpha=alpha).clamp_(lo, hi)
            else:
                adv = project(adv.add_(_step_direction(g, norm), alpha=alpha), x, eps, norm)
        if restarts == 1:
            return adv
        loss, succ = _per_sample_loss(model, adv, y, target)
        if best is None:
            best, best_loss, best_succ = adv, loss, succ
        else:
            _keep_stronger(best, best_loss, best_succ, adv, loss, succ)
    return best


def _rfgsm_core(model, x, y, gen, *, eps, alpha, steps, target=None):
    lo, hi = (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)
    noise = torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype).sign_()
    adv = (x + alpha * noise).clamp_(0.0, 1.0)
    step = (eps - alpha) / steps if steps > 1 else (eps - alpha)
    for _ in range(steps):
        g, _ = input_gradient(model, adv, y, target)
        adv = adv.add_(g.sign_(), alpha=step).clamp_(lo, hi)
    return adv


def _mifgsm_core(model, x, y, gen, *, eps, alpha, steps, decay, target=None):
    lo, hi = (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)
    adv = x.clone()
    momentum = torch.zeros_like(x)
    dims = tuple(range(1, x.dim()))
    for _ in range(steps):
        g, _ = input_gradient(model, adv, y, target)
        g = g / g.abs().mean(dim=dims, keepdim=True).clamp_min(1e-12)
        momentum = momentum.mul_(decay).add_(g)
        adv = adv.add_(momentum.sign(), alpha=alpha).clamp_(lo, hi)
    return adv


# ------------------------------------------------------------------------------------------ public attacks
def fgsm(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, random_start: bool = False,
         seed: int | None = None, *, target: Any = None, batch_size: int | None = _DEFAULT_CHUNK,
         generator: torch.Generator | None = None) -> torch.Tensor:
    """Fast Gradient Sign Method: ``clip(x + eps * sign(grad_x CE(f(x), y)), 0, 1)``; with ``target`` the
    targeted variant ``clip(x - eps * sign(grad_x CE(f(x), target)), 0, 1)``.

    With ``random_start`` the gradient is taken at a uniform random point of the L-inf eps-ball (the RobOT
    reference setting) and the step is projected back into the ball. x: N x C x H x W in [0, 1]; y: int64 [N];
    target: None, an int or int64 [N] (each different from y). Returns N x C x H x W on x's device.
    ``batch_size`` bounds how many images go through the model at once.
    """
    x, y = _prepare(model, x, y)
    eps = check_eps("eps", eps)
    target = _check_target(model, target, y)
    return _run(_fgsm_core, model, x, y, seed, batch_size, generator, per_sample={"target": target}, eps=eps,
                random_start=bool(random_start))


def pgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, alpha: float | None = None,
        steps: int = 10, norm: str = "linf", random_start: bool = True, restarts: int = 1,
        seed: int | None = None, *, target: Any = None, batch_size: int | None = _DEFAULT_CHUNK,
        generator: torch.Generator | None = None) -> torch.Tensor:
    """Projected Gradient Descent on the cross-entropy (Madry et al. 2018), L-inf or L2 threat model.

    Each step moves by ``alpha`` along sign(grad) (L-inf) or grad / ||grad||_2 (L2), then projects into the
    eps-ball around x and into [0, 1]. ``alpha`` defaults to ``2.5 * eps / steps`` (Madry et al.'s rule).
    ``random_start`` starts from a random point of the ball. With ``restarts > 1`` the attack runs that many
    times and keeps, per sample, the strongest final point: a successful one if any, else the one with the
    highest loss (one extra forward pass per restart). With ``target`` (an int or int64 [N]) it descends the
    cross-entropy with the target class and success means "predicted as the target".
    x: N x C x H x W in [0, 1]; y: int64 [N]. Returns N x C x H x W on x's device.
    """
    x, y = _prepare(model, x, y)
    norm = check_norm(norm)
    eps = check_eps("eps", eps, norm)
    steps = _check_steps(steps)
    restarts = _check_steps(restarts, "restarts")
    alpha = 2.5 * eps / steps if alpha is None else _check_non_negative(alpha, "alpha")
    target = _check_target(model, target, y)
    return _run(_pgd_core, model, x, y, seed, batch_size, generator, per_sample={"target": target}, eps=eps,
                alpha=alpha, steps=steps, norm=norm, random_start=bool(random_start), restarts=restarts)


def bim(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, alpha: float | None = None,
        steps: int = 10, seed: int | None = None, *, target: Any = None, batch_size: int | None = _DEFAULT_CHUNK,
        generator: torch.Generator | None = None) -> torch.Tensor:
    """Basic Iterative Method (Kurakin et al. 2017): L-inf PGD started from the clean input (no random start);
    with ``target`` the iterative least-likely/target-class variant of the same paper.

    ``alpha`` defaults to ``eps / steps * 1.25`` (so the steps can reach the boundary of the ball with some
    slack, as in Kurakin et al.'s min(eps + 4/255, 1.25 eps) budget). Returns N x C x H x W on x's device.
    """
    x, y = _prepare(model, x, y)
    eps = check_eps("eps", eps)
    steps = _check_steps(steps)
    alpha = 1.25 * eps / steps if alpha is None else _check_non_negative(alpha, "alpha")
    target = _check_target(model, target, y)
    return _run(_pgd_core, model, x, y, seed, batch_size, generator, per_sample={"target": target}, eps=eps,
                alpha=alpha, steps=steps, norm="linf", random_start=False, restarts=1)


def rfgsm(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, alpha: float | None = None,
          steps: int = 1, seed: int | None = None, *, target: Any = None, batch_size: int | None = _DEFAULT_CHUNK,
          generator: torch.Generator | None = None) -> torch.Tensor:
    """R+FGSM (Tramer et al. 2018): ``x' = clip(x + alpha * sign(N(0, I)))`` then ``steps`` gradient sign steps
    of ``(eps - alpha) / steps`` each, projected into the L-inf eps-ball and [0, 1]; ``target`` makes the steps
    descend the cross-entropy with the target class.

    ``alpha`` defaults to ``eps / 2`` and must not exceed ``eps``. Returns N x C x H x W on x's device.
    """
    x, y = _prepare(model, x, y)
    eps = check_eps("eps", eps)
    steps = _check_steps(steps)
    alpha = eps / 2 if alpha is None else _check_non_negative(alpha, "alpha")
    if alpha > eps:
        raise ConfigError(f"rfgsm needs alpha <= eps, got alpha={alpha} > eps={eps}")
    target = _check_target(model, target, y)
    return _run(_rfgsm_core, model, x, y, seed, batch_size, generator, per_sample={"target": target}, eps=eps,
                alpha=alpha, steps=steps)


def mifgsm(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, alpha: float | None = None,
           steps: int = 10, decay: float = 1.0, seed: int | None = None, *, target: Any = None,
           batch_size: int | None = _DEFAULT_CHUNK, generator: torch.Generator | None = None) -> torch.Tensor:
    """Momentum Iterative FGSM (Dong et al. 2018): ``g <- decay * g + grad / mean|grad|``, step ``alpha * sign(g)``,
    projected into the L-inf eps-ball and [0, 1], from the clean input. ``alpha`` defaults to ``eps / steps``
    (the paper's setting); ``target`` makes it descend the cross-entropy with the target class (the paper's
    targeted variant). Returns N x C x H x W on x's device.
    """
    x, y = _prepare(model, x, y)
    eps = check_eps("eps", eps)
    steps = _check_steps(steps)
    alpha = eps / steps if alpha is None else _check_non_negative(alpha, "alpha")
    decay = _check_non_negative(decay, "decay")
    target = _check_target(model, target, y)
    return _run(_mifgsm_core, model, x, y, seed, batch_size, generator, per_sample={"target": target}, eps=eps,
                alpha=alpha, steps=steps, decay=decay)
