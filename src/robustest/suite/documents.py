"""The ``results`` of ``suite build`` and ``suite check`` in results.json: what the suite holds (its size, strata,
fingerprints, attack and certificate) and, for a check, the estimates, the comparison, the verdict and the rows of
every stratum."""

from __future__ import annotations

from typing import Any

from robustest.suite.check import SuiteCheck
from robustest.suite.format import Suite
from robustest.suite.report import stratum_rows

__all__ = ["SUITE_FILE", "build_results", "check_results"]

#: the file name of a suite in the folder ``suite build`` writes
SUITE_FILE = "suite.pt"


def _certify(meta: dict[str, Any]) -> dict[str, Any]:
    return {"certify": meta["certify"]["method"]} if "certify" in meta else {}


def build_results(suite: Suite) -> dict[str, Any]:
    """The results of ``suite build`` for the built ``suite`` (saved as :data:`SUITE_FILE`)."""
    m = suite.meta
    return {"command": "build",
            "suite": {"file": SUITE_FILE, "k": m["k"], "n_population": m["n_population"],
                      "strata": len(m["stratum_sizes"]), "by_class": m["strata"]["by_class"],
                      "stratum_sizes": m["stratum_sizes"], "stratum_samples": m["stratum_samples"],
                      "stratum_weights": m["stratum_weights"], "data_sha256": m["data_sha256"],
                      "baseline_sha256": m["baseline_sha256"], "attack": m["attack"],
                      "corruption_settings": len(m["corruption"]["settings"]), **_certify(m)},
            "baseline": m["baseline"], "files": [SUITE_FILE, "results.json", "report.html"]}


def check_results(res: SuiteCheck, suite: Suite) -> dict[str, Any]:
    """The results of ``suite check``: :meth:`SuiteCheck.to_dict`, its message, the suite checked against (with
    the attack version that ran) and one row per stratum (:func:`stratum_rows`)."""
    m = suite.meta
    return {"command": "check", **res.to_dict(), "message": res.message(),
            "suite": {"k": m["k"], "n_population": m["n_population"], "strata": len(m["stratum_sizes"]),
                      "dataset": m.get("dataset"), "split": m.get("split"), "data_sha256": m["data_sha256"],
                      "baseline_sha256": m["baseline_sha256"], "attack": {**m["attack"], "version": res.version},
                      **_certify(m)},
            "strata": stratum_rows(suite, res.outcomes, res.baseline_outcomes),
            "files": ["results.json", "report.html"]}
