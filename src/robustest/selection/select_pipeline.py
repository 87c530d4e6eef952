"""The select pipeline: select a budget of inputs from a scores file with one strategy and write the selection
(what ``robustest select`` runs).

* :func:`read_scored_tests`: the tests file a scores file indexes into, checked against that index.
* :func:`strategy_input`: what a strategy selects from, as it declares (:attr:`robustest.selection.Strategy.needs`):
  the scores [N], the covered cells [N, F] of a coverage metric, or the given features [N, D].
* :func:`select_pipeline`: :func:`robustest.selection.select`, then ``OUT/selected.pt`` (plain tensors: the
  positions in the scored set, their scores, strategy, metric, pool size, x0_index), ``selected.csv`` and, with the
  tests, ``selected_tests.pt``; returns a :class:`SelectRun` whose :meth:`SelectRun.to_results` is the select
  verb's results.

Example::

    payload = read_scores("scores/scores.pt")
    run = select_pipeline(payload, "best", 30, out="sel")
    write_results("sel", "select", settings, run.to_results(), {"total_s": 1.0})
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from robustest.core.atomic import atomic_save, atomic_write_text, check_writable
from robustest.core.errors import ConfigError, DataError
from robustest.selection.dispatch import select
from robustest.selection.registry import describe, get
from robustest.selection.scores_file import score_stats

__all__ = ["SelectRun", "read_scored_tests", "select_pipeline", "strategy_input"]


def read_scored_tests(path: str | Path, index: torch.Tensor) -> dict[str, Any]:
    """The tests file at ``path`` (:func:`robustest.data.load_tests`) with ``scored_x`` and ``scored_y``: the tests
    at the scores' ``index`` [N], in the scores' order. Raises DataError when the index reaches past its tests."""
    from robustest import data as datasets

    t = datasets.load_tests(path)
    if len(index) and int(index.max()) >= t["x"].shape[0]:
        raise DataError(f"the scores index test {int(index.max())} but {path} holds {t['x'].shape[0]} tests: pass the "
                        "tests file that was scored")
    t["scored_x"], t["scored_y"] = t["x"][index.long()], t["y"][index.long()]
    return t


def strategy_input(payload: dict[str, Any], strategy: str, features: torch.Tensor | None = None) -> torch.Tensor:
    """What ``strategy`` selects from in the scores file ``payload`` (:func:`read_scores`): its covered cells
    ("bits", a coverage metric's), ``features`` [N, D] (which the caller computes from the tests), or the scores,
    which must then be finite. One-line ConfigError when what it needs is missing."""
    spec, scores = get(strategy), payload["scores"]
    if spec.needs == "bits":
        bits = payload.get("bits")
        if not isinstance(bits, torch.Tensor):
            raise ConfigError(f"--strategy {strategy} needs covered cells: score with --metric "
                              "nc|kmnc|nbc|snac|tknc and pass that scores.pt")
        return bits
    if spec.needs == "features":
        if features is None:
            raise ConfigError(f"--strategy {strategy} selects by the model's features of the tests: pass --tests "
                              "TESTS.pt (the file that was scored) and --checkpoint MODEL")
        return features
    if not bool(torch.isfinite(scores).all()):
        bad = int((~torch.isfinite(scores)).sum())
        raise ConfigError(f"{bad} of {len(scores)} scores are NaN or infinite: rescore or drop them before selecting")
    return scores


@dataclass
class SelectRun:
    """What :func:`select_pipeline` did: the positions ``idx`` in the pool, the ``chosen`` scores, the
    ``warnings`` the strategy gave, the ``results`` of results.json (without files), the ``files`` written and the
    ``settings`` in effect (the strategy and those of its options it reads: ``k``, ``fill``, and ``seed`` when it
    draws at random)."""

    idx: torch.Tensor
    chosen: torch.Tensor
    warnings: list[str]
    results: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def summary_line(self, strategy: str) -> str:
        """The selection in one line: how many of the pool ``strategy`` selected, and the mean score of the selected
        inputs beside the pool's (what ``robustest select`` prints)."""
        from robustest.report import format_value as fmt

        r = self.results
        return (f"selected {len(self.idx)} of {r['pool_size']} inputs with {strategy}: selected scores mean "
                f"{fmt(r['selected_scores'].get('mean'))} (pool {fmt(r['pool_scores'].get('mean'))})")

    def to_results(self) -> dict[str, Any]:
        """The ``results`` of the select verb's results.json."""
        return {**self.results, "files": self.files}


def select_pipeline(payload: dict[str, Any], strategy: str, n: int, *, out: str | Path, source: torch.Tensor | None
                    = None, k: int = 4, seed: int = 0, fill: str = "total",
                    tests: dict[str, Any] | None = None) -> SelectRun:
    """Select ``n`` of the inputs of the scores file ``payload`` with ``strategy`` (``source``: what it selects
    from, default :func:`strategy_input` of the payload; ``k``, ``seed``, ``fill``: its options) and write the
    selection into the folder ``out``, created if missing (the selected tests too, given the scored ``tests`` of
    :func:`read_scored_tests`)."""
    out = check_writable(out)
    scores, pool, spec = payload["scores"], len(payload["scores"]), get(strategy)
    source = strategy_input(payload, strategy) if source is None else source
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idx = select(source, n, strategy, k=k, seed=seed, fill=fill)
    notes = [str(w.message) for w in caught]
    chosen = scores[idx].float()
    pos = payload["index"][idx].long()
    selected: dict[str, Any] = {"indices": pos, "scores": chosen, "strategy": strategy,
                                "metric": payload.get("metric"), "pool_size": pool}
    if isinstance(payload.get("x0_index"), torch.Tensor):
        selected["x0_index"] = payload["x0_index"][idx]
    atomic_save(selected, out / "selected.pt")
    lines = ["rank,index,score"] + [f"{r},{i},{repr(float(v))}" for r, (i, v) in
                                    enumerate(zip(pos.tolist(), chosen.tolist()))]
    atomic_write_text(out / "selected.csv", "\n".join(lines) + "\n")
    if tests is not None:
        _write_tests(tests, pos, out / "selected_tests.pt", strategy)
    results: dict[str, Any] = {
        "metric": payload.get("metric"), "description": describe(strategy), "requested": n, "selected": len(idx),
        "pool_size": pool, "warnings": notes, "pool_scores": score_stats(scores),
        "selected_scores": score_stats(chosen)}
    if spec.needs == "bits":
        bits = payload["bits"]
        results["cells"] = int(bits.shape[1])
        results["cells_covered_by_pool"] = int(bits.any(0).sum())
        results["cells_covered_by_selection"] = int(bits[idx].any(0).sum()) if len(idx) else 0
    files = {"selected": "selected.pt", "csv": "selected.csv", "report": "report.html",
             **({"tests": "selected_tests.pt"} if tests is not None else {})}
    settings: dict[str, Any] = {"strategy": strategy, **{name: value for name, value in (("k", k), ("fill", fill))
                                                        if name in spec.options}}
    if spec.seeded or settings.get("fill") == "random":
        settings["seed"] = seed
    return SelectRun(idx, chosen, notes, results, files, settings)


def _write_tests(t: dict[str, Any], pos: torch.Tensor, dest: Path, strategy: str) -> None:
    from robustest import data as datasets

    fol = t.get("fol")
    extra = dict(t.get("extra") or {})
    extra["selected_by"] = strategy
    datasets.save_tests(dest, t["x"][pos], t["y"][pos], t["x0_index"][pos], t["method"],
                        fol=fol[pos] if isinstance(fol, torch.Tensor) else None, extra=extra)
