"""Loss-based test metrics of RobOT: zero-order loss (ZOL) and first-order loss (FOL).

With ``J`` the cross-entropy, ``y`` the label and ``g = grad_x J(f(x'), y)``:

* ``zol(x') = J(f(x'), y)``
* ``fol(x') = eps * ||g||_q - <x' - x0, g>`` with ``q`` the dual norm of the perturbation norm ``p``
  (``linf -> l1``, ``l2 -> l2``, ``l1 -> linf``), ``x0`` the seed ``x'`` was derived from. Inside the
  eps-ball FOL >= 0, and FOL = 0 at a first-order stationary point of the inner maximisation.
* ``fol_gradnorm(x') = ||g||_2``: the plain gradient norm RobOT's reference code calls its "L2" FOL.

Gradients are computed for a whole batch with one forward and one backward pass of the *sum* of the
per-sample losses: in eval mode samples do not interact, so the input gradient of the sum is the stack
of per-sample gradients. The model's train/eval mode and its parameters' ``requires_grad`` flags are
restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError, DataError
from robustest.core.inputs import check_images, check_labels
from robustest.core.modelcall import eval_mode, forward, frozen_params
from robustest.core.validation import check_eps

__all__ = ["DEFAULT_BATCH_SIZE", "NORMS", "fol", "fol_gradnorm", "input_gradients", "zol"]

#: Chunk size used when ``batch_size`` is None.
DEFAULT_BATCH_SIZE = 1024

#: Perturbation norm -> dual norm order used on the gradient.
NORMS: dict[str, float] = {"linf": 1.0, "l2": 2.0, "l1": float("inf")}

LABELS = ("true", "pred")


def _chunks(n: int, batch_size: int | None) -> Iterator[tuple[int, int]]:
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    bs = batch_size or DEFAULT_BATCH_SIZE
    for s in range(0, n, bs):
        yield s, min(s + bs, n)


def _check_label_mode(label: str) -> None:
    if label not in LABELS:
        raise ConfigError(f"label must be 'true' or 'pred', got {label!r}")


def _prepare(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None, label: str) -> None:
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_images(x)
    _check_label_mode(label)
    if label == "true":
        if y is None:
            raise DataError("y is None but label='true' needs the true labels: pass y or use label='pred'")
        check_labels(y, x.shape[0])
    elif y is not None:
        check_labels(y, x.shape[0])


def _check_range(logits: torch.Tensor, y: torch.Tensor) -> None:
    if y.numel() and (int(y.max()) >= logits.shape[1] or int(y.min()) < 0):
        raise DataError(f"labels span [{int(y.min())}, {int(y.max())}] but the model has {logits.shape[1]} classes: "
                        "check the labels or the model")


def _predicted(model: nn.Module, x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Argmax prediction of ``model`` on ``x`` (already on ``device``), no graph."""
    with torch.no_grad():
        return forward(model, x).argmax(dim=1)


def zol(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int | None = None) -> torch.Tensor:
    """Zero-order loss: per-sample cross-entropy ``J(f(x), y)``.

    Args:
        model: classifier returning logits ``[N, K]``.
        x: images ``[N, C, H, W]`` in [0, 1].
        y: int64 labels ``[N]``.
        batch_size: chunk size (None: :data:`DEFAULT_BATCH_SIZE`).

    Returns:
        float32 tensor ``[N]`` on ``x``'s device, in input order.
    """
    _prepare(model, x, y, "true")
    device = resolve_device(model)
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    with eval_mode(model), torch.no_grad():
        for s, e in _chunks(x.shape[0], batch_size):
            logits = forward(model, x[s:e].to(device))
            yb = y[s:e].to(device)
            _check_range(logits, yb)
            loss = F.cross_entropy(logits.float(), yb, reduction="none")
            out[s:e] = loss.to(x.device)
    return out


def input_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample input gradients of the cross-entropy for one batch (one forward, one backward).

    ``x`` ``[B, C, H, W]`` and ``y`` ``[B]`` must be on the model's device; the model must already be in eval
    mode. Returns ``[B, C, H, W]``.
    """
    xb = x.detach().clone().requires_grad_(True)
    logits = forward(model, xb)
    _check_range(logits, y)
    loss = F.cross_entropy(logits.float(), y, reduction="sum")
    (g,) = torch.autograd.grad(loss, xb)
    return g


def _batched_gradients(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor | None,
    x0: torch.Tensor | None,
    label: str,
    batch_size: int | None,
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Yield ``(s, e, x_batch, grad_batch, x0_batch)`` on the model's device."""
    device = resolve_device(model)
    for s, e in _chunks(x.shape[0], batch_size):
        xb = x[s:e].to(device)
        x0b = x0[s:e].to(device) if x0 is not None else None
        if label == "pred":
            if x0b is not None:
                yb = _predicted(model, x0b, device)
                g = input_gradients(model, xb, yb)
            else:
                # one forward serves both the prediction and the loss
                xg = xb.detach().clone().requires_grad_(True)
                logits = forward(model, xg)
                yb = logits.detach().argmax(dim=1)
                loss = F.cross_entropy(logits.float(), yb, reduction="sum")
                (g,) = torch.autograd.grad(loss, xg)
        else:
            assert y is not None
            g = input_gradients(model, xb, y[s:e].to(device))
        yield s, e, xb, g, x0b


def fol(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor | None,
    x0: torch.Tensor | None = None,
    eps: float = 0.3,
    norm: str = "linf",
    label: str = "true",
    *,
    batch_size: int | None = None,
) -> torch.Tensor:
    """First-order loss ``eps * ||g||_q - <x - x0, g>`` of each test input (RobOT, FOSC).

    Args:
        model: classifier returning logits ``[N, K]``.
        x: test inputs ``x'`` ``[N, C, H, W]`` in [0, 1].
        y: int64 labels ``[N]`` (may be None with ``label="pred"``).
        x0: seeds ``[N, C, H, W]`` the tests were derived from; None means each input is its own seed
            (FOL reduces to ``eps * ||g||_q``).
        eps: radius of the perturbation ball (> 0).
        norm: perturbation norm ``p``: ``"linf"``, ``"l2"`` or ``"l1"``; the gradient is measured in the
            dual norm ``q`` (l1, l2, linf respectively).
        label: ``"true"`` uses ``y``; ``"pred"`` uses the model's prediction on ``x0`` (on ``x`` when ``x0``
            is None), as RobOT's fuzzer does.
        batch_size: chunk size (None: :data:`DEFAULT_BATCH_SIZE`).

    Returns:
        float32 tensor ``[N]`` on ``x``'s device, in input order.
    """
    if norm not in NORMS:
        raise ConfigError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")
    eps = check_eps("eps", eps, norm)
    _prepare(model, x, y, label)
    if x0 is not None:
        check_images(x0, "x0")
        if x0.shape != x.shape:
            raise DataError(f"x0 has shape {tuple(x0.shape)} but x has {tuple(x.shape)}: give one seed per input")
    q = NORMS[norm]
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    with eval_mode(model), frozen_params(model):
        for s, e, xb, g, x0b in _batched_gradients(model, x, y, x0, label, batch_size):
            gf = g.flatten(1).float()
            val = eps * torch.linalg.vector_norm(gf, ord=q, dim=1)
            if x0b is not None:
                val = val - ((xb - x0b).flatten(1).float() * gf).sum(dim=1)
            out[s:e] = val.to(x.device)
    return out


def fol_gradnorm(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor | None,
    label: str = "true",
    *,
    batch_size: int | None = None,
) -> torch.Tensor:
    """The reference code's "L2 FOL": the plain L2 norm ``||grad_x J(f(x), y)||_2`` of each input.

    Args:
        model: classifier returning logits ``[N, K]``.
        x: images ``[N, C, H, W]`` in [0, 1].
        y: int64 labels ``[N]`` (may be None with ``label="pred"``).
        label: ``"true"`` uses ``y``; ``"pred"`` the model's prediction on ``x``.
        batch_size: chunk size (None: :data:`DEFAULT_BATCH_SIZE`).

    Returns:
        float32 tensor ``[N]`` on ``x``'s device.
    """
    _prepare(model, x, y, label)
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    with eval_mode(model), frozen_params(model):
        for s, e, _xb, g, _ in _batched_gradients(model, x, y, None, label, batch_size):
            out[s:e] = torch.linalg.vector_norm(g.flatten(1).float(), ord=2, dim=1).to(x.device)
    return out
