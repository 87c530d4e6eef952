"""The checks :func:`robustest.evaluate.evaluate` runs on a model before and while it attacks it: cheap, batched
probes for the ways a model can fool gradient attacks (Athalye, Carlini & Wagner 2018; Tramer et al. 2020; the
checks of Croce & Hein's AutoAttack, extended).

* :func:`probe_model` (once, on a few images): randomness (5 forward passes without reseeding, AutoAttack's test:
  a prediction changes or the L2-normalised outputs differ by more than 1e-4), probability outputs (every output
  in [0, 1], rows summing to 1 within 1e-5), a dynamic defence (the forward pass changes a parameter or buffer,
  or calls autograd itself), and whether the output has a gradient path to the input at all;
* :func:`gradient_status` (per sample): the input gradient of the margin ``z_y - max_{j != y} z_j`` is exactly
  zero, or NaN/infinite; the margin itself shows saturation (cross-entropy gradients underflow in float32 once it
  exceeds :data:`SATURATED_MARGIN`);
* :class:`LogProbabilities`: the model a probability-output model is attacked through (log p are logits).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from robustest.attacks import margin
from robustest.core.modelcall import eval_mode, forward, frozen_params

__all__ = ["RANDOMNESS_TOLERANCE", "SATURATED_MARGIN", "LogProbabilities", "ModelProbe", "gradient_path",
           "gradient_status", "probe_model", "state_fingerprint"]

#: L2 distance of the normalised outputs of two forwards above which a model counts as randomised (AutoAttack's)
RANDOMNESS_TOLERANCE = 1e-4
#: logit margin above which float32 cross-entropy gradients underflow (exp(-88) is below float32's normal range)
SATURATED_MARGIN = 80.0
#: gradient status codes of :func:`gradient_status`
GRAD_OK, GRAD_ZERO, GRAD_NONFINITE = 0, 1, 2


class LogProbabilities(nn.Module):
    """``log(model(x))`` for a model whose outputs are probabilities: the same predictions, and logits whose
    gradients do not vanish the way the gradients of a second softmax over probabilities do."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return forward(self.model, x).clamp_min(1e-30).log()


@dataclass
class ModelProbe:
    """What :func:`probe_model` found on ``num_images`` images.

    ``randomised``: repeated forwards disagree (``max_output_diff``: the largest L2 distance of the normalised
    outputs, ``prediction_changes``: images whose class changed in some forward); ``probability_output``;
    ``changed_state``: names of parameters and buffers a forward pass changed; ``autograd_calls``: calls of
    autograd during one forward pass; ``gradient_path``: False when the output does not depend differentiably on
    the input (``gradient_error``: the error the gradient forward raised, if any)."""

    num_images: int
    forwards: int
    randomised: bool
    max_output_diff: float
    prediction_changes: int
    probability_output: bool
    changed_state: list[str] = field(default_factory=list)
    autograd_calls: int = 0
    gradient_path: bool = True
    gradient_error: str | None = None

    @property
    def dynamic(self) -> bool:
        return bool(self.changed_state) or self.autograd_calls > 0

    def to_dict(self) -> dict[str, Any]:
        return {"num_images": self.num_images, "forwards": self.forwards, "randomised": self.randomised,
                "max_output_diff": self.max_output_diff, "prediction_changes": self.prediction_changes,
                "probability_output": self.probability_output, "changed_state": list(self.changed_state),
                "autograd_calls": self.autograd_calls, "gradient_path": self.gradient_path,
                "gradient_error": self.gradient_error}


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {f"parameter {k}": p.detach().clone() for k, p in model.named_parameters()}
    out.update({f"buffer {k}": b.detach().clone() for k, b in model.named_buffers()})
    return out


def state_fingerprint(model: nn.Module) -> dict[str, tuple[float, float]]:
    """A cheap fingerprint of every parameter and buffer (sum and sum of squares, in float64): what an
    evaluation compares before and after its attacks to catch a model that changes itself while attacked."""
    out = {}
    with torch.no_grad():
        for kind, items in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
            for k, t in items:
                d = t.detach().double()
                out[f"{kind} {k}"] = (float(d.sum()), float((d * d).sum()))
    return out


def _autograd_codes() -> set[Any]:
    fns = [torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward]
    return {f.__code__ for f in fns if hasattr(f, "__code__")}


def _count_autograd_calls(model: nn.Module, x: torch.Tensor) -> int:
    """Calls of ``torch.autograd.grad`` / ``backward`` while ``model`` runs one forward pass of ``x`` (traced as
    AutoAttack's check_dynamic does, but matching the functions themselves, not every function of that name)."""
    codes = _autograd_codes()
    calls = 0

    def trace(frame, event, arg):  # noqa: ANN001
        nonlocal calls
        if event == "call" and frame.f_code in codes:
            calls += 1
        return None  # no line tracing inside any frame

    old = sys.gettrace()
    sys.settrace(trace)
    try:
        with torch.no_grad():
            forward(model, x)
    finally:
        sys.settrace(old)
    return calls


def gradient_path(model: nn.Module, x: torch.Tensor) -> tuple[bool, str | None]:
    """``(True, None)`` when ``model``'s output on images ``x`` (N x C x H x W) has an autograd path to ``x``, else
    ``(False, why)``; the caller sets the mode."""
    xr = x.detach().clone().requires_grad_(True)
    try:
        with torch.enable_grad():
            out = forward(model, xr)
            if not out.requires_grad:
                return False, "the output does not require grad"
            (g,) = torch.autograd.grad(out.float().sum(), xr, allow_unused=True)
    except RuntimeError as e:
        return False, str(e).splitlines()[0] if str(e) else type(e).__name__
    if g is None:
        return False, "the output does not depend on the input through autograd"
    return True, None


def probe_model(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, forwards: int = 5,
                tolerance: float = RANDOMNESS_TOLERANCE) -> ModelProbe:
    """Probe ``model`` on images ``x`` (N x C x H x W in [0, 1], a few dozen are enough) with labels ``y`` [N]:
    randomness over ``forwards`` forward passes (not reseeded in between), probability outputs, a dynamic
    defence and the gradient path. The model runs in eval mode with frozen parameters; its mode is restored."""
    with eval_mode(model), frozen_params(model):
        before = _state(model)
        outs = []
        with torch.no_grad():
            for _ in range(forwards):
                outs.append(forward(model, x).float())
        changed = [k for k, v in _state(model).items() if not torch.equal(v, before[k])]
        del before
        normed = [o / (o.norm(dim=1, keepdim=True) + 1e-10) for o in outs]
        diff = max((float((normed[i] - normed[j]).norm(dim=1).max()) for i in range(forwards)
                    for j in range(i + 1, forwards)), default=0.0)
        preds = torch.stack([o.argmax(1) for o in outs])
        changes = int((preds != preds[0]).any(0).sum())
        o = outs[0]
        prob = bool(o.max() < 1 + 1e-5 and o.min() > -1e-5 and ((o.sum(1) - 1).abs() < 1e-5).all())
        calls = _count_autograd_calls(model, x[:2])
        path, err = gradient_path(model, x[:2])
    return ModelProbe(num_images=int(x.shape[0]), forwards=forwards, randomised=changes > 0 or diff > tolerance,
                      max_output_diff=diff, prediction_changes=changes, probability_output=prob,
                      changed_state=changed, autograd_calls=calls, gradient_path=path, gradient_error=err)


def gradient_status(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Per sample (int64 [N]): :data:`GRAD_OK`, :data:`GRAD_ZERO` (the input gradient of the margin is exactly zero
    everywhere) or :data:`GRAD_NONFINITE` (some entry is NaN or infinite), from one forward and backward pass of
    the summed margins per batch (samples do not interact in eval mode). ``x``: N x C x H x W; ``y``: int64 [N]."""
    out = []
    with eval_mode(model), frozen_params(model):
        for s in range(0, x.shape[0], batch_size):
            xr = x[s:s + batch_size].detach().clone().requires_grad_(True)
            with torch.enable_grad():
                m = margin(forward(model, xr).float(), y[s:s + batch_size])
                (g,) = torch.autograd.grad(m.sum(), xr, allow_unused=True)
            if g is None:
                out.append(torch.full((xr.shape[0],), GRAD_ZERO, dtype=torch.long))
                continue
            g = g.flatten(1)
            code = torch.where((g == 0).all(1), GRAD_ZERO, GRAD_OK)
            code = torch.where(~torch.isfinite(g).all(1), GRAD_NONFINITE, code)
            out.append(code.long().cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)
