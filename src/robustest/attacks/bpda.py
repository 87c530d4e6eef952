"""BPDA: Backward Pass Differentiable Approximation (Athalye, Carlini & Wagner 2018).

A defence whose forward pass is not usefully differentiable (quantisation, JPEG, thermometer encoding, a
purifier with a zero or random gradient) obfuscates gradients: gradient attacks see zero or noise and report
robustness that is not there. BPDA keeps the defence's forward pass and replaces its backward pass with that of
a differentiable approximation ``approx`` (the identity, "straight-through", when the defence maps an input close
to itself). Attacks then run unchanged on the wrapped model::

    bpda_model = with_bpda(model, "0")      # submodule "0" (as in model.named_modules()) becomes straight-through
    adv = robustest.attacks.pgd(bpda_model, x, y, eps=0.3)

:class:`BPDA` is the wrapper module, :func:`straight_through` the identity case, and :func:`with_bpda` returns a
copy of a model (sharing its parameters and buffers) with named submodules wrapped.

Value and gradient: the output of ``BPDA(module, approx)(x)`` is ``module(x)`` bit for bit (it is not computed as
``a + (module(x) - a).detach()``, whose float rounding may differ from ``module(x)`` by an ulp); its
vector-Jacobian product is that of ``approx`` at ``x``. ``module`` runs without autograd (its parameters receive
no gradient through the wrapper and are never modified); a module ``approx`` with parameters does receive theirs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from robustest.core.errors import ConfigError

__all__ = ["BPDA", "Approximation", "straight_through", "with_bpda"]

#: What a backward pass may be replaced with: the identity (None or "identity"), an nn.Module or a callable,
#: tensor -> tensor of the module's output shape.
Approximation = str | nn.Module | Callable[[torch.Tensor], torch.Tensor] | None

_MAX_LISTED = 10


def _shape(t: torch.Tensor) -> str:
    return "x".join(str(s) for s in t.shape) or "scalar"


def _check_approx(approx: Any, where: str = "") -> nn.Module | Callable[[torch.Tensor], torch.Tensor] | None:
    """None for the identity; an nn.Module or callable as given; else ConfigError."""
    at = f" for submodule {where!r}" if where else ""
    if approx is None or (isinstance(approx, str) and approx.strip().lower() == "identity"):
        return None
    if isinstance(approx, str):
        raise ConfigError(f"unknown BPDA approximation {approx!r}{at}: use 'identity', an nn.Module or a callable "
                          "tensor -> tensor")
    if not callable(approx):
        raise ConfigError(f"BPDA approximation{at} must be 'identity', an nn.Module or a callable tensor -> tensor, "
                          f"got {type(approx).__name__}")
    return approx


class _Substitute(torch.autograd.Function):
    """Value ``module(x)``, gradient flowing into ``surrogate`` (``approx(x)``, or ``x`` itself for the identity)."""

    @staticmethod
    def forward(ctx: Any, surrogate: torch.Tensor, module: nn.Module, x: torch.Tensor,
                identity: bool) -> torch.Tensor:  # type: ignore[override]
        out = module(x)  # autograd is off inside forward: no graph through module
        _check_output(out, surrogate, identity)
        ctx.surrogate_dtype = surrogate.dtype
        if out is x or out is surrogate or out._base is not None:
            # autograd forbids in-place changes of a custom Function's output that is an input or a view;
            # a copy keeps later in-place layers (ReLU(inplace=True)) working (same values)
            out = out.clone()
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:  # type: ignore[override]
        return grad.to(ctx.surrogate_dtype), None, None, None


def _check_output(out: Any, surrogate: torch.Tensor, identity: bool) -> None:
    """ConfigError unless ``out`` is a tensor of the surrogate's shape (the input's shape for the identity)."""
    if not isinstance(out, torch.Tensor):
        raise ConfigError(f"BPDA needs a module that returns a tensor, this one returns {type(out).__name__}")
    if out.shape != surrogate.shape:
        if identity:
            raise ConfigError(f"straight-through BPDA needs an output of the input's shape, but the module maps "
                              f"{_shape(surrogate)} to {_shape(out)}: give an approx returning {_shape(out)}")
        raise ConfigError(f"BPDA approx must return the module's output shape: the module returns {_shape(out)}, "
                          f"approx returns {_shape(surrogate)}")


class BPDA(nn.Module):
    """``module``'s forward pass with ``approx``'s backward pass.

    ``BPDA(module, approx)(x)`` equals ``module(x)`` bit for bit, and its gradient with respect to ``x`` (the
    vector-Jacobian product for any upstream gradient) is that of ``approx(x)``. ``approx``: None or
    ``"identity"`` (straight-through: the upstream gradient passes unchanged; needs ``module(x)`` of ``x``'s
    shape), an nn.Module (registered as the submodule ``approx``, so it follows ``.to(device)``) or a callable
    tensor -> tensor returning ``module(x)``'s shape. A wrong shape is a one-line :class:`ConfigError`.

    x: any batched tensor, e.g. N x C x H x W, on any device (the output is where ``module`` puts it). ``module``
    runs without autograd: its parameters get no gradient through the wrapper and are never changed. Without
    gradients (``torch.no_grad()``) the wrapper only runs ``module``. ``module`` is registered as the submodule
    ``module``, so state-dict keys gain the prefix ``module.``.
    """

    def __init__(self, module: nn.Module, approx: Approximation = None) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise ConfigError(f"BPDA wraps an nn.Module, got {type(module).__name__}")
        self.module = module
        self.approx = _check_approx(approx)

    @property
    def identity(self) -> bool:
        """Whether the backward pass is the identity (straight-through)."""
        return self.approx is None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: tensor (e.g. N x C x H x W) -> ``module(x)`` (same shape for the identity), gradient of approx."""
        if not isinstance(x, torch.Tensor):
            raise ConfigError(f"BPDA takes a tensor, got {type(x).__name__}")
        if not torch.is_grad_enabled():
            out = self.module(x)
            if self.identity:
                _check_output(out, x, True)
            return out
        surrogate = x if self.approx is None else self.approx(x)
        if not isinstance(surrogate, torch.Tensor):
            raise ConfigError(f"BPDA approx must return a tensor, got {type(surrogate).__name__}")
        if not surrogate.requires_grad:  # nothing to differentiate: the module's value alone, without a graph
            with torch.no_grad():
                out = self.module(x)
            _check_output(out, surrogate, self.identity)
            return out
        return _Substitute.apply(surrogate, self.module, x, self.identity)

    def extra_repr(self) -> str:
        if self.approx is None:
            return "approx=identity"
        if isinstance(self.approx, nn.Module):
            return ""  # printed as the submodule
        return f"approx={getattr(self.approx, '__name__', type(self.approx).__name__)}"


def straight_through(module: nn.Module) -> BPDA:
    """``module`` with the identity as its backward pass (BPDA's straight-through estimator): the value is
    ``module(x)``, the gradient the upstream gradient itself. ``module`` must map x to x's shape."""
    return BPDA(module, None)


# ----------------------------------------------------------------------------------------------- with_bpda
def _check_parts(parts: Any) -> dict[str, Any]:
    """{dotted name: approximation} from a mapping, a comma-separated string or a list of names (identity)."""
    if isinstance(parts, Mapping):
        items = list(parts.items())
    elif isinstance(parts, str):
        items = [(p.strip(), None) for p in parts.split(",")]
    elif isinstance(parts, Iterable):
        items = [(p, None) for p in parts]
    else:
        raise ConfigError(f"parts must map submodule names to approximations, or name submodules (a list or "
                          f"'a.b,c'), got {type(parts).__name__}")
    if not items:
        raise ConfigError("with_bpda needs at least one submodule name (as in model.named_modules())")
    out: dict[str, Any] = {}
    for name, approx in items:
        if not isinstance(name, str):
            raise ConfigError(f"submodule names must be strings (as in model.named_modules()), got {name!r}")
        name = name.strip()
        if name == "":
            raise ConfigError("BPDA cannot wrap the whole model (the name ''): name a submodule, e.g. the "
                              "preprocessing defence, as in model.named_modules()")
        out[name] = _check_approx(approx, name)
    return out


def _copy_tree(module: nn.Module, memo: dict[int, nn.Module]) -> nn.Module:
    """A shallow copy of every module in the tree (same parameters, buffers and other attributes; own
    containers, so replacing a child, a parameter or a hook of the copy leaves the original alone). A module
    reachable twice is copied once; TorchScript submodules are shared as they are."""
    if id(module) in memo:
        return memo[id(module)]
    if isinstance(module, torch.jit.ScriptModule):
        memo[id(module)] = module
        return module
    new = object.__new__(type(module))  # not cls.__new__: fx's GraphModule.__new__ makes a class per instance
    memo[id(module)] = new
    state = {k: (type(v)(v) if type(v) in (dict, OrderedDict, set) else v) for k, v in module.__dict__.items()}
    state["_modules"] = OrderedDict((k, None if m is None else _copy_tree(m, memo))
                                    for k, m in module._modules.items())
    object.__setattr__(new, "__dict__", state)
    return new


def with_bpda(model: nn.Module, parts: Mapping[str, Approximation] | str | Iterable[str]) -> nn.Module:
    """A copy of ``model`` whose named submodules are wrapped in :class:`BPDA`.

    ``parts``: a mapping from a submodule's dotted name (as in ``model.named_modules()``) to its approximation
    (``"identity"``, an nn.Module or a callable tensor -> tensor), or names alone (a list, or a comma-separated
    string ``"a.b,c"``), each then straight-through. The copy shares every parameter and buffer with ``model``
    (no extra memory; weight changes are seen by both) and keeps the top module's attributes
    (``robustest_spec`` ...); its module objects are shallow copies, so ``model`` itself is left unchanged (its
    submodules are not replaced, its modes and hooks are its own). Nested names ("a" and "a.b") both apply.

    Refused with a one-line :class:`ConfigError`: an unknown name (the message lists available names), the whole
    model (``""``), a name inside a TorchScript submodule, and a TorchScript model (BPDA needs Python modules).
    """
    if isinstance(model, torch.jit.ScriptModule):
        raise ConfigError("BPDA needs a Python nn.Module, not a TorchScript model: load the model from its Python "
                          "code (pass --model pkg.module:factory)")
    if not isinstance(model, nn.Module):
        raise ConfigError(f"with_bpda takes an nn.Module, got {type(model).__name__}")
    wanted = _check_parts(parts)
    available = [n for n, _ in model.named_modules(remove_duplicate=False) if n]
    known = set(available)
    for name in wanted:
        if name not in known:
            listed = ", ".join(available[:_MAX_LISTED]) or "none"
            more = f" (and {len(available) - _MAX_LISTED} more)" if len(available) > _MAX_LISTED else ""
            raise ConfigError(f"unknown submodule {name!r} for BPDA: the model's submodules are {listed}{more}")
    new = _copy_tree(model, {})
    for name in sorted(wanted, key=lambda n: -n.count(".")):  # deepest first: shallower paths stay valid
        *path, last = name.split(".")
        parent = new
        for piece in path:
            parent = parent._modules[piece]
            if isinstance(parent, torch.jit.ScriptModule):
                raise ConfigError(f"submodule {name!r} is inside a TorchScript module: BPDA needs a Python "
                                  "nn.Module (pass --model pkg.module:factory)")
        parent._modules[last] = BPDA(parent._modules[last], wanted[name])
    return new
