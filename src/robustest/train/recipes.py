"""Training recipes: the optimiser, schedule, loss, precision and data options of
:func:`robustest.train.fit` and :func:`robustest.train.harden`, checked up front, and the named recipes of the
seeds' full-scale settings.

* :class:`Recipe` holds them as one value; :meth:`Recipe.check` validates every option (finite, in range, known
  names) for a number of epochs; :func:`check_device` refuses what the device cannot do (fp16 off CUDA).
* :func:`make_optimizer`: Adam, or SGD with (Nesterov) momentum; with ``decay_norm_bias=False`` weight
  decay skips the parameters of normalisation layers, biases and every other 1-D parameter.
* the learning-rate schedule these options describe is built by :func:`robustest.train.schedules.make_schedule`.
* :func:`crop_flip`: CIFAR-style random crop from a zero-padded image plus horizontal flip, batched and
  seeded (N x C x H x W in, same shape out).
* :func:`grad_scaler`: the GradScaler of fp16 mixed precision on CUDA (autocast itself is
  :func:`robustest.core.amp.autocast`).
* :func:`compile_model` / :func:`compile_error`: ``torch.compile``, with a one-line error when it is not
  available or fails to compile.
* :data:`RECIPES` / :func:`recipe`: the seeds' training recipes as ``fit`` keyword arguments;
  :func:`layered_recipe`: a named recipe (or fit's defaults) overridden by the options given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.amp import AMP_MODES
from robustest.core.errors import ConfigError
from robustest.core.options import option
from robustest.core.validation import check_bool, check_choice, check_float, check_int
from robustest.train.schedules import CYCLIC_PEAK, SCHEDULES

__all__ = ["AUGMENTS", "FIT_DEFAULTS", "OPTIMIZERS", "RECIPES", "Recipe", "SGD_MOMENTUM", "as_recipe", "check_device",
           "compile_error", "compile_model", "crop_flip", "grad_scaler", "layered_recipe", "make_optimizer",
           "no_decay_parameters", "recipe"]

OPTIMIZERS = ("adam", "sgd")
AUGMENTS = ("crop-flip",)
CROP_PADDING = 4
#: SGD's momentum where a recipe leaves it unset
SGD_MOMENTUM = 0.9

#: torch's normalisation layers: their weights and biases get no weight decay with ``decay_norm_bias=False``
_NORM_LAYERS: tuple[type, ...] = tuple(t for t in (
    nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm,
    getattr(nn, "RMSNorm", None)) if t is not None)


@dataclass(frozen=True)
class Recipe:
    """A training recipe: the optimiser, schedule, loss, precision and data options that :func:`robustest.train.fit`,
    :func:`robustest.train.harden`, :func:`robustest.weakrobust.enhance` and the RobOT config take as one value.

    Build it freely (``Recipe(optimizer="sgd", lr=0.1, schedule="cosine")``); :meth:`check` validates it for a
    number of epochs, which every function that trains does before any work. ``momentum`` and ``nesterov`` are SGD's
    (None: 0.9 and Nesterov on; harden's SGD: Nesterov off) and refused with Adam. Each field carries its
    command-line kind and help, from which the verbs that train generate their flags."""

    optimizer: str = option("adam", "choice", "optimizer", choices=OPTIMIZERS)
    lr: float = option(1e-3, "rate", "(peak) learning rate")
    weight_decay: float = option(0.0, "non-negative", "weight decay")
    momentum: float | None = option(None, "below-one", "SGD momentum", shown=f"{SGD_MOMENTUM:g}")
    nesterov: bool | None = option(None, "switch", "Nesterov momentum for SGD", shown="on")
    schedule: str | None = option(None, "choice", "learning-rate schedule, stepped per batch: cosine decay to 0, "
                                  "step (x0.1 at --milestones), cyclic (linear up to the rate at 40 % of training, "
                                  "then down to 0), none", choices=("none", *SCHEDULES))
    warmup_epochs: float = option(0.0, "non-negative", "linear learning-rate warm-up over the first E epochs, "
                                  "before the schedule", metavar="E")
    milestones: tuple[float, ...] | None = option(None, "epochs", "--schedule step: epochs at which the rate falls "
                                                  "x0.1 (default: 50 % and 75 % of training)", metavar="E1,E2")
    label_smoothing: float = option(0.0, "below-one", "label smoothing in [0, 1)")
    decay_norm_bias: bool = option(True, "switch", "apply weight decay to normalisation layers and biases too "
                                   "(the named recipes: no)")
    amp: str | None = option(None, "choice", "mixed precision: bf16 autocast (CUDA or CPU) or fp16 autocast + "
                             "GradScaler (CUDA)", choices=AMP_MODES)
    compile: bool = option(False, "flag", "train through torch.compile")
    augment: str | None = option(None, "choice", "crop-flip: pad 4, random crop, horizontal flip, per batch",
                                 choices=("none", *AUGMENTS))

    def check(self, epochs: int) -> Recipe:
        """This recipe validated for a training of ``epochs`` epochs: the copy every trainer runs with (SGD's
        momentum and Nesterov resolved; "none" schedules and augmentations as None; milestones a tuple).

        Raises a one-line :class:`ConfigError` for an unknown name, a non-finite or out-of-range number, SGD options
        with Adam, Nesterov without momentum, ``warmup_epochs`` outside [0, epochs) or with the cyclic schedule
        (which has its own warm-up), ``milestones`` without ``schedule="step"``, not strictly increasing or outside
        (0, epochs], ``label_smoothing`` outside [0, 1).

        Example: ``Recipe(optimizer="sgd", lr=0.1).check(10)`` -> ``Recipe(optimizer="sgd", lr=0.1, momentum=0.9,
        nesterov=True, ...)``.
        """
        optimizer, schedule = self.optimizer, self.schedule
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {optimizer!r}: use 'adam' or 'sgd'")
        if schedule in ("none", "constant"):
            schedule = None
        if schedule is not None and schedule not in SCHEDULES:
            raise ConfigError(f"unknown schedule {schedule!r}: use None, 'cosine', 'step' or 'cyclic'")
        lr_f = check_float("lr", self.lr, 0.0, 10.0, lo_open=True)
        wd = check_float("weight_decay", self.weight_decay, 0.0, 1.0)
        mom: float | None = None
        nest: bool | None = None
        if optimizer != "sgd":
            if self.momentum is not None or self.nesterov is not None:
                raise ConfigError(f"momentum and nesterov are options of optimizer='sgd', not {optimizer!r}: drop "
                                  "them or use optimizer='sgd'")
        else:
            mom = check_float("momentum", SGD_MOMENTUM if self.momentum is None else self.momentum, 0.0, 1.0,
                              hi_open=True)
            nest = check_bool("nesterov", True if self.nesterov is None else self.nesterov)
            if nest and mom == 0:
                raise ConfigError("nesterov needs a momentum > 0: give momentum=0.9 or nesterov=False")
        warm = check_float("warmup_epochs", self.warmup_epochs, 0.0)
        if warm > 0 and schedule == "cyclic":
            raise ConfigError("the cyclic schedule has its own warm-up (it rises from 0 to the rate over the first "
                              f"{CYCLIC_PEAK:.0%} of training): drop warmup_epochs")
        if warm > 0 and warm >= epochs:
            raise ConfigError(f"warmup_epochs must be below the number of epochs ({epochs}), got "
                              f"{self.warmup_epochs}")
        return Recipe(optimizer=optimizer, lr=lr_f, weight_decay=wd, momentum=mom, nesterov=nest,
                      schedule=schedule, warmup_epochs=warm, milestones=self._checked_milestones(schedule, epochs),
                      label_smoothing=check_float("label_smoothing", self.label_smoothing, 0.0, 1.0, hi_open=True),
                      decay_norm_bias=check_bool("decay_norm_bias", self.decay_norm_bias),
                      amp=check_choice("amp", self.amp, AMP_MODES, allow_none=True),
                      compile=check_bool("compile", self.compile),
                      augment=check_choice("augment", None if self.augment == "none" else self.augment, AUGMENTS,
                                           allow_none=True))

    def _checked_milestones(self, schedule: str | None, epochs: int) -> tuple[float, ...] | None:
        milestones = self.milestones
        if milestones is None:
            return None
        if schedule != "step":
            raise ConfigError("milestones go with schedule='step': give schedule='step' or drop milestones")
        if isinstance(milestones, (str, bytes)) or not isinstance(milestones, Sequence) or not milestones:
            raise ConfigError(f"milestones must be a non-empty list of epochs, got {milestones!r}")
        ms = tuple(check_float("milestones", m, 0.0, float(epochs), lo_open=True) for m in milestones)
        if any(b <= a for a, b in zip(ms, ms[1:])):
            raise ConfigError(f"milestones must be strictly increasing epochs, got {list(milestones)}")
        return ms

    def require_only(self, honoured: Sequence[str], trainer: str) -> Recipe:
        """This recipe, when it sets no field outside ``honoured`` (the fields ``trainer`` takes); else a one-line
        :class:`ConfigError` naming the first such field: a trainer never ignores an option silently."""
        ignored = sorted(set(self.given()) - set(honoured))
        if ignored:
            raise ConfigError(f"{trainer} does not take the recipe option {ignored[0]} (it honours "
                              f"{', '.join(honoured)}): leave it unset")
        return self

    def given(self) -> dict[str, Any]:
        """The fields that differ from :class:`Recipe`'s defaults, by name (what a caller set)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def to_dict(self) -> dict[str, Any]:
        """Every field, as results.json and the resume states record it: milestones a list, and SGD's momentum and
        Nesterov as SGD would run them (0.9, on) where unset."""
        d = asdict(self)
        d["milestones"] = list(self.milestones) if self.milestones is not None else None
        d["momentum"] = SGD_MOMENTUM if self.momentum is None else self.momentum
        d["nesterov"] = True if self.nesterov is None else self.nesterov
        return d

    def in_effect(self) -> dict[str, Any]:
        """The options that shape a run, as the train verb records them: the set fields of :meth:`to_dict` only,
        and SGD's momentum and Nesterov only with SGD."""
        d = self.to_dict()
        if d["optimizer"] != "sgd":
            del d["momentum"], d["nesterov"]
        return {k: v for k, v in d.items() if v is not None}


def as_recipe(recipe: Any) -> Recipe:
    """``recipe`` as a :class:`Recipe` (None: the defaults), unchecked; anything else is a one-line ConfigError."""
    if recipe is None:
        return Recipe()
    if not isinstance(recipe, Recipe):
        raise ConfigError(f"recipe must be a robustest.train.recipes.Recipe (or None for the defaults), got "
                          f"{type(recipe).__name__}: build one with Recipe(optimizer=..., lr=..., ...)")
    return recipe


def check_device(opts: Recipe, device: torch.device) -> None:
    """Refuse, before any work, the options ``device`` cannot run: fp16 autocast needs CUDA (GradScaler);
    bf16 autocast needs CUDA with bf16 support or the CPU."""
    if opts.amp == "fp16" and device.type != "cuda":
        raise ConfigError(f"amp='fp16' needs a CUDA device (autocast + GradScaler), not {device.type}: use "
                          "amp='bf16' or no amp on the CPU")
    if opts.amp == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError("amp='bf16' is not supported by this GPU: use amp='fp16'")
        if device.type not in ("cuda", "cpu"):
            raise ConfigError(f"amp='bf16' runs on CUDA or the CPU, not {device.type}: drop amp")


# ------------------------------------------------------------------------------------------- optimiser
def no_decay_parameters(model: nn.Module) -> set[int]:
    """ids of the parameters weight decay skips with ``decay_norm_bias=False``: those of normalisation layers,
    biases, and every other parameter with at most one dimension (gains and biases of custom norms)."""
    skip: set[int] = set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if isinstance(module, _NORM_LAYERS) or name.endswith("bias") or p.ndim <= 1:
                skip.add(id(p))
    return skip


def make_optimizer(model: nn.Module, opts: Recipe) -> torch.optim.Optimizer:
    """The optimiser over the trainable parameters of ``model``: Adam, or SGD with ``opts.momentum`` and
    ``opts.nesterov`` (unset: 0.9, on); weight decay on every parameter, or (``decay_norm_bias=False``) not on
    norms/biases."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups: list[Any] = params
    if not opts.decay_norm_bias and opts.weight_decay > 0:
        skip = no_decay_parameters(model)
        groups = [{"params": [p for p in params if id(p) not in skip]},
                  {"params": [p for p in params if id(p) in skip], "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
    if opts.optimizer == "adam":
        return torch.optim.Adam(groups, lr=opts.lr, weight_decay=opts.weight_decay)
    return torch.optim.SGD(groups, lr=opts.lr, momentum=SGD_MOMENTUM if opts.momentum is None else opts.momentum,
                           weight_decay=opts.weight_decay, nesterov=True if opts.nesterov is None else opts.nesterov)


# ------------------------------------------------------------------------------------------ augmentation
def crop_flip(x: torch.Tensor, padding: int = CROP_PADDING, generator: torch.Generator | None = None
              ) -> torch.Tensor:
    """CIFAR-style augmentation of a batch ``x`` (N x C x H x W): each image is zero-padded by ``padding``
    pixels, cropped back to H x W at a uniformly random offset and flipped horizontally with probability 1/2
    (torchvision's ``RandomCrop(size, padding)`` + ``RandomHorizontalFlip()``), all in one gather. The random
    draws come from ``generator`` (on the CPU), so the same generator state gives the same batch."""
    if x.dim() != 4:
        raise ConfigError(f"crop_flip takes images N x C x H x W, got shape {tuple(x.shape)}")
    n, c, h, w = x.shape
    p = int(padding)
    if n == 0:
        return x
    oy = torch.randint(0, 2 * p + 1, (n,), generator=generator)
    ox = torch.randint(0, 2 * p + 1, (n,), generator=generator)
    flip = torch.rand(n, generator=generator) < 0.5
    rows = oy[:, None] + torch.arange(h)  # n x h, in padded coordinates
    ar = torch.arange(w)
    cols = ox[:, None] + torch.where(flip[:, None], w - 1 - ar, ar)  # n x w
    lin = (rows[:, :, None] * (w + 2 * p) + cols[:, None, :]).reshape(n, 1, h * w).to(x.device)
    padded = F.pad(x, (p, p, p, p)).flatten(2)
    return torch.gather(padded, 2, lin.expand(n, c, h * w)).view(n, c, h, w)


# ------------------------------------------------------------------------------------- mixed precision
def grad_scaler(amp: str | None, device: torch.device) -> torch.amp.GradScaler | None:
    """A GradScaler for fp16 autocast on CUDA (None otherwise: bf16 needs no loss scaling)."""
    if amp != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


# ------------------------------------------------------------------------------------------- compile
def compile_model(model: nn.Module) -> nn.Module:
    """``torch.compile(model)`` (sharing its parameters); a one-line ConfigError when torch has no compile or
    refuses to set it up (e.g. an unsupported Python). Compilation itself happens at the first call: wrap
    that call with :func:`compile_error`."""
    fn = getattr(torch, "compile", None)
    if fn is None:
        raise ConfigError(f"compile=True needs torch.compile, which torch {torch.__version__} lacks: train "
                          "without compile")
    try:
        return fn(model)
    except Exception as exc:  # noqa: BLE001 - any refusal to set up compilation
        raise ConfigError(f"torch.compile is not available here ({_first_line(exc)}): train without compile") \
            from exc


def compile_error(exc: BaseException) -> ConfigError | None:
    """The one-line ConfigError for an exception raised while ``torch.compile`` compiled the first step
    (dynamo, inductor or the C++/Triton toolchain), or None when ``exc`` did not come from compilation."""
    mod = type(exc).__module__ or ""
    text = str(exc)
    if mod.startswith(("torch._dynamo", "torch._inductor")) or "inductor" in text.lower() or \
            "triton" in text.lower() or "dynamo" in text.lower():
        return ConfigError(f"torch.compile failed on this machine ({_first_line(exc)}): train without compile")
    return None


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:160] or type(exc).__name__)


# --------------------------------------------------------------------------------------------- recipes
RECIPES: dict[str, dict[str, Any]] = {
    # RobOT's CIFAR-10 ResNet-20 (Testing4AI/RobOT, CIFAR-10/train_model.py): Keras Adam 1e-3, batch 64,
    # 100 epochs, x0.1 from the 52nd, 77th and 92nd epoch (its 0-based "epoch > 50/75/90"), L2 1e-4 on the
    # conv kernels (= weight decay 2e-4 on the gradient), random shifts, rotations and flips (here crop-flip).
    "robot-cifar": {"optimizer": "adam", "lr": 1e-3, "batch_size": 64, "epochs": 100, "weight_decay": 2e-4,
                    "decay_norm_bias": False, "schedule": "step", "milestones": [51, 76, 91],
                    "augment": "crop-flip"},
    # AugMix's CIFAR recipe (google-research/augmix, cifar.py; WRN-40-2): SGD 0.1, Nesterov momentum 0.9,
    # weight decay 5e-4, batch 128, 100 epochs, cosine, random crop (pad 4) + flip.
    "cifar-sgd": {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4,
                  "decay_norm_bias": False, "batch_size": 128, "epochs": 100, "schedule": "cosine",
                  "augment": "crop-flip"},
    # AugMix's ImageNet ResNet-50 recipe (google-research/augmix, imagenet.py): SGD 0.1 for batch 256,
    # momentum 0.9 (no Nesterov), weight decay 1e-4, 90 epochs, x0.1 at epochs 30 and 60, flips and crops.
    "imagenet-sgd": {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": False, "weight_decay": 1e-4,
                     "decay_norm_bias": False, "batch_size": 256, "epochs": 90, "schedule": "step",
                     "milestones": [30, 60], "augment": "crop-flip"},
}


def recipe(name: str, epochs: int | None = None) -> dict[str, Any]:
    """The keyword arguments of :func:`robustest.train.fit` for recipe ``name`` (a copy, ``epochs``
    included). With ``epochs`` given, the schedule keeps its shape: milestones and warm-up are scaled by
    ``epochs / recipe epochs``."""
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}: choose one of {', '.join(sorted(RECIPES))}")
    out = {k: (list(v) if isinstance(v, list) else v) for k, v in RECIPES[name].items()}
    if epochs is not None:
        e = check_int("epochs", epochs, 1)
        assert e is not None
        scale = e / out["epochs"]
        if out.get("milestones"):
            out["milestones"] = [m * scale for m in out["milestones"]]
        if out.get("warmup_epochs"):
            out["warmup_epochs"] = out["warmup_epochs"] * scale
        out["epochs"] = e
    return out


#: what a fit without a named recipe starts from (the options of ``robustest train``'s defaults)
FIT_DEFAULTS: dict[str, Any] = {"batch_size": 64, "lr": 1e-3, "optimizer": "adam", "weight_decay": 0.0}


def layered_recipe(name: str | None, epochs: int | None, given: Mapping[str, Any]) -> tuple[int, int, Recipe]:
    """(epochs, batch size, checked :class:`Recipe`) of the named recipe ``name`` (None: :data:`FIT_DEFAULTS`),
    overridden by the options ``given`` (``batch_size`` and :class:`Recipe` fields; ``"none"`` turns a schedule or
    augmentation off) and by ``epochs`` (None: the recipe's, whose schedule is scaled to the epochs given).

    The recipe's SGD momentum and Nesterov do not carry over to another optimiser, nor its milestones to another
    schedule, unless given. Raises :class:`ConfigError` without epochs from either side, or on a bad option.

    Example: ``layered_recipe("cifar-sgd", 10, {"lr": 0.05})`` -> ``(10, 128, Recipe(optimizer="sgd", lr=0.05,
    ...))``.
    """
    kw: dict[str, Any] = {**FIT_DEFAULTS, **(recipe(name, epochs=epochs) if name is not None else {}), **given}
    epochs = epochs if epochs is not None else kw.get("epochs")
    kw.pop("epochs", None)
    if epochs is None:
        raise ConfigError("give --epochs N (or a --recipe, which brings its epochs)")
    if kw["optimizer"] != "sgd":  # a recipe's SGD settings do not carry over to optimizer adam
        for key in ("momentum", "nesterov"):
            if key not in given:
                kw.pop(key, None)
    if kw.get("schedule") != "step" and "milestones" not in given:
        kw.pop("milestones", None)
    batch_size = int(kw.pop("batch_size"))
    return epochs, batch_size, Recipe(**kw).check(epochs)
