"""``check_suite``: run a suite's stored attacks and corruptions on a candidate model, estimate its robust
accuracy with an interval, and compare it with the baseline on the same samples.

Verdict (see docs/SUITE.md): with ``drop = baseline - candidate`` (stratified robust accuracy on the suite) and the
exact one-sided McNemar p-value of the discordant pairs, the candidate **regressed** when
``p_value < alpha`` AND ``drop > max_drop``; otherwise it passes. Without a baseline there is no verdict. The gate
also fails (verdict ``unreliable``) when the candidate's evaluation, or the baseline's when it is evaluated, raised
a flag of severity ``unreliable`` that ``accept_flags`` does not name. A suite built with a certificate stores
which samples the baseline's certificate proves; the candidate's certificate is compared the same way (the
samples certified before and no longer, ``b``, against the reverse, ``c``: exact McNemar and the stratified drop
of certified accuracy), and a significant drop beyond ``max_drop`` is a regression too.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from robustest.core.errors import ConfigError
from robustest.suite.build import evaluate_outcomes
from robustest.suite.format import Suite, model_fingerprint
from robustest.suite.stats import Difference, Estimate, outcome_estimates, paired_difference

__all__ = ["DEFAULT_ALPHA", "DEFAULT_MAX_DROP", "SuiteCheck", "check_suite", "load_suite"]

DEFAULT_ALPHA = 0.05
DEFAULT_MAX_DROP = 0.02


@dataclass
class SuiteCheck:
    """Outcome of :func:`check_suite`.

    ``robust``, ``clean``, ``corruption``: the candidate's stratified estimates (:class:`Estimate`; corruption
    None without corruption settings); ``baseline``: the baseline's; ``comparison`` / ``corruption_comparison``:
    :class:`Difference` baseline - candidate (None without a baseline); ``regression``: the verdict (None without
    a baseline); ``baseline_source``: "stored" (the suite's outcomes reused), "evaluated" or None; per sample
    (length K): ``outcomes`` and ``baseline_outcomes`` dicts of ``clean``, ``robust`` (bool [K]) and
    ``corruption`` (bool [K, S]). ``flags``: the candidate's evaluation flags (dicts; the evaluated baseline's
    follow with ``"model": "baseline"``), ``accepted_flags``: names accepted, ``blocking_flags``: the names of the
    unreliable flags not accepted; :attr:`failed` is True on a regression or a blocking flag. A suite with certified
    outcomes adds ``certified`` (the candidate's estimate), ``certified_comparison`` (baseline - candidate; ``b``:
    certificates lost) and ``certified_regression``; ``outcomes`` then hold ``certified`` (bool [K]) too.
    """

    robust: Estimate
    clean: Estimate
    corruption: Estimate | None
    baseline: dict[str, Estimate] | None
    comparison: Difference | None
    corruption_comparison: Difference | None
    regression: bool | None
    alpha: float
    max_drop: float
    version: str
    baseline_source: str | None
    outcomes: dict[str, torch.Tensor]
    baseline_outcomes: dict[str, torch.Tensor] | None
    timings: dict[str, float] = field(default_factory=dict)
    flags: list[dict[str, Any]] = field(default_factory=list)
    accepted_flags: tuple[str, ...] = ()
    certified: Estimate | None = None
    certified_comparison: Difference | None = None
    certified_regression: bool | None = None

    @property
    def blocking_flags(self) -> list[str]:
        """Names of the unreliable flags not accepted (in order, each once)."""
        names = [f["name"] for f in self.flags if f["severity"] == "unreliable" and f["name"] not in
                 self.accepted_flags]
        return list(dict.fromkeys(names))

    @property
    def failed(self) -> bool:
        """The gate fails: a regression (of robust or certified accuracy), or a flag that makes an evaluation
        unreliable."""
        return bool(self.regression) or bool(self.certified_regression) or bool(self.blocking_flags)

    def gate_lines(self) -> list[str]:
        """What the gate says beside its verdict, one line each: every flag (the baseline's marked), then, when the
        gate fails, why: a blocking flag without a regression, or each significant drop beyond ``max_drop``."""
        lines = [f"{'baseline ' if f.get('model') == 'baseline' else ''}flag {f['severity']} {f['name']}: "
                 f"{f['message']} (remedy: {f['remedy']})" for f in self.flags]
        if self.blocking_flags and not (self.regression or self.certified_regression):
            lines.append(f"gate failed: the evaluation is flagged unreliable ({', '.join(self.blocking_flags)}); fix "
                         "the cause, or accept with --accept-flag NAME")
        if self.regression and self.comparison is not None:
            c = self.comparison
            lines.append(f"robust accuracy dropped by {100 * c.drop:.1f} points (McNemar p = {c.p_value:.3g} < "
                         f"{self.alpha:g}, more than --max-drop {100 * self.max_drop:.1f} points): regression")
        if self.certified_regression and self.certified_comparison is not None:
            c = self.certified_comparison
            lines.append(f"{c.b} samples certified by the baseline lost their certificate; certified accuracy dropped "
                         f"by {100 * c.drop:.1f} points (McNemar p = {c.p_value:.3g} < {self.alpha:g}, more than "
                         f"--max-drop {100 * self.max_drop:.1f} points): regression")
        return lines

    def __repr__(self) -> str:
        r = self.robust
        text = (f"SuiteCheck(robust {100 * r.value:.1f}% [{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}], "
                f"version={self.version!r}")
        if self.comparison is not None:
            c = self.comparison
            text += (f", drop {100 * c.drop:+.1f} points [{100 * c.ci_low:+.1f}, {100 * c.ci_high:+.1f}], "
                     f"McNemar p={c.p_value:.3g}, {'REGRESSION' if self.regression else 'pass'}")
        return text + ")"

    @property
    def verdict(self) -> str:
        """"regression" (robust or certified accuracy), "unreliable" (an unaccepted unreliable flag), "pass" or
        "no baseline"."""
        if self.regression or self.certified_regression:
            return "regression"
        if self.blocking_flags:
            return "unreliable"
        return "no baseline" if self.regression is None else "pass"

    def message(self) -> str:
        """The verdict in words (one paragraph)."""
        r = self.robust
        est = (f"robust accuracy {100 * r.value:.1f}% (95% interval {100 * r.ci_low:.1f}-{100 * r.ci_high:.1f}%) on "
               f"{len(self.outcomes['robust'])} suite samples")
        flagged = ""
        if self.blocking_flags:
            flagged = (f"; UNRELIABLE: the evaluation is flagged {', '.join(self.blocking_flags)} (accept with "
                       "--accept-flag NAME / accept_flags=)")
        if self.comparison is None:
            return est + "; no baseline to compare with" + self._certified_message() + flagged
        c = self.comparison
        b = self.baseline["robust_accuracy"].value if self.baseline else float("nan")
        head = "REGRESSION" if self.regression else "no regression"
        why = (f"the drop is significant (exact McNemar p = {c.p_value:.3g} < alpha {self.alpha:g}) and larger than "
               f"max_drop {100 * self.max_drop:.1f} points" if self.regression else
               (f"McNemar p = {c.p_value:.3g} is not below alpha {self.alpha:g}" if c.p_value >= self.alpha else
                f"the drop is significant (p = {c.p_value:.3g}) but not larger than max_drop "
                f"{100 * self.max_drop:.1f} points"))
        return (f"{head}: {est}, baseline {100 * b:.1f}%; drop {100 * c.drop:+.1f} points (interval "
                f"{100 * c.ci_low:+.1f} to {100 * c.ci_high:+.1f}); {c.b} samples broken only by the candidate, "
                f"{c.c} only by the baseline; {why}{self._certified_message()}{flagged}")

    def _certified_message(self) -> str:
        """The certified outcomes' part of :meth:`message` ("" for a suite without them)."""
        if self.certified is None:
            return ""
        text = f"; certified accuracy {100 * self.certified.value:.1f}%"
        c = self.certified_comparison
        if c is None:
            return text
        b = self.baseline["certified_accuracy"].value if self.baseline else float("nan")
        head = "CERTIFIED REGRESSION" if self.certified_regression else "no certified regression"
        return (f"; {head}: {text[2:]}, baseline {100 * b:.1f}%; {c.b} samples certified by the baseline lost "
                f"their certificate, {c.c} gained one (drop {100 * c.drop:+.1f} points, McNemar p = "
                f"{c.p_value:.3g})")

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready results (estimates, comparison, verdict)."""
        d: dict[str, Any] = {
            "estimate": self.robust.to_dict() | {"robust_accuracy": self.robust.value},
            "clean": self.clean.to_dict(),
            "verdict": self.verdict, "regression": self.regression, "alpha": self.alpha, "max_drop": self.max_drop,
            "attack_version": self.version, "baseline_source": self.baseline_source,
            "flags": list(self.flags), "accepted_flags": list(self.accepted_flags),
            "blocking_flags": self.blocking_flags, "failed": self.failed,
        }
        if self.corruption is not None:
            d["corruption"] = self.corruption.to_dict() | {"corruption_accuracy": self.corruption.value}
        if self.certified is not None:
            d["certified"] = self.certified.to_dict() | {"certified_accuracy": self.certified.value}
            d["certified_regression"] = self.certified_regression
        if self.certified_comparison is not None:
            d["certified_comparison"] = self.certified_comparison.to_dict()
            d["lost_certificates"] = self.certified_comparison.b
        if self.baseline is not None:
            d["baseline"] = {k: v.to_dict() for k, v in self.baseline.items()}
        if self.comparison is not None:
            d["comparison"] = self.comparison.to_dict()
        if self.corruption_comparison is not None:
            d["corruption_comparison"] = self.corruption_comparison.to_dict()
        return d


def regressed(comparison: Difference, alpha: float, max_drop: float) -> bool:
    """The verdict rule: a regression when the one-sided exact McNemar p-value (H1: the candidate is worse) is
    below ``alpha`` AND the drop is larger than ``max_drop``; a drop of exactly ``max_drop`` passes."""
    return bool(comparison.p_value < alpha and comparison.drop > max_drop)


def load_suite(suite: Suite | str | os.PathLike[str]) -> Suite:
    """A :class:`Suite` as given, or read from a file."""
    return suite if isinstance(suite, Suite) else Suite.load(suite)


def _check_takes(model: nn.Module, role: str, x: torch.Tensor, y: torch.Tensor) -> None:
    """One line when ``model`` cannot run on the suite's images (or its classes do not cover the labels)."""
    from robustest.core.modelchecks import check_model_fits

    shape = "x".join(str(int(d)) for d in x.shape[1:])
    try:
        check_model_fits(model, (x, y))  # one forward pass of one blank image, and the labels
    except ConfigError as exc:
        if exc.__cause__ is None:  # not a failed forward pass: the check's own line (channels, classes)
            raise ConfigError(f"the {role} model does not fit the suite: {exc}") from exc
        detail = " ".join(str(exc.__cause__).split())[:160]
        raise ConfigError(f"the {role} model's input shape does not match the suite's {shape} images ({detail}): "
                          f"give a {role} model for {shape} images, such as the one the suite was built with"
                          ) from exc


def check_suite(candidate: nn.Module, suite: Suite | str | os.PathLike[str], baseline: nn.Module | bool | None = None,
                *, alpha: float = DEFAULT_ALPHA, max_drop: float = DEFAULT_MAX_DROP, version: str | None = None,
                level: float = 0.95, progress: bool = False, accept_flags: Any = ()) -> SuiteCheck:
    """Check ``candidate`` on ``suite`` (a :class:`Suite` or its file).

    ``baseline``: None compares with the outcomes stored in the suite (its own baseline); a model is evaluated on
    the suite's samples unless its state_dict fingerprint equals the suite's baseline and the attack version is
    the stored one (then the stored outcomes are reused); False: no comparison, only the estimate. ``version``:
    "standard" or "fast" (default: the suite's); another version than the stored one needs a baseline model.
    ``alpha`` (0 < alpha < 1) and ``max_drop`` (in [0, 1], accuracy as a fraction) define the verdict (module
    docstring); ``level``: the confidence level of the intervals; ``accept_flags``: names of unreliable flags the gate
    accepts (:data:`robustest.evaluate.FLAGS`).
    """
    from robustest.evaluate.flags import check_accepted

    t0 = time.perf_counter()
    accepted = check_accepted(accept_flags)
    suite = load_suite(suite)
    for name, v, lo, hi in (("alpha", alpha, 0.0, 1.0), ("level", level, 0.0, 1.0)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo < v < hi:
            raise ConfigError(f"{name} must lie in (0, 1), got {v!r}")
    if isinstance(max_drop, bool) or not isinstance(max_drop, (int, float)) or not 0 <= max_drop <= 1:
        raise ConfigError(f"max_drop must be an accuracy difference in [0, 1], got {max_drop!r}")
    if not isinstance(candidate, nn.Module):
        raise ConfigError(f"candidate must be a torch.nn.Module, got {type(candidate).__name__}")
    stored = dict(suite.meta["attack"])
    version = stored["version"] if version is None else str(version)
    if version not in ("standard", "fast"):
        raise ConfigError(f"version must be 'standard' or 'fast', got {version!r}")
    attack = {**stored, "version": version}
    same_attack = version == stored["version"]
    if baseline is True:
        baseline = None
    if baseline is None and not same_attack:
        raise ConfigError(f"the suite's baseline outcomes were measured with version {stored['version']!r}: pass the "
                          f"baseline model to evaluate it with {version!r} too (or no baseline)")
    if baseline is not None and baseline is not False and not isinstance(baseline, nn.Module):
        raise ConfigError(f"baseline must be a torch.nn.Module, None or False, got {type(baseline).__name__}")
    x, y = suite.images(), suite.y.long()
    if isinstance(baseline, nn.Module):
        _check_takes(baseline, "baseline", x, y)
    certify = suite.meta.get("certify")
    if certify is not None:  # a model the bounds do not cover: refused before any attack
        from robustest.evaluate.certification import check_method

        for m in (candidate, baseline if isinstance(baseline, nn.Module) else None):
            if m is not None:
                check_method(m, tuple(x.shape[1:]), certify["method"], stored["norm"])
    from robustest.core.devices import resolve_device

    x = x.to(resolve_device(candidate))
    y = y.to(x.device)
    timings: dict[str, float] = {}
    out = evaluate_outcomes(candidate, x, y, attack, suite.meta["corruption"], progress=progress, certify=certify)
    flags_seen = list(out.get("flags", []))
    timings.update({f"candidate_{k}": v for k, v in out["seconds"].items()})
    stored_out = {"clean": suite.clean.bool(), "robust": suite.robust.bool(), "corruption": suite.corruption.bool(),
                  "certified": None if suite.certified is None else suite.certified.bool()}
    base_out: dict[str, torch.Tensor] | None = None
    source = None
    if baseline is None:
        base_out, source = stored_out, "stored"
    elif baseline is not False:
        if same_attack and model_fingerprint(baseline) == suite.meta["baseline_sha256"]:
            base_out, source = stored_out, "stored"
        else:
            t1 = time.perf_counter()
            b = evaluate_outcomes(baseline, x.to(resolve_device(baseline)), y.to(resolve_device(baseline)), attack,
                                  suite.meta["corruption"], progress=progress, certify=certify)
            base_out, source = b, "evaluated"
            flags_seen = [*out.get("flags", []), *({**f, "model": "baseline"} for f in b.get("flags", []))]
            timings["baseline_s"] = time.perf_counter() - t1
    est = outcome_estimates(out, suite.stratum, suite.sizes, level)
    base_est = outcome_estimates(base_out, suite.stratum, suite.sizes, level) if base_out is not None else None
    comparison = corr_cmp = None
    regression = None
    if base_out is not None:
        comparison = paired_difference(base_out["robust"], out["robust"], suite.stratum, suite.sizes, level)
        if out["corruption"].shape[1]:
            corr_cmp = paired_difference(base_out["corruption"].double().mean(1), out["corruption"].double().mean(1),
                                         suite.stratum, suite.sizes, level)
        regression = regressed(comparison, alpha, max_drop)
    cert_cmp, cert_regression = None, None
    if base_out is not None and out.get("certified") is not None:
        cert_cmp = paired_difference(base_out["certified"], out["certified"], suite.stratum, suite.sizes, level)
        cert_regression = regressed(cert_cmp, alpha, max_drop)
    timings["total_s"] = time.perf_counter() - t0
    keys = ("clean", "robust", "corruption", *(("certified",) if certify is not None else ()))
    return SuiteCheck(robust=est["robust_accuracy"], clean=est["clean_accuracy"],
                      corruption=est.get("corruption_accuracy"), baseline=base_est, comparison=comparison,
                      corruption_comparison=corr_cmp, regression=regression, alpha=float(alpha),
                      max_drop=float(max_drop), version=version, baseline_source=source,
                      outcomes={k: out[k] for k in keys},
                      baseline_outcomes=None if base_out is None else {k: base_out[k] for k in keys},
                      timings=timings, flags=flags_seen, accepted_flags=accepted,
                      certified=est.get("certified_accuracy"), certified_comparison=cert_cmp,
                      certified_regression=cert_regression)
