"""Score a whole data set with any metric, streaming it batch by batch.

:func:`score` is what ``robustest score`` runs: the data set (any data-like object: tensors, a robustest
ImageDataset/FolderDataset, a Dataset or a DataLoader) is read one batch at a time, so memory holds one
batch of images plus the per-sample results, never the whole set as float tensors. Results carry each
sample's index in the data set, so a shuffling DataLoader still scores the right samples.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from robustest.core import batching, devices, distributed, inputs
from robustest.core.errors import ConfigError, DataError
from robustest.core.progress import progress as progress_bar

__all__ = ["AMP_METRICS", "ScoreResult", "score"]

#: the metrics computed from the logits of one forward pass alone, which ``amp`` may run under autocast
AMP_METRICS = ("zol", "gini", "entropy", "margin", "max_prob")


@dataclass
class ScoreResult:
    """Per-sample scores of one metric on a data set.

    ``scores`` float ``[N]``, ``index`` int64 ``[N]`` (positions in the data set), ``labels`` int64 ``[N]``
    (None for unlabelled data), ``options`` the metric options in effect; coverage metrics add ``bits``
    (bool ``[N, cells]``), ``set_coverage`` (fraction of cells the whole set covers), ``num_cells`` and
    ``layers``.
    """

    metric: str
    scores: torch.Tensor
    index: torch.Tensor
    labels: torch.Tensor | None
    options: dict[str, Any] = field(default_factory=dict)
    bits: torch.Tensor | None = None
    set_coverage: float | None = None
    num_cells: int | None = None
    layers: list[str] | None = None

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    def __repr__(self) -> str:
        finite = self.scores[torch.isfinite(self.scores)]
        mean = f", mean {float(finite.double().mean()):.4g}" if finite.numel() else ""
        cov = f", set coverage {self.set_coverage:.3f}" if self.set_coverage is not None else ""
        return f"ScoreResult({self.metric}, n={len(self)}{mean}{cov})"


def score(model: nn.Module, data: Any, metric: str, *, train: Any = None,
          x0: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None = None, layers: Any = None,
          batch_size: int = 256, device: torch.device | str | None = None, progress: bool = False,
          amp: str | None = None, **opts: Any) -> ScoreResult:
    """Score every sample of ``data`` with ``metric`` (a name of :func:`robustest.metrics.names`).

    ``x0``: FOL's seeds, a tensor aligned with ``data`` or a function mapping a batch's data-set positions
    to its seed images. ``train``: the training data coverage and surprise metrics build their reference
    from (streamed too). ``opts`` go to the metric (FOL: ``eps``, ``norm``, ``label``; coverage: ``k``,
    ``threshold``, ``top_k``, ``scale``; surprise: ``var_threshold``, ``max_features``, ``filter_scope``).
    ``amp``: "bf16" (CPU or CUDA) or "fp16" (CUDA) runs the model's forward passes under ``torch.autocast``
    for the metrics of :data:`AMP_METRICS` (from the logits alone; the logits are returned in float32 and the
    softmax, loss and scores computed in float32). Metrics that need input gradients (fol, fol_gradnorm) or
    layer activations compared with a float32 reference (coverage, surprise) refuse it.
    """
    from robustest import metrics
    from robustest.core.amp import autocast, check_amp

    m = metrics.info(metric)
    if m.needs_train and train is None:
        raise ConfigError(f"metric {metric!r} needs training data for its reference profile: pass train=")
    if amp is not None and metric not in AMP_METRICS:
        why = "input gradients" if m.kind == "loss" else "layer activations compared with a float32 reference"
        raise ConfigError(f"amp applies to the metrics computed from the logits alone ({', '.join(AMP_METRICS)}); "
                          f"{metric} needs {why} in float32: drop amp")
    dev = devices.resolve_device(model, device)
    amp = check_amp(amp, dev)
    scores, index, labels, bits = [], [], [], []
    result = ScoreResult(metric, torch.empty(0), torch.empty(0, dtype=torch.int64), None, dict(opts))
    per_batch: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor], torch.Tensor]
    union: torch.Tensor | None = None
    if m.kind == "coverage":
        from robustest.metrics.coverage import DEFAULTS, CoverageProfile, _options

        profile = CoverageProfile.build(model, train, layers=layers, batch_size=batch_size)
        name, o = _options(metric, dict(opts))
        result.options = {**DEFAULTS[metric], **opts}
        result.layers, result.num_cells = profile.layers, profile.num_cells(name, **o)

        def per_batch(xb, yb, idx):
            nonlocal union
            acts = profile.activations(xb, batch_size=batch_size)
            bits.append(profile.bits_from_activations(acts, metric, **opts).cpu())
            u = profile._union_from_activations(acts, name, o)
            union = u if union is None else union | u
            return profile.per_input_from_activations(acts, metric, **opts)
    elif m.kind == "surprise":
        from robustest.metrics.surprise import SurpriseAdequacy

        unknown = set(opts) - {"var_threshold", "max_features", "filter_scope"}
        if unknown:
            raise ConfigError(f"{metric} takes options var_threshold, max_features, filter_scope, "
                              f"not {', '.join(sorted(unknown))}")
        sa = SurpriseAdequacy.build(model, train, layers, batch_size=batch_size, **opts)

        def per_batch(xb, yb, idx):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                return sa.lsa(xb) if metric == "lsa" else sa.dsa(xb)
    else:
        def per_batch(xb, yb, idx):
            seeds = None
            if x0 is not None:
                seeds = x0(idx) if callable(x0) else batching.take(x0, idx)[0]
                seeds = seeds.to(xb.device)
            if m.needs_labels and yb is None and opts.get("label", "true") != "pred":
                raise ConfigError(f"metric {metric!r} needs labels: the data set has none (or use label='pred')")
            with autocast(amp, dev):
                return metrics.compute(metric, model, xb, yb, x0=seeds, batch_size=batch_size, **opts)

    total = batching.num_samples(data)
    shard = distributed.Shard.current()  # under torchrun each rank scores its part; the parts are gathered
    batches = batching.iter_batches(data, batch_size, dev, with_index=True, shard=shard)
    for idx, xb, yb in progress_bar(batches, enabled=progress, desc=metric, total=-(-total // batch_size),
                                        unit="batch"):
        inputs.check_images(xb, "x")
        scores.append(per_batch(xb, yb, idx).detach().float().cpu())
        index.append(idx.cpu())
        if yb is not None:
            labels.append(torch.as_tensor(yb).long().cpu())
    cat = (lambda ts: torch.cat(ts) if ts else None)  # noqa: E731
    has_labels = len(labels) == len(scores)
    parts = distributed.all_gather_cat({"scores": cat(scores), "index": cat(index),
                                        "labels": cat(labels) if has_labels else None, "bits": cat(bits)})
    if parts["scores"] is None or parts["scores"].numel() == 0:
        raise DataError("nothing to score: the data set is empty")
    result.scores, result.index = parts["scores"], parts["index"]
    result.labels = parts["labels"] if parts["labels"] is not None and len(parts["labels"]) == len(result.scores) \
        else None
    if parts["bits"] is not None:
        result.bits = parts["bits"]
        unions = [u for u in distributed.all_gather_objects(None if union is None else union.cpu()) if u is not None]
        assert unions and result.num_cells is not None
        result.set_coverage = float(torch.stack(unions).any(0).sum()) / result.num_cells
    return result
