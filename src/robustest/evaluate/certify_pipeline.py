"""The certify pipeline: certify a model's samples and write the run's per-sample file (what ``robustest certify``
runs).

:func:`certify_pipeline` takes a loaded model and data, runs :func:`robustest.evaluate.certification.run_certify`
(IBP, CROWN or randomised smoothing) and writes ``OUT/samples.csv``; :meth:`CertifyRun.to_results` is the verb's
part of results.json (the figures, the model and data described, peak memory, the files);
:func:`robustest.evaluate.certify_report.certify_report` its report.

Example::

    run = certify_pipeline(model, (x, y), 0.1, out="cert", method="ibp")
    write_results("cert", "certify", run.result.settings, run.to_results(), run.result.timings)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from robustest.core.memory import peak_rss_mib
from robustest.evaluate.certification import CertifyResult, run_certify

__all__ = ["CertifyRun", "certify_pipeline"]


@dataclass
class CertifyRun:
    """One certification: its result, the files written (names in the output folder) and ``describe``, what
    :meth:`to_results` records about the model and the data."""

    result: CertifyResult
    files: list[str]
    describe: dict[str, Any] = field(default_factory=dict)

    def summary_line(self, dataset: str = "custom") -> str:
        """The certification in one line: the data set, images, ball, method (smoothing's sigma) and the certified
        and clean accuracy (what ``robustest certify`` prints)."""
        r = self.result
        method = r.settings["method"]
        what = f"{method} (sigma={r.settings['sigma']:g})" if method == "smoothing" else method
        return (f"{dataset} ({r.num_samples} images), {r.settings['norm']} eps={r.eps:g}, {what}: certified "
                f"{100 * r.certified_accuracy:.2f}%, clean {100 * r.clean_accuracy:.2f}%")

    def to_results(self) -> dict[str, Any]:
        """The certification's figures (:meth:`CertifyResult.to_results`), ``model`` and ``data`` as described (data
        with ``num_samples``), ``peak_rss_mib`` and ``files``; JSON-ready."""
        return {**self.result.to_results(), "model": dict(self.describe.get("model") or {}),
                "data": {**(self.describe.get("data") or {}), "num_samples": self.result.num_samples},
                "peak_rss_mib": peak_rss_mib(), "files": list(self.files)}


def certify_pipeline(model: nn.Module, data: Any, eps: float, *, out: str | Path,
                     describe: dict[str, Any] | None = None, **options: Any) -> CertifyRun:
    """Certify ``model`` on the labelled ``data`` (images N x C x H x W in [0, 1], int64 labels [N]) at ``eps`` and
    write ``out/samples.csv`` (one row per sample, :meth:`CertifyResult.rows`); ``out`` is created after the
    certification, so an argument it refuses leaves nothing behind.

    ``options``: the other keyword arguments of :func:`robustest.evaluate.certification.run_certify` (norm, method,
    sigma, n0, n, alpha, seed, batch_size, block_size, progress); ``describe``: ``model`` and ``data``, recorded as
    they are. Raises what ``run_certify`` raises, and :class:`robustest.core.errors.OutputError` for an ``out`` that
    cannot be written."""
    from robustest import report
    from robustest.core.atomic import check_writable

    result = run_certify(model, data, eps, **options)
    folder = check_writable(out)  # created once the certification has run: a refused argument writes nothing
    report.write_csv(folder / "samples.csv", result.rows())
    return CertifyRun(result, ["results.json", "samples.csv", "report.html"], dict(describe or {}))
