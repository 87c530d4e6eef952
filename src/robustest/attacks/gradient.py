"""Fixed-step gradient attacks: FGSM, PGD (L-inf, L2), BIM, R+FGSM and MI-FGSM, untargeted or targeted.

Untargeted, every step ascends the cross-entropy with the label y; with ``target=`` (one class for all samples or
int64 [N]) it descends the cross-entropy with the target class instead (the targeted variants of Kurakin et al.
2017 and Madry et al. 2018), and success means "predicted as the target". x: N x C x H x W in [0, 1]; y: int64
[N]; every function returns N x C x H x W on x's device, inside the eps-ball around x and inside [0, 1].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
from robustest.attacks.registry import Attack
from robustest.core.errors import ConfigError
from robustest.core.modelcall import forward
from robustest.core.validation import MAX_L2_RADIUS, check_eps

__all__ = ["PGDDetails", "StopRule", "bim", "fgsm", "mifgsm", "pgd", "rfgsm"]


# ------------------------------------------------------------------------------------------- core loops
def _fgsm_core(model, x, y, gen, *, eps, random_start, target=None):
    start = random_point(x, eps, "linf", gen) if random_start else x
    g, _ = input_gradient(model, start, y, target)
    adv = start + eps * g.sign()
    if random_start:
        return project(adv, x, eps, "linf")
    return adv.clamp_(0.0, 1.0)


def _per_sample(v: Any, x: torch.Tensor) -> Any:
    """A number as it is; a per-sample tensor [n] as n x 1 x 1 x 1 (broadcasting over x's samples)."""
    return v.view(-1, *([1] * (x.dim() - 1))) if isinstance(v, torch.Tensor) else v


def _pgd_start(x, eps, norm, gen, random_start, start_draw):
    """The starting point: x itself, :func:`random_point` (``start_draw="ball"``) or, with ``"unit"`` (L-inf),
    ``clip(x + (2u - 1) * eps)``, u uniform in [0, 1) drawn in torch's default dtype."""
    if not random_start:
        return x.clone()
    if start_draw == "unit":
        return (x + (torch.rand(x.shape, generator=gen, device=x.device) * 2 - 1) * eps).clamp(0, 1)
    return random_point(x, eps, norm, gen)


def _hits(logits, y, target):
    """Success per sample from its logits: misclassified (untargeted) or predicted as the target."""
    return logits.argmax(1) != y if target is None else logits.argmax(1) == target


def _pgd_once(model, x, y, gen, *, eps, alpha, steps, norm, random_start, target=None, index=None, stop=None,
              stop_from=0, start_draw="ball", track_success=False):
    """One PGD run on a chunk -> (x_adv, evals int64 [n], success bool [n] or None).

    While no sample has stopped, every step runs on the whole chunk in place; once ``stop`` (called from
    gradient evaluation ``stop_from`` on with (k, x_adv, grad, logits, index) of the active samples) marks
    samples, they keep their current point and leave the active set, and the next passes run on the rest only.
    ``eps`` / ``alpha``: numbers or n x 1 x 1 x 1. ``success``: some evaluated point (the final one included,
    one extra forward pass over the samples still active) was successful, with ``track_success``."""
    lo = hi = None
    if norm == "linf":
        lo, hi = (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)
    adv = _pgd_start(x, eps, norm, gen, random_start, start_draw)
    n = x.shape[0]
    evals = torch.zeros(n, dtype=torch.long, device=x.device)
    success = torch.zeros(n, dtype=torch.bool, device=x.device) if track_success else None
    active = None  # None: every sample of the chunk is active (no selection needed)
    xa = adv

    def sel(t):
        return t if active is None or not isinstance(t, torch.Tensor) else t.index_select(0, active)

    for k in range(steps):
        g, logits = input_gradient(model, xa, sel(y), sel(target))
        if active is None:
            evals.add_(1)
        else:
            evals.index_add_(0, active, torch.ones_like(active))
        if success is not None:
            _or_into(success, active, _hits(logits, sel(y), sel(target)))
        if stop is not None and k >= stop_from:
            done = stop(k, xa, g, logits, sel(index))
            if not isinstance(done, torch.Tensor) or done.shape != (xa.shape[0],):
                raise ConfigError(f"stop must return a bool tensor of the {xa.shape[0]} active samples, got "
                                  f"{getattr(done, 'shape', done)!r}")
            done = done.to(torch.bool)
            if bool(done.any()):
                keep = ~done
                active = torch.arange(n, device=x.device) if active is None else active
                active, xa, g = active[keep], xa[keep], g[keep]
                if active.numel() == 0:
                    break
        step = sel(alpha)
        if norm == "linf":
            xa = _ascend(xa, g.sign_(), step).clamp_(sel(lo), sel(hi))
        else:
            xa = project(_ascend(xa, _step_direction(g, norm), step), sel(x), sel(eps), norm)
        if active is None:
            adv = xa
        else:
            adv.index_copy_(0, active, xa)
    if success is not None and (active is None or active.numel()):  # the final points of the active samples
        with torch.no_grad():
            _or_into(success, active, _hits(forward(model, xa), sel(y), sel(target)))
    return adv, evals, success


def _ascend(adv: torch.Tensor, direction: torch.Tensor, alpha: Any) -> torch.Tensor:
    """In place: ``adv + alpha * direction`` (alpha a number or n x 1 x 1 x 1)."""
    if isinstance(alpha, torch.Tensor):
        return adv.add_(direction.mul_(alpha))
    return adv.add_(direction, alpha=alpha)


def _or_into(flags: torch.Tensor, active: torch.Tensor | None, new: torch.Tensor) -> None:
    """In place: ``flags[active] |= new`` (every sample when ``active`` is None)."""
    if active is None:
        flags |= new
    else:
        flags[active] |= new


def _pgd_core(model, x, y, gen, *, eps, alpha, steps, norm, random_start, restarts, target=None, index=None,
              stop=None, stop_from=0, start_draw="ball", details=False, track_success=False):
    eps, alpha = _per_sample(eps, x), _per_sample(alpha, x)
    run = {"eps": eps, "alpha": alpha, "steps": steps, "norm": norm, "random_start": random_start,
           "target": target, "start_draw": start_draw}
    if details:  # one restart (pgd checks it)
        return _pgd_once(model, x, y, gen, index=index, stop=stop, stop_from=stop_from,
                         track_success=track_success, **run)
    best = best_loss = best_succ = None
    for _ in range(restarts):
        adv = _pgd_once(model, x, y, gen, **run)[0]
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


@dataclass
class PGDDetails:
    """What :func:`pgd` did, with ``return_details=True``: ``adv`` (N x C x H x W on x's device), ``evals``
    (int64 [N]: the gradient evaluations spent on each sample, ``steps`` unless its stopping rule fired) and
    ``success`` (bool [N], with ``track_success``: some point the attack evaluated, the final one included, was
    successful; else None)."""

    adv: torch.Tensor
    evals: torch.Tensor
    success: torch.Tensor | None = None


#: A per-sample stopping rule: ``stop(k, x_adv, grad, logits, index) -> bool [m]`` for the m active samples at
#: gradient evaluation k (0-based): their points (m x C x H x W), the objective's gradient there (not to be
#: modified), the logits (m x K) and their positions in x (int64 [m]). True: the sample keeps its point and stops.
StopRule = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def pgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float | torch.Tensor, alpha: Any = None,
        steps: int = 10, norm: str = "linf", random_start: bool = True, restarts: int = 1,
        seed: int | None = None, *, target: Any = None, batch_size: int | None = _DEFAULT_CHUNK,
        generator: torch.Generator | None = None, stop: StopRule | None = None, stop_from: int = 0,
        start_draw: str = "ball", return_details: bool = False, track_success: bool = False
        ) -> torch.Tensor | PGDDetails:
    """Projected Gradient Descent on the cross-entropy (Madry et al. 2018), L-inf or L2 threat model.

    Each step moves by ``alpha`` along sign(grad) (L-inf) or grad / ||grad||_2 (L2), then projects into the
    eps-ball around x and into [0, 1]. ``alpha`` defaults to ``2.5 * eps / steps`` (Madry et al.'s rule).
    ``random_start`` starts from a random point of the ball. With ``restarts > 1`` the attack runs that many
    times and keeps, per sample, the strongest final point: a successful one if any, else the one with the
    highest loss (one extra forward pass per restart). With ``target`` (an int or int64 [N]) it descends the
    cross-entropy with the target class and success means "predicted as the target".
    x: N x C x H x W in [0, 1]; y: int64 [N]. Returns N x C x H x W on x's device.

    Per-sample budgets: ``eps`` may be a float tensor [N] (each sample its own ball; ``alpha``, a number or a
    tensor [N], then defaults to ``2.5 * eps / steps`` per sample). ``stop`` (a :data:`StopRule`, restarts = 1)
    is asked from gradient evaluation ``stop_from`` on which samples stop: they keep their current point and
    leave the active set, and later passes run on the remaining samples only. ``start_draw="unit"`` (L-inf)
    draws the random start as ``(2u - 1) * eps`` instead of ``u * 2 eps - eps`` (the same law; other float
    roundings). ``return_details`` returns a :class:`PGDDetails` (evaluations per sample; ``track_success``
    adds whether any evaluated point succeeded, for one extra forward pass over the samples still active).
    """
    x, y = _prepare(model, x, y)
    norm = check_norm(norm)
    steps = _check_steps(steps)
    restarts = _check_steps(restarts, "restarts")
    per_sample: dict[str, Any] = {"target": _check_target(model, target, y)}
    if isinstance(eps, torch.Tensor) and eps.dim() == 1:
        eps = per_sample["eps"] = _check_eps_per_sample(eps, x.shape[0], norm)
    else:
        eps = check_eps("eps", eps, norm)
    if isinstance(alpha, torch.Tensor) and alpha.dim() == 1:
        per_sample["alpha"] = _check_alpha_per_sample(alpha, x.shape[0])
    elif isinstance(eps, torch.Tensor) and alpha is None:
        per_sample["alpha"] = 2.5 * eps / steps
    else:
        alpha = 2.5 * eps / steps if alpha is None else _check_non_negative(alpha, "alpha")
    details = _check_details(stop, stop_from, start_draw, norm, restarts, return_details, track_success)
    if stop is not None:
        per_sample["index"] = torch.arange(x.shape[0], device=y.device)
    kw = {k: v for k, v in (("eps", eps), ("alpha", alpha)) if k not in per_sample}
    out = _run(_pgd_core, model, x, y, seed, batch_size, generator, per_sample=per_sample, steps=steps,
               norm=norm, random_start=bool(random_start), restarts=restarts, stop=stop, stop_from=stop_from,
               start_draw=start_draw, details=details, track_success=bool(track_success), **kw)
    if not details:
        return out
    if isinstance(out, torch.Tensor):  # no samples
        none = torch.zeros(0, dtype=torch.long, device=x.device)
        out = (out, none, none.bool() if track_success else None)
    adv, evals, success = out
    return PGDDetails(adv, evals, success) if return_details else adv


def _check_eps_per_sample(eps: torch.Tensor, n: int, norm: str) -> torch.Tensor:
    """Per-sample radii: a floating tensor [N] of finite values in (0, 1] (L-inf) or (0, MAX_L2_RADIUS] (L2)."""
    if not eps.is_floating_point() or eps.shape[0] != n:
        raise ConfigError(f"per-sample eps must be a floating tensor of {n} radii, got {eps.dtype} "
                          f"{tuple(eps.shape)}")
    bound = 1.0 if norm == "linf" else MAX_L2_RADIUS
    if n and (not bool(torch.isfinite(eps).all()) or float(eps.min()) <= 0 or float(eps.max()) > bound):
        raise ConfigError(f"per-sample eps must lie in (0, {bound:g}] for the {norm} threat model")
    return eps.float()


def _check_alpha_per_sample(alpha: torch.Tensor, n: int) -> torch.Tensor:
    """Per-sample step sizes: a floating tensor [N] of finite values >= 0."""
    if not alpha.is_floating_point() or alpha.shape[0] != n:
        raise ConfigError(f"per-sample alpha must be a floating tensor of {n} step sizes, got {alpha.dtype} "
                          f"{tuple(alpha.shape)}")
    if n and (not bool(torch.isfinite(alpha).all()) or float(alpha.min()) < 0):
        raise ConfigError("per-sample alpha must hold finite numbers >= 0")
    return alpha.float()


def _check_details(stop: Any, stop_from: Any, start_draw: Any, norm: str, restarts: int, return_details: bool,
                   track_success: bool) -> bool:
    """Check pgd's stopping and reporting options; True when the run must count evaluations per sample."""
    if stop is not None and not callable(stop):
        raise ConfigError(f"stop must be a callable (k, x_adv, grad, logits, index) -> bool mask, got {stop!r}")
    if isinstance(stop_from, bool) or not isinstance(stop_from, int) or stop_from < 0:
        raise ConfigError(f"stop_from must be an integer >= 0, got {stop_from!r}")
    if start_draw not in ("ball", "unit") or (start_draw == "unit" and norm != "linf"):
        raise ConfigError(f"start_draw must be 'ball' or (L-inf only) 'unit', got {start_draw!r}")
    if track_success and not return_details:
        raise ConfigError("track_success needs return_details=True (success is a field of PGDDetails)")
    details = stop is not None or bool(return_details)
    if details and restarts > 1:
        raise ConfigError("stop and return_details need restarts=1")
    return details


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


#: the attacks of this module, registered by :mod:`robustest.attacks`
RECORDS = (
    Attack("fgsm", fgsm, "Fast Gradient Sign Method (L-inf, one step; optional random start; target=)",
           norms=("linf",)),
    Attack("pgd", pgd, "Projected Gradient Descent (L-inf or L2; random start; restarts keep the strongest; target=)",
           default_steps=10),
    Attack("bim", bim, "Basic Iterative Method (L-inf PGD from the clean input; target=)", norms=("linf",),
           default_steps=10),
    Attack("rfgsm", rfgsm, "R+FGSM: random sign step then gradient sign steps (L-inf; target=)", norms=("linf",),
           default_steps=1, aliases=("r_fgsm",)),
    Attack("mifgsm", mifgsm, "Momentum Iterative FGSM (L-inf; target=)", norms=("linf",), default_steps=10,
           aliases=("mi_fgsm",)),
)
