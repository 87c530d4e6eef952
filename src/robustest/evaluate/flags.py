"""Flags: what an evaluation found that may make its robust accuracy an over-estimate.

A :class:`Flag` is raised by the checks of :func:`robustest.evaluate.evaluate` (randomised or dynamic models,
probability or saturated outputs, zero or missing input gradients, a gradient-free attack breaking what the
gradient attacks left robust, unstable predictions). Each has a ``severity``:

* ``info``: noted, the figure is not in doubt (e.g. zero gradients on samples that were broken anyway);
* ``warning``: something was off and robustest acted on it (e.g. it attacked the log-probabilities of a model that
  returns probabilities, or chose the ``rand`` version for a randomised model);
* ``unreliable``: the robust accuracy may be far above the truth. Every gate (``eval --fail-under``,
  ``suite check``, :func:`robustest.testing.assert_robust`, :func:`robustest.testing.assert_no_regression`) fails on
  such a flag unless the user accepts it by name; ``unsound-certificate`` (a sample both certified and broken, from
  ``eval --certify``) cannot be accepted.

:data:`FLAGS` is the catalogue (name -> what it means); docs/EVAL.md gives each flag's threshold and remedy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from robustest.core.errors import ConfigError

__all__ = ["FLAGS", "NEVER_ACCEPTED", "SEVERITIES", "Flag", "blocking", "check_accepted", "flag_lines"]

SEVERITIES = ("info", "warning", "unreliable")

#: every flag an evaluation can raise -> what it means
FLAGS = {
    "randomised": "repeated forward passes of the same images give different outputs",
    "dynamic-defence": "the forward pass changes the model's parameters or buffers, or runs autograd itself",
    "probability-output": "the model returns probabilities (rows in [0, 1] summing to 1), not logits",
    "saturated-logits": "logit margins so large that cross-entropy gradients underflow to zero in float32",
    "no-gradient-path": "the model's output has no gradient path to its input",
    "zero-gradient": "the input gradient of the model's margin is exactly zero",
    "non-finite-gradient": "the input gradient of the model's margin is NaN or infinite",
    "gradient-free-breaks": "a gradient-free attack (Square) or a transfer broke samples the gradient attacks left "
                            "robust",
    "unstable-predictions": "repeated forward passes of an image disagree on its class",
    "incomplete-optimisation": "the attack's loss was still rising at its last steps, and a longer run broke more",
    "unsound-certificate": "a sample is both certified and broken by a checked adversarial point (eval --certify): "
                           "the certificate or the evaluation is wrong",
}
#: flags no gate accepts: they say a figure is wrong, not merely in doubt
NEVER_ACCEPTED = ("unsound-certificate",)


@dataclass(frozen=True)
class Flag:
    """One finding of an evaluation's checks.

    ``name``: a key of :data:`FLAGS`; ``severity``: ``info``, ``warning`` or ``unreliable``; ``samples``: the data
    indices concerned (empty when the finding is about the model as a whole); ``message``: one sentence of what was
    measured; ``remedy``: what to do about it.
    """

    name: str
    severity: str
    message: str
    remedy: str
    samples: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.name not in FLAGS:
            raise ValueError(f"unknown flag {self.name!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: name, severity, message, remedy, the number of samples and their indices."""
        return {"name": self.name, "severity": self.severity, "message": self.message, "remedy": self.remedy,
                "num_samples": len(self.samples), "samples": list(self.samples)}

    def line(self) -> str:
        """One line for stderr: ``severity name: message (remedy)``."""
        return f"{self.severity} {self.name}: {self.message} (remedy: {self.remedy})"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Flag:
        return cls(str(d["name"]), str(d["severity"]), str(d["message"]), str(d["remedy"]),
                   tuple(int(i) for i in d.get("samples", ())))


def check_accepted(names: Any) -> tuple[str, ...]:
    """The flag names a user accepts (a comma-separated string or an iterable of names), checked against
    :data:`FLAGS`; a one-line ConfigError names an unknown one and lists the known."""
    if names is None:
        return ()
    if isinstance(names, str):
        names = [n for n in names.split(",") if n.strip()]
    out = []
    for n in names:
        key = str(n).strip().lower().replace("_", "-")
        if key not in FLAGS:
            raise ConfigError(f"unknown flag {n!r} to accept: use one of {', '.join(FLAGS)}")
        if key in NEVER_ACCEPTED:
            raise ConfigError(f"the flag {key} cannot be accepted: it says a figure is wrong (a sample both certified "
                              "and broken), not merely in doubt")
        out.append(key)
    return tuple(dict.fromkeys(out))


def blocking(flags: Iterable[Flag], accepted: Iterable[str] = ()) -> list[Flag]:
    """The flags of severity ``unreliable`` not accepted by name: a gate fails while any is left."""
    acc = set(accepted)
    return [f for f in flags if f.severity == "unreliable" and f.name not in acc]


def flag_lines(flags: Iterable[Flag], prefix: str = "robustest") -> list[str]:
    """One stderr line per flag, ``PREFIX: flag SEVERITY NAME: message (remedy: ...)``."""
    return [f"{prefix}: flag {f.line()}" for f in flags]
