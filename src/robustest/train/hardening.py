"""Adversarial fine-tuning ("hardening"): train a model on adversarial examples generated against the model
as it learns, with any objective of :mod:`robustest.train.objectives` (pgd-at, trades, fosc, fol-budget, fast-at
built in), every one counting its compute.

Mode choice (BatchNorm, dropout): adversarial examples are generated with the model in eval mode (running
statistics, no dropout, no update of BatchNorm statistics, gradients w.r.t. the input only), then the update step
runs in train mode, as common PyTorch adversarial-training code does (TRADES' reference code, Rice et al. 2020).
Per-sample stopping therefore does not depend on which other samples are still active.

Compute accounting (:class:`robustest.core.compute.ComputeCount`): sample-forwards and sample-backwards of the
attack and the update step, per epoch and in total; ``passes = (forward + 2 * backward) / 3``. A PGD-AT epoch
with k steps over N samples costs exactly ``N * (k + 1)`` passes; TRADES ``N * (k + 2 + 1/3)``; Fast-AT ``2 N``.
Validation (``val=``) is reported apart and not counted as training compute.

Recipe (the settings that make adversarial training stable; docs/HARDEN.md has the sweeps behind the defaults):
``eps_warmup``: the radius grows linearly from 0 to ``eps`` over that fraction of the training steps (every batch
its own radius ``eps_t``; the step ``alpha`` scales with it; stepped per batch), as Gowal et al. (2018) and Wong et
al. (2020) do at MNIST's eps 0.3. ``schedule`` (None, "cosine", "step", "cyclic") with ``warmup_epochs`` and
``milestones``: the learning-rate schedule of :func:`robustest.train.schedules.make_schedule`, stepped per batch.
``optimizer`` "adam" or "sgd" (``momentum``, ``nesterov``), ``weight_decay``.

Robust early stopping and the catastrophic-overfitting guard: :mod:`robustest.train.early_stopping`
(``HardenResult.guard_epoch`` records the epoch that collapsed).

Randomness: epoch e draws its shuffling, random starts and dropout from seeds derived from ``(seed, e)``, so the
epoch number is the whole random state: a run resumed from the state written after epoch e (``state_dir``,
``resume=True``) gives the same final weights as an uninterrupted run.

The epochs run through :func:`robustest.train.engine.run_epochs`; :class:`_Run` is harden's
:class:`~robustest.train.engine.EpochLoop` (its hooks: the epoch's seeds and order, the objective's step, the
optimiser step, validation with best keeping and the guard, the state file).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from robustest.core.batching import DataLike, as_tensors
from robustest.core.compute import ComputeCount
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError, DataError
from robustest.core.inputs import check_images, check_labels
from robustest.core.modelcall import eval_mode, forward
from robustest.core.progress import progress as progress_bar
from robustest.core.seeding import derive_seed, make_generator, seed_everything
from robustest.core.validation import check_eps, check_float, check_int
from robustest.train import early_stopping, objectives
from robustest.train.early_stopping import KEEP
from robustest.train.engine import Batch, EpochLoop, run_epochs
from robustest.train.objectives.base import Objective, StepContext, StepOutput
from robustest.train.recipes import Recipe, as_recipe, make_optimizer
from robustest.train.schedules import eps_schedule, make_schedule
from robustest.train.state import StateFile, data_digest, in_state_dir

__all__ = ["DEFAULT_STEPS", "EPS_WARMUP", "HardenResult", "check_trainable", "harden",
           "harden_settings"]

#: attack steps of the inner maximisation when ``steps`` is None (methods with ``fixed_steps`` take theirs)
DEFAULT_STEPS = 10
#: the fraction of the training steps over which eps grows from 0 when ``eps_warmup`` is not given (harden's recipe is
#: :class:`robustest.train.recipes.Recipe`'s defaults, Adam 1e-3 at a constant rate; docs/HARDEN.md gives the sweeps)
EPS_WARMUP = 0.3
#: the Recipe fields harden honours (the others stay at their defaults: harden computes its own losses in fp32, on
#: the images as given)
HARDEN_RECIPE_FIELDS = ("optimizer", "lr", "weight_decay", "momentum", "nesterov", "schedule", "warmup_epochs",
                        "milestones")


@dataclass
class HardenResult:
    """What :func:`harden` did.

    ``settings``: every parameter in effect (defaults resolved). ``epochs``: one dict per epoch with ``epoch``,
    ``loss``, ``adv_accuracy`` (train-mode accuracy on the training inputs of the loss' adversarial term),
    ``lr``, ``seconds``, ``compute`` (:meth:`ComputeCount.to_dict`), ``attack_evals_mean`` (gradient evaluations
    of the inner maximisation per sample), ``stopped_early`` (fraction of samples whose attack stopped before the
    budget), the objective's epoch values (fosc: ``fosc_c``, the epoch's c_t), ``eps`` (the radius of the epoch's
    last batch; below the target during the eps warm-up), the schedule values of the objective's last step (ibp /
    crown-ibp: ``kappa``, crown-ibp's ``beta``, and ``eps`` the bounds' radius) and, with ``val``,
    ``val_clean_accuracy`` / ``val_pgd_accuracy``. ``compute``: the totals over all epochs. ``resumed_epochs``:
    epochs loaded from ``state_dir`` (0: fresh run). ``best_epoch``: the epoch of the highest validation PGD
    accuracy (None without ``val``); ``kept_epoch``: the epoch whose weights the model ends with; ``guard_epoch``:
    the epoch at which the catastrophic-overfitting guard stopped training (None: it did not); ``last_weights``:
    the last epoch's state_dict (on the CPU) when another epoch's weights were kept, else None.
    """

    method: str
    settings: dict[str, Any]
    epochs: list[dict[str, Any]] = field(default_factory=list)
    num_samples: int = 0
    resumed_epochs: int = 0
    best_epoch: int | None = None
    kept_epoch: int | None = None
    guard_epoch: int | None = None
    last_weights: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def compute(self) -> dict[str, Any]:
        total = ComputeCount()
        for e in self.epochs:
            total = total.add(ComputeCount.from_dict(e["compute"]))
        return total.to_dict()

    @property
    def seconds(self) -> float:
        return float(sum(e["seconds"] for e in self.epochs))

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "settings": dict(self.settings), "num_samples": self.num_samples,
                "epochs": [dict(e) for e in self.epochs], "compute": self.compute, "seconds": self.seconds,
                "resumed_epochs": self.resumed_epochs, "best_epoch": self.best_epoch, "kept_epoch": self.kept_epoch,
                "guard_epoch": self.guard_epoch}


# ----------------------------------------------------------------------------------------------- settings
def harden_settings(method: str = "pgd-at", eps: float = 0.3, epochs: int = 5, *, batch_size: int = 128,
                    recipe: Recipe | None = None, eps_warmup: float = EPS_WARMUP, eps_train: float | None = None,
                    steps: int | None = None, alpha: float | None = None, co_guard: bool | None = None,
                    keep: str = "last", val_attack: str | None = None, seed: int = 0, **options: Any
                    ) -> dict[str, Any]:
    """The settings :func:`harden` would use for these arguments (defaults resolved), without doing any work.

    ``val_attack`` (None): "apgd-ce" for the single-step methods (those with the catastrophic-overfitting guard:
    their failure is masked gradients, which fixed-step PGD reads as robustness), "pgd" for the others.

    ``options``: the method-specific options of the registered objectives (None: the method's default).
    Raises :class:`ConfigError` with one line for an unknown method, eps outside (0, 1], a non-finite or
    out-of-range number, epochs < 1, or a method option given to another method; TypeError for a keyword that
    is no objective's option.
    """
    owners = objectives.option_owners()
    for key in options:
        if key in HARDEN_RECIPE_FIELDS:
            raise TypeError(f"{key} is a training recipe option: pass recipe=Recipe({key}=...) "
                            "(robustest.train.recipes.Recipe)")
        if key not in owners:
            raise TypeError(f"harden_settings() got an unexpected keyword argument {key!r} (method options: "
                            f"{', '.join(owners)})")
    objective = objectives.get(method, harden_method=True)
    m = objective.name
    eps_f = float(check_eps("eps", eps))  # the project's one radius check (same message in every verb)
    n_epochs = check_int("epochs", epochs, lo=1)
    s: dict[str, Any] = {"method": m, "eps": eps_f, "norm": "linf", "epochs": n_epochs,
                         "batch_size": check_int("batch_size", batch_size, lo=1)}
    s.update(_recipe_settings(n_epochs, as_recipe(recipe)))
    s["eps_warmup"] = check_float("eps_warmup", eps_warmup, 0.0, 1.0, hi_open=True)  # a fraction of the steps
    s["eps_train"] = eps_f if eps_train is None else float(check_eps("eps_train", eps_train))
    k = str(keep).lower()
    if k not in KEEP:
        raise ConfigError(f"keep must be 'best' (robust early stopping on the validation data) or 'last', got {keep!r}")
    s["keep"] = k
    if val_attack is None:
        val_attack = "pgd" if objective.co_guard is None else "apgd-ce"
    early_stopping.val_key(val_attack)  # known, or a one-line error
    s["val_attack"] = val_attack
    _check_owners(m, {**options, "co_guard": co_guard}, owners)
    if objective.co_guard is not None:
        s["co_guard"] = objective.co_guard if co_guard is None else bool(co_guard)
    s["steps"] = _attack_steps(objective, steps)
    s["alpha"] = objective.alpha(s["eps_train"], s["steps"]) if alpha is None else check_float(
        "alpha", alpha, lo=0.0, hi=1.0, lo_open=True)
    for opt in objective.options:
        s[opt.name] = opt.resolve(options.get(opt.name))
    if objective.check is not None:
        objective.check(s)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    s["seed"] = int(seed)
    return s


def _harden_recipe(recipe: Recipe, epochs: int) -> Recipe:
    """``recipe`` checked for harden (:meth:`Recipe.check`): SGD without Nesterov unless asked (the adversarial-training
    papers' choice); a field harden does not honour (label smoothing, precision, compile, augmentation, weight decay
    off norms) set is a one-line ConfigError."""
    recipe = recipe.require_only(HARDEN_RECIPE_FIELDS, "harden")
    if recipe.optimizer == "sgd" and recipe.nesterov is None:
        recipe = replace(recipe, nesterov=False)
    return recipe.check(epochs)


def _recipe_settings(epochs: int, recipe: Recipe) -> dict[str, Any]:
    """The optimiser and learning-rate schedule settings of :func:`_harden_recipe`'s checked recipe."""
    opts = _harden_recipe(recipe, epochs)
    s: dict[str, Any] = {"lr": opts.lr, "optimizer": opts.optimizer, "weight_decay": opts.weight_decay}
    if opts.optimizer == "sgd":
        s.update({"momentum": opts.momentum, "nesterov": opts.nesterov})
    s.update({"schedule": opts.schedule, "warmup_epochs": opts.warmup_epochs,
              "milestones": list(opts.milestones) if opts.milestones is not None else None})
    return s


def _check_owners(method: str, given: dict[str, Any], owners: dict[str, Any]) -> None:
    """A method option (or ``co_guard``) set for a method that does not take it is an error."""
    guarded = tuple(name for name in objectives.names() if objectives.get(name).co_guard is not None)
    for key, takers in [*((k, v[0]) for k, v in owners.items()), ("co_guard", guarded)]:
        if given.get(key) is not None and method not in takers:
            raise ConfigError(f"{key} applies to method {' / '.join(takers)} only, not {method!r}: leave it unset")


def _attack_steps(objective: Objective, steps: int | None) -> int:
    """The attack steps: the objective's fixed number (any other given is an error), or ``steps`` (default
    :data:`DEFAULT_STEPS`)."""
    fixed = objective.fixed_steps
    if fixed is None:
        return check_int("steps", DEFAULT_STEPS if steps is None else steps, lo=1)
    if steps is not None and steps != fixed:
        what = "one step" if fixed == 1 else f"{fixed} steps"
        raise ConfigError(f"{objective.name} takes exactly {what}, got steps={steps!r}: use pgd-at for more")
    return fixed


def check_trainable(model: Any) -> None:
    """Raise :class:`ConfigError` unless ``model`` is an ``nn.Module`` with at least one trainable parameter."""
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if (getattr(model, "robustest_source", None) or {}).get("kind") == "export":
        raise ConfigError("a torch.export program (.pt2) is frozen for inference and cannot be trained: harden the "
                          "model it was exported from (--checkpoint model.pt or --model pkg.module:factory --weights)")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError("the model has no trainable parameters (a frozen TorchScript model, or requires_grad off "
                          "everywhere): harden needs weights it can train")


# ---------------------------------------------------------------------------------------------- state
def _cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _check_data(data: DataLike, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = as_tensors(data)
    if y is None:
        raise DataError(f"harden needs labelled {what} data: pass (x, y) or a labelled Dataset")
    check_images(x, f"{what} images")
    y = check_labels(y, x.shape[0], name=f"{what} labels")
    if int(x.shape[0]) == 0:
        raise DataError(f"the {what} data is empty: check the split, the path and --limit")
    return x, y


@dataclass
class _Run(EpochLoop):
    """One harden call's working state and its epoch hooks (:class:`~robustest.train.engine.EpochLoop`): the
    model, its settings and data, the optimiser and schedule, the state file, the result being filled, the best
    validation epoch so far and the caller's callback; the running epoch's objective, order, attack generator,
    values and tallies."""

    model: nn.Module
    s: dict[str, Any]
    x: torch.Tensor
    y: torch.Tensor
    xv: torch.Tensor | None
    yv: torch.Tensor | None
    dev: torch.device
    val_steps: int
    state: StateFile | None = None
    steps_per_epoch: int = 1
    opt: torch.optim.Optimizer | None = None
    sched: torch.optim.lr_scheduler.LambdaLR | None = None
    result: HardenResult | None = None
    best: dict[str, Any] = field(default_factory=lambda: {"epoch": None, "score": -1.0, "model": None})
    start: int = 0
    progress: bool = False
    on_epoch_end: Callable[[int, nn.Module, dict[str, Any]], Any] | None = None
    objective: Objective | None = None
    perm: torch.Tensor | None = None
    gen: torch.Generator | None = None
    values: dict[str, Any] = field(default_factory=dict)
    tally: dict[str, Any] = field(default_factory=dict)

    def stopped(self) -> bool:
        assert self.result is not None
        return self.result.guard_epoch is not None

    def begin_epoch(self, epoch: int) -> None:
        """The epoch's draws, from seeds derived from (seed, epoch): global (dropout), shuffling, attack."""
        s = self.s
        self.objective = objective = objectives.get(s["method"])
        seed_everything(derive_seed(s["seed"], epoch, "global"))  # dropout and any other global draws
        self.perm = torch.randperm(int(self.x.shape[0]),
                                   generator=make_generator(derive_seed(s["seed"], epoch, "shuffle")))
        self.gen = make_generator(derive_seed(s["seed"], epoch, "attack"), self.dev)
        self.values = objective.epoch_values(epoch, s) if objective.epoch_values is not None else {}
        self.tally = {"count": ComputeCount(), "loss": 0.0, "correct": 0, "evals": 0, "early": 0, "eps": s["eps_train"],
                      "values": {}}

    def batches(self, epoch: int) -> Iterator[Batch]:
        """The epoch's batches in its seeded order, on the device (float32 images, int64 labels)."""
        s, n, bs = self.s, int(self.x.shape[0]), self.s["batch_size"]
        assert self.perm is not None
        starts = range(0, n, bs)
        for b0 in progress_bar(starts, enabled=self.progress, desc=f"{s['method']} {epoch}/{s['epochs']}",
                               total=len(starts), unit="batch"):
            idx = self.perm[b0:b0 + bs]
            yield (idx, self.x[idx].to(self.dev, torch.float32, non_blocking=True),
                   self.y[idx].to(self.dev, torch.long, non_blocking=True))

    def forward(self, epoch: int, i: int, batch: Batch) -> tuple[torch.Tensor, StepOutput]:
        """The objective's step on batch ``i`` at its radius of the eps warm-up -> (loss, the step's output)."""
        s = self.s
        self.tally["eps"] = eps_t = eps_schedule((epoch - 1) * self.steps_per_epoch + i,
                                                 s["epochs"] * self.steps_per_epoch, s["eps_train"], s["eps_warmup"])
        assert self.gen is not None and self.objective is not None
        out = _batch(self.model, batch[1], batch[2], self.gen, s, eps_t, self.values, self.objective,
                     (epoch, i, self.steps_per_epoch))
        return out.loss, out

    def diverged(self, epoch: int, i: int, loss: torch.Tensor, aux: Any) -> str:
        assert self.objective is not None
        return (f"harden diverged: the {self.objective.name} loss is {float(loss.detach())}; lower the learning "
                f"rate (lr={self.s['lr']:g})" + self.objective.diverged_hint)

    def update(self, epoch: int, i: int, batch: Batch, loss: torch.Tensor, aux: StepOutput) -> None:
        """The optimiser and schedule steps, then the epoch's tallies (compute, loss, adversarial accuracy,
        attack evaluations, samples stopped early)."""
        assert self.opt is not None
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if aux.restore is not None:
            aux.restore()
        t, yb = self.tally, batch[2]
        correct = int((aux.logits.detach().argmax(1) == yb).sum())
        if self.sched is not None:
            self.sched.step()
        t["count"] = t["count"].add(aux.compute)
        t["loss"] += float(loss.detach()) * batch[1].shape[0]
        t["correct"] += correct
        t["evals"] += int(aux.evals.sum())
        t["early"] += aux.stopped
        t["values"] = aux.values

    def summary(self, epoch: int) -> dict[str, Any]:
        """The epoch's record (without validation); the model ends in eval mode."""
        self.model.eval()
        assert self.opt is not None
        t, n = self.tally, int(self.x.shape[0])
        record: dict[str, Any] = {
            "epoch": epoch, "loss": t["loss"] / n, "adv_accuracy": t["correct"] / n,
            "lr": self.opt.param_groups[0]["lr"], "eps": t["eps"], "attack_evals_mean": t["evals"] / n,
            "stopped_early": t["early"] / n, "compute": t["count"].to_dict(),
        }
        record.update(self.values)
        record.update(t["values"])  # the objective's own schedule (ibp: its radius replaces the warm-up's)
        return record

    def validate(self, epoch: int, record: dict[str, Any]) -> None:
        _validate(self, epoch, record)

    def record(self, epoch: int, record: dict[str, Any], seconds: float) -> None:
        assert self.result is not None
        record["seconds"] = seconds
        self.result.epochs.append(record)

    def save(self, epoch: int) -> None:
        _save_state(self, epoch)

    def after_epoch(self, epoch: int, record: dict[str, Any]) -> None:
        if self.on_epoch_end is not None:
            self.on_epoch_end(epoch, self.model, record)


# ----------------------------------------------------------------------------------------------- harden
def harden(
    model: nn.Module,
    data: DataLike,
    method: str = "pgd-at",
    eps: float = 0.3,
    epochs: int = 5,
    *,
    batch_size: int = 128,
    recipe: Recipe | None = None,
    eps_warmup: float = EPS_WARMUP,
    eps_train: float | None = None,
    steps: int | None = None,
    alpha: float | None = None,
    co_guard: bool | None = None,
    keep: str | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    val: DataLike | None = None,
    val_steps: int = 10,
    val_attack: str | None = None,
    on_epoch_end: Callable[[int, nn.Module, dict[str, Any]], Any] | None = None,
    state_dir: str | Path | None = None,
    resume: bool = False,
    **options: Any,
) -> HardenResult:
    """Adversarially train ``model`` in place on labelled ``data`` with ``method`` (a name of
    :func:`robustest.train.objectives.names`): fine-tune a trained model, or train one from its random
    initialisation with the same call.

    ``data``: an (x, y) pair, a Dataset or a DataLoader (materialised): images N x C x H x W in [0, 1], int64
    labels [N]. ``eps``: L-inf radius in (0, 1] the model is hardened for (validation and the guard measure at it).
    ``eps_train`` (default ``eps``): the radius the training attack (or certified training's bounds) works at,
    reached after ``eps_warmup`` (default 0.3) of the training steps; larger than ``eps`` trains for a margin (at
    MNIST's eps 0.3, 0.4: docs/HARDEN.md). ``steps`` (default 10; fast-at: 1) gradient steps of ``alpha``
    (default ``2.5 * eps_train / steps``; fast-at ``1.25 * eps_train``) for the inner maximisation. Method options
    (``**options``; None: the default; setting one for another method is an error): ``mix`` (pgd-at, fraction of
    the loss on clean inputs, default 0), ``beta`` (trades, default 6), ``fosc_c_max`` / ``fosc_warmup`` (fosc,
    defaults 0.5 / 0.8: c_t reaches 0 after 80 % of the epochs), ``fol_threshold`` / ``stop_misclassified`` /
    ``fol_min_steps`` (fol-budget, defaults 0.1 / True / 2), and those of any registered objective. ``co_guard``
    (fast-at, default True: the catastrophic-overfitting guard, active with ``val``). Training: ``recipe``
    (:class:`robustest.train.recipes.Recipe`; None: Adam 1e-3 at a constant rate) with its ``optimizer``, ``lr``,
    ``weight_decay``, ``momentum`` / ``nesterov`` (SGD; default 0.9, Nesterov off), ``schedule`` ("cosine", "step",
    "cyclic"), ``warmup_epochs`` and ``milestones`` (its other fields are refused); ``batch_size``, ``epochs``;
    randomness from ``seed`` only.

    ``val``: held-out labelled data measured after every epoch (clean accuracy and the robust accuracy under
    ``val_attack``: "pgd", ``val_steps`` steps of eps/4 with a random start, or "apgd-ce", APGD-CE with ``val_steps``
    iterations, which also sees masked gradients; None: apgd-ce for the single-step methods, else pgd; not counted
    as training compute). ``keep``: "best" (the default with ``val``: robust early stopping, the model ends with the
    weights of the best validation robust accuracy) or "last" (the default without). ``on_epoch_end(epoch, model,
    record)`` is called after every epoch, after the epoch's state was written. ``state_dir``: write the state after
    every epoch (model, optimizer, schedule, best epoch, history) atomically to ``state_dir/harden_state.pt``;
    ``resume=True`` continues from it (same settings, validation attack and steps, and data required) and gives the
    same final weights as an uninterrupted run.

    Every argument is checked before any work (ConfigError / DataError with one line). The model ends in eval
    mode. Returns a :class:`HardenResult` with per-epoch figures and compute.
    """
    if keep is None:
        keep = "best" if val is not None else "last"
    s = harden_settings(method, eps, epochs, batch_size=batch_size, recipe=recipe, eps_warmup=eps_warmup,
                        eps_train=eps_train, steps=steps, alpha=alpha, co_guard=co_guard, keep=keep,
                        val_attack=val_attack, seed=seed, **options)
    run = _prepare(model, data, s, device=device, val=val, val_steps=val_steps, on_epoch_end=on_epoch_end,
                   state_dir=state_dir, resume=resume)
    _start(run)
    result = run.result
    assert result is not None
    run.progress, run.on_epoch_end = progress, on_epoch_end
    run_epochs(run, range(run.start + 1, s["epochs"] + 1))
    _keep(run)
    model.eval()
    return result


def _prepare(model: nn.Module, data: DataLike, s: dict[str, Any], *, device: torch.device | str | None,
             val: DataLike | None, val_steps: int, on_epoch_end: Any, state_dir: str | Path | None,
             resume: bool) -> _Run:
    """Check every argument of a harden call against the model and the data (before any work); the model moves to
    its device. Returns the run with its data, device and state file (and the state's fingerprint)."""
    check_trainable(model)
    val_steps = check_int("val_steps", val_steps, lo=1)
    if on_epoch_end is not None and not callable(on_epoch_end):
        raise ConfigError("on_epoch_end must be callable (epoch, model, record) or None")
    if s["keep"] == "best" and val is None:
        raise ConfigError("keep='best' picks the epoch by validation PGD accuracy: pass val= (held-out labelled "
                          "data) or keep='last'")
    x, y = _check_data(data, "training")
    xv, yv = _check_data(val, "validation") if val is not None else (None, None)
    dev = resolve_device(model, device)
    model.to(dev)
    with torch.no_grad(), eval_mode(model):  # labels must index the model's outputs
        num_classes = forward(model, x[:1].to(dev)).shape[-1]
    check_labels(y, int(x.shape[0]), num_classes, name="training labels")
    if yv is not None:
        check_labels(yv, yv.shape[0], num_classes, name="validation labels")
    run = _Run(model, s, x, y, xv, yv, dev, val_steps)
    digest = data_digest(x, y, *((xv, yv) if xv is not None and yv is not None else ())) if state_dir else ""
    # a resumed run must validate as it began (its best epoch so far was scored that way; the attack is in s)
    run.state = in_state_dir("harden", state_dir, resume, {**s, "val_steps": val_steps} if xv is not None else s,
                             digest)
    return run


def _start(run: _Run) -> None:
    """Build the optimiser and per-batch learning-rate schedule (robustest.train.recipes / schedules) and the empty
    result; with a state file, continue from it."""
    s, model = run.s, run.model
    n = int(run.x.shape[0])
    run.steps_per_epoch = -(-n // s["batch_size"])
    opts = Recipe(**{k: s.get(k) for k in HARDEN_RECIPE_FIELDS}).check(s["epochs"])
    run.opt = make_optimizer(model, opts)
    run.sched = make_schedule(run.opt, opts, s["epochs"], run.steps_per_epoch)
    run.result = result = HardenResult(method=s["method"], settings=dict(s), num_samples=n)
    state = run.state
    if state is not None and state.path.is_file():  # resume=True: in_state_dir refuses it otherwise
        st = state.load()
        model.load_state_dict(st["model"])
        run.opt.load_state_dict(st["optimizer"])
        if run.sched is not None:
            run.sched.load_state_dict(st["schedule"])
        result.epochs = [dict(e) for e in st["history"]]
        run.best = dict(st["best"])
        result.guard_epoch = st["extra"].get("guard_epoch")
        run.start = result.resumed_epochs = int(st["epoch"])
    if state is not None:  # under torchrun every rank has read the state before rank 0 writes the next
        from robustest.core import distributed

        distributed.barrier()


def _validate(run: _Run, epoch: int, record: dict[str, Any]) -> None:
    """With validation data: its clean and robust accuracy into ``record``, then the catastrophic-overfitting guard
    on an epoch trained wholly at the full radius (the epoch a rule fires in is recorded and training stops; in the
    eps warm-up validation's radius is larger than training's, and a model still learning swings under it) or robust
    early stopping's best epoch so far."""
    s, result, model = run.s, run.result, run.model
    assert result is not None
    if run.xv is not None:
        record.update(early_stopping.validate(model, run.xv, run.yv, s["eps"], run.val_steps,
                                              derive_seed(s["seed"], "val"), s["val_attack"]))
        score = record[early_stopping.val_key(s["val_attack"])]
        guard = None
        if s.get("co_guard") and _full_radius_epoch(run, epoch):
            guard = _single_step_guard(run, record, score)
        if guard is not None:
            result.guard_epoch = epoch
            record["guard"] = guard
        elif score >= run.best["score"]:
            run.best = {"epoch": epoch, "score": score, "model": _cpu_state(model)}


def _single_step_guard(run: _Run, record: dict[str, Any], score: float) -> str | None:
    """The guard's rules, in order, for an epoch trained wholly at the full radius: "collapsed" (the validation score
    far under the best so far), "masked" (the training attack far above the validation score), "overstated" (a longer
    APGD-CE, whose figures go into ``record``, finds much less); None when none fires."""
    if run.best["epoch"] is not None and early_stopping.collapsed(score, run.best["score"]):
        return "collapsed"
    if early_stopping.masked(record["adv_accuracy"], score):
        return "masked"
    s = run.s
    record.update(early_stopping.short_long(run.model, run.xv, run.yv, s["eps"], run.val_steps,
                                            derive_seed(s["seed"], "val-long")))
    return "overstated" if early_stopping.overstated(record["val_short_accuracy"], record["val_long_accuracy"]) \
        else None


def _full_radius_epoch(run: _Run, epoch: int) -> bool:
    """Every batch of ``epoch`` trained at the full radius (the eps warm-up was over when it began): only then is its
    training adversarial accuracy comparable with the validation PGD accuracy at eps."""
    s = run.s
    first = (epoch - 1) * run.steps_per_epoch
    return eps_schedule(first, s["epochs"] * run.steps_per_epoch, 1.0, s["eps_warmup"]) >= 1.0


def _save_state(run: _Run, epoch: int) -> None:
    """Write the state after ``epoch`` to the state file, when there is one (:mod:`robustest.train.state`; no random
    state: every epoch derives its seeds from (seed, epoch))."""
    result = run.result
    assert result is not None and run.opt is not None
    if run.state is not None:
        run.state.save(epoch, model=run.model, optimizer=run.opt, schedule=run.sched, history=result.epochs,
                       best=run.best, seconds=result.seconds, extra={"guard_epoch": result.guard_epoch})


def _keep(run: _Run) -> None:
    """End with the kept epoch's weights: the best validation epoch with keep='best' or after the guard stopped
    training, else the last (whose weights stay in ``last_weights`` when another epoch was kept)."""
    result, best = run.result, run.best
    assert result is not None
    result.best_epoch = best["epoch"]
    result.kept_epoch = len(result.epochs) if result.epochs else None
    if (run.s["keep"] == "best" or result.guard_epoch is not None) and best["model"] is not None \
            and best["epoch"] != result.kept_epoch:
        result.last_weights = _cpu_state(run.model)
        run.model.load_state_dict(best["model"])
        result.kept_epoch = best["epoch"]


def _batch(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor, gen: torch.Generator, s: dict[str, Any],
           eps: float, values: dict[str, Any], objective: Objective, place: tuple[int, int, int]) -> StepOutput:
    """The step of ``objective`` on a batch xb (B x C x H x W), yb (int64 [B]) at radius ``eps`` (the step
    ``alpha`` scaled by ``eps / s["eps_train"]``), up to its loss: the engine checks it finite before the update.
    ``place``: (epoch, step within it, steps per epoch)."""
    epoch, i, per_epoch = place
    return objective.step(model, xb, yb, gen, StepContext(s, eps, s["alpha"] * eps / s["eps_train"], values,
                                                          epoch_number=epoch, step=i, steps_per_epoch=per_epoch))
