"""The eval pipeline: the ensemble, the bracket, the gate and the files of one evaluation (what ``robustest eval``
runs).

:func:`eval_pipeline` takes a loaded model and data, runs :func:`robustest.evaluate.evaluate` (attacks, checks,
flags, optionally corruptions), with ``certify`` the certified lower bound on the same samples
(:func:`robustest.evaluate.certification.bracket_eval`), decides the gate (``fail_under``: robust accuracy at least
that and no unaccepted unreliable flag) and writes ``OUT/samples.csv`` (and ``OUT/adv.pt`` with ``save_adv``).
:meth:`EvalRun.to_results` is the verb's part of results.json; :func:`robustest.evaluate.eval_report.eval_report`
its report.

Example::

    run = eval_pipeline(model, (x, y), 8 / 255, out="ev", fail_under=0.4)
    write_results("ev", "eval", settings, run.to_results(), run.timings)
    exit_status = 0 if run.passed is not False else 1
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from robustest.core.devices import model_device
from robustest.core.memory import peak_rss_mib
from robustest.core.options import defaults_of
from robustest.evaluate.certification import Bracket
from robustest.evaluate.ensemble import EvalResult, evaluate
from robustest.evaluate.eval_report import sample_rows
from robustest.evaluate.flags import Flag

__all__ = ["EvalRun", "eval_pipeline"]

#: evaluate()'s defaults of what the settings record (a caller may leave them out)
_EVALUATE_DEFAULTS = defaults_of(evaluate)


@dataclass
class EvalRun:
    """One evaluation: the ensemble's result, the bracket (None without ``certify``), the gate (None without
    ``fail_under``; else its threshold, verdict and flags), the files written (names in the output folder) and the
    wall-clock seconds of each part; ``describe``: what :meth:`to_results` records about the model and the data."""

    result: EvalResult
    bracket: Bracket | None
    gate: dict[str, Any] | None
    files: list[str]
    timings: dict[str, float]
    describe: dict[str, Any] = field(default_factory=dict)
    request: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool | None:
        """The gate's verdict: True passed, False failed, None no gate."""
        return None if self.gate is None else bool(self.gate["passed"])

    @property
    def blocking(self) -> list[Flag]:
        """The unreliable flags not accepted: each fails the gate."""
        return self.result.blocking(self.request.get("accept_flags", ()))

    @property
    def failed(self) -> bool:
        """The run fails its check: the gate failed, or (without a gate) the bracket is unsound."""
        unsound = self.bracket is not None and not self.bracket.sound
        return self.passed is False or (unsound and self.passed is None)

    def settings(self, *, batch_size_auto: bool = False, baseline: str | None = None,
                 surrogate: str | None = None) -> dict[str, Any]:
        """The settings the evaluation ran with, as results.json records them: the radius (a list for a curve),
        threat model, version, batch and block size, seed and device, then each option given (``baseline`` and
        ``surrogate``: the names of their files; the severities with the corruptions), ``save_adv`` and the flags
        accepted. ``batch_size_auto``: the batch size was probed."""
        r = {**_EVALUATE_DEFAULTS, **self.request}
        d: dict[str, Any] = {k: r[k] for k in ("eps", "norm", "version", "batch_size", "block_size", "seed",
                                               "device")}
        if batch_size_auto:
            d["batch_size_auto"] = True
        named = {**r, "baseline": baseline, "surrogate": surrogate}
        d.update({k: named[k] for k in ("attacks", "n_targets", "fail_under", "baseline", "amp", "bpda", "surrogate",
                                        "forwards", "certify") if named.get(k) is not None})
        if r.get("corruptions") is not None:
            d.update(corruptions=r["corruptions"], severities=list(r["severities"]))
        if r.get("save_adv"):
            d["save_adv"] = True
        if r.get("accept_flags"):
            d["accept_flag"] = list(r["accept_flags"])
        return d

    def summary_lines(self) -> tuple[list[str], list[str]]:
        """The figures as the eval verb prints them: (the lines before the flags: each radius of a curve, then the
        data set, images, threat model, version (``asked -> ran`` when ``auto`` escalated), clean and robust
        accuracy with the accuracy after each attack; the lines after them: the corruption summary, the bracket)."""
        r, brk, c = self.result, self.bracket, self.result.corruption
        per = ", ".join(f"{k} {100 * v:.2f}%" for k, v in r.attacks.items())
        plan = r.version if r.plan == r.version else f"{r.version} -> {r.plan}"
        before = [f"eps={p['eps']:g}: robust {100 * p['robust_accuracy']:.2f}% ({p['broke']} of {p['attacked']} "
                  "broken at this radius)" for p in r.curve or []]
        before.append(f"{self.describe.get('dataset', 'custom')} ({r.num_samples} images), {r.norm} eps={r.eps:g}, "
                      f"{plan}: clean {100 * r.clean_accuracy:.2f}%, robust {100 * r.robust_accuracy:.2f}% ({per})")
        after = []
        if c is not None:
            mce = "" if c["mce"] is None else f", mCE {100 * c['mce']:.2f}% of the baseline's"
            after.append(f"corruptions: mean accuracy {100 * c['mean_corruption_accuracy']:.2f}%{mce}")
        if brk is not None:
            after.append(f"bracket ({brk.method}): certified {100 * brk.certified_accuracy:.2f}% <= robust "
                         f"{100 * brk.robust_accuracy:.2f}% <= clean {100 * brk.clean_accuracy:.2f}% "
                         f"({brk.counts()['undecided']} undecided)")
        return before, after

    def gate_lines(self) -> list[str]:
        """What the run says beside its figures, one line each: an unsound bracket, and when the gate failed, why
        (robust accuracy below ``fail_under``, or the unreliable flags not accepted)."""
        lines = []
        if self.bracket is not None and not self.bracket.sound:
            lines.append(f"SOUNDNESS ERROR: {self.bracket.counts()['unsound']} samples are both certified and broken "
                         "(samples.csv: bracket = unsound); the figures cannot be trusted")
        if self.passed is False and self.gate is not None:
            acc, under = self.result.robust_accuracy, self.gate["fail_under"]
            if acc < under:
                lines.append(f"robust accuracy {acc:.4f} is below --fail-under {under:.4f}")
            if self.blocking:
                lines.append(f"gate failed: the evaluation is flagged unreliable "
                             f"({', '.join(f.name for f in self.blocking)}); fix the cause, or accept with "
                             "--accept-flag NAME")
        return lines

    def to_results(self) -> dict[str, Any]:
        """The results of an eval run (docs/RESULTS_SCHEMA.md, eval), without the contract's header: the figures,
        the process's peak memory and the files written."""
        d = self.describe
        doc = self.result.to_dict()
        for key in ("format", "version", "world_size", "timings"):
            doc.pop(key, None)
        if self.bracket is not None:
            doc["bracket"] = self.bracket.to_dict()
        doc["attack_settings"] = doc.pop("settings", {})  # the ensemble's own parameters, attack by attack
        doc["robustbench"] = self.result.robustbench(dataset=d.get("dataset", "custom"), name=d.get("name", "model"),
                                                     architecture=d.get("architecture"))
        doc["model"] = dict(d.get("model", {}))
        doc["data"] = {"dataset": d.get("dataset", "custom"), **d.get("data", {}),
                       "num_samples": self.result.num_samples}
        if d.get("baseline_source") is not None:
            doc["attack_settings"].setdefault("corruptions", {})["baseline_checkpoint"] = str(d["baseline_source"])
        if self.gate is not None:
            doc["gate"] = dict(self.gate)
        return {**doc, "peak_rss_mib": peak_rss_mib(), "files": list(self.files)}


def eval_pipeline(model: nn.Module, data: Any, eps: float | list[float], *, out: str | Path, norm: str = "linf",
                  version: str = "auto", certify: str | None = None, fail_under: float | None = None,
                  accept_flags: tuple[str, ...] | list[str] = (), save_adv: bool = False,
                  describe: dict[str, Any] | None = None, **options: Any) -> EvalRun:
    """Evaluate ``model`` on the labelled ``data`` (images N x C x H x W in [0, 1], int64 labels [N]) at ``eps`` (a
    list: the robustness curve), bracket it with the certificate ``certify`` ("ibp" or "crown"; a soundness error
    joins the flags), decide the gate at ``fail_under`` and write ``out/samples.csv`` (and ``out/adv.pt``); ``out`` is
    created after the evaluation, so an argument it refuses leaves nothing behind.

    ``options``: the other keyword arguments of :func:`robustest.evaluate.evaluate` (attacks, n_targets, seed,
    batch_size, block_size, corruptions, severities, baseline, progress, amp, bpda, surrogate, forwards).
    ``describe``: dataset, name and architecture (the RobustBench entry), model and data (recorded as they are),
    baseline_source (the baseline's file). ``accept_flags``: names of the unreliable flags the gate accepts. Raises
    what :func:`robustest.evaluate.evaluate` raises."""
    from robustest import report
    from robustest.core.atomic import atomic_save, check_writable

    describe = dict(describe or {})
    result = evaluate(model, data, eps, norm=norm, version=version, keep_adv=True, **options)
    brk = None
    if certify is not None:
        from robustest.evaluate.certification import bracket_eval

        brk = bracket_eval(model, data, result, certify)  # a soundness error joins result.flags
    gate = None
    if fail_under is not None:
        stopping = result.blocking(list(accept_flags))
        gate = {"fail_under": fail_under, "passed": result.robust_accuracy >= fail_under and not stopping,
                "accuracy_passed": result.robust_accuracy >= fail_under, "accepted_flags": list(accept_flags),
                "blocking_flags": [f.name for f in stopping]}
    out = check_writable(out)  # created once the evaluation has run: a refused argument writes nothing
    files = ["results.json", "samples.csv", "report.html"]
    if save_adv:
        atomic_save({"format": "robustest-eval-adversarials", "version": 1, "x": result.adv, "y": result.y,
                     "index": result.index, "robust": result.robust}, out / "adv.pt")
        files.append("adv.pt")
    report.write_csv(out / "samples.csv", sample_rows(result, brk))
    timings = {**result.timings, **(brk.timings if brk is not None else {})}
    request = {"eps": eps, "norm": norm, "version": version, "certify": certify, "fail_under": fail_under,
               "save_adv": save_adv, "accept_flags": list(accept_flags), **options, "device": str(model_device(model))}
    return EvalRun(result, brk, gate, files, timings, describe, request)
