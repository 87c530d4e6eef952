"""The harden pipeline: measure a model, harden it, measure it again, save it (what ``robustest harden`` runs).

:func:`harden_pipeline` takes a loaded model and loaded data; it measures the model's robustness on the test images
(:class:`Measurement`: clean accuracy, the per-sample worst case of PGD and APGD-CE, optionally the AutoAttack-style
ensemble and certified accuracy by bound propagation), hardens it with :func:`robustest.train.harden`, measures the
kept model and, when another epoch was kept, the last epoch's, and writes ``OUT/model.pt`` (and ``OUT/last.pt``).
The measurement before training is saved in ``OUT/state/before.json``, so a resumed run does not repeat it.

Example::

    run = harden_pipeline(model, train, test, "pgd-at", out="hard", measurement=Measurement(eps=0.3),
                          options={"eps": 0.3, "epochs": 5, "recipe": Recipe(schedule="cosine")}, val=val)
    doc = write_results("hard", "harden", settings, run.to_results(), {**run.timings, "total_s": seconds})

(``run.timings`` hold the parts; results.json also records the whole run's ``total_s``.)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from robustest.core.atomic import atomic_write_json
from robustest.core.errors import ConfigError
from robustest.core.memory import peak_rss_mib
from robustest.core.options import option
from robustest.train.hardening import HardenResult, harden

__all__ = ["HardenRun", "Measurement", "certificates_for", "claim_run_dir", "harden_pipeline", "measure_model"]


@dataclass(frozen=True)
class Measurement:
    """How a model is measured before and after hardening, on the test images.

    ``whitebox_limit``: PGD (``pgd_steps`` of eps/4 from a random start, best of ``pgd_restarts``) and APGD-CE
    (``apgd_steps``; 0 skips it) on the first ``whitebox_limit`` images (0: no attacks); ``autoattack``: also the
    ensemble of :func:`robustest.evaluate.evaluate` ("fast" or "standard") on those images; ``certify``: the
    certificates whose certified accuracy at ``eps`` is measured on all test images ("ibp", "crown"), or None.
    The attack settings carry the flags of ``robustest harden`` (:func:`robustest.core.options.option`)."""

    eps: float
    whitebox_limit: int = option(500, "count", "white-box attacks (and --autoattack) on the first N test images; 0 "
                                 "skips them", metavar="N")
    pgd_steps: int = option(20, "positive-int", "PGD steps", flag="whitebox-pgd-steps")
    pgd_restarts: int = option(2, "positive-int", "PGD restarts", flag="whitebox-restarts")
    apgd_steps: int = option(50, "count", "APGD-CE steps, 0 skips")
    seed: int = 0
    autoattack: str | None = option(
        None, "choice", "also measure robust accuracy under the AutoAttack-style ensemble of 'robustest eval' on the "
        "white-box images, before and after (and of the last epoch's model when another was kept): fast = APGD-CE + "
        "APGD-T on 3 classes, standard = AutoAttack's standard version", choices=("fast", "standard"), shown="off")
    certify: tuple[str, ...] | None = None


def measure_model(model: nn.Module, test: Any, m: Measurement) -> dict[str, Any]:
    """The figures of ``model`` on the labelled ``test`` data (images N x C x H x W in [0, 1]) under ``m``: the keys of
    :meth:`robustest.evaluate.RobustnessReport.to_dict` without its timing and fixed-set keys, and with
    ``certify``, ``certified_<name>_accuracy`` per certificate and ``certified_accuracy`` (certified by any)."""
    from robustest.evaluate import measure

    rep = measure(model, test, eps=m.eps, whitebox=m.whitebox_limit > 0, whitebox_limit=m.whitebox_limit or None,
                  pgd_steps=m.pgd_steps, pgd_restarts=m.pgd_restarts, apgd_steps=m.apgd_steps, seed=m.seed,
                  autoattack=m.autoattack is not None and m.whitebox_limit > 0,
                  autoattack_version=m.autoattack or "standard")
    d = rep.to_dict()
    for key in ("fixed_set_accuracy", "fixed_set_size", "seconds"):  # seconds go to timings: results stay reproducible
        d.pop(key, None)
    if m.certify:
        d.update(_certified(model, test, m))
    return d


def _certified(model: nn.Module, test: Any, m: Measurement) -> dict[str, Any]:
    from robustest import certify
    from robustest.evaluate.clean import labelled_tensors

    x, y = labelled_tensors(test, "test data")
    out: dict[str, Any] = {}
    proved = torch.zeros(x.shape[0], dtype=torch.bool)
    for name in m.certify or ():
        cert = getattr(certify, name)(model, x, y, m.eps)
        out[f"certified_{name}_accuracy"] = cert.certified_accuracy
        proved |= cert.certified.cpu()
    out["certified_accuracy"] = int(proved.sum()) / x.shape[0] if x.shape[0] else 0.0
    return out


def claim_run_dir(out: str | Path, settings: dict[str, Any], resume: bool) -> Path:
    """Mark the existing folder ``out`` as holding the harden run of ``settings`` (JSON-ready), after refusing to
    overwrite another run without ``resume`` or to resume one with other settings (one-line ConfigError)."""
    from robustest.core import distributed

    out = Path(out)
    marker = out / "state" / "run.json"
    if marker.is_file() or (out / "results.json").is_file():
        if not resume:
            raise ConfigError(f"{out} already holds a harden run: pass --resume to continue it or choose another --out")
        try:
            prev = json.loads(marker.read_text()).get("args")
        except (OSError, ValueError, AttributeError):
            prev = None
        if prev != settings:
            raise ConfigError(f"{out} holds a run with other settings: resume with the same options or choose "
                              "another --out")
    distributed.barrier()  # every rank has looked at the folder before rank 0 writes the marker
    atomic_write_json(marker, {"args": settings})
    return out


def certificates_for(method: str, given: list[str] | None, model: nn.Module, test: Any) -> list[str] | None:
    """The certificates measured before and after hardening with ``method``: ``given`` (None: the method's own,
    e.g. ibp and crown for certified training; ``["none"]``: none). A model bound propagation does not cover is
    refused here, before any work, when certifying or training with the bounds (one-line ConfigError)."""
    from robustest.train import objectives

    chosen = given if given is not None else list(objectives.get(method).certificates)
    if "none" in chosen and len(chosen) > 1:
        raise ConfigError(f"--certify none turns certification off: give it alone, not with {chosen}")
    names = [c for c in chosen if c != "none"]
    if names or objectives.get(method).certificates:  # certified training needs the bounds too
        from robustest.certify import check_certifiable
        from robustest.core.batching import image_shape
        from robustest.core.modelcall import eval_mode

        with eval_mode(model):  # tracing runs one forward: BatchNorm's running statistics stay as they are
            check_certifiable(model, image_shape(test))
    return names or None


@dataclass
class HardenRun:
    """What :func:`harden_pipeline` measured and wrote: the figures before, after (the kept epoch's model) and of
    the last epoch's model (None when it is the kept one), the training run itself, its CPU seconds, the data sizes
    and the files written (relative to the output folder). :meth:`to_results` is the verb's part of results.json."""

    before: dict[str, Any]
    after: dict[str, Any]
    last: dict[str, Any] | None
    result: HardenResult
    training_cpu_s: float
    data: dict[str, Any]
    files: dict[str, str]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def final_epoch(self) -> int:
        """The number of epochs trained (the last epoch)."""
        return len(self.result.epochs)

    def summary_rows(self) -> list[dict[str, Any]]:
        """The table the verb prints: one row per model measured (before, after: the kept epoch's, and the last
        epoch's when another was kept), with the columns of :func:`robustest.train.harden_report.summary_figures`."""
        from robustest.train.harden_report import summary_figures

        return [{"model": name, **summary_figures(r)} for name, r in (
            ("before", self.before), (f"after (epoch {self.result.kept_epoch})", self.after),
            (f"last (epoch {self.final_epoch})", self.last)) if r is not None]

    def summary_line(self) -> str:
        """The training in one line: method, epochs, images, passes (in all and per image), training CPU seconds
        and, when the catastrophic-overfitting guard stopped the run, its epoch and what it saw."""
        from robustest.report import format_value
        from robustest.train.harden_report import guard_reason

        res, n = self.result, self.final_epoch
        c = res.compute
        guard = "" if res.guard_epoch is None else (f"; stopped by the catastrophic-overfitting guard at epoch "
                                                    f"{res.guard_epoch} ({guard_reason(res)})")
        return (f"{res.method}: {n} epoch{'s' if n != 1 else ''} on {res.num_samples} images, {c['passes']:.4g} "
                f"forward+backward passes ({c['passes'] / res.num_samples:.2f} per image), "
                f"{format_value(self.training_cpu_s, 'cpu_s')} CPU-seconds of training{guard}")

    def to_results(self) -> dict[str, Any]:
        """The results of a harden run (docs/RESULTS_SCHEMA.md, harden), without the contract's header."""
        res = self.result
        return {"data": self.data, "before": self.before, "after": self.after, "last": self.last,
                "kept_epoch": res.kept_epoch, "best_epoch": res.best_epoch, "guard_epoch": res.guard_epoch,
                "autoattack_accuracy": self.after.get("autoattack_accuracy"),
                "autoattack_flags": self.after.get("autoattack_flags"),
                "certified_accuracy": self.after.get("certified_accuracy"),
                "epochs": res.epochs, "compute": res.compute, "resumed_epochs": res.resumed_epochs,
                "training_cpu_s": self.training_cpu_s, "peak_rss_mib": peak_rss_mib(), "files": dict(self.files)}


def harden_pipeline(model: nn.Module, train: Any, test: Any, method: str, *, out: str | Path,
                    measurement: Measurement, options: dict[str, Any], val: Any = None, resume: bool = False,
                    device: str | None = None, progress: bool = False, metadata: dict[str, Any] | None = None
                    ) -> HardenRun:
    """Measure ``model`` on ``test``, harden it in place on ``train`` (robust early stopping on ``val``, None: none),
    measure it again, and write ``out/model.pt`` (the kept epoch's model) and ``out/last.pt`` (the last epoch's,
    when another was kept); the resumable state goes to ``out/state/``.

    ``options``: the keyword arguments of :func:`robustest.train.harden` (eps, epochs, its ``recipe``, the method's
    options, the validation's ``val_steps`` and ``val_attack``); ``metadata``: stored in the checkpoints under
    ``"hardened"`` beside the settings, compute and kept epoch. ``resume``: continue the interrupted run in ``out``
    (the measurement before is read back). Raises what :func:`robustest.train.harden` raises."""
    from robustest.core.batching import num_samples
    from robustest.models.checkpoints import source_of

    out = Path(out)
    spec = source_of(model)
    t1 = time.perf_counter()
    before_path = out / "state" / "before.json"
    if resume and before_path.is_file():
        before = json.loads(before_path.read_text())
    else:
        before = measure_model(model, test, measurement)
        atomic_write_json(before_path, before)
    t_before = time.perf_counter() - t1

    t2, cpu2 = time.perf_counter(), time.process_time()
    res = harden(model, train, method, **options, device=device, progress=progress, val=val,
                 state_dir=out / "state", resume=resume)
    t_harden, cpu_harden = time.perf_counter() - t2, time.process_time() - cpu2

    t3 = time.perf_counter()
    after = measure_model(model, test, measurement)
    last = last_model = None
    if res.last_weights is not None:
        from robustest.models.checkpoints import clone_model

        last_model = clone_model(model)
        last_model.load_state_dict(res.last_weights)
        last_model.eval()
        last = measure_model(last_model, test, measurement)
    t_after = time.perf_counter() - t3
    files = _save(out, model, last_model, res, metadata or {})
    data = {"num_train": num_samples(train) + (0 if val is None else num_samples(val)), "num_fit": res.num_samples,
            "num_val": 0 if val is None else num_samples(val), "num_test": num_samples(test), "model": spec}
    return HardenRun(before, after, last, res, cpu_harden, data, files,
                     {"before_s": t_before, "harden_s": t_harden, "after_s": t_after})


def _save(out: Path, model: nn.Module, last_model: nn.Module | None, res: HardenResult,
          metadata: dict[str, Any]) -> dict[str, str]:
    from robustest.models.checkpoints import save_checkpoint

    meta = dict(getattr(model, "robustest_metadata", {}) or {})
    meta["hardened"] = {"settings": res.settings, "compute": res.compute, "kept_epoch": res.kept_epoch, **metadata}
    save_checkpoint(out / "model.pt", model, metadata=meta)
    files = {"model": "model.pt", "report": "report.html", "state": "state/"}
    if last_model is not None:
        save_checkpoint(out / "last.pt", last_model,
                        metadata={**meta, "hardened": {**meta["hardened"], "kept_epoch": len(res.epochs)}})
        files["last_model"] = "last.pt"
    return files
