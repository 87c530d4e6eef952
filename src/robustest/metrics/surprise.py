"""Surprise adequacy (Kim, Feldt & Yoo, ICSE 2019): how surprising an input's activation trace is with
respect to the traces of the training data.

:class:`SurpriseAdequacy` stores the activation traces of the training data (one neuron per fully-connected
unit, one per convolutional channel as the **mean over its spatial positions**, see
:mod:`robustest.metrics.activations`) and the model's predicted class of each training input.
By default the traced layer is the model's deepest hidden activation module (e.g. ``relu4`` of LeNet-5).

* **LSA** (likelihood-based): ``LSA(x) = -log f_c(a(x))`` where ``c`` is the class the model predicts for
  ``x`` and ``f_c`` a Gaussian KDE (``scipy.stats.gaussian_kde``, Scott's bandwidth) fitted on the traces of
  the training inputs predicted as ``c``. Neurons whose variance over those training traces is below
  ``var_threshold`` are left out (variance filtering; ``filter_scope="class"`` filters each class on its own
  traces as dnn-tip's per-class LSA does, ``"union"`` drops, from every class, the neurons that are
  low-variance in any class, as Kim et al.'s SADL does). ``max_features`` keeps at most that many
  highest-variance neurons per class (dnn-tip's ``max_features``; with ``var_threshold=None`` exactly as
  dnn-tip, otherwise low-variance neurons are dropped as well). The value is ``-log(kde.evaluate)``
  exactly as dnn-tip computes it; where that density underflows to 0 (dnn-tip returns ``inf``) the
  log-space ``-kde.logpdf`` is used, so values stay finite.
* **DSA** (distance-based): with ``a`` the trace of ``x``, ``x_a`` the nearest training trace of the same
  predicted class and ``x_b`` the training trace of another class nearest to ``x_a``:
  ``DSA(x) = ||a - x_a|| / ||x_a - x_b||`` (Euclidean). Computed in float64 with batched matrix products
  (``torch.cdist`` in chunks, centred data), then the two chosen distances recomputed directly.

Inputs of a class no training input was predicted as get ``inf`` (maximally surprising).
"""

from __future__ import annotations

import warnings
from contextlib import closing
from typing import Any

import numpy as np
import torch
from torch import nn

from robustest.core import devices, inputs
from robustest.core.errors import ConfigError, DataError
from robustest.metrics.activations import LayerSpec, default_layers, iter_traces, resolve_layers

__all__ = ["SurpriseAdequacy", "sa_scores"]

_MAX_BLOCK = 1 << 23  # elements of one float64 distance block (64 MiB)


class SurpriseAdequacy:
    """Training traces of a model's chosen layers and the surprise adequacies computed against them.

    Attributes: ``layers`` (module names), ``sizes`` (neurons per traced output), ``train_acts`` float32
    ``[M, F]`` (CPU), ``train_pred`` int64 ``[M]`` (predicted classes), ``var_threshold``, ``max_features``,
    ``filter_scope``; ``model`` (needed by the image-taking methods; not serialised).
    """

    def __init__(self, train_acts: torch.Tensor, train_pred: torch.Tensor, layers: list[str], sizes: list[int],
                 model: nn.Module | None = None, *, var_threshold: float | None = 1e-5,
                 max_features: int | None = None, filter_scope: str = "class", batch_size: int = 256) -> None:
        if train_acts.dim() != 2 or train_acts.shape[1] != sum(sizes):
            raise DataError(f"training traces must have shape [M, {sum(sizes)}], got {tuple(train_acts.shape)}")
        if train_pred.shape != (train_acts.shape[0],):
            raise DataError("give one predicted class per training trace")
        if train_acts.shape[0] == 0:
            raise DataError("the training data is empty: surprise adequacy needs training traces")
        if filter_scope not in ("class", "union"):
            raise ConfigError(f"filter_scope must be 'class' or 'union', got {filter_scope!r}")
        if var_threshold is not None and var_threshold < 0:
            raise ConfigError(f"var_threshold must be >= 0, got {var_threshold}")
        if max_features is not None and (not isinstance(max_features, int) or max_features < 1):
            raise ConfigError(f"max_features must be a positive integer, got {max_features!r}")
        self.train_acts = train_acts.detach().to("cpu", torch.float32).contiguous()
        self.train_pred = train_pred.detach().to("cpu", torch.int64)
        self.layers = list(layers)
        self.sizes = [int(s) for s in sizes]
        self.model = model
        self.var_threshold = var_threshold
        self.max_features = max_features
        self.filter_scope = filter_scope
        self.batch_size = int(batch_size)
        self._kde: dict[int, tuple[Any, np.ndarray]] | None = None

    # ------------------------------------------------------------------------------------------- building
    @classmethod
    def build(cls, model: nn.Module, train: Any, layers: LayerSpec = None, *, var_threshold: float | None = 1e-5,
              max_features: int | None = None, filter_scope: str = "class", batch_size: int = 256,
              device: torch.device | str | None = None) -> SurpriseAdequacy:
        """Trace ``model`` on training data ``train`` (images in [0, 1], an ``(x, y)`` pair or a data set).

        ``layers`` defaults to the deepest default layer (the last hidden activation module).
        """
        names = resolve_layers(model, layers if layers is not None else default_layers(model)[-1:])
        acts, preds, sizes = [], [], []
        it = iter_traces(model, train, names, batch_size, device)
        with closing(it):  # type: ignore[type-var]
            for t in it:
                acts.append(t.acts.cpu())
                preds.append(t.logits.argmax(1).cpu())
                sizes = t.sizes
        if not acts:
            raise DataError("the training data is empty: surprise adequacy needs training traces")
        return cls(torch.cat(acts), torch.cat(preds), names, sizes, model, var_threshold=var_threshold,
                   max_features=max_features, filter_scope=filter_scope, batch_size=batch_size)

    def to_dict(self) -> dict[str, Any]:
        """The reference as plain tensors and scalars (``torch.save``-able)."""
        return {
            "format": "robustest.surprise_adequacy", "version": 1, "layers": list(self.layers),
            "sizes": torch.tensor(self.sizes, dtype=torch.int64), "train_acts": self.train_acts.clone(),
            "train_pred": self.train_pred.clone(), "var_threshold": self.var_threshold,
            "max_features": self.max_features, "filter_scope": self.filter_scope,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], model: nn.Module | None = None) -> SurpriseAdequacy:
        """Rebuild from :meth:`to_dict`; ``model`` is needed to score images."""
        if not isinstance(d, dict) or d.get("format") != "robustest.surprise_adequacy":
            raise DataError("not a surprise-adequacy reference: expected a dict written by SurpriseAdequacy.to_dict()")
        return cls(d["train_acts"], d["train_pred"], list(d["layers"]),
                   [int(s) for s in torch.as_tensor(d["sizes"]).tolist()], model, var_threshold=d["var_threshold"],
                   max_features=d["max_features"], filter_scope=d["filter_scope"])

    # --------------------------------------------------------------------------------------------- traces
    def activations(self, x: torch.Tensor, *, batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Traces and predicted classes of images ``x [N, C, H, W]``: ``(float32 [N, F], int64 [N])`` on the
        model's device."""
        if self.model is None:
            raise ConfigError("this reference has no model (loaded with from_dict): pass model= to from_dict")
        inputs.check_images(x, "x")
        acts, preds = [], []
        it = iter_traces(self.model, x, self.layers, batch_size or self.batch_size)
        with closing(it):  # type: ignore[type-var]
            for t in it:
                if t.sizes != self.sizes:
                    raise DataError(f"the model's layer sizes {t.sizes} differ from the reference's {self.sizes}")
                acts.append(t.acts)
                preds.append(t.logits.argmax(1))
        if not acts:
            dev = devices.model_device(self.model)
            return torch.zeros(0, sum(self.sizes), device=dev), torch.zeros(0, dtype=torch.int64, device=dev)
        return torch.cat(acts), torch.cat(preds)

    def _check(self, acts: torch.Tensor, pred: torch.Tensor) -> None:
        f = self.train_acts.shape[1]
        if not isinstance(acts, torch.Tensor) or acts.dim() != 2 or acts.shape[1] != f:
            raise DataError(f"traces must have shape [N, {f}], got {getattr(acts, 'shape', type(acts).__name__)}")
        if not isinstance(pred, torch.Tensor) or pred.shape != (acts.shape[0],):
            raise DataError("give one predicted class per trace (an int64 tensor of shape [N])")

    # ------------------------------------------------------------------------------------------------ LSA
    def _removed(self, class_acts: np.ndarray) -> np.ndarray:
        var = np.var(class_acts, axis=0)
        if self.max_features is not None:
            removed = np.argsort(var)[: -min(self.max_features, class_acts.shape[1])]
            if self.var_threshold:  # both given: also drop low-variance neurons among the kept ones
                removed = np.union1d(removed, np.where(var < self.var_threshold)[0])
            return np.asarray(removed, dtype=np.int64)
        if self.var_threshold:
            return np.where(var < self.var_threshold)[0]
        return np.zeros(0, dtype=np.int64)

    def _kdes(self) -> dict[int, tuple[Any, np.ndarray]]:
        if self._kde is not None:
            return self._kde
        from scipy.stats import gaussian_kde

        acts = self.train_acts.numpy()
        pred = self.train_pred.numpy()
        classes = [int(c) for c in np.unique(pred)]
        removed = {c: self._removed(acts[pred == c]) for c in classes}
        if self.filter_scope == "union":
            union = np.unique(np.concatenate(list(removed.values())))
            removed = dict.fromkeys(classes, union)
        kdes: dict[int, tuple[Any, np.ndarray]] = {}
        for c in classes:
            kept = np.delete(acts[pred == c], removed[c], axis=1)
            if kept.shape[1] == 0:
                raise DataError(f"variance filtering left no neuron for class {c}: lower var_threshold "
                                "or choose another layer")
            try:
                kdes[c] = (gaussian_kde(kept.transpose()), removed[c])
            except (np.linalg.LinAlgError, ValueError) as exc:
                raise DataError(
                    f"the KDE of class {c} cannot be fitted ({kept.shape[0]} traces, {kept.shape[1]} neurons: "
                    f"{str(exc).splitlines()[0]}): give more training data, raise var_threshold, set max_features "
                    "or choose a layer with fewer neurons"
                ) from exc
        self._kde = kdes
        return kdes

    def lsa_from_activations(self, acts: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """LSA of traces ``acts [N, F]`` with predicted classes ``pred [N]`` -> float64 ``[N]`` on acts' device."""
        self._check(acts, pred)
        kdes = self._kdes()
        a = acts.detach().to("cpu", torch.float32).numpy()
        p = pred.detach().cpu().numpy()
        out = np.full(a.shape[0], np.inf, dtype=np.float64)
        for c in np.unique(p):
            if int(c) not in kdes:
                continue
            kde, removed = kdes[int(c)]
            idx = np.where(p == c)[0]
            pts = np.delete(a[idx], removed, axis=1).transpose()
            with np.errstate(divide="ignore"):
                vals = -np.log(kde.evaluate(pts))
            under = ~np.isfinite(vals)
            if under.any():
                vals[under] = -kde.logpdf(pts[:, under])
            out[idx] = vals
        return torch.from_numpy(out).to(acts.device)

    def lsa(self, x: torch.Tensor, *, batch_size: int | None = None) -> torch.Tensor:
        """Likelihood-based surprise adequacy of images ``x [N, C, H, W]`` -> float64 ``[N]`` on x's device."""
        acts, pred = self.activations(x, batch_size=batch_size)
        return self.lsa_from_activations(acts, pred).to(x.device)

    # ------------------------------------------------------------------------------------------------ DSA
    def dsa_from_activations(self, acts: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """DSA of traces ``acts [N, F]`` with predicted classes ``pred [N]`` -> float64 ``[N]`` on acts' device.

        Nearest neighbours come from chunked ``torch.cdist`` on centred float64 traces (one matrix product per
        chunk, on acts' device); the two distances of each input are then recomputed directly.
        """
        self._check(acts, pred)
        dev = acts.device
        train = self.train_acts.to(dev, torch.float64)
        tpred = self.train_pred.to(dev)
        if int(tpred.unique().numel()) < 2:
            raise DataError("DSA needs training inputs predicted as at least two classes")
        center = train.mean(0)
        train_c = train - center
        a = acts.detach().to(torch.float64)
        a_c = a - center
        p = pred.to(dev)
        out = torch.full((a.shape[0],), float("inf"), dtype=torch.float64, device=dev)
        for c in p.unique().tolist():
            same = (tpred == c).nonzero().squeeze(1)
            if same.numel() == 0:
                continue
            other = (tpred != c).nonzero().squeeze(1)
            sel = (p == c).nonzero().squeeze(1)
            ref = _nearest(a_c[sel], train_c[same])  # positions in `same`
            ref_idx = same[ref]
            uniq, inv = ref_idx.unique(return_inverse=True)
            nb = other[_nearest(train_c[uniq], train_c[other])][inv]
            dist_a = (a[sel] - train[ref_idx]).norm(dim=1)
            dist_b = (train[ref_idx] - train[nb]).norm(dim=1)
            out[sel] = dist_a / dist_b
        return out

    def dsa(self, x: torch.Tensor, *, batch_size: int | None = None) -> torch.Tensor:
        """Distance-based surprise adequacy of images ``x [N, C, H, W]`` -> float64 ``[N]`` on x's device."""
        acts, pred = self.activations(x, batch_size=batch_size)
        return self.dsa_from_activations(acts, pred).to(x.device)

    def __repr__(self) -> str:
        return (f"SurpriseAdequacy(layers={self.layers}, neurons={sum(self.sizes)}, "
                f"train={self.train_acts.shape[0]})")


def _nearest(q: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Index in ``ref [M, F]`` of the nearest row to each row of ``q [N, F]`` (chunked; int64 ``[N]``)."""
    chunk = max(1, _MAX_BLOCK // max(1, ref.shape[0]))
    out = torch.empty(q.shape[0], dtype=torch.int64, device=q.device)
    for s in range(0, q.shape[0], chunk):
        d = torch.cdist(q[s:s + chunk], ref)
        out[s:s + chunk] = d.argmin(1)
    return out


def sa_scores(model: nn.Module, train: Any, x: torch.Tensor, metric: str = "lsa", *, layers: LayerSpec = None,
              batch_size: int = 256, **opts: Any) -> torch.Tensor:
    """Build a :class:`SurpriseAdequacy` of ``model`` on ``train`` and score images ``x [N, C, H, W]`` with
    ``metric`` ("lsa" or "dsa") -> float64 ``[N]`` on x's device. ``opts``: ``var_threshold``,
    ``max_features``, ``filter_scope``."""
    metric = str(metric).lower()
    if metric not in ("lsa", "dsa"):
        raise ConfigError(f"unknown surprise metric {metric!r}: choose 'lsa' or 'dsa'")
    unknown = set(opts) - {"var_threshold", "max_features", "filter_scope"}
    if unknown:
        raise ConfigError(f"{metric} takes options var_threshold, max_features, filter_scope, "
                          f"not {', '.join(sorted(unknown))}")
    inputs.check_images(x, "x")
    sa = SurpriseAdequacy.build(model, train, layers, batch_size=batch_size, **opts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return sa.lsa(x) if metric == "lsa" else sa.dsa(x)
