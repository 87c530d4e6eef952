"""CROWN (Zhang et al. 2018): linear bounds propagated backwards through the graph's linear relaxation.

A bound on ``A . z_target`` moves layer by layer to the input: affine ops transpose exactly; a ReLU with input
bounds ``[l, u]`` is replaced by its CROWN relaxation (upper line through ``(l, 0)`` and ``(u, u)``, lower slope 1
when ``u > -l`` else 0, stable neurons exact); a max-pool window by ``max >= x_i*`` (``i*`` the element with the
largest lower bound) below and, above, ``x_i*`` when it dominates the window (``l_i* >= u_j`` for the others), else
the window's largest upper bound. The input ball is then concretised (dual norm).

Intermediate bounds (the inputs of every ReLU and max-pool) come from CROWN itself, as in auto_LiRPA: a neuron is
bounded backwards only when one IBP step from the tighter bounds below leaves it unstable for that sample (every
neuron when something other than a ReLU reads it, or when more than 90 % of the sample's neurons of the layer are
unstable), and every CROWN bound is intersected with that IBP step. A sample's bounds therefore never depend on
the other samples of its batch; they equal auto_LiRPA's for the sample alone (auto_LiRPA bounds the neurons
unstable for any sample of the batch, so its figures move with the batch). ``intermediate="ibp"`` keeps IBP's
boxes instead (CROWN-IBP, Zhang et al. 2020).

Memory: coefficients are N x S x (largest layer); S (the rows bounded at once) is chosen to stay near
``budget`` elements.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from robustest.certify.graph import Graph
from robustest.certify.interval import Bounds, first_weight_layer, input_box, interval_bounds, step
from robustest.certify.ops import affine_transposed, concretize, maxpool_relaxation, relaxed, relu_relaxation
from robustest.certify.patches import chain, conv_bounds, patch_width

BUDGET = 1 << 25  # elements of one coefficient tensor (128 MiB in float32)
SPARSE_SHARE = 0.9  # above this share of unstable neurons, a sample's layer is bounded whole


def _add(acc: dict[int, torch.Tensor], key: int, value: torch.Tensor) -> None:
    acc[key] = acc[key] + value if key in acc else value


class Propagator:
    """Bounds of one graph on one batch of balls (``x``: N x C x H x W, radius ``eps``, ``norm`` linf or l2)."""

    def __init__(self, graph: Graph, x: torch.Tensor, eps: float, norm: str, *, intermediate: str = "crown",
                 budget: int = BUDGET) -> None:
        self.graph, self.x, self.eps, self.norm = graph, x, eps, norm
        self.box = input_box(x, eps, norm)
        self.ibp = interval_bounds(graph, x, eps, norm)
        self.consumers = graph.consumers()
        self.budget = budget
        self.bounds: dict[int, Bounds] = {0: self.ibp[0]}
        if intermediate == "ibp":
            self.bounds.update(enumerate(self.ibp))
        else:
            self.bounds.update({i: self.ibp[i] for i in self._exact()})

    def _exact(self) -> set[int]:
        """Ops whose IBP box is already the exact one: per-element maps of the input box and one weight layer on
        top of it (L-inf), or the dual-norm first weight layer (L2)."""
        if self.norm != "linf":
            first = first_weight_layer(self.graph)
            return set() if first is None else {first}
        boxes, exact = {0}, {0}
        for i, op in enumerate(self.graph.ops[1:], start=1):
            if not op.inputs or op.inputs[0] not in boxes or op.kind == "add":
                continue
            if op.kind in ("reshape", "identity") or op.kind == "affine" and op.kind_detail == "diag":
                boxes.add(i)
                exact.add(i)
            elif op.kind == "affine":
                exact.add(i)
        return exact

    def bounds_of(self, i: int) -> Bounds:
        """Op ``i``'s output bounds (N x op shape), computing the ones below it as needed."""
        if i in self.bounds:
            return self.bounds[i]
        op = self.graph.ops[i]
        inputs = {j: self.bounds_of(j) for j in op.inputs}
        reference = step(op, inputs)
        if op.kind in ("relu", "maxpool", "reshape", "identity"):
            self.bounds[i] = reference
            return reference
        lo, hi = reference
        n = lo.shape[0]
        reads = [self.graph.ops[c].kind for c in self.consumers[i]]
        flat_lo, flat_hi = lo.flatten(1).clone(), hi.flatten(1).clone()
        if reads and all(k == "relu" for k in reads):
            # only the signs of these bounds matter below: bound a sample's unstable neurons, keep the IBP step
            # for its stable ones (whatever the other samples need), so its bounds do not depend on its batch
            wanted = (flat_lo < 0) & (flat_hi > 0)
            # as auto_LiRPA: when more than 90 % of a sample's neurons are unstable, bound all of them
            wanted[wanted.float().mean(1) > SPARSE_SHARE] = True
        else:
            wanted = torch.ones_like(flat_lo, dtype=torch.bool)
        rows = wanted.any(0).nonzero().flatten()
        path = chain(self.graph, i)
        width = max(int(math.prod(o.out_shape)) for o in self.graph.ops[: i + 1]) if path is None \
            else patch_width(self.graph, path)
        chunk = max(1, self.budget // max(1, n * width))
        for start in range(0, rows.numel(), chunk):
            part = rows[start:start + chunk]
            if path is not None:
                lower, upper = conv_bounds(self.graph, path, part, self.bounds_of, self.x, self.box, self.eps,
                                           self.norm)
            else:  # the same rows for every sample until the first relaxation: one copy, broadcast over the batch
                a = lo.new_zeros(1, part.numel(), flat_lo.shape[1])
                a[0, torch.arange(part.numel(), device=lo.device), part] = 1.0
                lower, upper = self.backward(i, a.view(1, part.numel(), *op.out_shape))
            use = wanted[:, part]
            flat_lo[:, part] = torch.where(use, torch.maximum(flat_lo[:, part], lower), flat_lo[:, part])
            flat_hi[:, part] = torch.where(use, torch.minimum(flat_hi[:, part], upper), flat_hi[:, part])
        self.bounds[i] = (flat_lo.view_as(lo), flat_hi.view_as(hi))
        return self.bounds[i]

    def backward(self, target: int, a: torch.Tensor, *, lower: bool = True, upper: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Lower and upper bounds (N x S) of ``sum(a * z_target)`` over the ball; ``a`` is N x S x target shape
        (or 1 x S x target shape, the same rows for every sample). A side not asked for comes back as NaN."""
        n, s = self.x.shape[0], a.shape[1]
        acc_lo: dict[int, torch.Tensor] = {target: a} if lower else {}
        acc_hi: dict[int, torch.Tensor] = {target: a} if upper else {}
        const_lo = a.new_zeros(n, s)
        const_hi = a.new_zeros(n, s)
        for i in range(target, -1, -1):
            al, au = acc_lo.pop(i, None), acc_hi.pop(i, None)
            if al is None and au is None:
                continue
            op = self.graph.ops[i]
            if op.kind == "input":
                if al is not None:
                    const_lo = const_lo + concretize(al, self.x, *self.box, self.eps, self.norm, sign=-1)
                if au is not None:
                    const_hi = const_hi + concretize(au, self.x, *self.box, self.eps, self.norm, sign=+1)
                continue
            if op.kind == "affine":
                if al is not None:
                    al, c = affine_transposed(op, al)
                    const_lo = const_lo + c
                if au is not None:
                    au, c = affine_transposed(op, au)
                    const_hi = const_hi + c
            elif op.kind == "relu":
                al, au, cl, cu = self._relu(op.inputs[0], al, au)
                const_lo, const_hi = const_lo + cl, const_hi + cu
            elif op.kind == "maxpool":
                al, au, cl, cu = self._maxpool(op.inputs[0], op.params["kernel"], al, au)
                const_lo, const_hi = const_lo + cl, const_hi + cu
            elif op.kind == "reshape":
                al = None if al is None else al.reshape(al.shape[0], s, *op.in_shape)
                au = None if au is None else au.reshape(au.shape[0], s, *op.in_shape)
            for j in op.inputs:
                if al is not None:
                    _add(acc_lo, j, al)
                if au is not None:
                    _add(acc_hi, j, au)
        nan = torch.full_like(const_lo, float("nan"))
        return (const_lo if lower else nan), (const_hi if upper else nan)

    def _relu(self, source: int, al: torch.Tensor | None, au: torch.Tensor | None
              ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | float, torch.Tensor | float]:
        lo, hi = self.bounds_of(source)
        lo_slope, up_slope, up_icpt = (t.unsqueeze(1) for t in relu_relaxation(lo, hi))
        cl: torch.Tensor | float = 0.0
        cu: torch.Tensor | float = 0.0
        if al is not None:
            al, cl = relaxed(al, lo_slope, up_slope, up_icpt, upper=False)
        if au is not None:
            au, cu = relaxed(au, lo_slope, up_slope, up_icpt, upper=True)
        return al, au, cl, cu

    def _maxpool(self, source: int, kernel: tuple[int, int], al: torch.Tensor | None, au: torch.Tensor | None
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | float, torch.Tensor | float]:
        lo, hi = self.bounds_of(source)
        n, c, h, w = lo.shape
        index, linear, icpt = (t.unsqueeze(1) for t in maxpool_relaxation(lo, hi, kernel))
        flat_index = index.squeeze(1).flatten(2)

        def to_input(coef: torch.Tensor) -> torch.Tensor:
            s = coef.shape[1]
            out = coef.new_zeros(n, s, c, h * w)
            idx = flat_index.unsqueeze(1).expand(n, s, c, flat_index.shape[-1])
            return out.scatter_add_(-1, idx, coef.flatten(3)).view(n, s, c, h, w)

        cl: torch.Tensor | float = 0.0
        cu: torch.Tensor | float = 0.0
        if al is not None:
            al, cl = relaxed(al, 1.0, linear, icpt, upper=False)
            al = to_input(al)
        if au is not None:
            au, cu = relaxed(au, 1.0, linear, icpt, upper=True)
            au = to_input(au)
        return al, au, cl, cu

    def margins(self, spec: torch.Tensor) -> torch.Tensor:
        """Lower bounds (N x S) of ``spec @ logits`` (``spec``: N x S x K), CROWN's and IBP's tighter one."""
        last = len(self.graph.ops) - 1
        for op in self.graph.ops:  # bottom-up, so each intermediate bound finds the ones below it ready
            if op.kind in ("relu", "maxpool"):
                self.bounds_of(op.inputs[0])
        lower, _ = self.backward(last, spec, upper=False)
        return torch.maximum(lower, ibp_margins(self.graph, self.bounds_of, spec, self.x, self.eps, self.norm))


def ibp_margins(graph: Graph, bounds: Callable[[int], Bounds], spec: torch.Tensor,
                x: torch.Tensor | None = None, eps: float = 0.0, norm: str = "linf") -> torch.Tensor:
    """IBP's lower bounds (N x S) of ``spec @ logits``, with the specification folded into the last weight layer
    (Gowal et al. 2018's elision) when the logits come from one; ``spec`` is N x S x K; ``bounds(i)`` gives op
    ``i``'s box (IBP's own, or the tighter ones CROWN found, as auto_LiRPA's final comparison uses). When that layer
    reads the input through per-element maps only, and the ball (``x``, ``eps``, ``norm``) is given, the folded
    row is concretised on the ball itself (exact, also for L2)."""
    i = len(graph.ops) - 1
    while graph.ops[i].kind == "identity":
        i = graph.ops[i].inputs[0]
    op = graph.ops[i]
    if op.kind == "affine" and op.kind_detail in ("linear", "conv"):
        a, const = affine_transposed(op, spec.view(*spec.shape[:2], *op.out_shape))
        j = op.inputs[0]
        if x is not None:
            a_in, c_in, k = a, const, j
            while graph.ops[k].kind in ("reshape", "identity") or graph.ops[k].kind == "affine" \
                    and graph.ops[k].kind_detail == "diag":
                below = graph.ops[k]
                if below.kind == "affine":
                    a_in, c = affine_transposed(below, a_in)
                    c_in = c_in + c
                elif below.kind == "reshape":
                    a_in = a_in.reshape(*a_in.shape[:2], *below.in_shape)
                k = below.inputs[0]
            if graph.ops[k].kind == "input":
                return c_in + concretize(a_in, x, *input_box(x, eps, norm), eps, norm, sign=-1)
        lo, hi = bounds(j)
    else:
        a, const = spec, spec.new_zeros(spec.shape[:2])
        lo, hi = bounds(i)
    flat = a.flatten(2)
    return const + (flat.clamp(min=0) * lo.flatten(1).unsqueeze(1)).sum(-1) \
        + (flat.clamp(max=0) * hi.flatten(1).unsqueeze(1)).sum(-1)
