"""FAB: the Fast Adaptive Boundary attack (Croce & Hein 2019/2020), a minimum-norm attack, targeted (FAB-T, the
AutoAttack version) or untargeted, L-inf or L2.

Each step linearises the decision boundary between the label y and a class t at the current point x1,
``{z : f_t(x1) - f_y(x1) + <grad(f_t - f_y)(x1), z - x1> = 0}``, and projects both x1 and the clean input x0
onto that hyperplane intersected with the box [0, 1]^d (the minimum-norm projection in the attack's norm,
:func:`_project_hyperplane_box`). With d1, d2 the two moves it steps to
``clip((x1 + eta d1)(1 - a) + (x0 + eta d2) a, 0, 1)``, ``a = min(|d1| / (|d1| + |d2|), alpha_max)``
(the bias towards x0 keeps the perturbation small); when the new point is adversarial it is recorded if its
norm is the smallest so far and the search backs off towards x0: ``x1 <- x0 + beta (x1 - x0)``.
Untargeted, t is the class whose linearised boundary is closest; FAB-T uses, in turn, the ``n_targets``
most likely other classes of the clean input (AutoAttack: 9), each only on the samples not yet broken within
eps. Settings of AutoAttack's standard version: 100 steps, alpha_max 0.1, eta 1.05, beta 0.9, one restart.

Differences from the reference implementation (fra31/auto-attack): the projection is computed by one
batched sort-and-cumulative-sum solve for both norms (same minimiser, different arithmetic); when the
hyperplane cannot be reached inside the box the projection moves every coordinate to the bound that brings it
closest; randomness comes from a ``torch.Generator``. A found point counts only when its norm is <= eps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from robustest.attacks._core import (
    _DEFAULT_CHUNK,
    _check_n_targets,
    _check_non_negative,
    _check_steps,
    _check_target,
    _classes_from_logits,
    _num_classes,
    _prepare,
    _run,
    check_norm,
    lp_norm,
)
from robustest.attacks.registry import Attack
from robustest.core.modelcall import forward
from robustest.core.validation import check_eps

__all__ = ["fab", "fab_t"]


def _project_hyperplane_box(t: torch.Tensor, w: torch.Tensor, c: torch.Tensor, norm: str) -> torch.Tensor:
    """Per row, the minimum L-inf or L2 norm move d with ``<w, d> = c`` and ``0 <= t + d <= 1``.

    t, w: N x D; c: [N]; returns d: N x D. Moving coordinate i in direction s_i = sign(w_i c) by m_i >= 0 changes
    <w, d> by |w_i| m_i, and it can move at most r_i (to the bound of [0, 1] in that direction). The minimisers
    are m_i = min(lam, r_i) (L-inf) and m_i = |w_i| min(lam, r_i / |w_i|) (L2, the KKT solution clip(lam w)) for
    the smallest lam >= 0 with sum_i a_i min(lam, b_i) = |c| (a = |w|, b = r for L-inf; a = w^2, b = r / |w| for
    L2): a piecewise linear, non-decreasing function of lam, solved exactly by sorting the b_i. When even lam =
    infinity falls short of |c| every coordinate moves to its bound.
    """
    sgn = torch.where(c >= 0, 1.0, -1.0).to(w.dtype)
    ws = w * sgn[:, None]
    direction = ws.sign()
    room = torch.where(ws > 0, 1.0 - t, t).clamp_min(0.0)
    a = ws.abs()
    nz = a > 0
    if norm == "linf":
        coef, b = a, torch.where(nz, room, torch.zeros_like(room))
    else:
        coef = a * a
        b = torch.where(nz, room / torch.where(nz, a, torch.ones_like(a)), torch.zeros_like(room))
    need = c.abs()
    b_sorted, order = b.sort(dim=1)
    coef_sorted = coef.gather(1, order)
    cum_cb = (coef_sorted * b_sorted).cumsum(1)
    cum_c = coef_sorted.cumsum(1)
    total_c = cum_c[:, -1:]
    value = cum_cb + b_sorted * (total_c - cum_c)  # g(b_(k)) for every k
    reach = value >= need[:, None]
    feasible = reach[:, -1]
    k = reach.to(torch.int8).argmax(1, keepdim=True)  # first breakpoint at or above |c|
    below_cb = cum_cb.gather(1, k) - (coef_sorted * b_sorted).gather(1, k)  # sum over j < k of a_j b_j
    slope = total_c - cum_c.gather(1, k) + coef_sorted.gather(1, k)  # sum over j >= k of a_j
    lam = (need[:, None] - below_cb) / slope.clamp_min(1e-30)
    lam = torch.where(feasible[:, None], lam.clamp_min(0.0), torch.full_like(lam, float("inf")))
    m = torch.minimum(lam, b)
    if norm == "l2":
        m = m * a
    return direction * m


def _linearisation(model, x1, y, t, hit_target, norm):
    """(f_t - f_y at x1 [N], its gradient N x D, logits at x1). Untargeted (t None): for the class whose
    linearised boundary is closest (smallest |f_k - f_y| / ||grad(f_k - f_y)||_dual)."""
    n = x1.shape[0]
    xr = x1.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = forward(model, xr)
        if t is not None:
            z_t = logits.gather(1, t[:, None]).squeeze(1)
            if hit_target:  # the boundary between t and the strongest other class
                z_o = logits.scatter(1, t[:, None], float("-inf")).amax(1)
            else:
                z_o = logits.gather(1, y[:, None]).squeeze(1)
            diff = z_t - z_o
            (g,) = torch.autograd.grad(diff.sum(), xr)
            return diff.detach(), g.reshape(n, -1), logits.detach()
        k = logits.shape[1]
        grads = []
        for j in range(k):  # one backward pass per class (not per sample)
            (gj,) = torch.autograd.grad(logits[:, j].sum(), xr, retain_graph=j < k - 1)
            grads.append(gj.reshape(n, -1))
    jac = torch.stack(grads, 1)  # N x K x D
    z = logits.detach()
    df = z - z.gather(1, y[:, None])
    dg = jac - jac[torch.arange(n, device=x1.device), y][:, None]
    dual = dg.abs().sum(2) if norm == "linf" else dg.norm(dim=2)
    dist = df.abs() / (dual + 1e-12)
    dist.scatter_(1, y[:, None], float("inf"))
    j = dist.argmin(1)
    ar = torch.arange(n, device=x1.device)
    return df[ar, j], dg[ar, j], z


def _fab_step(model, x1, x0, y, t, *, norm, alpha_max, eta, beta, hit_target, shape):
    """One FAB step for the rows of x1 / x0 (m x D): (new x1, adversarial flags, distances to x0)."""
    df, w, _ = _linearisation(model, x1.view(-1, *shape[1:]), y, t, hit_target, norm)
    with torch.no_grad():
        wx1 = (w * x1).sum(1)
        d1 = _project_hyperplane_box(x1, w, -df, norm)
        d2 = _project_hyperplane_box(x0, w, -df + wx1 - (w * x0).sum(1), norm)
        n1 = lp_norm(d1, norm).clamp_min(1e-8)
        n2 = lp_norm(d2, norm).clamp_min(1e-8)
        alpha = (n1 / (n1 + n2)).clamp(0.0, alpha_max)[:, None]
        x1 = ((x1 + eta * d1) * (1 - alpha) + (x0 + eta * d2) * alpha).clamp_(0.0, 1.0)
        pred = forward(model, x1.view(-1, *shape[1:])).argmax(1)
        adv = pred == t if hit_target else pred != y
        return x1, adv, lp_norm(x1 - x0, norm)


def _fab_run(model, x, y, t, gen, *, eps, steps, norm, alpha_max, eta, beta, random_start, hit_target,
             stop_on_success=False):
    """One FAB run on one chunk. Returns (best adversarial point, its norm; inf where none was found). With
    ``stop_on_success`` a sample leaves the batch once a point within eps was found (FAB would go on shrinking
    it)."""
    n = x.shape[0]
    shape = x.shape
    x0 = x.reshape(n, -1)
    bshape = (n,) + (1,) * (x.dim() - 1)
    if random_start:  # a random point on the sphere of radius eps / 2 (AutoAttack's restarts)
        if norm == "linf":
            r = torch.rand(x.shape, generator=gen, device=x.device, dtype=x.dtype).mul_(2).sub_(1)
            r = r / r.flatten(1).abs().amax(1).clamp_min(1e-12).view(bshape)
        else:
            r = torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype)
            r = r / r.flatten(1).norm(dim=1).clamp_min(1e-12).view(bshape)
        x1 = (x + 0.5 * eps * r).clamp_(0.0, 1.0).reshape(n, -1)
    else:
        x1 = x0.clone()
    best = x0.clone()
    best_norm = torch.full((n,), float("inf"), device=x.device)
    limit = eps + eps * 1e-6 + 1e-7
    kw = {"norm": norm, "alpha_max": alpha_max, "eta": eta, "beta": beta, "hit_target": hit_target, "shape": shape}
    for _ in range(steps):
        act = (best_norm > limit).nonzero().flatten() if stop_on_success else None
        if act is not None and act.numel() == 0:
            break
        if act is None or act.numel() == n:
            x1, adv, dist = _fab_step(model, x1, x0, y, t, **kw)
            rows = slice(None)
        else:
            x1_a, adv, dist = _fab_step(model, x1[act], x0[act], y[act], None if t is None else t[act], **kw)
            rows = act
            x1 = x1.index_copy(0, act, x1_a)
        with torch.no_grad():
            x1_r, x0_r = x1[rows], x0[rows]
            better = adv & (dist < best_norm[rows])
            best[rows] = torch.where(better[:, None], x1_r, best[rows])
            best_norm[rows] = torch.where(better, dist, best_norm[rows])
            x1[rows] = torch.where(adv[:, None], x0_r + (x1_r - x0_r) * beta, x1_r)
    return best.view(shape), best_norm


def _fab_core(model, x, y, gen, *, eps, steps, norm, targeted, n_targets, restarts, alpha_max, eta, beta,
              target=None, stop_on_success=False):
    with torch.no_grad():
        logits = forward(model, x)
    hit = target is not None
    _classes_from_logits(logits, n_targets if targeted and not hit else 0, need=2, what="FAB")
    pred = logits.argmax(1)
    active = pred != target if hit else pred == y
    out = x.clone()
    if hit:
        plan = [target]
    elif targeted:
        order = logits.argsort(dim=1, descending=True)
        plan = [order[:, j] for j in range(1, n_targets + 1)]
    else:
        plan = [None]
    tol = eps * 1e-6 + 1e-7
    for tgt in plan:
        for r in range(restarts):
            idx = active.nonzero().flatten()
            if idx.numel() == 0:
                return out
            best, best_norm = _fab_run(model, x[idx], y[idx], None if tgt is None else tgt[idx], gen, eps=eps,
                                       steps=steps, norm=norm, alpha_max=alpha_max, eta=eta, beta=beta,
                                       random_start=r > 0, hit_target=hit, stop_on_success=stop_on_success)
            ok = best_norm <= eps + tol
            out[idx[ok]] = best[ok]
            active[idx[ok]] = False
    return out


def fab(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int = 100, norm: str = "linf",
        targeted: bool = True, n_targets: int = 9, restarts: int = 1, alpha_max: float = 0.1, eta: float = 1.05,
        beta: float = 0.9, seed: int | None = None, *, target: Any = None, stop_on_success: bool = False,
        batch_size: int | None = _DEFAULT_CHUNK, generator: torch.Generator | None = None) -> torch.Tensor:
    """FAB (Croce & Hein 2020), the minimum-norm boundary attack of AutoAttack; FAB-T when ``targeted`` (the
    default): one run per each of the ``n_targets`` most likely other classes of the clean input, each on the
    samples not yet broken. Untargeted (``targeted=False``) it linearises towards the closest boundary, which costs
    one backward pass per class per step. Restarts after the first start from a random point at distance eps/2.

    Returns, per sample, the smallest-norm adversarial point found if its L-inf / L2 norm is <= ``eps``, else
    the clean input (FAB minimises the norm; eps only decides success). With ``target`` (an int or int64 [N],
    each different from y) it linearises the boundary between the target and the strongest other class and
    success means "predicted as the target". Each step costs one forward+backward and one forward pass.
    ``stop_on_success`` stops a sample's run once a point within eps is found (the same success, a larger
    returned norm; used by :func:`robustest.evaluate.evaluate`).
    x: N x C x H x W in [0, 1]; y: int64 [N]; returns N x C x H x W on x's device.
    """
    x, y = _prepare(model, x, y)
    norm = check_norm(norm)
    eps = check_eps("eps", eps, norm)
    steps = _check_steps(steps)
    restarts = _check_steps(restarts, "restarts")
    n_targets = _check_n_targets(n_targets, _num_classes(model)) if targeted else int(n_targets)
    alpha_max = _check_non_negative(alpha_max, "alpha_max")
    eta = _check_non_negative(eta, "eta")
    beta = _check_non_negative(beta, "beta")
    target = _check_target(model, target, y)
    return _run(_fab_core, model, x, y, seed, batch_size, generator, per_sample={"target": target}, eps=eps,
                steps=steps, norm=norm, targeted=bool(targeted), n_targets=n_targets, restarts=restarts,
                alpha_max=alpha_max, eta=eta, beta=beta, stop_on_success=bool(stop_on_success))


def fab_t(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int = 100, norm: str = "linf",
          n_targets: int = 9, restarts: int = 1, alpha_max: float = 0.1, eta: float = 1.05, beta: float = 0.9,
          seed: int | None = None, *, target: Any = None, stop_on_success: bool = False,
          batch_size: int | None = _DEFAULT_CHUNK, generator: torch.Generator | None = None) -> torch.Tensor:
    """FAB-T, AutoAttack's targeted FAB: :func:`fab` with ``targeted=True`` (see there).
    x: N x C x H x W in [0, 1]; y: int64 [N]; returns N x C x H x W on x's device."""
    return fab(model, x, y, eps, steps=steps, norm=norm, targeted=True, n_targets=n_targets, restarts=restarts,
               alpha_max=alpha_max, eta=eta, beta=beta, seed=seed, target=target, stop_on_success=stop_on_success,
               batch_size=batch_size, generator=generator)


def _fab_untargeted(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int = 100,
                    norm: str = "linf", restarts: int = 1, alpha_max: float = 0.1, eta: float = 1.05,
                    beta: float = 0.9, seed: int | None = None, *, stop_on_success: bool = False,
                    batch_size: int | None = _DEFAULT_CHUNK, generator: torch.Generator | None = None) -> torch.Tensor:
    return fab(model, x, y, eps, steps=steps, norm=norm, targeted=False, restarts=restarts, alpha_max=alpha_max,
               eta=eta, beta=beta, seed=seed, stop_on_success=stop_on_success, batch_size=batch_size,
               generator=generator)


#: the attacks of this module, registered by :mod:`robustest.attacks`
RECORDS = (
    Attack("fab_t", fab_t, "FAB-T: targeted minimum-norm boundary attack over the top-9 other classes (L-inf, L2)",
           default_steps=100, scale_free=True, aliases=("fabt", "fab_targeted")),
    Attack("fab", _fab_untargeted, "FAB: untargeted minimum-norm boundary attack (L-inf or L2)", default_steps=100,
           scale_free=True),
)
