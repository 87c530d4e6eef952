"""The block loop of :func:`robustest.evaluate.evaluate`: per block of images, the clean pass, the per-sample
gradient check, then the plan's attacks in order, each on the samples still robust (or the part of them its step
names), every point judged on the real model (by the majority of ``forwards`` forward passes).

Per block b, attack k draws from a generator seeded ``seed + k + b * BATCH_SEED_STRIDE``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from robustest.attacks import BATCH_SEED_STRIDE, lp_norm, margin
from robustest.core import distributed
from robustest.core.amp import autocast
from robustest.core.batching import DataLike, batch_origin, iter_batches, num_samples
from robustest.core.errors import DataError
from robustest.core.inputs import check_images, check_labels
from robustest.core.modelcall import eval_mode, forward
from robustest.core.progress import progress as _progress
from robustest.core.seeding import make_generator
from robustest.evaluate.checks import GRAD_OK, gradient_status
from robustest.evaluate.plans import PROBE_SIZE, PlanStep

__all__ = ["GRAD_NO_PATH", "GRAD_UNCHECKED", "PARTS", "RunSetup", "Tally", "attack_blocks", "judge"]

#: gradient codes beside checks.GRAD_OK / GRAD_ZERO / GRAD_NONFINITE
GRAD_NO_PATH, GRAD_UNCHECKED = 3, -1
#: the per-sample results of :func:`attack_blocks`, in the order they are gathered
PARTS = ("index", "y", "clean_pred", "adv_pred", "code", "linf", "l2", "adv", "grad", "unstable", "margin")


@dataclass
class RunSetup:
    """What every block shares: the real ``model`` (judges every point), the ``attack_model`` whose gradients
    and queries the attacks use (the model itself, its log-probabilities or a BPDA copy), an optional
    ``surrogate`` (transfer steps), the ``steps``, whether the attack model has a ``gradient_path``, and the
    judging ``forwards``."""

    model: nn.Module
    attack_model: nn.Module
    steps: list[PlanStep]
    num_classes: int
    eps: float
    norm: str
    seed: int
    batch_size: int
    block_size: int
    device: torch.device
    amp: str | None = None
    keep_adv: bool = False
    progress: bool = False
    forwards: int = 1
    gradient_path: bool = True
    surrogate: nn.Module | None = None


@dataclass
class Tally:
    """What the blocks add up: per-sample parts (CPU tensors, one per block; ``code`` is -2 for a clean error, -1
    for robust, else the index of the step that broke the sample; ``grad`` the gradient code; ``unstable``: the
    repeated forwards disagreed on some judged point), per-step counts and seconds, the seconds of the clean pass
    and of the checks, and the blocks whose probe broke a sample (``escalated``)."""

    parts: dict[str, list[torch.Tensor]]
    breaks: dict[str, int]
    attacked: dict[str, int]
    seconds: dict[str, float]
    clean_s: float = 0.0
    checks_s: float = 0.0
    escalated: int = 0
    blocks: int = 0
    skipped: dict[str, str] = field(default_factory=dict)

    @classmethod
    def start(cls, steps: list[PlanStep]) -> Tally:
        return cls(parts={k: [] for k in PARTS}, breaks={s.name: 0 for s in steps},
                   attacked={s.name: 0 for s in steps}, seconds={s.name: 0.0 for s in steps})

    def gather(self) -> dict[str, torch.Tensor | None]:
        """The per-sample parts of every rank, in data order (None for a part no block kept); under torchrun the
        counts and seconds become sums over the ranks."""
        parts = distributed.all_gather_cat({k: torch.cat(v) if v else None for k, v in self.parts.items()})
        if distributed.world_size() > 1:
            for counts in (self.breaks, self.attacked, self.seconds):
                every = distributed.all_gather_objects(dict(counts))
                for k_ in counts:
                    counts[k_] = sum(t[k_] for t in every)
            self.clean_s = sum(distributed.all_gather_objects(self.clean_s))
            self.checks_s = sum(distributed.all_gather_objects(self.checks_s))
            self.escalated = sum(distributed.all_gather_objects(self.escalated))
            self.blocks = sum(distributed.all_gather_objects(self.blocks))
        return parts


def _logits(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Logits (float32 N x K) of ``x`` in batches of ``batch_size`` (the caller sets the mode)."""
    return torch.cat([forward(model, x[s:s + batch_size]).float() for s in range(0, x.shape[0], batch_size)])


def _predicted(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Predicted labels (int64 [N]) of ``x``."""
    return _logits(model, x, batch_size).argmax(1)


def judge(model: nn.Module, x: torch.Tensor, y: torch.Tensor, forwards: int = 1, batch_size: int = 256
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Judge images ``x`` (N x C x H x W) with labels ``y`` [N] by ``forwards`` forward passes (caller sets the
    mode): ``(pred int64 [N], wrong bool [N], unstable bool [N])``. A sample is ``wrong`` when more than half of
    the forwards misclassify it; ``pred`` is then its most frequent wrong class, else ``y``; ``unstable``: the
    forwards disagree. With one forward: the argmax, ``pred != y`` and no instability."""
    first = _predicted(model, x, batch_size)
    if forwards == 1:
        return first, first != y, torch.zeros_like(y, dtype=torch.bool)
    preds = torch.stack([first] + [_predicted(model, x, batch_size) for _ in range(forwards - 1)])
    k = max(int(preds.max()) + 1, int(y.max()) + 1 if y.numel() else 1)
    counts = torch.nn.functional.one_hot(preds, k).sum(0)  # N x K
    right = counts.gather(1, y[:, None]).squeeze(1)
    wrong = (forwards - right) * 2 > forwards
    other = counts.scatter(1, y[:, None], -1).argmax(1)
    return torch.where(wrong, other, y), wrong, (preds != preds[0]).any(0)


#: seconds between the "still running" lines of a long step
HEARTBEAT_S = 60.0


class _Status:
    """A line on stderr per step when progress is on but stderr is not a terminal (a CI log never looks hung):
    the step, the samples it ran on, what it broke, the time and an estimate of what is left; during a step, a
    line every :data:`HEARTBEAT_S` seconds."""

    def __init__(self, enabled: bool, total: int) -> None:
        isatty = getattr(sys.stderr, "isatty", None)
        self.enabled = enabled and not (callable(isatty) and isatty()) and distributed.is_main()
        self.total, self.done, self.t0 = max(total, 1), 0, time.perf_counter()

    @contextlib.contextmanager
    def running(self, name: str, attacked: int) -> Iterator[None]:
        """While the step ``name`` runs on ``attacked`` samples: a line every HEARTBEAT_S seconds."""
        if not self.enabled:
            yield
            return
        stop = threading.Event()
        t_step = time.perf_counter()

        def beat() -> None:
            while not stop.wait(HEARTBEAT_S):
                print(f"evaluate: {name} still running on {attacked} samples, {time.perf_counter() - t_step:.0f}s "
                      f"into it ({time.perf_counter() - self.t0:.0f}s elapsed)", file=sys.stderr, flush=True)

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def step(self, name: str, attacked: int, broke: int, seconds: float) -> None:
        if self.enabled:
            el = time.perf_counter() - self.t0
            print(f"evaluate: {name} on {attacked} samples broke {broke} in {seconds:.1f}s ({self.done} of "
                  f"{self.total} samples done, {el:.0f}s elapsed)", file=sys.stderr, flush=True)

    def block(self, n: int) -> None:
        self.done += n
        if self.enabled:
            el = time.perf_counter() - self.t0
            left = el / self.done * (self.total - self.done)
            print(f"evaluate: {self.done} of {self.total} samples done, {el:.0f}s elapsed, about {left:.0f}s left",
                  file=sys.stderr, flush=True)


def attack_blocks(data: DataLike, setup: RunSetup) -> Tally:
    """Run the plan over ``data`` in blocks of ``setup.block_size`` images (this rank's share under torchrun)."""
    tally = Tally.start(setup.steps)
    shard = distributed.Shard.current()
    block, pos = batch_origin(data, setup.block_size, shard)
    status = _Status(setup.progress, num_samples(data))
    for idx, xb, yb in iter_batches(data, setup.block_size, setup.device, with_index=True, shard=shard):
        b, pos = pos // block, pos + len(idx)
        gens = [make_generator(setup.seed + k + b * BATCH_SEED_STRIDE, setup.device) for k in range(len(setup.steps))]
        if yb is None:
            raise DataError("evaluate needs labels: pass (x, y) or a labelled data set")
        xb = check_images(xb).float()
        yb = check_labels(yb, xb.shape[0], setup.num_classes).long()
        _attack_block(xb, yb, idx, gens, tally, setup, status)
        tally.blocks += 1
        status.block(len(idx))
    return tally


def _clean_pass(xb: torch.Tensor, yb: torch.Tensor, tally: Tally, setup: RunSetup
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(clean pred, correct, unstable, margin of the predicted class) of one block."""
    t0 = time.perf_counter()
    with eval_mode(setup.model), torch.no_grad(), autocast(setup.amp, setup.device):
        logits = _logits(setup.model, xb, setup.batch_size)
        if setup.forwards == 1:  # the one forward gives both the verdict and the margins
            cp = logits.argmax(1)
            wrong, unstable = cp != yb, torch.zeros_like(yb, dtype=torch.bool)
        else:
            cp, wrong, unstable = judge(setup.model, xb, yb, setup.forwards, setup.batch_size)
    tally.clean_s += time.perf_counter() - t0
    return cp, ~wrong, unstable, margin(logits, yb)


def _gradient_codes(xb: torch.Tensor, yb: torch.Tensor, correct: torch.Tensor, tally: Tally, setup: RunSetup
                    ) -> torch.Tensor:
    """Gradient code per sample of the block (GRAD_UNCHECKED for clean errors)."""
    t0 = time.perf_counter()
    codes = torch.full((xb.shape[0],), GRAD_UNCHECKED, dtype=torch.long, device=xb.device)
    sel = correct.nonzero().flatten()
    if sel.numel():
        if setup.gradient_path:
            codes[sel] = gradient_status(setup.attack_model, xb[sel], yb[sel], setup.batch_size).to(xb.device)
        else:
            codes[sel] = GRAD_NO_PATH
    tally.checks_s += time.perf_counter() - t0
    return codes


def _targets(step: PlanStep, robust: torch.Tensor, grad: torch.Tensor, probe_broke: bool, gen: torch.Generator,
             incomplete: torch.Tensor) -> torch.Tensor | None:
    """Positions in the block the step attacks (None: the step does not run on this block)."""
    if step.only == "escalate" and not probe_broke:
        return None
    mask = robust
    if step.only == "bad-gradient":
        mask = robust & (grad != GRAD_OK)
    elif step.only == "incomplete":
        mask = robust & incomplete
    sel = mask.nonzero().flatten()
    if step.only == "probe" and sel.numel() > PROBE_SIZE:
        pick = torch.randperm(sel.numel(), generator=gen, device=gen.device)[:PROBE_SIZE].to(sel.device)
        sel = sel[pick.sort().values]
    return sel


def _attack_block(xb: torch.Tensor, yb: torch.Tensor, idx: torch.Tensor, gens: list[torch.Generator],
                  tally: Tally, setup: RunSetup, status: _Status) -> None:
    """The clean pass, the gradient check and the steps in order on one block; per-sample parts, counts and
    seconds go to ``tally``."""
    cp, correct, unstable, margin = _clean_pass(xb, yb, tally, setup)
    grad = _gradient_codes(xb, yb, correct, tally, setup)
    tol = setup.eps * 1e-6 + 1e-6
    robust = correct.clone()
    code = torch.where(robust, -1, -2)
    adv, ap = xb.clone(), cp.clone()
    probe_broke = False
    incomplete = torch.zeros_like(robust)
    for k, step in enumerate(_progress(setup.steps, enabled=setup.progress and status.enabled is False,
                                       desc="evaluate", unit="attack")):
        if not robust.any():
            break
        if step.needs_gradient and not setup.gradient_path:
            tally.skipped[step.name] = "the model has no gradient path to its input"
            continue
        sel = _targets(step, robust, grad, probe_broke, gens[k], incomplete)
        if sel is None or sel.numel() == 0:
            continue
        t0 = time.perf_counter()
        attacker = setup.surrogate if step.on_surrogate else setup.attack_model
        with status.running(step.name, int(sel.numel())):
            out = step.fn(attacker, xb[sel], yb[sel], setup.eps, generator=gens[k], batch_size=setup.batch_size,
                          **step.params)
        if isinstance(out, tuple):  # (points, still improving): APGD's trace
            out, improving = out
            incomplete[sel] |= improving.to(incomplete.device)
        with eval_mode(setup.model), torch.no_grad():
            pred, wrong, shaky = judge(setup.model, out, yb[sel], setup.forwards, setup.batch_size)
        broke = wrong & (lp_norm(out - xb[sel], setup.norm) <= setup.eps + tol)
        hit = sel[broke]
        unstable[sel] |= shaky
        robust[hit] = False
        code[hit] = k
        adv[hit] = out[broke]
        ap[hit] = pred[broke]
        probe_broke |= step.only == "probe" and bool(broke.any())
        seconds = time.perf_counter() - t0
        tally.seconds[step.name] += seconds
        tally.breaks[step.name] += int(hit.numel())
        tally.attacked[step.name] += int(sel.numel())
        status.step(step.name, int(sel.numel()), int(hit.numel()), seconds)
    tally.escalated += int(probe_broke)
    broken = (~robust & correct).nonzero().flatten()
    if setup.forwards == 1 and broken.numel():  # a second look at every adversarial point: is the verdict stable?
        with eval_mode(setup.model), torch.no_grad():
            again = _predicted(setup.model, adv[broken], setup.batch_size)
        unstable[broken] |= again != ap[broken]
    delta = (adv - xb).flatten(1)
    block_parts = {"index": idx, "y": yb, "clean_pred": cp, "adv_pred": ap, "code": code,
                   "linf": delta.abs().amax(1), "l2": delta.norm(dim=1), "grad": grad, "unstable": unstable,
                   "margin": margin}
    if setup.keep_adv:
        block_parts["adv"] = adv
    for k_, v in block_parts.items():
        tally.parts[k_].append(v.cpu())
