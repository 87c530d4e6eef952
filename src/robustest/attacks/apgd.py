"""Auto-PGD (Croce & Hein 2020, "Reliable evaluation of adversarial robustness with an ensemble of diverse
parameter-free attacks"): APGD-CE, APGD-DLR and the targeted APGD-T, L-inf or L2.

One run of APGD (:func:`_apgd_run`) is PGD with momentum 0.75 (the first step without) whose step size starts at
``2 * eps`` and is halved at checkpoints w_j: the first after 22% of the steps, then after intervals that shrink
by 3% of the steps down to at least 6%. At a checkpoint a sample's step size is halved, and the sample restarts
from its best point so far, when (1) the loss increased in at most ``rho`` (0.75) of the steps since the last
checkpoint, or (2) the step size was not halved at the last checkpoint and the best loss has not improved since.
Losses: cross-entropy (APGD-CE), the Difference of Logits Ratio (APGD-DLR) and its targeted form (APGD-T, the
target classes being the ``n_targets`` most likely other classes of the clean input, 9 in AutoAttack).

Differences from the reference implementation (fra31/auto-attack), all stated in the docstrings below:
the oscillation count at the first checkpoint compares the first step with the loss at the starting point (the
paper's definition) instead of with an unfilled (zero) entry of the loss history; randomness comes from a
``torch.Generator`` seeded by the caller, not from the global seed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from robustest.attacks._core import (
    _DEFAULT_CHUNK,
    _check_n_targets,
    _check_non_negative,
    _check_steps,
    _check_target,
    _classes_from_logits,
    _dlr_loss,
    _dlr_targeted_loss,
    _flat_norm,
    _keep_stronger,
    _num_classes,
    _prepare,
    _run,
    _step_direction,
    check_norm,
    input_gradient,
    project,
)
from robustest.attacks.registry import Attack
from robustest.core.modelcall import forward
from robustest.core.validation import check_eps

__all__ = ["apgd", "apgd_dlr", "apgd_t"]


def _loss_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, target: torch.Tensor | None,
               hit_target: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gradient of the summed per-sample loss at x, logits (detached), per-sample loss (detached))."""
    if loss == "ce":
        g, logits = input_gradient(model, x, y)
        return g, logits, F.cross_entropy(logits, y, reduction="none")
    xr = x.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = forward(model, xr)
        per = _dlr_loss(logits, y) if loss == "dlr" else _dlr_targeted_loss(logits, y, target, hit_target)
        (g,) = torch.autograd.grad(per.sum(), xr)
    return g.contiguous(), logits.detach(), per.detach()


def _eot_loss_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, target: torch.Tensor | None,
                   hit_target: bool, eot: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_loss_grad` averaged over ``eot`` forward and backward passes (Expectation over Transformation, for
    randomised models): the mean gradient, logits and loss; one pass when ``eot`` is 1."""
    if eot == 1:
        return _loss_grad(model, x, y, loss, target, hit_target)
    parts = [_loss_grad(model, x, y, loss, target, hit_target) for _ in range(eot)]
    g, logits, per = (torch.stack(p).mean(0) for p in zip(*parts))
    return g, logits, per


def _halve_at_checkpoint(losses: torch.Tensor, rho: float, halved_last: torch.Tensor, best_last: torch.Tensor,
                         best: torch.Tensor) -> torch.Tensor:
    """Which samples halve their step size at a checkpoint (AutoAttack's rule), bool [N].

    ``losses``: (k + 1) x N, the loss at the previous checkpoint's step and at each of the k steps since;
    ``halved_last``: whether each sample halved at the previous checkpoint; ``best_last`` / ``best``: its best loss
    then and now. A sample halves when (1) the loss increased in at most a fraction ``rho`` of the k steps
    (``increases <= k * rho``, as the reference code counts), or (2) it did not halve at the previous checkpoint
    and its best loss has not improved since."""
    k = losses.shape[0] - 1
    increases = (losses[1:] > losses[:-1]).sum(0)
    return (increases <= k * rho) | (~halved_last & (best_last >= best))


def _apgd_run(model, x, y, gen, *, eps, steps, norm, rho, loss="ce", target=None, hit_target=False,
              stop_on_success=False, eot=1, trace=None):
    """One run of APGD on one chunk, following Croce & Hein (2020) and AutoAttack's ``attack_single_run``.

    ``loss``: "ce" (cross-entropy with y), "dlr" or "dlr_t" (targeted DLR towards ``target``). Success is
    "prediction != y", or "prediction == target" with ``hit_target``. Returns (x_out, loss_best, success): x_out
    is the last successful iterate for successful samples, else the highest-loss iterate. With
    ``stop_on_success`` a sample leaves the batch once it is successful (its first successful iterate is
    returned; the others' runs are unchanged, so success is the same at less cost). Difference from the
    reference code: the oscillation count of the first checkpoint compares the first step with the loss at the
    starting point (the paper's definition) instead of with an unfilled (zero) entry of the loss history.
    ``trace``: a dict that gets ``improving`` (bool [n]): the sample was not broken and its best loss still rose,
    by more than 1e-3 of its whole rise, in the last tenth of the steps (Pintor et al. 2022's "incomplete
    optimisation").
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
        return z.clamp(lo, hi) if norm == "linf" else project(z, x, eps, "l2")

    def ok(logits: torch.Tensor, yy: torch.Tensor, tt: torch.Tensor | None) -> torch.Tensor:  # True = not successful
        pred = logits.argmax(1)
        return pred != tt if hit_target else pred == yy

    x_best = x_adv.clone()
    x_best_adv = x_adv.clone()
    loss_steps = torch.zeros(steps + 1, n, device=x.device)
    g, logits, cur = _eot_loss_grad(model, x_adv, y, loss, target, hit_target, eot)
    loss_steps[0] = cur
    robust = ok(logits, y, target)
    loss_best = cur.clone()
    grad_best = g.clone()
    step_size = torch.full(bshape, 2.0 * eps, device=x.device, dtype=x.dtype)
    x_adv_old = x_adv.clone()
    k = n_iter_2
    counter = 0
    loss_best_last_check = loss_best.clone()
    reduced_last_check = torch.ones(n, dtype=torch.bool, device=x.device)
    tail_from = steps - max(steps // 10, 1)
    best_before_tail = None
    for i in range(steps):
        if i == tail_from:
            best_before_tail = loss_best.clone()
        with torch.no_grad():
            momentum = x_adv - x_adv_old
            x_adv_old = x_adv
            a = 0.75 if i > 0 else 1.0
            z = proj(x_adv + step_size * _step_direction(g, norm))
            x_adv = proj(x_adv + (z - x_adv) * a + momentum * (1 - a))
        act = robust.nonzero().flatten() if stop_on_success else None
        if act is not None and act.numel() == 0:
            break
        if act is None or act.numel() == n:
            g, logits, cur = _eot_loss_grad(model, x_adv, y, loss, target, hit_target, eot)
            pred_ok = ok(logits, y, target)
        else:  # only the samples not yet successful go through the model; the others keep their state
            t_a = None if target is None else target[act]
            g_a, logits_a, cur_a = _eot_loss_grad(model, x_adv[act], y[act], loss, t_a, hit_target, eot)
            g = torch.zeros_like(x_adv).index_copy_(0, act, g_a)
            cur = loss_best.clone().index_copy_(0, act, cur_a)
            pred_ok = torch.ones(n, dtype=torch.bool, device=x.device).index_copy_(0, act, ok(logits_a, y[act], t_a))
        with torch.no_grad():
            x_best_adv = torch.where(pred_ok.view(bshape), x_best_adv, x_adv)
            robust &= pred_ok
            loss_steps[i + 1] = cur
            improved = cur > loss_best
            imp = improved.view(bshape)
            x_best = torch.where(imp, x_adv, x_best)
            grad_best = torch.where(imp, g, grad_best)
            loss_best = torch.where(improved, cur, loss_best)
            counter += 1
            if counter == k:
                reduce = _halve_at_checkpoint(loss_steps[i + 1 - k:i + 2], rho, reduced_last_check,
                                              loss_best_last_check, loss_best)
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
    if trace is not None:
        rise = loss_best - loss_steps[0]
        improving = torch.zeros_like(success) if best_before_tail is None else (
            (loss_best - best_before_tail) > 1e-3 * rise.abs() + 1e-6)
        trace["improving"] = improving & robust
    return out, loss_best, success


def _apgd_core(model, x, y, gen, *, eps, steps, norm, restarts, rho, eot_iter, stop_on_success, loss="ce",
               return_trace=False):
    best = best_loss = best_succ = None
    improving = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    for _ in range(restarts):
        trace: dict[str, Any] | None = {} if return_trace else None
        adv, cur, succ = _apgd_run(model, x, y, gen, eps=eps, steps=steps, norm=norm, rho=rho, loss=loss,
                                   stop_on_success=stop_on_success, eot=eot_iter, trace=trace)
        if trace is not None:
            improving |= trace["improving"]
        if best is None:
            best, best_loss, best_succ = adv, cur, succ
        else:
            _keep_stronger(best, best_loss, best_succ, adv, cur, succ)
    if return_trace:
        return best, improving & ~best_succ
    return best


def _apgd_t_core(model, x, y, gen, *, eps, steps, norm, restarts, rho, n_targets, target=None,
                 stop_on_success=False):
    """APGD-T on one chunk. Without ``target``: for each of the ``n_targets`` most likely other classes of the
    clean input (in order), ``restarts`` runs of APGD on the targeted DLR loss, each only on the samples not yet
    misclassified (AutoAttack's loop). With ``target``: ``restarts`` runs towards the given classes on the samples
    not yet predicted as their target. Samples never broken keep the highest-loss point of their last run."""
    with torch.no_grad():
        logits = forward(model, x)
    _classes_from_logits(logits, 0 if target is not None else n_targets, need=4, what="APGD-T (targeted DLR loss)")
    hit = target is not None
    pred = logits.argmax(1)
    active = pred != target if hit else pred == y
    out = x.clone()
    if hit:
        plan = [target]
    else:
        order = logits.argsort(dim=1, descending=True)
        plan = [order[:, j] for j in range(1, n_targets + 1)]
    for tgt in plan:
        for _ in range(restarts):
            idx = active.nonzero().flatten()
            if idx.numel() == 0:
                return out
            adv, _, succ = _apgd_run(model, x[idx], y[idx], gen, eps=eps, steps=steps, norm=norm, rho=rho,
                                     loss="dlr_t", target=tgt[idx], hit_target=hit, stop_on_success=stop_on_success)
            out[idx] = adv
            active[idx[succ]] = False
    return out


# ------------------------------------------------------------------------------------------ public attacks
def apgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int = 100, norm: str = "linf",
         restarts: int = 1, rho: float = 0.75, seed: int | None = None, *, stop_on_success: bool = False,
         eot_iter: int = 1, return_trace: bool = False, batch_size: int | None = _DEFAULT_CHUNK,
         generator: torch.Generator | None = None) -> Any:
    """APGD-CE (Croce & Hein 2020): PGD on the cross-entropy with momentum 0.75 and a step size that starts at
    ``2 * eps`` and is halved at checkpoints (after 22%, then shrinking intervals of at least 6% of the steps)
    where the loss increased in at most a fraction ``rho`` of the steps since the last checkpoint, or where the
    best loss did not improve and the step was not halved at the last checkpoint; a halving restarts from the
    best point. Follows AutoAttack's reference implementation; L-inf or L2.

    Returns, per sample, the last misclassified iterate if the attack succeeded, else the highest-loss iterate;
    with ``restarts > 1`` the strongest of the runs (successful first, else highest loss; every restart runs on
    every sample, unlike AutoAttack, which restarts only the samples not yet broken: the success is the same).
    ``stop_on_success`` stops attacking a sample once it is misclassified (then its first misclassified iterate
    is returned): the same success for less work, used by :func:`robustest.evaluate.evaluate`. ``eot_iter > 1``
    (Expectation over Transformation, for randomised models; AutoAttack's ``rand`` version uses 20) averages the
    gradient, logits and loss of that many forward and backward passes at every step. ``return_trace=True``
    returns ``(x_adv, improving)``: ``improving`` (bool [N]) marks the samples not broken whose best loss still
    rose in the last tenth of the steps (the optimisation may be incomplete; Pintor et al. 2022).
    x: N x C x H x W in [0, 1]; y: int64 [N]; returns N x C x H x W on x's device.
    """
    x, y = _prepare(model, x, y)
    norm = check_norm(norm)
    eps = check_eps("eps", eps, norm)
    steps = _check_steps(steps)
    restarts = _check_steps(restarts, "restarts")
    rho = _check_non_negative(rho, "rho")
    return _run(_apgd_core, model, x, y, seed, batch_size, generator, eps=eps, steps=steps, norm=norm,
                restarts=restarts, rho=rho, stop_on_success=bool(stop_on_success),
                eot_iter=_check_steps(eot_iter, "eot_iter"), return_trace=bool(return_trace))


def apgd_dlr(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int = 100, norm: str = "linf",
             restarts: int = 1, rho: float = 0.75, seed: int | None = None, *, stop_on_success: bool = False,
             eot_iter: int = 1, batch_size: int | None = _DEFAULT_CHUNK,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """APGD-DLR (Croce & Hein 2020): the APGD schedule of :func:`apgd` on the Difference of Logits Ratio
    ``-(z_y - max_{i != y} z_i) / (z_pi1 - z_pi3)``, which is invariant to shifting and rescaling the logits (so
    it does not suffer from the vanishing cross-entropy gradients of over-confident models). Needs a model with
    at least 3 classes. Same return convention (and ``stop_on_success``, ``eot_iter``) as :func:`apgd`.
    x: N x C x H x W in [0, 1]; y: int64 [N].
    """
    x, y = _prepare(model, x, y)
    norm = check_norm(norm)
    eps = check_eps("eps", eps, norm)
    steps = _check_steps(steps)
    restarts = _check_steps(restarts, "restarts")
    rho = _check_non_negative(rho, "rho")
    return _run(_apgd_dlr_core, model, x, y, seed, batch_size, generator, eps=eps, steps=steps, norm=norm,
                restarts=restarts, rho=rho, stop_on_success=bool(stop_on_success),
                eot_iter=_check_steps(eot_iter, "eot_iter"))


def _apgd_dlr_core(model, x, y, gen, **kw):
    with torch.no_grad():
        logits = forward(model, x[:1])
    _classes_from_logits(logits, 0, need=3, what="APGD-DLR")
    return _apgd_core(model, x, y, gen, loss="dlr", **kw)


def apgd_t(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int = 100, norm: str = "linf",
           n_targets: int = 9, restarts: int = 1, rho: float = 0.75, seed: int | None = None, *,
           target: Any = None, stop_on_success: bool = False, batch_size: int | None = _DEFAULT_CHUNK,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """APGD-T (Croce & Hein 2020): the APGD schedule of :func:`apgd` on the targeted DLR loss
    ``-(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2)``, run once for each of the ``n_targets`` most likely other
    classes t of the clean input (AutoAttack: 9, one restart each), each time only on the samples no earlier
    target has misclassified; success means "misclassified". Needs a model with at least 4 classes and
    ``n_targets <= classes - 1``.

    With ``target`` (an int or int64 [N], each different from y) it attacks those classes instead and success
    means "predicted as the target"; the loss's label term z_y is then ``max_{i != t} z_i`` (equal to z_y while
    y is the top class), so the run pushes t to the top rather than only above y. Returns, per sample, the
    successful point if any, else the highest-loss point of the sample's last run (clean points the model
    already gets wrong come back unchanged); ``stop_on_success`` as in :func:`apgd`.
    x: N x C x H x W in [0, 1]; y: int64 [N].
    """
    x, y = _prepare(model, x, y)
    norm = check_norm(norm)
    eps = check_eps("eps", eps, norm)
    steps = _check_steps(steps)
    restarts = _check_steps(restarts, "restarts")
    rho = _check_non_negative(rho, "rho")
    n_targets = _check_n_targets(n_targets, _num_classes(model))
    target = _check_target(model, target, y)
    return _run(_apgd_t_core, model, x, y, seed, batch_size, generator, per_sample={"target": target}, eps=eps,
                steps=steps, norm=norm, restarts=restarts, rho=rho, n_targets=n_targets,
                stop_on_success=bool(stop_on_success))


#: the attacks of this module, registered by :mod:`robustest.attacks`
RECORDS = (
    Attack("apgd", apgd, "APGD-CE: parameter-free step size schedule (L-inf or L2; restarts)", default_steps=100,
           aliases=("apgd_ce",)),
    Attack("apgd_dlr", apgd_dlr, "APGD-DLR: APGD on the Difference of Logits Ratio loss (L-inf or L2)",
           min_classes=3, default_steps=100, scale_free=True),
    Attack("apgd_t", apgd_t, "APGD-T: APGD on the targeted DLR loss over the top-9 other classes (L-inf or L2)",
           min_classes=4, default_steps=100, scale_free=True, aliases=("apgdt", "apgd_targeted")),
)
