"""Targeted enhancement (METHODS B3): training with AugMix + Jensen-Shannon consistency + an adversarial
copy of each image, the augmentation pool extended by the corruptions found to be weaknesses. The epochs run
through :func:`robustest.train.engine.run_epochs` (:class:`_Run` is enhance's
:class:`~robustest.train.engine.EpochLoop`); each batch's loss is the ``augmix-jsd-adv`` objective's
(:mod:`robustest.weakrobust.enhance_objective`), looked up in :mod:`robustest.train.objectives`' registry when
enhance starts."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from robustest import attacks
from robustest.core import distributed, reprs
from robustest.core.batching import DataLike, image_shape
from robustest.core.devices import channels_last_wanted, resolve_device
from robustest.core.distributed import Shard
from robustest.core.errors import ConfigError
from robustest.core.modelcall import set_mode
from robustest.core.options import spec
from robustest.core.seeding import seed_everything
from robustest.core.validation import check_eps
from robustest.models.checkpoints import clone_model, state_fingerprint
from robustest.train import TrainData, objectives
from robustest.train.engine import Batch, EpochLoop, run_epochs
from robustest.train.objectives import Objective, StepContext, StepOutput
from robustest.train.recipes import Recipe, as_recipe, make_optimizer
from robustest.train.state import StateFile, check_state_dir, in_state_dir, restore_rng, rng_state
from robustest.weakrobust.augment import augmentation_pool
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
        return reprs.one_line(self, epochs=len(self.epochs), loss=last.get("loss"), ce=last.get("ce"),
                              jsd=last.get("jsd"), adv=last.get("adv"), pool=len(self.pool),
                              weaknesses=len(self.weaknesses), seconds=self.seconds)

    def to_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "pool": self.pool, "weaknesses": self.weaknesses, "config": self.config,
                "seconds": self.seconds}


@dataclass
class _Run(EpochLoop):
    """One enhancement run's working state, shared by its epochs, and its epoch hooks
    (:class:`~robustest.train.engine.EpochLoop`): the model (and its DDP wrapper, the one that steps), the
    optimiser, the data source, the random stream of the AugMix draws and the pool's operations, the adversarial
    copies made once (``x_adv_all``, N x C x H x W on CPU) or the frozen starting model they are made against,
    the objective and the settings (``config``: the objective's ``ctx.settings``); the history, the resume file
    and what it must match; the running epoch's sums of the loss terms."""

    model: nn.Module
    step_model: nn.Module
    opt: torch.optim.Optimizer
    source: TrainData
    rng: np.random.Generator
    ops: list[Callable]
    dev: torch.device
    shard: Shard
    num_classes: int
    x_adv_all: torch.Tensor | None
    frozen: nn.Module | None
    objective: Objective
    config: dict[str, Any]
    history: list[dict[str, float]] = field(default_factory=list)
    state: StateFile | None = None
    seconds_before: float = 0.0
    t0: float = 0.0
    tot: dict[str, float] = field(default_factory=dict)
    seen: int = 0

    @property
    def use_ddp(self) -> bool:
        return self.shard.world_size > 1

    def begin_epoch(self, epoch: int) -> None:
        self.tot, self.seen = {"loss": 0.0, "ce": 0.0, "jsd": 0.0, "adv": 0.0}, 0

    def batches(self, epoch: int) -> Iterable[Batch]:
        return self.source.indexed_epoch(epoch, self.num_classes)

    def forward(self, epoch: int, i: int, batch: Batch) -> tuple[torch.Tensor, StepOutput]:
        """Step ``i``'s batch through the objective's step (the model that steps, :meth:`context`) -> (loss, the
        step's output, its terms ce, jsd, adv)."""
        ib, xb, yb = batch
        xb, yb = xb.to(self.dev), yb.to(self.dev).long()
        out = self.objective.step(self.step_model, xb, yb, None, self.context(epoch, i, ib))
        return out.loss, out

    def context(self, ep: int, s: int, ib: torch.Tensor | None) -> StepContext:
        """What step ``s`` of epoch ``ep`` hands the objective besides its batch (positions ``ib``): the settings,
        the adversarial copy's radius and step, and ``extra``: the AugMix stream and operations, the batch's
        stored adversarial copy (on the device) or else the model and seed its copy is made with."""
        c = self.config
        extra: dict[str, Any] = {"rng": self.rng, "ops": self.ops, "adv": None}
        if c["adversarial"]:
            if self.x_adv_all is not None:
                extra["adv"] = self.x_adv_all[ib].to(self.dev)
            else:
                extra["attack_model"] = self.frozen if self.frozen is not None else self.model
                extra["attack_seed"] = (c["seed"] + ep * self.source.n + s * c["batch_size"]
                                        + self.shard.rank * 7_919)
        return StepContext(c, eps=c["eps"], alpha=c["adv_alpha"], extra=extra)

    def diverged(self, epoch: int, i: int, loss: torch.Tensor, aux: StepOutput) -> str:
        ce, jsd, adv = (_term(aux, k) for k in ("ce", "jsd", "adv"))
        return (f"enhance diverged at epoch {epoch}, step {i + 1}: the loss is {float(loss.detach())} (cross-entropy "
                f"{ce}, JSD {jsd}, adversarial {adv}); lower the learning rate (lr={self.config['lr']:g}) or the "
                "loss weights")

    def update(self, epoch: int, i: int, batch: Batch, loss: torch.Tensor, aux: StepOutput) -> None:
        """The optimiser step (the loss weighted by the rank's share under DDP) and the epoch's sums."""
        self.opt.zero_grad(set_to_none=True)
        (loss * self.source.batch_weight if self.use_ddp else loss).backward()
        self.opt.step()
        if aux.restore is not None:  # what the objective asked to undo after the step (AWP's weight perturbation)
            aux.restore()
        m = len(batch[2])
        self.seen += m
        self.tot["loss"] += float(loss.detach()) * m
        for k_ in ("ce", "jsd", "adv"):
            self.tot[k_] += _term(aux, k_) * m

    def summary(self, epoch: int) -> dict[str, float]:
        """The epoch's record: epoch and the mean loss and its terms over every rank's samples (loss, ce, jsd,
        adv); the engine adds the seconds it took."""
        tot, n = self.tot, self.seen
        if self.use_ddp:  # the epoch's means over every rank's samples
            sums = distributed.all_reduce_sum(torch.tensor([*tot.values(), float(n)], dtype=torch.float64,
                                                           device=self.dev)).cpu().tolist()
            tot, n = dict(zip(tot, sums[:-1])), int(sums[-1])
        return {"epoch": epoch, **{k_: v / max(n, 1) for k_, v in tot.items()}}

    def record(self, epoch: int, record: dict[str, float], seconds: float) -> None:
        record["seconds"] = seconds
        self.history.append(record)

    def save(self, epoch: int) -> None:
        if self.state is not None:
            _save_state(self, self.state, epoch)


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
    eps: float | None = None,
    adv_steps: int = 10,
    adv_alpha: float | None = None,
    adv_source: str = "offline",
    width: int = 3,
    severity: float = 3.0,
    recipe: Recipe | None = None,
    batch_size: int = 64,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    state_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    ddp: bool | None = None,
) -> EnhanceResult:
    """Targeted enhancement (METHODS B3): train ``model`` in place on labelled ``train`` with
    ``L = CE(x) + jsd_weight * JSD(p(x), p(aug1), p(aug2)) + adv_weight * CE(x_adv)``.

    ``aug1``/``aug2`` are two independent AugMix mixtures over :data:`AUGMIX_OPS` extended by the corruption
    types in ``weaknesses`` (names from ``robustest.corruptions``; attack names are accepted and covered by
    the adversarial term; a :class:`ValidationResult` contributes its ``weaknesses()``). ``x_adv``: L-inf
    PGD (radius ``eps``, default the middle of :func:`default_eps_grid`; ``adv_steps`` steps of ``adv_alpha``,
    default ``eps / 4``) against the model as it is at the start (``adv_source="offline"``, the reference
    recipe) or against the current model every batch (``"online"``). ``augmix=False`` drops the JSD term
    (adversarial fine-tuning only); ``adversarial=False`` drops ``x_adv`` (AugMix only); both False is
    plain training with the same budget. ``recipe`` (:class:`robustest.train.recipes.Recipe`; None: Adam 1e-3): the
    optimiser of the update, its rate and weight decay (a schedule, warm-up or other recipe option is refused).
    The model ends in eval mode.

    ``state_dir``: after every epoch the model, optimiser and random states are saved atomically to
    ``state_dir/enhance_state.pt``; a later call with the same settings, starting model and data size and
    ``resume=True`` continues after the last saved epoch (bit-exact on the in-memory path; a DataLoader's own
    shuffling restarts), another one is refused with one line (as a state there without ``resume``).

    Under torchrun with several ranks (``ddp=None``, the default, or True) the model trains with
    DistributedDataParallel as :func:`robustest.train.fit` does: each rank takes its part of every global
    batch of ``batch_size`` (its own AugMix draws and PGD starts), the loss is reweighted so that the averaged
    gradient is the global batch's, and every rank ends with the same weights, close to (not equal to) one
    process's. ``ddp=False``: every rank trains the whole model by itself (equal to one process).
    """
    _check_settings(epochs, adv_source, jsd_weight, adv_weight, eps, adv_alpha, adv_steps, width, batch_size,
                    severity)
    opts = as_recipe(recipe).require_only(ENHANCE_RECIPE_FIELDS, "enhance").check(epochs)
    check_state_dir("enhance", state_dir, resume)
    weak = [str(w) for w in ((weaknesses.weaknesses() if isinstance(weaknesses, ValidationResult) else weaknesses)
                             or [])]
    pool_names, ops = augmentation_pool(weak)
    dev = resolve_device(model, device)
    model.to(dev)
    seed_everything(seed)
    shard = Shard.current() if ddp is not False else Shard()
    source = TrainData(train, batch_size, seed, shard=shard)
    num_classes = source.check(model, dev)
    radius = float(eps) if eps is not None else default_eps_grid(image_shape(train)[0])[1]
    alpha = float(adv_alpha) if adv_alpha is not None else radius / 4
    t0 = time.perf_counter()
    x_adv_all, frozen = (_offline_adversarial(model, source, dev, radius, alpha, adv_steps, seed)
                         if adversarial and adv_source == "offline" else (None, None))
    opt, rng, step_model = _optimiser_and_streams(model, dev, shard, opts, seed)
    config = {"epochs": epochs, "augmix": augmix, "adversarial": adversarial, "jsd_weight": jsd_weight,
              "adv_weight": adv_weight, "eps": radius, "adv_steps": adv_steps, "adv_alpha": alpha,
              "adv_source": adv_source, "width": width, "severity": severity, "lr": opts.lr,
              **_optimizer_config(opts), "batch_size": batch_size, "seed": seed}
    run = _Run(model, step_model, opt, source, rng, ops, dev, shard, num_classes, x_adv_all, frozen,
               objectives.get("augmix-jsd-adv"), config)
    run.state = in_state_dir("enhance", state_dir, resume, _resume_settings(run, config, pool_names),
                             fix="delete it to start again")
    run.history, start, run.seconds_before = _resume(run)
    run.t0 = t0
    run_epochs(run, range(start, epochs + 1), ddp=run.use_ddp, progress=progress, desc="enhance")
    set_mode(model, False)
    return EnhanceResult(epochs=run.history, pool=pool_names, weaknesses=weak, config=config,
                         seconds=run.seconds_before + time.perf_counter() - t0)


#: the options of :func:`enhance` a command line offers, with their flags (``robustest enhance``)
#: the Recipe fields enhance honours (its loop has no schedule, precision or augmentation of its own)
ENHANCE_RECIPE_FIELDS = ("optimizer", "lr", "weight_decay", "momentum", "nesterov", "decay_norm_bias")
ENHANCE_OPTIONS = {
    "jsd_weight": spec("non-negative", "weight of the JSD term"),
    "adv_weight": spec("non-negative", "weight of CE(x_adv)"),
    "eps": spec("linf-eps", "L-inf radius of the adversarial copy's PGD", shown="0.1 grey, 4/255 colour"),
    "adv_steps": spec("positive-int", "PGD steps"),
    "adv_source": spec("choice", "PGD against the starting model once (offline) or the current model per batch",
                       choices=("offline", "online")),
    "batch_size": spec("positive-int", "batch size"),
}


def _check_settings(epochs: int, adv_source: str, jsd_weight: float, adv_weight: float, eps: float | None,
                    adv_alpha: float | None, adv_steps: int, width: int, batch_size: int, severity: float) -> None:
    """A one-line ConfigError for the first of :func:`enhance`'s settings that is out of its range."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ConfigError(f"epochs must be an integer >= 0, got {epochs!r}")
    if adv_source not in ("offline", "online"):
        raise ConfigError(f"adv_source must be 'offline' or 'online', got {adv_source!r}")
    for name, v in (("jsd_weight", jsd_weight), ("adv_weight", adv_weight)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"{name} must be a finite number >= 0, got {v!r}")
    check_eps("eps", eps, allow_none=True)
    if adv_alpha is not None and not (isinstance(adv_alpha, (int, float)) and 0 < adv_alpha <= 1):
        raise ConfigError(f"adv_alpha must be a step in (0, 1], got {adv_alpha!r}")
    for name, v, hi in (("adv_steps", adv_steps, 10_000), ("width", width, 100), ("batch_size", batch_size, 10**7)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
            raise ConfigError(f"{name} must be an integer in [1, {hi}], got {v!r}")
    if isinstance(severity, bool) or not isinstance(severity, (int, float)) or not 0 < severity <= 10:
        raise ConfigError(f"severity must be a number in (0, 10] (AugMix's scale), got {severity!r}")


def _offline_adversarial(model: nn.Module, source: TrainData, dev: torch.device, eps: float, alpha: float,
                         steps: int, seed: int) -> tuple[torch.Tensor | None, nn.Module | None]:
    """The offline recipe's adversary -> (x_adv_all, frozen): stored samples are attacked once, against the
    starting model (x_adv_all: N x C x H x W on CPU, in data-set order); a DataLoader's items change every epoch
    (augmentation), so its batches are attacked later against ``frozen``, an eval-mode copy of the start model."""
    if source.loader is None:
        parts = []
        for s in range(0, source.n, 256):
            xs, ys = source.gather(torch.arange(s, min(s + 256, source.n)))
            parts.append(attacks.pgd(model, xs.to(dev), ys.to(dev), eps=eps, alpha=alpha, steps=steps,
                                     seed=seed + s).detach().cpu())
        return torch.cat(parts), None
    frozen = clone_model(model)
    set_mode(frozen, False)
    return None, frozen


def _optimizer_config(opts: Recipe) -> dict[str, Any]:
    """The optimiser settings a run records beside its rate: none when the recipe sets nothing but the rate (Adam
    without weight decay, the default), else the optimiser, its weight decay and where it applies, and SGD's
    momentum and Nesterov."""
    if set(opts.given()) <= {"lr"}:
        return {}
    d = {"optimizer": opts.optimizer, "weight_decay": opts.weight_decay, "decay_norm_bias": opts.decay_norm_bias}
    if opts.optimizer == "sgd":
        d.update(momentum=opts.momentum, nesterov=opts.nesterov)
    return d


def _optimiser_and_streams(model: nn.Module, dev: torch.device, shard: Shard, opts: Recipe, seed: int
                           ) -> tuple[torch.optim.Optimizer, np.random.Generator, nn.Module]:
    """The optimiser of the recipe ``opts`` (:func:`robustest.train.recipes.make_optimizer`), the AugMix random
    stream and the module that steps (the model, or its DDP wrapper under several ranks)."""
    opt = make_optimizer(model, opts)
    # under DDP each rank draws its own augmentations and PGD starts (rank 0's are one process's)
    rng = np.random.default_rng([seed, shard.rank] if shard.rank else seed)
    channels_last_wanted(model, dev)  # a conv net on CUDA goes channels_last before DDP lays out its buckets
    step_model: nn.Module = model
    if shard.world_size > 1:  # gradients averaged over the ranks; rank 0's weights and buffers broadcast at the start
        step_model = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    return opt, rng, step_model


def _resume_settings(run: _Run, config: dict[str, Any], pool_names: list[str]) -> dict[str, Any]:
    """What a saved state must match to be continued: the settings, the pool, the data size, the starting model
    (and under DDP the number of ranks)."""
    return {**config, "pool": pool_names, "n": run.source.n, "model": state_fingerprint(run.model),
            # DDP training depends on the number of ranks (each rank's share of a batch)
            **({"world_size": run.shard.world_size} if run.use_ddp else {})}


def _resume(run: _Run) -> tuple[list[dict[str, float]], int, float]:
    """Load the run's saved state (when there is one) into it -> (history, first epoch to train, seconds spent
    before); no history and a start at epoch 1 when there is none. With a state file every rank waits until all
    have read it."""
    history: list[dict[str, float]] = []
    start, seconds_before = 1, 0.0
    if run.state is None:
        return history, start, seconds_before
    if run.state.path.is_file():
        st = run.state.load()
        run.model.load_state_dict(st["model"])
        run.opt.load_state_dict(st["optimizer"])
        restore_rng(st["rng"], run.dev, {"data": run.source.gen}, run.rng)
        history = [dict(e) for e in st["history"]]
        start, seconds_before = int(st["epoch"]) + 1, float(st["seconds"])
    distributed.barrier()  # every rank has read the state before rank 0 writes the next one
    return history, start, seconds_before


def _save_state(run: _Run, state: StateFile, ep: int) -> None:
    """Save the run after epoch ``ep`` (:mod:`robustest.train.state`): what :func:`_resume` needs to continue
    bit-exactly (the weights, the optimiser, the AugMix stream, torch's and the data order's random states)."""
    state.save(ep, model=run.model, optimizer=run.opt, rng=rng_state(run.dev, {"data": run.source.gen}, run.rng),
               history=run.history, seconds=run.seconds_before + time.perf_counter() - run.t0)


def _term(out: StepOutput, name: str) -> float:
    """The value of the step's loss term ``name`` (0 when its objective gives none)."""
    term = out.terms.get(name)
    return 0.0 if term is None else float(term.detach())
