"""The scores file (``robustest score`` writes it, ``robustest select`` reads it): scores.pt, a dict of tensors read
with ``torch.load(weights_only=True)`` (scores [N], index [N], optional labels, x0_index [N] and the covered cells
bits [N, F]), or scores.csv with an ``index,score[,label][,x0_index]`` header; and the statistics of scores."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch

from robustest.core.errors import DataError
from robustest.core.reading import check_torch_file
from robustest.core.stats import describe

__all__ = ["QUANTILES", "check_scores_payload", "read_scores", "score_stats", "summarize", "write_scores_csv"]

#: the quantiles :func:`summarize` reports (robustest.core.stats.describe)
QUANTILES = ("q01", "q05", "q25", "q50", "q75", "q95", "q99")


def read_scores(path: str | Path) -> dict[str, Any]:
    """Read a scores.pt (weights_only) or a scores.csv with an ``index,score`` header into a dict."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"scores file {str(path)!r} does not exist: write one with 'robustest score'")
    if path.suffix.lower() == ".csv":
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            rows = list(reader)
            columns = reader.fieldnames or []
        if "score" not in columns:
            raise DataError(f"{path} has no 'score' column: pass a scores.csv written by 'robustest score'")
        try:
            scores = torch.tensor([float(r["score"]) for r in rows], dtype=torch.float64)
            index = torch.tensor([int(r["index"]) for r in rows], dtype=torch.int64) if "index" in columns \
                else torch.arange(len(rows))
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            raise DataError(f"{path}: unreadable score or index value ({' '.join(str(exc).split())[:80]})") from None
        return check_scores_payload({"scores": scores, "index": index, "metric": None}, str(path))
    check_torch_file(path, "scores file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure means the file is refused
        raise DataError(f"{path} is not a readable scores file ({type(exc).__name__}): "
                        "pass the scores.pt written by 'robustest score'") from exc
    if isinstance(payload, torch.Tensor):
        payload = {"scores": payload}
    if not isinstance(payload, dict) or not isinstance(payload.get("scores"), torch.Tensor):
        raise DataError(f"{path} holds no 'scores' tensor: pass the scores.pt written by 'robustest score'")
    s = payload["scores"]
    if s.dim() != 1 or not (s.is_floating_point() or s.dtype in (torch.int32, torch.int64)):
        raise DataError(f"{path}: scores must be a 1-D tensor of numbers, got {s.dtype} of shape {tuple(s.shape)}")
    payload.setdefault("index", torch.arange(len(s)))
    return check_scores_payload(payload, str(path))


def check_scores_payload(payload: dict[str, Any], source: str) -> dict[str, Any]:
    """The tensors of a scores file must agree with each other: one score, index, label, x0_index and row
    of covered cells per input; indices are non-negative, distinct integers (never wrapped around)."""
    s = payload["scores"]
    n = len(s)
    if n == 0:
        raise DataError(f"{source}: the scores file is empty: score a non-empty data set")
    for key in ("index", "labels", "x0_index"):
        t = payload.get(key)
        if t is None and key != "index":
            continue
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or len(t) != n or t.is_floating_point() \
                or t.dtype == torch.bool:
            got = f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise DataError(f"{source}: {key!r} must be {n} integers (one per score), got {got}: the file is "
                            "damaged; score again")
        if int(t.min()) < 0:
            raise DataError(f"{source}: negative {key} {int(t.min())}: the file is damaged; score again")
    if len(torch.unique(payload["index"])) != n:
        raise DataError(f"{source}: 'index' names an input twice: the file is damaged; score again")
    bits = payload.get("bits")
    if bits is not None and (not isinstance(bits, torch.Tensor) or bits.dim() != 2 or bits.shape[0] != n):
        got = tuple(bits.shape) if isinstance(bits, torch.Tensor) else type(bits).__name__
        raise DataError(f"{source}: 'bits' must hold one row of covered cells per score ({n} rows), got {got}")
    return payload


def summarize(scores: torch.Tensor) -> dict[str, Any]:
    """count, mean, std, min, max and quantiles of a 1-D score tensor (NaN-free)."""
    if scores.numel() == 0:
        return {"count": 0}
    return {**describe(scores, ("count", "mean", "std", "min", "max")), "quantiles": describe(scores, QUANTILES)}


def score_stats(s: torch.Tensor) -> dict[str, Any]:
    """count, mean, min, max and median of the finite values of ``s`` [N] (``{"count": 0}`` when none is)."""
    if not bool(torch.isfinite(s).any()):
        return {"count": 0}
    return describe(s, ("count", "mean", "min", "max", "median"), finite=True)


def write_scores_csv(path: str | Path, index: torch.Tensor, scores: torch.Tensor, y: torch.Tensor | None,
               x0_index: torch.Tensor | None) -> None:
    """index,score[,label][,x0_index] as CSV, written atomically in one go."""
    from robustest.core.atomic import atomic_write_text

    cols = [index.tolist(), [repr(float(v)) for v in scores.tolist()]]
    header = ["index", "score"]
    if y is not None:
        cols.append(y.tolist())
        header.append("label")
    if x0_index is not None:
        cols.append(x0_index.tolist())
        header.append("x0_index")
    lines = [",".join(header)] + [",".join(str(c) for c in row) for row in zip(*cols)]
    atomic_write_text(path, "\n".join(lines) + "\n")
