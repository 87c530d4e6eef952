"""Adversarial attacks, batched, seeded, behind one registry.

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
apgd_dlr   APGD on the Difference of Logits Ratio loss (Croce & Hein 2020).
apgd_t     Targeted APGD on the targeted DLR loss over the top-9 other classes (AutoAttack's APGD-T).
fab_t      FAB-T: targeted minimum-norm Fast Adaptive Boundary attack (AutoAttack's FAB-T).
fab        Untargeted FAB (closest linearised boundary; one backward pass per class and step).
square     Square Attack (Andriushchenko et al. 2020): score-based black-box random search, L-inf or L2.
=========  ==========================================================================================

The gradient attacks (fgsm, pgd, bim, rfgsm, mifgsm) also take ``target=`` (a class or int64 [N]) for their
targeted variants; apgd_t and fab_t take it to attack given classes instead of the most likely ones. :func:`pgd`
also takes per-sample radii (``eps`` a tensor [N]), a per-sample stopping rule (``stop=``, a :data:`StopRule`:
stopped samples leave the active set) and ``return_details=True`` for a :class:`PGDDetails` (gradient
evaluations per sample, whether any evaluated point succeeded): the inner maximisation of adversarial training
and the white-box radius search of ``weakrobust`` run on it.

:func:`attack` runs any of them by name over a data set in batches and returns an :class:`AttackResult` with the
adversarial images, per-sample success (prediction on the adversarial image differs from the label), clean
correctness and perturbation norms, so callers never recompute them. :func:`robustest.evaluate.evaluate` runs
the AutoAttack ensemble (apgd -> apgd_t -> fab_t -> square) on top of them.

The model's train/eval mode and its parameters' ``requires_grad`` flags are restored after every call; attacks
run the model in eval mode and take gradients with respect to the input only. Randomness comes from a
``torch.Generator`` on the model's device seeded with ``seed``: the same seed (and batch size) gives the same
result. Losses are summed per-sample losses, so a sample's gradient does not depend on the batch it is in.

Float note: L-inf projections clamp to ``[max(x - eps, 0), min(x + eps, 1)]``, so ``|x_adv - x|`` may exceed
``eps`` by one float rounding (about 6e-8 for values in [0, 1]).

Layout: ``_core`` (validation, losses, projections, chunked runner), ``gradient`` (FGSM, PGD, BIM, R+FGSM,
MI-FGSM), ``apgd`` (APGD-CE, APGD-DLR, APGD-T), ``fab`` (FAB, FAB-T), ``square``, ``cw``, each with the
:class:`Attack` records of its attacks (``RECORDS``: threat models, eps-ball or not, fewest classes, default
steps, scale-free loss); ``registry`` (the :class:`Attack` record, :func:`register` / :func:`unregister` /
:func:`registered` to add one from outside, :func:`get`, :func:`names`); this module registers the built-ins and
holds :func:`attack` and :class:`AttackResult`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from robustest.attacks import apgd as apgd_module
from robustest.attacks import cw, gradient
from robustest.attacks import fab as fab_module
from robustest.attacks import square as square_module
from robustest.attacks._core import (  # noqa: F401 - re-exported for callers and tests
    _DEFAULT_CHUNK,
    BATCH_SEED_STRIDE,
    NORMS,
    _check_non_negative,
    _check_steps,
    _flat_norm,
    _keep_stronger,
    _num_classes,
    _prepare,
    _run,
    check_norm,
    input_gradient,
    lp_norm,
    margin,
    project,
    random_point,
)
from robustest.attacks.apgd import apgd, apgd_dlr, apgd_t
from robustest.attacks.bpda import BPDA, straight_through, with_bpda
from robustest.attacks.cw import cw_l2
from robustest.attacks.fab import fab, fab_t
from robustest.attacks.gradient import PGDDetails, StopRule, bim, fgsm, mifgsm, pgd, rfgsm
from robustest.attacks.registry import (
    ATTACKS,
    Attack,
    attack_function,
    canonical_name,
    describe,
    get,
    names,
    register,
    registered,
    unregister,
)
from robustest.attacks.square import square
from robustest.core.batching import DataLike
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError
from robustest.core.inputs import check_images, check_labels
from robustest.core.modelcall import eval_mode, forward
from robustest.core.seeding import make_generator

__all__ = [
    "ATTACKS",
    "Attack",
    "AttackResult",
    "BPDA",
    "PGDDetails",
    "StopRule",
    "apgd",
    "apgd_dlr",
    "apgd_t",
    "attack",
    "attack_function",
    "bim",
    "canonical_name",
    "check_norm",
    "cw_l2",
    "describe",
    "fab",
    "fab_t",
    "fgsm",
    "get",
    "input_gradient",
    "lp_norm",
    "margin",
    "mifgsm",
    "names",
    "pgd",
    "project",
    "random_point",
    "register",
    "registered",
    "rfgsm",
    "square",
    "straight_through",
    "unregister",
    "with_bpda",
]


# ------------------------------------------------------------------------------------------------- registry
for _module in (gradient, cw, apgd_module, fab_module, square_module):
    for _record in _module.RECORDS:
        register(_record)


# --------------------------------------------------------------------------------------------- attack()
@dataclass
class AttackResult:
    """Outcome of :func:`attack` on N samples (all per-sample tensors are 1-D of length N, on the CPU).

    adv: adversarial images N x C x H x W (the clipped, valid images; on the input's device).
    y: the labels attacked. clean_pred / adv_pred: the model's predictions on x and adv.
    success: adv_pred != y. clean_correct: clean_pred == y.
    linf / l2: per-sample L-inf and L2 norms of adv - x.
    target: the target classes of a targeted attack (int64 [N]; None for an untargeted one); then
    ``target_success`` (adv_pred == target) is what the attack aimed for.
    index: int64 [N], the position in the data set of each row (rows follow the data's order, which for a
    shuffled DataLoader is its sampler's draw).
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
    target: torch.Tensor | None = None
    index: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.success.shape[0])

    def __repr__(self) -> str:
        from robustest.core.reprs import one_line, shape

        return one_line(self, name=self.name, n=len(self), eps=self.params.get("eps"),
                        success_rate=self.success_rate if len(self) else None,
                        robust_accuracy=self.robust_accuracy if len(self) else None, adv=shape(self.adv),
                        max_linf=float(self.linf.max()) if len(self) else None, seconds=self.seconds)

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
    def target_success(self) -> torch.Tensor | None:
        """Samples predicted as their target on adv (BoolTensor[N]); None for an untargeted attack."""
        return None if self.target is None else self.adv_pred == self.target

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
        extra = {}
        if self.target is not None:
            extra["target_success_rate"] = float(self.target_success.double().mean()) if len(self) else float("nan")
        return {
            "attack": self.name, "params": dict(self.params), "n": len(self), **extra,
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
    own predictions are attacked), an ``(x, y)`` pair, a ``Dataset`` or a ``DataLoader`` (streamed batch by
    batch). ``kw`` are the attack's parameters (eps, steps, alpha, norm, restarts, ...). Batch ``k`` (images
    ``k * batch_size`` on in the data's order; a DataLoader's own batches) draws its random numbers from a
    generator on the model's device seeded with ``seed + k * BATCH_SEED_STRIDE``, so the result equals the
    attack function's with the same seed and ``batch_size``, and under torchrun (each rank attacks whole
    batches of its share; the results are gathered on every rank) one process's. ``progress`` shows a
    progress bar over batches. ``target`` (targeted attacks) may be one class or int64 [N] (by position in
    the data set). Returns an :class:`AttackResult`.
    """
    from robustest.core import distributed
    from robustest.core.batching import batch_origin, iter_batches, num_samples
    from robustest.core.progress import progress as _progress

    entry = get(name)
    if "generator" in kw or "batch_size" in kw:
        raise ConfigError("attack() takes seed and batch_size itself; do not pass generator")
    if any(k in kw for k in ("stop", "return_details", "track_success")) or any(
            isinstance(kw.get(k), torch.Tensor) and kw[k].dim() > 0 for k in ("eps", "alpha")):
        raise ConfigError("attack() takes one eps and returns images: call robustest.attacks.pgd itself for "
                          "per-sample eps, stopping rules or details")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    data = (x_or_data, y) if isinstance(x_or_data, torch.Tensor) else x_or_data
    if isinstance(x_or_data, torch.Tensor):
        check_images(x_or_data)
    n = num_samples(data)
    device = resolve_device(model)
    k_classes = _num_classes(model)
    if y is not None and not isinstance(x_or_data, torch.Tensor):
        raise ConfigError("give labels y only with an image tensor; a data set brings its own labels")
    if y is not None:
        y = check_labels(torch.as_tensor(y), n, k_classes)
        data = (x_or_data, y)
    target = kw.pop("target", None)
    if target is not None:
        if isinstance(target, bool) or not isinstance(target, (int, torch.Tensor)):
            raise ConfigError(f"target must be a class index or a tensor of N class indices, got {target!r}")
        if isinstance(target, int):
            target = torch.full((n,), target, dtype=torch.long)
        target = check_labels(target, n, k_classes, name="target").long()
    t0 = time.perf_counter()
    advs, clean_preds, adv_preds, ys, xs_delta, idxs = [], [], [], [], [], []
    shard = distributed.Shard.current()
    # batch ordinals count in the data's order (a DataLoader yields its own batches, of its own size)
    step, pos = batch_origin(data, batch_size, shard)
    batches = iter_batches(data, batch_size, with_index=True, shard=shard)
    with distributed.sharded_work():  # each rank attacks its share (work counters add the ranks up)
        for idx, xb, yb in _progress(batches, enabled=progress, desc=canonical_name(name),
                                     total=-(-n // step), unit="batch"):
            xb = check_images(xb).to(device)
            k, pos = pos // step, pos + len(xb)
            idxs.append(idx.cpu().long())
            gen = make_generator(None if seed is None else int(seed) + k * BATCH_SEED_STRIDE, device)
            with eval_mode(model), torch.no_grad():
                cp = forward(model, xb).argmax(1)
            yb = cp if yb is None else check_labels(torch.as_tensor(yb), len(xb), k_classes).to(device).long()
            if target is not None:
                kw["target"] = target[idx].to(device)
            adv = entry.fn(model, xb, yb, batch_size=None, generator=gen, **kw)
            with eval_mode(model), torch.no_grad():
                ap = forward(model, adv).argmax(1)
            advs.append(adv.detach())
            xs_delta.append((adv.detach() - xb).flatten(1).cpu())
            clean_preds.append(cp.cpu())
            adv_preds.append(ap.cpu())
            ys.append(yb.cpu())
    kw.pop("target", None)
    out_dev = x_or_data.device if isinstance(x_or_data, torch.Tensor) else torch.device("cpu")
    cat = (lambda ts: torch.cat(ts) if ts else None)  # noqa: E731
    parts = distributed.all_gather_cat({"adv": cat([a.to(out_dev) for a in advs]), "clean": cat(clean_preds),
                                        "advp": cat(adv_preds), "y": cat(ys), "delta": cat(xs_delta),
                                        "index": cat(idxs)})
    if parts["adv"] is None:  # no samples at all
        shape = (0, *(x_or_data.shape[1:] if isinstance(x_or_data, torch.Tensor) else ()))
        empty = torch.empty(0, dtype=torch.long)
        parts = {"adv": torch.empty(shape), "clean": empty, "advp": empty, "y": empty, "delta": torch.empty(0, 0),
                 "index": empty}
    adv_all, clean_pred, adv_pred, y_cpu = parts["adv"].to(out_dev), parts["clean"], parts["advp"], parts["y"].long()
    delta = parts["delta"]
    params = {**kw, "seed": seed, "batch_size": batch_size}
    if target is not None:
        params["target"] = "per-sample"
    return AttackResult(
        name=canonical_name(name), adv=adv_all, y=y_cpu, success=adv_pred != y_cpu,
        clean_correct=clean_pred == y_cpu, clean_pred=clean_pred, adv_pred=adv_pred,
        linf=delta.abs().amax(1) if delta.shape[1] else delta.sum(1), l2=delta.norm(p=2, dim=1),
        params=params, seconds=time.perf_counter() - t0, target=None if target is None else target.cpu(),
        index=parts["index"].long(),
    )
