"""Neuron coverage: NC, KMNC, NBC, SNAC and TKNC from a training-data profile.

A :class:`CoverageProfile` is built from training data in one streaming pass (per-neuron min, max, mean and
sample standard deviation, accumulated in float64 with Chan et al.'s parallel variance update). It then
tells, for any inputs, which coverage *cells* each input covers (``bits``, ``BoolTensor[N, cells]``), the
fraction of cells each input covers (``per_input``, ``[N]``) and the fraction covered by the inputs together
(``set_coverage``). Everything is batched over inputs and runs on the model's device (CPU or CUDA).

Neurons are those of :mod:`robustest.metrics.activations`: by default the outputs of every activation
module; a convolutional channel is one neuron whose value is the **mean of the channel over its spatial
positions** (the DeepHunter / dnn-tip convention). Activations are float32; profile statistics float64.

The definitions are those of dnn-tip 0.1.1 (Weiss & Tonella, ISSTA 2022), on the same activation arrays and
profile statistics, with ``a`` a neuron's activation and ``min``, ``max``, ``std`` its training statistics
(``std`` with ddof=1, as dnn-tip's Welford ``var_s``):

* ``nc`` (dnn-tip's NAC; DeepXplore): a neuron is covered when ``a > threshold`` (strict), on the raw
  activation; cells = neurons. Default ``threshold=0.5``. ``scaled=True`` first min-max scales each layer's
  activations per input (DeepXplore's variant, not dnn-tip's).
* ``kmnc`` (DeepGauge): ``k`` sections per neuron with bounds ``t_i = min + i * ((max - min) / k)``,
  ``i = 0..k`` (float64); section ``i`` is covered when ``t_i <= a < t_{i+1}``, so a value equal to the
  training max (or outside [min, max]) covers no section. Cells = neurons * k, neuron-major. Default ``k=10``
  (DeepGauge used 1000, dnn-tip's study 2).
* ``nbc`` (DeepGauge): two cells per neuron, ``a <= min - scale * std`` and ``a >= max + scale * std``
  (non-strict, as dnn-tip). Cells = neurons * 2, neuron-major (lower, upper). Default ``scale=0``.
* ``snac``: one cell per neuron, ``a >= max + scale * std``. Default ``scale=0``.
* ``tknc``: a neuron is covered when it is among the ``top_k`` largest activations of its layer for the
  input (per layer, ties broken toward the later neuron as a stable ascending sort would). Default
  ``top_k=1``; every input covers the same number of cells, so its per-input value is constant.

dnn-tip's per-input score is the count of covered cells; ``per_input`` returns that count divided by the
number of cells.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

import torch
from torch import nn

from robustest.core import inputs
from robustest.core.errors import ConfigError, DataError
from robustest.metrics.activations import LayerSpec, iter_traces, resolve_layers

__all__ = ["DEFAULTS", "METRICS", "CoverageProfile", "per_input_scores"]

METRICS = ("nc", "kmnc", "nbc", "snac", "tknc")
#: Default options of each metric.
DEFAULTS: dict[str, dict[str, Any]] = {
    "nc": {"threshold": 0.5, "scaled": False},
    "kmnc": {"k": 10},
    "nbc": {"scale": 0.0},
    "snac": {"scale": 0.0},
    "tknc": {"top_k": 1},
}
_ALIASES = {"nac": "nc"}
_KMNC_LOOP_MAX = 32  # up to this many sections KMNC compares against a table of bounds; above, it uses the formula


def _options(metric: str, opts: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    name = _ALIASES.get(str(metric).lower(), str(metric).lower())
    if name not in DEFAULTS:
        raise ConfigError(f"unknown coverage metric {metric!r}: choose one of {', '.join(METRICS)}")
    unknown = set(opts) - set(DEFAULTS[name])
    if unknown:
        raise ConfigError(
            f"{name} takes options {', '.join(DEFAULTS[name])}, not {', '.join(sorted(unknown))}"
        )
    out = {**DEFAULTS[name], **opts}
    if name == "kmnc" and (not isinstance(out["k"], int) or isinstance(out["k"], bool) or out["k"] < 1):
        raise ConfigError(f"kmnc needs an integer k >= 1 sections, got {out['k']!r}")
    if name == "tknc" and (not isinstance(out["top_k"], int) or isinstance(out["top_k"], bool) or out["top_k"] < 1):
        raise ConfigError(f"tknc needs an integer top_k >= 1, got {out['top_k']!r}")
    if name in ("nbc", "snac"):
        out["scale"] = float(out["scale"])
    if name == "nc":
        out["threshold"] = float(out["threshold"])
        out["scaled"] = bool(out["scaled"])
    return name, out


class CoverageProfile:
    """Per-neuron training statistics of a model's chosen layers, and the coverage metrics computed from them.

    Attributes: ``layers`` (module names), ``sizes`` (neurons per traced layer output, summing to F),
    ``count`` (training inputs seen) and float64 ``[F]`` tensors ``min``, ``max``, ``mean``, ``std`` (ddof=1).
    ``model`` is the model the profile measures (needed by the image-taking methods; not serialised).
    """

    def __init__(self, layers: list[str], sizes: list[int], count: int, min: torch.Tensor, max: torch.Tensor,
                 mean: torch.Tensor, std: torch.Tensor, model: nn.Module | None = None,
                 batch_size: int = 256) -> None:
        f = int(sum(sizes))
        for name, t in (("min", min), ("max", max), ("mean", mean), ("std", std)):
            if t.shape != (f,):
                raise DataError(f"profile {name} has shape {tuple(t.shape)}, expected ({f},) from the layer sizes")
        self.layers = list(layers)
        self.sizes = [int(s) for s in sizes]
        self.count = int(count)
        self.min = min.detach().to("cpu", torch.float64)
        self.max = max.detach().to("cpu", torch.float64)
        self.mean = mean.detach().to("cpu", torch.float64)
        self.std = std.detach().to("cpu", torch.float64)
        self.model = model
        self.batch_size = int(batch_size)
        self._on: dict[torch.device, dict[str, torch.Tensor]] = {}

    # ------------------------------------------------------------------------------------------- building
    @classmethod
    def build(cls, model: nn.Module, data: Any, layers: LayerSpec = None, batch_size: int = 256,
              device: torch.device | str | None = None) -> CoverageProfile:
        """Profile ``model`` on training ``data`` (images ``[N, C, H, W]`` in [0, 1], an ``(x, y)`` pair or a
        data set) in one streaming pass: per-neuron min, max, mean and std (float64, ddof=1)."""
        names = resolve_layers(model, layers)
        n = 0
        mean = m2 = lo = hi = None
        sizes: list[int] = []
        it = iter_traces(model, data, names, batch_size, device)
        with closing(it):  # type: ignore[type-var]
            for t in it:
                a = t.acts.double()
                nb = a.shape[0]
                if nb == 0:
                    continue
                bmean = a.mean(0)
                bm2 = ((a - bmean) ** 2).sum(0)
                bmin, bmax = a.min(0).values, a.max(0).values
                if mean is None:
                    mean, m2, lo, hi, sizes = bmean, bm2, bmin, bmax, t.sizes
                else:
                    tot = n + nb
                    delta = bmean - mean
                    mean = mean + delta * (nb / tot)
                    m2 = m2 + bm2 + delta**2 * (n * nb / tot)
                    lo, hi = torch.minimum(lo, bmin), torch.maximum(hi, bmax)
                n += nb
        if mean is None:
            raise DataError("the training data is empty: a coverage profile needs at least one input")
        var = m2 / (n - 1) if n > 1 else torch.zeros_like(m2)
        return cls(names, sizes, n, lo, hi, mean, var.clamp_min(0).sqrt(), model=model, batch_size=batch_size)

    @property
    def num_neurons(self) -> int:
        """Number of neurons F (channels of convolutional layers, units of fully-connected ones)."""
        return int(sum(self.sizes))

    def num_cells(self, metric: str, **opts: Any) -> int:
        """Number of coverage cells of ``metric`` (neurons, or neurons * k for KMNC, * 2 for NBC)."""
        name, o = _options(metric, opts)
        f = self.num_neurons
        return f * o["k"] if name == "kmnc" else f * 2 if name == "nbc" else f

    # ------------------------------------------------------------------------------------- serialisation
    def to_dict(self) -> dict[str, Any]:
        """The profile as plain tensors, ints and strings (``torch.save``-able, loads with ``weights_only``)."""
        return {
            "format": "robustest.coverage_profile", "version": 1, "layers": list(self.layers),
            "sizes": torch.tensor(self.sizes, dtype=torch.int64), "count": self.count,
            "min": self.min.clone(), "max": self.max.clone(), "mean": self.mean.clone(), "std": self.std.clone(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], model: nn.Module | None = None) -> CoverageProfile:
        """Rebuild a profile saved by :meth:`to_dict`; ``model`` is needed to score images."""
        if not isinstance(d, dict) or d.get("format") != "robustest.coverage_profile":
            raise DataError("not a coverage profile: expected a dict written by CoverageProfile.to_dict()")
        return cls(list(d["layers"]), [int(s) for s in torch.as_tensor(d["sizes"]).tolist()], int(d["count"]),
                   d["min"], d["max"], d["mean"], d["std"], model=model)

    # ----------------------------------------------------------------------------------------- scoring
    def _stats(self, device: torch.device) -> dict[str, torch.Tensor]:
        if device not in self._on:
            self._on[device] = {k: getattr(self, k).to(device) for k in ("min", "max", "std")}
        return self._on[device]

    def _check_acts(self, acts: torch.Tensor) -> torch.Tensor:
        if not isinstance(acts, torch.Tensor) or acts.dim() != 2 or acts.shape[1] != self.num_neurons:
            shape = tuple(acts.shape) if isinstance(acts, torch.Tensor) else type(acts).__name__
            raise DataError(f"activations must have shape [N, {self.num_neurons}] (the profile's neurons), got {shape}")
        return acts

    def _cells(self, acts: torch.Tensor, name: str, o: dict[str, Any]) -> tuple[torch.Tensor, bool | None]:
        """Compact form of the covered cells of ``acts [B, F]``: for KMNC ``(code [B, F], True)`` with ``code`` the
        covered section in [0, k) or ``k`` for none (an integer tensor), else ``(bits [B, cells], None)``.

        Bounds are computed in float64 and compared with the float32 activations exactly, through the nearest
        float32 value on the right side of each bound (``a >= t`` iff ``a >= ceil32(t)``, ``a <= t`` iff
        ``a <= floor32(t)``), so every comparison runs in float32.
        """
        st = self._stats(acts.device)
        acts = acts.float()
        if name == "nc":
            a = self._scale_per_layer(acts) if o["scaled"] else acts
            return a > o["threshold"], None
        if name == "kmnc":
            return self._kmnc_code(acts, o["k"], st), True
        if name == "nbc":
            lower = acts <= self._bound(st, "lower", o["scale"])
            upper = acts >= self._bound(st, "upper", o["scale"])
            return torch.stack((lower, upper), dim=2).flatten(1), None
        if name == "snac":
            return acts >= self._bound(st, "upper", o["scale"]), None
        return self._top_k(acts, o["top_k"]), None

    @staticmethod
    def _bound(st: dict[str, torch.Tensor], side: str, scale: float) -> torch.Tensor:
        """float32 form of ``min - scale * std`` (floored) or ``max + scale * std`` (ceiled), cached."""
        key = f"{side}:{scale!r}"
        if key not in st:
            st[key] = (_floor32(st["min"] - scale * st["std"]) if side == "lower"
                       else _ceil32(st["max"] + scale * st["std"]))
        return st[key]

    def _kmnc_code(self, acts: torch.Tensor, k: int, st: dict[str, torch.Tensor]) -> torch.Tensor:
        """KMNC section of each activation, ``k`` where none: ``acts [B, F]`` -> integer ``[B, F]``."""
        lo, jump = st["min"], (st["max"] - st["min"]) / k
        if k <= _KMNC_LOOP_MAX:  # few sections: count the float32-rounded bounds each activation reaches
            steps = torch.arange(k + 1, device=acts.device, dtype=torch.float64)
            bounds = _ceil32(lo[:, None] + jump[:, None] * steps[None, :]).t().contiguous()  # [k+1, F]
            count = torch.zeros(acts.shape, dtype=torch.uint8, device=acts.device)
            for i in range(k + 1):
                count.add_((acts >= bounds[i]).view(torch.uint8))
            # count 1..k -> section count - 1; 0 (below min) and k + 1 (at or above the last bound) -> k
            return torch.where((count >= 1) & (count <= k), count - 1, torch.full_like(count, k))
        # Many sections: bounds t_i = min + jump * i in float64, evaluated only at each activation's candidate
        # section (the same float64 products and sums as the full table, so the result is exact), corrected.
        a = acts.double()
        sec = ((a - lo) / jump).nan_to_num_(0.0, float(k - 1), 0.0).floor_().clamp_(0, k - 1)
        sec -= (a < lo + jump * sec).double()
        sec += (a >= lo + jump * (sec + 1)).double()
        sec.clamp_(0, k - 1)
        valid = (a >= lo + jump * sec) & (a < lo + jump * (sec + 1))
        sec = sec.long()
        missed = ~valid & (a >= lo) & (a < lo + jump * k)
        if bool(missed.any()):  # degenerate bounds (jump below the float64 spacing at min): count bounds <= a
            rows, cols = missed.nonzero(as_tuple=True)
            steps = torch.arange(k + 1, device=acts.device, dtype=torch.float64)
            bounds = lo[cols, None] + jump[cols, None] * steps
            sec[rows, cols] = (bounds <= a[rows, cols][:, None]).sum(1) - 1
            valid[rows, cols] = True
        return sec.masked_fill_(~valid, k)

    def _top_k(self, acts: torch.Tensor, top_k: int) -> torch.Tensor:
        out = torch.zeros_like(acts, dtype=torch.bool)
        start = 0
        for size in self.sizes:
            k = min(top_k, size)
            if k == size:
                out[:, start:start + size] = True
                start += size
                continue
            layer = acts[:, start:start + size].contiguous()  # topk is much slower on strided rows
            vals, idx = torch.topk(layer, k, dim=1)
            # the k largest are unambiguous unless another neuron ties with the k-th (or there is a NaN)
            tied = ((layer >= vals[:, k - 1:]).sum(1) > k) | layer.isnan().any(1)
            if bool(tied.any()):
                rows = tied.nonzero().squeeze(1)
                idx[rows] = _stable_top_k(layer[rows], k)
            out.scatter_(1, idx + start, True)
            start += size
        return out

    def _scale_per_layer(self, acts: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(acts)
        start = 0
        for size in self.sizes:
            layer = acts[:, start:start + size]
            lo = layer.min(1, keepdim=True).values
            rng = layer.max(1, keepdim=True).values - lo
            out[:, start:start + size] = torch.where(rng > 0, (layer - lo) / rng.clamp_min(1e-38),
                                                     torch.zeros_like(layer))
            start += size
        return out

    def bits_from_activations(self, acts: torch.Tensor, metric: str = "kmnc", **opts: Any) -> torch.Tensor:
        """Covered cells of activation traces ``acts [N, F]`` -> ``BoolTensor[N, cells]`` (on acts' device)."""
        name, o = _options(metric, opts)
        self._check_acts(acts)
        cells, is_code = self._cells(acts, name, o)
        if is_code is None:
            return cells
        return (cells[..., None] == torch.arange(o["k"], device=acts.device, dtype=cells.dtype)).flatten(1)

    def per_input_from_activations(self, acts: torch.Tensor, metric: str = "kmnc", **opts: Any) -> torch.Tensor:
        """Fraction of cells each trace covers: ``acts [N, F]`` -> float32 ``[N]``."""
        name, o = _options(metric, opts)
        self._check_acts(acts)
        total = float(self.num_cells(name, **o))
        if name == "tknc":  # every input covers exactly min(top_k, size) neurons of each layer
            per_layer = sum(min(o["top_k"], size) for size in self.sizes)
            return torch.full((acts.shape[0],), per_layer / total, device=acts.device)
        if name == "nbc":  # count both sides without building the interleaved cells
            st = self._stats(acts.device)
            a = acts.float()
            counts = ((a <= self._bound(st, "lower", o["scale"])).sum(1)
                      + (a >= self._bound(st, "upper", o["scale"])).sum(1))
            return counts.float() / total
        cells, is_code = self._cells(acts, name, o)
        counts = (cells < o["k"] if is_code else cells).sum(1)
        return counts.float() / total

    def _union_from_activations(self, acts: torch.Tensor, name: str, o: dict[str, Any]) -> torch.Tensor:
        cells, is_code = self._cells(acts, name, o)
        if is_code is None:
            return cells.any(0)
        k = o["k"]
        covered = torch.zeros(self.num_neurons, k + 1, dtype=torch.bool, device=acts.device)
        neuron = torch.arange(self.num_neurons, device=acts.device)[None, :]
        covered.index_put_((neuron, cells.long()), torch.ones((), dtype=torch.bool, device=acts.device))
        return covered[:, :k].flatten()

    def set_coverage_from_activations(self, acts: torch.Tensor, metric: str = "kmnc", **opts: Any) -> float:
        """Fraction of cells covered by the traces ``acts [N, F]`` together, in [0, 1]."""
        name, o = _options(metric, opts)
        self._check_acts(acts)
        return float(self._union_from_activations(acts, name, o).sum()) / self.num_cells(name, **o)

    # ------------------------------------------------------------------------------------ image scoring
    def _traces(self, x: torch.Tensor, batch_size: int | None) -> Iterator[torch.Tensor]:
        if self.model is None:
            raise ConfigError("this profile has no model (loaded with from_dict): pass model= to from_dict")
        inputs.check_images(x, "x")
        it = iter_traces(self.model, x, self.layers, batch_size or self.batch_size)
        with closing(it):  # type: ignore[type-var]
            for t in it:
                if t.sizes != self.sizes:
                    raise DataError(f"the model's layer sizes {t.sizes} differ from the profile's {self.sizes}: "
                                    "build the profile on this model")
                yield t.acts

    def activations(self, x: torch.Tensor, *, batch_size: int | None = None) -> torch.Tensor:
        """Activation traces of images ``x [N, C, H, W]`` -> float32 ``[N, F]`` on x's device."""
        parts = list(self._traces(x, batch_size))
        if not parts:
            return torch.zeros(0, self.num_neurons, device=x.device)
        return torch.cat(parts).to(x.device)

    def bits(self, x: torch.Tensor, metric: str = "kmnc", *, batch_size: int | None = None,
             **opts: Any) -> torch.Tensor:
        """Which cells each image covers: ``x [N, C, H, W]`` -> ``BoolTensor[N, cells]`` on x's device."""
        _options(metric, opts)
        parts = [self.bits_from_activations(a, metric, **opts).to(x.device) for a in self._traces(x, batch_size)]
        if not parts:
            return torch.zeros(0, self.num_cells(metric, **opts), dtype=torch.bool, device=x.device)
        return torch.cat(parts)

    def per_input(self, x: torch.Tensor, metric: str = "kmnc", *, batch_size: int | None = None,
                  **opts: Any) -> torch.Tensor:
        """Fraction of the metric's cells each image covers: ``x [N, C, H, W]`` -> float32 ``[N]`` on x's device."""
        _options(metric, opts)
        parts = [self.per_input_from_activations(a, metric, **opts).to(x.device) for a in self._traces(x, batch_size)]
        return torch.cat(parts) if parts else torch.zeros(0, device=x.device)

    def set_coverage(self, x: torch.Tensor, metric: str = "kmnc", *, batch_size: int | None = None,
                     **opts: Any) -> float:
        """Fraction of the metric's cells covered by the images ``x [N, C, H, W]`` together, in [0, 1]."""
        name, o = _options(metric, opts)
        covered: torch.Tensor | None = None
        for a in self._traces(x, batch_size):
            u = self._union_from_activations(a, name, o)
            covered = u if covered is None else covered | u
        return 0.0 if covered is None else float(covered.sum()) / self.num_cells(name, **o)

    def __repr__(self) -> str:
        return (f"CoverageProfile(layers={self.layers}, neurons={self.num_neurons}, count={self.count})")


def _stable_top_k(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest of each row of float32 ``x``, ties broken toward the later column, i.e. the last
    k of a stable ascending sort (NumPy's), via distinct int64 keys ordered like the values."""
    bits = (x + 0.0).contiguous().view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    order = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()
    key = order * (1 << 32) + torch.arange(x.shape[1], device=x.device)
    return torch.topk(key, k, dim=1).indices


def _ceil32(t: torch.Tensor) -> torch.Tensor:
    """The smallest float32 >= each float64 value (so ``a >= t`` iff ``a >= _ceil32(t)`` for float32 ``a``)."""
    c = t.float()
    return torch.where(c.double() < t, torch.nextafter(c, torch.full_like(c, float("inf"))), c)


def _floor32(t: torch.Tensor) -> torch.Tensor:
    """The largest float32 <= each float64 value (so ``a <= t`` iff ``a <= _floor32(t)`` for float32 ``a``)."""
    c = t.float()
    return torch.where(c.double() > t, torch.nextafter(c, torch.full_like(c, float("-inf"))), c)


def per_input_scores(model: nn.Module, train: Any, x: torch.Tensor, metric: str = "kmnc", *,
                     layers: LayerSpec = None, batch_size: int = 256, **opts: Any) -> torch.Tensor:
    """Build a profile of ``model`` on ``train`` and return each image's coverage fraction: ``x [N, C, H, W]``
    -> float32 ``[N]`` on x's device (see :class:`CoverageProfile` for the metrics and their options)."""
    _options(metric, opts)
    inputs.check_images(x, "x")
    profile = CoverageProfile.build(model, train, layers=layers, batch_size=batch_size)
    return profile.per_input(x, metric, **opts)
