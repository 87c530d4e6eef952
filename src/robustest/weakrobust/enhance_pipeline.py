"""The enhance pipeline: targeted enhancement measured before and after (what ``robustest enhance`` runs).

:func:`read_weaknesses` reads the weaknesses to target (names, or the results.json of ``robustest validate``);
:func:`enhance_pipeline` measures the model on the test split (clean accuracy, FGSM and PGD error, the mCE of
corruptions held out of the training pool), enhances it with :func:`robustest.weakrobust.enhance`, measures it again
and writes ``OUT/model.pt``. :meth:`EnhanceRun.to_results` is the verb's part of results.json.

Example::

    run = enhance_pipeline(model, train, test, ["fog"], out="enh", eval_limit=200, epochs=1)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from robustest.core.batching import take
from robustest.core.devices import model_device
from robustest.core.errors import DataError
from robustest.core.memory import peak_rss_mib
from robustest.weakrobust.enhance import EnhanceResult, enhance
from robustest.weakrobust.validation import validate

__all__ = ["EnhanceRun", "enhance_pipeline", "held_out_corruptions", "measure_enhancement", "read_weaknesses",
           "state_folder"]


def read_weaknesses(items: list[str]) -> list[str]:
    """The weakness names in ``items``, each a comma-separated list of names or a validate results.json (its
    ``weaknesses`` list), without repeats in their first order. Raises DataError for a file that is not one."""
    names: list[str] = []
    for it in items:
        p = Path(it)
        if it.endswith(".json") or p.is_file():
            if not p.is_file():
                raise DataError(f"weaknesses file {it!r} does not exist: pass the results.json of 'robustest validate'")
            try:
                d = json.loads(p.read_text())
            except (OSError, ValueError) as exc:
                raise DataError(f"{it} is not a JSON file: pass the results.json of 'robustest validate'") from exc
            if not isinstance(d, dict) or not isinstance(d.get("weaknesses"), list):
                raise DataError(f"{it} has no 'weaknesses' list: pass the results.json of 'robustest validate'")
            names += [str(w) for w in d["weaknesses"]]
        else:
            names += [w for w in it.split(",") if w]
    return list(dict.fromkeys(names))


def held_out_corruptions(weaknesses: list[str], count: int = 6) -> list[str]:
    """The first ``count`` registered corruptions that are not among ``weaknesses`` (kept out of the training pool):
    the before/after comparison measures generalisation on them."""
    from robustest import corruptions

    return [c for c in corruptions.names() if c not in weaknesses][:count]


def measure_enhancement(model: nn.Module, test: Any, limit: int, held_out: list[str], seed: int) -> dict[str, Any]:
    """Clean accuracy, mean FGSM/PGD error, the mCE of the ``held_out`` corruptions (severities 1, 3, 5) and the
    error per perturbation type of ``model`` on the first ``limit`` images of ``test``; {} without test data."""
    from robustest.evaluate import accuracy

    if test is None:
        return {}
    x, y = take(test, torch.arange(min(limit, len(test))))
    r = validate(model, (x, y), None, perturbations=["fgsm", "pgd"] + held_out, severities=(1, 3, 5), seed=seed)
    return {"clean_accuracy": accuracy(model, (x, y)), "mean_adv_error": r.mean_adv_error, "mce_held_out": r.mce,
            "per_type": {t: e for t, (_f, e) in r.per_type().items()}}


@dataclass
class EnhanceRun:
    """One enhancement: the training's result, the weaknesses targeted, the corruptions held out, the figures
    before and after ({} without test data) and the files written."""

    result: EnhanceResult
    weaknesses: list[str]
    held_out: list[str]
    before: dict[str, Any]
    after: dict[str, Any]
    files: dict[str, str]
    eval_limit: int = 0
    device: str = "cpu"

    @property
    def settings(self) -> dict[str, Any]:
        """The settings in effect, as results.json records them: the weaknesses, epochs and terms, each term's
        weights (the adversarial copy's radius as resolved), the optimiser's, the test samples, seed and device."""
        c = self.result.config
        d = {"weaknesses": self.weaknesses, "epochs": c["epochs"], "augmix": c["augmix"],
             "adversarial": c["adversarial"]}
        if c["augmix"]:
            d["jsd_weight"] = c["jsd_weight"]
        if c["adversarial"]:
            d.update({k: c[k] for k in ("adv_weight", "eps", "adv_steps", "adv_source")})
        return {**d, "lr": c["lr"], "batch_size": c["batch_size"], "eval_limit": self.eval_limit, "seed": c["seed"],
                "device": self.device}

    def summary_line(self) -> str | None:
        """Before and after in one line: test accuracy, mean adversarial error, held-out mCE (None without test
        figures)."""
        from robustest.report import format_value as fmt

        b, a = self.before, self.after
        if not (b and a):
            return None
        return (f"test accuracy {fmt(b['clean_accuracy'], 'accuracy')} -> {fmt(a['clean_accuracy'], 'accuracy')}; "
                f"mean adversarial error {fmt(b['mean_adv_error'], 'error')} -> {fmt(a['mean_adv_error'], 'error')}; "
                f"held-out mCE {fmt(b['mce_held_out'], 'mce')} -> {fmt(a['mce_held_out'], 'mce')}")

    @property
    def train_seconds(self) -> float:
        """Wall-clock seconds of the training."""
        return float(self.result.to_dict().get("seconds", 0.0) or 0.0)

    def to_results(self) -> dict[str, Any]:
        """The results of an enhance run (docs/RESULTS_SCHEMA.md, enhance), without the contract's header."""
        enh = self.result.to_dict()
        enh.pop("seconds", None)
        return {"enhance": enh, "held_out_corruptions": self.held_out, "before": self.before, "after": self.after,
                "peak_rss_mib": peak_rss_mib(), "files": dict(self.files)}


def enhance_pipeline(model: nn.Module, train: Any, test: Any, weaknesses: list[str], *, out: str | Path,
                     eval_limit: int, seed: int = 0, **options: Any) -> EnhanceRun:
    """Measure ``model`` on ``test`` (None: not measured), enhance it in place on ``train`` against ``weaknesses``
    (``options``: the keyword arguments of :func:`robustest.weakrobust.enhance`, state_dir and resume among them),
    measure it again and write ``out/model.pt`` (its metadata records the enhancement and the weaknesses)."""
    from robustest.models.checkpoints import save_checkpoint

    held_out = held_out_corruptions(weaknesses) if test is not None else []
    before = measure_enhancement(model, test, eval_limit, held_out, seed)
    res = enhance(model, train, weaknesses, seed=seed, **options)
    after = measure_enhancement(model, test, eval_limit, held_out, seed)
    meta = dict(getattr(model, "robustest_metadata", {}) or {})
    meta.update({"enhanced": res.config, "weaknesses": weaknesses})
    save_checkpoint(Path(out) / "model.pt", model, metadata=meta)
    return EnhanceRun(res, weaknesses, held_out, before, after, {"model": "model.pt", "report": "report.html"},
                      eval_limit, str(model_device(model)))


def _note(msg: str) -> None:
    print(f"note: {msg}", file=sys.stderr)


def state_folder(out: str | Path, settings: dict[str, Any], weaknesses: list[str], model: nn.Module, train: Any,
                 note: Callable[[str], None] = _note) -> Path:
    """The state folder of an enhancement in ``out``: named by the run's fingerprint (``settings``, the weaknesses,
    the starting model and the data), so rerunning the same command continues and a changed one starts afresh (the
    state of an earlier run with other settings is removed; ``note`` says so, and when a run is continued)."""
    import shutil

    from robustest.core import distributed
    from robustest.core.steps import data_fingerprint, fingerprint
    from robustest.models.checkpoints import state_fingerprint
    from robustest.train.state import STATE_FILES

    state = Path(out) / "state"
    fp = fingerprint("enhance", settings, sorted(weaknesses), state_fingerprint(model), data_fingerprint(train))[:16]
    folder = state / f"enhance_{fp}"
    stale = [f for f in state.glob("enhance_*") if f != folder] if state.is_dir() else []
    if stale and distributed.is_main():
        for f in stale:
            shutil.rmtree(f) if f.is_dir() else f.unlink(missing_ok=True)
        note("the enhancement state of an earlier run with other settings was removed: starting afresh")
    if (folder / STATE_FILES["enhance"]).is_file() and distributed.is_main():
        note(f"continuing the interrupted enhancement saved in {folder}")
    return folder
