"""What every attack shares: parameter validation, the per-sample losses, gradients, projections onto the
threat model's ball, the rule that keeps the stronger of two candidates, and the chunked runner.

Conventions (the same for every attack of the package): images x are float N x C x H x W in [0, 1], labels y
int64 [N]; a core ``core(model, x, y, gen, **params)`` works on one chunk already on the model's device and
returns the adversarial chunk; :func:`_run` calls it chunk by chunk in eval mode with frozen parameters and one
``torch.Generator`` on the model's device, so the same seed (and chunk size) gives the same result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError, DataError
from robustest.core.inputs import check_images, check_labels
from robustest.core.modelcall import eval_mode, forward, frozen_params
from robustest.core.seeding import make_generator

NORMS = ("linf", "l2")
_DEFAULT_CHUNK = 512


# ------------------------------------------------------------------------------------------ validation
def _check_non_negative(value: Any, name: str) -> float:
    """A finite number >= 0 (step sizes, constants); radii go through :func:`robustest.core.validation.check_eps`."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def _check_steps(steps: Any, name: str = "steps") -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"{name} must be a positive integer, got {steps!r}")
    return steps


def check_norm(norm: str) -> str:
    """The canonical name of a threat model's norm: ``"linf"`` (for inf / Linf / L-inf) or ``"l2"``."""
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


def _check_target(model: nn.Module, target: Any, y: torch.Tensor) -> torch.Tensor | None:
    """Target classes of a targeted attack: None, one class for every sample (an int) or int64 [N].
    Every target must differ from the sample's label."""
    if target is None:
        return None
    n = y.shape[0]
    if isinstance(target, bool):
        raise DataError("target must be a class index or a tensor of N class indices, got a bool")
    if isinstance(target, int):
        target = torch.full((n,), target, dtype=torch.long, device=y.device)
    elif not isinstance(target, torch.Tensor):
        target = torch.as_tensor(target)
    target = check_labels(target, n, _num_classes(model), name="target")
    same = int((target.to(y.device) == y).sum()) if n else 0
    if same:
        raise DataError(f"target equals the label for {same} sample(s): a targeted attack needs another class")
    return target.long()


def _check_n_targets(n_targets: Any, num_classes: int | None) -> int:
    k = _check_steps(n_targets, "n_targets")
    if num_classes is not None and k > num_classes - 1:
        raise ConfigError(f"n_targets={k} but the model has {num_classes} classes: use at most {num_classes - 1} "
                          "target classes")
    return k


def _classes_from_logits(logits: torch.Tensor, n_targets: int, *, need: int = 2, what: str = "attack") -> None:
    """Raise ConfigError when the logits have too few classes for ``n_targets`` target classes or for ``what``."""
    k = logits.shape[1]
    if k < need:
        raise ConfigError(f"{what} needs a model with at least {need} classes, this one returns {k}")
    if n_targets > k - 1:
        raise ConfigError(f"n_targets={n_targets} but the model returns {k} classes: use at most {k - 1} target "
                          "classes")


# ------------------------------------------------------------------------------------------ primitives
def _flat_norm(t: torch.Tensor) -> torch.Tensor:
    """Per-sample L2 norm of t (N x ...), shaped N x 1 x 1 x 1 for broadcasting."""
    return t.flatten(1).norm(p=2, dim=1).view(-1, *([1] * (t.dim() - 1)))


def lp_norm(t: torch.Tensor, norm: str) -> torch.Tensor:
    """Per-sample L-inf or L2 norm of t (N x ...), shape [N]."""
    f = t.flatten(1)
    return f.abs().amax(1) if norm == "linf" else f.norm(p=2, dim=1)


def input_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                   target: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x of the objective at x, logits at x (detached)). The objective is the summed cross-entropy with
    the labels y, or, with ``target``, minus the summed cross-entropy with the targets (ascending it moves
    towards the target class)."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = forward(model, x)
        if target is None:
            loss = F.cross_entropy(logits, y, reduction="sum")
        else:
            loss = -F.cross_entropy(logits, target, reduction="sum")
        (g,) = torch.autograd.grad(loss, x)
    # autograd may return an expanded (stride-0) gradient, e.g. when the output depends on x only through a
    # reduction; the attack loops update it in place, so make it dense (a no-op for ordinary gradients)
    return g.contiguous(), logits.detach()


def project(x_adv: torch.Tensor, x: torch.Tensor, eps: float, norm: str,
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


def random_point(x: torch.Tensor, eps: float, norm: str, gen: torch.Generator) -> torch.Tensor:
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


def _per_sample_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                     target: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-sample objective, success) at x, one forward pass without gradients. Untargeted: cross-entropy
    with y and success = prediction != y; targeted: minus the cross-entropy with the target and
    success = prediction == target."""
    with torch.no_grad():
        logits = forward(model, x)
    if target is None:
        return F.cross_entropy(logits, y, reduction="none"), logits.argmax(1) != y
    return -F.cross_entropy(logits, target, reduction="none"), logits.argmax(1) == target


def _keep_stronger(best: torch.Tensor, best_loss: torch.Tensor, best_succ: torch.Tensor,
                   cand: torch.Tensor, cand_loss: torch.Tensor, cand_succ: torch.Tensor) -> None:
    """In place: per sample, replace ``best`` by ``cand`` where the candidate is stronger
    (successful beats unsuccessful; otherwise the higher loss wins)."""
    better = (cand_succ & ~best_succ) | ((cand_succ == best_succ) & (cand_loss > best_loss))
    best[better] = cand[better]
    best_loss[better] = cand_loss[better]
    best_succ[better] = cand_succ[better]


# ------------------------------------------------------------------------------------------------ losses
def _dlr_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Difference of Logits Ratio (Croce & Hein 2020), per sample:
    ``-(z_y - max_{i != y} z_i) / (z_pi1 - z_pi3)`` with z sorted decreasingly (pi1 >= pi2 >= pi3).
    Shift- and scale-invariant in the logits; needs at least 3 classes."""
    top = logits.topk(3, dim=1).values
    z_y = logits.gather(1, y[:, None]).squeeze(1)
    other = torch.where(top[:, 0] == z_y, top[:, 1], top[:, 0])
    return -(z_y - other) / (top[:, 0] - top[:, 2] + 1e-12)


def _dlr_targeted_loss(logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor,
                       hit_target: bool = False) -> torch.Tensor:
    """Targeted DLR (Croce & Hein 2020), per sample: ``-(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2)``; needs at
    least 4 classes. With ``hit_target`` the label term z_y is replaced by ``max_{i != t} z_i`` (equal to z_y
    while y is the top class), so maximising the loss makes t the top class, not only beat y."""
    top = logits.topk(4, dim=1).values
    z_t = logits.gather(1, target[:, None]).squeeze(1)
    if hit_target:
        z_o = logits.scatter(1, target[:, None], float("-inf")).amax(1)
    else:
        z_o = logits.gather(1, y[:, None]).squeeze(1)
    return -(z_o - z_t) / (top[:, 0] - 0.5 * (top[:, 2] + top[:, 3]) + 1e-12)


def margin(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``z_y - max_{i != y} z_i`` per sample (<= 0 exactly when the sample is misclassified, ties included)."""
    z_y = logits.gather(1, y[:, None]).squeeze(1)
    return z_y - logits.scatter(1, y[:, None], float("-inf")).amax(1)


# ------------------------------------------------------------------------------------------ chunked runner
BATCH_SEED_STRIDE = 1_000_003  # chunk k of an attack draws from seed + k * this (chunk 0: the seed itself)


def _run(core: Callable[..., Any], model: nn.Module, x: torch.Tensor, y: torch.Tensor,
         seed: int | None, batch_size: int | None, gen: torch.Generator | None = None, *,
         per_sample: dict[str, torch.Tensor | None] | None = None, **kw: Any) -> Any:
    """Run ``core`` over x in chunks on the model's device, in eval mode with frozen parameters.

    Randomness: a given ``gen`` serves every chunk in order; otherwise chunk ``k`` draws from its own
    generator seeded with ``seed + k * BATCH_SEED_STRIDE`` (as :func:`robustest.attacks.attack` does), so a
    chunk's result depends only on its position, not on what ran before it.
    ``per_sample``: tensors of length N (e.g. target classes as int64, per-sample radii as float) sliced with
    the chunk and passed to ``core`` by name (None values are passed as None).
    Returns the adversarial images N x C x H x W on x's device; when ``core`` returns a tuple (x_adv, then
    per-sample tensors [n] or None), the tuple over all chunks (those tensors joined, on x's device)."""
    device = resolve_device(model)
    per_chunk = gen is None and seed is not None
    if gen is None:
        gen = make_generator(seed, device)
    elif gen.device.type != device.type:
        raise ConfigError(f"generator is on {gen.device} but the model is on {device}: create it with "
                          "robustest.core.seeding.make_generator(seed, device)")
    n = x.shape[0]
    if n == 0:
        return x.clone()
    bs = n if batch_size is None else int(batch_size)
    if bs < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    per_sample = per_sample or {}
    out = torch.empty_like(x)
    more: list[list[Any]] | None = None
    with eval_mode(model), frozen_params(model):
        for k, s in enumerate(range(0, n, bs)):
            e = min(s + bs, n)
            if per_chunk and k:
                gen = make_generator(int(seed) + k * BATCH_SEED_STRIDE, device)  # type: ignore[arg-type]
            xb = x[s:e].to(device, torch.float32).detach()
            yb = y[s:e].to(device, torch.long)
            extra = {k: (None if v is None else v[s:e].to(device, v.dtype if v.is_floating_point() else torch.long))
                     for k, v in per_sample.items()}
            res = core(model, xb, yb, gen, **extra, **kw)
            if isinstance(res, tuple):
                res, rest = res[0], res[1:]
                more = more or [[] for _ in rest]
                for parts, t in zip(more, rest):
                    parts.append(t)
            out[s:e] = res.detach().to(out.device, out.dtype)
    if more is None:
        return out
    return (out, *(None if parts[0] is None else torch.cat(parts).to(out.device) for parts in more))
