"""The bound-propagation entry points: ``ibp`` and ``crown`` certificates, differentiable ``margin_bounds`` for
certified training, and ``check_certifiable``, the up-front refusal of a model the bounds do not cover."""

from __future__ import annotations

import torch
from torch import nn

from robustest.certify.backward import Propagator, ibp_margins
from robustest.certify.certificate import Certificate
from robustest.certify.graph import Graph, trace
from robustest.certify.interval import interval_bounds
from robustest.core.devices import model_device
from robustest.core.inputs import check_images, check_labels
from robustest.core.modelcall import eval_mode, model_dtype
from robustest.core.validation import check_choice, check_eps, check_float, check_int

METHODS = ("ibp", "crown-ibp", "crown")
NORMS = ("linf", "l2")


def check_certifiable(model: nn.Module, input_shape: tuple[int, ...]) -> Graph:
    """The model's graph for inputs of ``input_shape`` (C x H x W); ConfigError (one line naming the layer and
    the supported set) when bound propagation does not cover the model. Traced in eval mode (the mode is
    restored), so the one forward pass of tracing leaves BatchNorm's running statistics as they are."""
    with eval_mode(model):
        return trace(model, tuple(input_shape), dtype=model_dtype(model), device=model_device(model))


def margin_spec(y: torch.Tensor, num_classes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """N x K x K: row ``j`` of sample ``n`` is ``e_y - e_j`` (row ``y`` is zero), so ``spec @ logits`` gives the
    margins ``z_y - z_j``."""
    eye = torch.eye(num_classes, dtype=dtype, device=y.device)
    return eye[y].unsqueeze(1) - eye.unsqueeze(0)


def _norm(norm: str) -> str:
    n = str(norm).lower().replace("-", "")
    return check_choice("norm", "linf" if n == "inf" else n, NORMS)


def margin_bounds(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, norm: str = "linf",
                  method: str = "ibp", *, graph: Graph | None = None) -> torch.Tensor:
    """Lower bounds (N x K) on ``z_y - z_j`` over the ball of radius ``eps`` around each image of ``x``
    (N x C x H x W, in [0, 1]); column ``y`` is 0. Differentiable with respect to the model's parameters (for
    certified training: ``cross_entropy(-margin_bounds(...), y)`` is Gowal et al.'s robust loss). ``method``:
    ``ibp``, ``crown-ibp`` (CROWN's backward pass over IBP's intermediate boxes) or ``crown``. The model's mode is
    left as it is (BatchNorm is bounded with its running statistics); ``eps`` 0 is allowed (a schedule's start).
    Pass ``graph`` (from :func:`check_certifiable`) to skip tracing on every call."""
    method = check_choice("method", method, METHODS)
    norm = _norm(norm)
    eps = check_float("eps", eps, 0.0)
    graph = graph if graph is not None else check_certifiable(model, tuple(x.shape[1:]))
    spec = margin_spec(y, graph.ops[-1].out_shape[0], x.dtype)
    if method == "ibp":
        boxes = interval_bounds(graph, x, eps, norm)
        return ibp_margins(graph, boxes.__getitem__, spec, x, eps, norm)
    prop = Propagator(graph, x, eps, norm, intermediate="ibp" if method == "crown-ibp" else "crown")
    if method == "crown-ibp":
        return prop.backward(len(graph.ops) - 1, spec, upper=False)[0]
    return prop.margins(spec)


def _certify(method: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, norm: str,
             batch_size: int | None, default_batch: int) -> Certificate:
    norm = _norm(norm)
    eps = check_eps("eps", eps, norm)
    x = check_images(x)
    graph = check_certifiable(model, tuple(x.shape[1:]))
    num_classes = graph.ops[-1].out_shape[0]
    y = check_labels(y, x.shape[0], num_classes)
    batch = check_int("batch_size", batch_size, 1) if batch_size is not None else default_batch
    device, dtype = model_device(model), model_dtype(model)
    parts = []
    with eval_mode(model), torch.no_grad():
        for start in range(0, x.shape[0], batch):
            xb = x[start:start + batch].to(device=device, dtype=dtype)
            yb = y[start:start + batch].to(device=device, dtype=torch.long)
            parts.append(margin_bounds(model, xb, yb, eps, norm, method, graph=graph).float().cpu())
    margins = torch.cat(parts) if parts else torch.zeros(0, num_classes)
    margins[torch.arange(margins.shape[0]), y.long().cpu()] = float("inf")
    certified = margins.min(dim=1).values > 0 if margins.shape[0] else torch.zeros(0, dtype=torch.bool)
    return Certificate(margins=margins, certified=certified, method=method, eps=eps, norm=norm)


def ibp(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, norm: str = "linf", *,
        batch_size: int | None = None) -> Certificate:
    """IBP certificate (Gowal et al. 2018) for each image of ``x`` (N x C x H x W in [0, 1], labels ``y``: N) on
    the ``norm`` ball of radius ``eps`` (L-inf clipped to [0, 1]; L2). Batched on the model's device; the model
    is evaluated in eval mode and its mode restored."""
    return _certify("ibp", model, x, y, eps, norm, batch_size, 256)


def crown(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, norm: str = "linf", *,
          batch_size: int | None = None) -> Certificate:
    """CROWN certificate (Zhang et al. 2018) with CROWN intermediate bounds, each margin the tighter of CROWN's
    and IBP's; arguments as :func:`ibp`."""
    return _certify("crown", model, x, y, eps, norm, batch_size, 64)
