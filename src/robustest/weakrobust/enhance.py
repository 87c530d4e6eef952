"""Targeted enhancement (METHODS B3): training with AugMix + Jensen-Shannon consistency + an adversarial
copy of each image, the augmentation pool extended by the corruptions found to be weaknesses."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from robustest import _repr
from robustest.errors import ConfigError, DataError
from robustest.runtime import (
    DataLike,
    as_tensors,
    check_images,
    check_labels,
    forward,
    make_generator,
    resolve_device,
    seed_everything,
)
from robustest.runtime import progress as progress_bar
from robustest.weakrobust.augment import _augmix, _jsd, augmentation_pool
from robustest.weakrobust.validation import ValidationResult, default_eps_grid


@dataclass
class EnhanceResult:
    """What :func:`enhance` did: per-epoch losses, the augmentation pool, the weaknesses used, timings."""

    epochs: list[dict[str, float]]
    pool: list[str]
    weaknesses: list[str]
    config: dict[str, Any]
    seconds: float

    def __repr__(self) -> str:
        last = self.epochs[-1] if self.epochs else {}
        return _repr.one_line(self, epochs=len(self.epochs), loss=last.get("loss"), ce=last.get("ce"),
                              jsd=last.get("jsd"), adv=last.get("adv"), pool=len(self.pool),
                              weaknesses=len(self.weaknesses), seconds=self.seconds)

    def to_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "pool": self.pool, "weaknesses": self.weaknesses, "config": self.config,
                "seconds": self.seconds}


def enhance(
    model: nn.Module,
    train: DataLike,
    weaknesses: Sequence[str] | ValidationResult | None = (),
    epochs: int = 1,
    *,
    augmix: bool = True,
    adversarial: bool = True,
    jsd_weight: float = 6.0,
    adv_weight: float = 0.5,
    adv_eps: float | None = None,
    adv_steps: int = 10,
    adv_alpha: float | None = None,
    adv_source: str = "offline",
    width: int = 3,
    severity: float = 3.0,
    lr: float = 1e-3,
    batch_size: int = 64,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> EnhanceResult:
    """Targeted enhancement (METHODS B3): train ``model`` in place on labelled ``train`` with
    ``L = CE(x) + jsd_weight * JSD(p(x), p(aug1), p(aug2)) + adv_weight * CE(x_adv)``.

    ``aug1``/``aug2`` are two independent AugMix mixtures over :data:`AUGMIX_OPS` extended by the corruption
    types in ``weaknesses`` (names from ``robustest.corruptions``; attack names are accepted and covered by
    the adversarial term; a :class:`ValidationResult` contributes its ``weaknesses()``). ``x_adv``: L-inf
    PGD (``adv_eps``, default the middle of :func:`default_eps_grid`; ``adv_steps`` steps of ``adv_alpha``,
    default ``adv_eps / 4``) against the model as it is at the start (``adv_source="offline"``, the reference
    recipe) or against the current model every batch (``"online"``). ``augmix=False`` drops the JSD term
    (adversarial fine-tuning only); ``adversarial=False`` drops ``x_adv`` (AugMix only); both False is
    plain training with the same budget. The model ends in eval mode.
    """
    from robustest import attacks as atk_mod

    if epochs < 0:
        raise ConfigError(f"epochs must be >= 0, got {epochs}")
    if adv_source not in ("offline", "online"):
        raise ConfigError(f"adv_source must be 'offline' or 'online', got {adv_source!r}")
    if isinstance(weaknesses, ValidationResult):
        weaknesses = weaknesses.weaknesses()
    weak = [str(w) for w in (weaknesses or [])]
    pool_names, ops = augmentation_pool(weak)
    x, y = as_tensors(train)
    if y is None:
        raise DataError("enhance needs labelled training data")
    check_images(x, "train images")
    y = check_labels(y, x.shape[0], name="train labels").long()
    dev = resolve_device(model, device)
    model.to(dev)
    eps = float(adv_eps) if adv_eps is not None else default_eps_grid(x.shape[1])[1]
    alpha = float(adv_alpha) if adv_alpha is not None else eps / 4
    t0 = time.perf_counter()
    seed_everything(seed)
    x_adv_all = None
    if adversarial and adv_source == "offline":
        parts = []
        for s in range(0, x.shape[0], 256):
            parts.append(atk_mod.pgd(model, x[s:s + 256].to(dev), y[s:s + 256].to(dev), eps=eps, alpha=alpha,
                                     steps=adv_steps, seed=seed + s).detach().cpu())
        x_adv_all = torch.cat(parts)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    gen = make_generator(seed)
    rng = np.random.default_rng(seed)
    n = x.shape[0]
    history = []
    for ep in progress_bar(range(1, epochs + 1), enabled=progress, desc="enhance", unit="epoch"):
        te = time.perf_counter()
        perm = torch.randperm(n, generator=gen)
        tot = {"loss": 0.0, "ce": 0.0, "jsd": 0.0, "adv": 0.0}
        for s in range(0, n, batch_size):
            ib = perm[s:s + batch_size]
            xb, yb = x[ib].to(dev), y[ib].to(dev)
            inputs = [xb]
            if augmix:
                inputs += [_augmix(xb, ops, rng, width, -1, severity), _augmix(xb, ops, rng, width, -1, severity)]
            if adversarial:
                if x_adv_all is not None:
                    inputs.append(x_adv_all[ib].to(dev))
                else:
                    inputs.append(atk_mod.pgd(model, xb, yb, eps=eps, alpha=alpha, steps=adv_steps,
                                              seed=seed + ep * n + s).detach())
            model.train()
            logits = forward(model, torch.cat(inputs)).split(xb.shape[0])
            ce = F.cross_entropy(logits[0], yb)
            loss = ce
            jsd = adv = torch.zeros((), device=dev)
            if augmix:
                jsd = _jsd(logits[:3])
                loss = loss + jsd_weight * jsd
            if adversarial:
                adv = F.cross_entropy(logits[-1], yb)
                loss = loss + adv_weight * adv
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            m = len(ib)
            for k_, v in (("loss", loss), ("ce", ce), ("jsd", jsd), ("adv", adv)):
                tot[k_] += float(v.detach()) * m
        history.append({"epoch": ep, **{k_: v / n for k_, v in tot.items()}, "seconds": time.perf_counter() - te})
    model.eval()
    config = {"epochs": epochs, "augmix": augmix, "adversarial": adversarial, "jsd_weight": jsd_weight,
              "adv_weight": adv_weight, "adv_eps": eps, "adv_steps": adv_steps, "adv_alpha": alpha,
              "adv_source": adv_source, "width": width, "severity": severity, "lr": lr, "batch_size": batch_size,
              "seed": seed}
    return EnhanceResult(epochs=history, pool=pool_names, weaknesses=weak, config=config,
                         seconds=time.perf_counter() - t0)
