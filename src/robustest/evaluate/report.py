"""The robustness report of one model: clean, fixed-set, white-box (and optionally AutoAttack-level) and
corruption accuracy in one :class:`RobustnessReport` (the RobOT measurements, METHODS.md A4)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from robustest.core.reprs import one_line
from robustest.core.validation import check_eps
from robustest.evaluate.adversarial import FixedAdversarialSet, fixed_set_accuracy, whitebox_accuracy
from robustest.evaluate.clean import clean_accuracy, labelled_tensors
from robustest.evaluate.corruption import corruption_accuracy
from robustest.evaluate.ensemble import evaluate

__all__ = ["RobustnessReport", "measure"]


@dataclass
class RobustnessReport:
    """Robustness of one model. Accuracies are in [0, 1] (None when not measured).

    * ``clean_accuracy``: on the clean evaluation split (``num_eval`` images).
    * ``fixed_set_accuracy``: on the fixed adversarial set built against the ORIGINAL model
      (``fixed_set_size`` examples; the paper's robustness measure).
    * ``whitebox_pgd_accuracy`` / ``whitebox_apgd_accuracy`` / ``whitebox_accuracy``: white-box attacks on
      THIS model at the same eps over the first ``num_whitebox`` evaluation images; ``whitebox_accuracy`` is
      the per-sample worst case (clean, PGD and APGD-CE all correct).
    * ``corruption_accuracy``: mean accuracy under common corruptions (when measured), details in
      ``corruption``.
    * ``autoattack_accuracy``: robust accuracy under :func:`evaluate`'s ensemble (``measure(autoattack=True)``,
      same images and eps as the white-box attacks), else None; ``autoattack_flags``: that evaluation's flags
      (:meth:`robustest.evaluate.Flag.to_dict`), else None.
    * ``seconds``: wall time of the measurement (kept out of reproducibility comparisons).
    """

    clean_accuracy: float
    fixed_set_accuracy: float | None
    fixed_set_size: int
    whitebox_pgd_accuracy: float | None
    whitebox_apgd_accuracy: float | None
    whitebox_accuracy: float | None
    eps: float
    num_eval: int
    num_whitebox: int
    corruption_accuracy: float | None = None
    corruption: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    autoattack_accuracy: float | None = None
    autoattack_flags: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN written as None)."""
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float) and v != v:
                d[k] = None
        return d

    def __repr__(self) -> str:
        return one_line(self, clean_accuracy=self.clean_accuracy, fixed_set_accuracy=self.fixed_set_accuracy,
                        fixed_set_size=self.fixed_set_size, whitebox_accuracy=self.whitebox_accuracy,
                        corruption_accuracy=self.corruption_accuracy, eps=self.eps, num_eval=self.num_eval,
                        num_whitebox=self.num_whitebox, seconds=self.seconds)


def measure(model: Any, data: Any, *, eps: float, fixed: FixedAdversarialSet | None = None,
            whitebox: bool = True, whitebox_limit: int | None = 1000, pgd_steps: int = 20, pgd_restarts: int = 2,
            apgd_steps: int = 50, corruptions: str | list[str] | None = None,
            corruption_severities: tuple[int, ...] = (1, 3, 5), seed: int = 0,
            batch_size: int = 256, autoattack: bool = False, autoattack_version: str = "standard"
            ) -> RobustnessReport:
    """Measure the robustness of ``model`` on the labelled evaluation split ``data``.

    ``fixed``: the fixed adversarial set built once against the ORIGINAL model (:func:`build_fixed_set`);
    without it ``fixed_set_accuracy`` is None. ``whitebox``: run PGD (``pgd_steps``, ``pgd_restarts``) and
    APGD-CE (``apgd_steps``) against ``model`` itself on the first ``whitebox_limit`` images (None: all).
    ``corruptions``: None (skip), ``"all"`` or a list of names for :func:`corruption_accuracy`.
    ``autoattack``: also run :func:`evaluate` (``autoattack_version``: "standard" = AutoAttack's ensemble, or
    "fast") on the same white-box images (needs ``whitebox``). Seeded.
    """
    t0 = time.perf_counter()
    eps = check_eps("eps", eps)
    x, y = labelled_tensors(data)
    clean = clean_accuracy(model, (x, y), batch_size=batch_size)
    fx = fixed_set_accuracy(model, fixed, batch_size=batch_size) if fixed is not None else None
    wb: dict[str, Any] = {"pgd": None, "apgd": None, "worst": None}
    nwb = 0
    if whitebox:
        m = x.shape[0] if whitebox_limit is None else min(int(whitebox_limit), x.shape[0])
        wb = whitebox_accuracy(model, (x[:m], y[:m]), eps, pgd_steps=pgd_steps, pgd_restarts=pgd_restarts,
                               apgd_steps=apgd_steps, seed=seed, batch_size=batch_size)
        nwb = m
    aa = aa_flags = None
    if whitebox and autoattack:
        res = evaluate(model, (x[:nwb], y[:nwb]), eps, version=autoattack_version, seed=seed, batch_size=batch_size)
        aa, aa_flags = res.robust_accuracy, [f.to_dict() for f in res.flags]
    corr_mean, corr = None, None
    if corruptions:
        res = corruption_accuracy(model, (x, y), corruptions=corruptions, severities=tuple(corruption_severities),
                                  seed=seed, batch_size=batch_size)
        corr = res.to_dict()
        corr_mean = float(res.mean_corruption_accuracy)
    settings = {"pgd_steps": pgd_steps, "pgd_alpha": eps / 4, "pgd_restarts": pgd_restarts, "apgd_steps": apgd_steps,
                "seed": seed, "whitebox_limit": whitebox_limit, "corruption_severities": list(corruption_severities)}
    if aa is not None:
        settings["autoattack_version"] = autoattack_version
    return RobustnessReport(clean_accuracy=clean, fixed_set_accuracy=fx, fixed_set_size=len(fixed) if fixed else 0,
                            whitebox_pgd_accuracy=wb["pgd"], whitebox_apgd_accuracy=wb["apgd"],
                            whitebox_accuracy=wb["worst"], eps=eps, num_eval=int(x.shape[0]), num_whitebox=nwb,
                            corruption_accuracy=corr_mean, corruption=corr, settings=settings,
                            seconds=time.perf_counter() - t0, autoattack_accuracy=aa, autoattack_flags=aa_flags)
