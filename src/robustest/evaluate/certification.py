"""Certified robustness beside the attacks: :func:`run_certify`, the certificate of every sample of a data set
(behind ``robustest certify``), and the **bracket** (:func:`bracket`, :func:`bracket_eval`; behind
``robustest eval --certify``), which puts a certificate and an evaluation's attacks side by side.

In a bracket every sample is exactly one of

* ``certified``: the certificate proves that no point of the ball changes the prediction away from the label;
* ``broken``: misclassified clean, or an adversarial point of the attacks *checked here*: the model, run again on
  it, misclassifies it, and the point lies in the ball (within ``eps * 1e-6 + 1e-6``, the evaluation's
  tolerance) and in [0, 1];
* ``undecided``: neither; its true outcome lies between the two bounds;

so ``certified share <= robust accuracy <= clean accuracy``. A sample both certified and broken contradicts the
certificate: a **soundness error** (a bug in the bounds, or a model whose outputs change between calls). It is
labelled ``unsound`` and counted apart, logged as an error, and raised as the flag ``unsound-certificate``
(severity ``unreliable``), which no gate accepts.

Randomised smoothing certifies the *smoothed* classifier (the majority vote under Gaussian noise), not the model
the attacks ran on: a sample certified for one and broken for the other contradicts nothing, so the bracket takes
bound-propagation certificates only (``ibp``, ``crown``). :func:`run_certify` takes all three methods.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from robustest import certify
from robustest.attacks import BATCH_SEED_STRIDE, lp_norm
from robustest.certify import Certificate, SmoothCertificate
from robustest.core.batching import DataLike, image_shape, iter_batches, num_samples, take
from robustest.core.devices import model_device
from robustest.core.errors import ConfigError, DataError
from robustest.core.inputs import check_images, check_labels
from robustest.core.modelcall import eval_mode, forward
from robustest.core.options import spec
from robustest.core.progress import progress as _progress
from robustest.core.reprs import one_line
from robustest.core.stats import describe
from robustest.core.validation import check_choice, check_eps, check_float, check_int, check_seed
from robustest.evaluate.flags import Flag
from robustest.evaluate.runner import judge

__all__ = ["BRACKET_METHODS", "CERTIFY_OPTIONS", "DEFAULT_BATCH", "LABELS", "METHODS", "NOT_COMPARABLE",
           "SMOOTHING_DEFAULTS", "Bracket", "CertifyResult", "bracket", "bracket_eval", "certified_outcomes",
           "check_method", "checked_breaks", "run_certify"]

METHODS = ("ibp", "crown", "smoothing")
#: the certificates a bracket takes: they are about the model itself
BRACKET_METHODS = ("ibp", "crown")
#: a bracket's per-sample labels
LABELS = ("certified", "undecided", "broken", "unsound")
#: images per bound-propagation batch (ibp, crown) or noisy images per forward pass (smoothing), by default
DEFAULT_BATCH = {"ibp": 256, "crown": 64, "smoothing": 1000}
#: Cohen et al.'s settings: selection draws, estimation draws, the confidence level's complement
SMOOTHING_DEFAULTS = {"n0": 100, "n": 100_000, "alpha": 0.001}
#: why a bracket refuses a smoothing certificate
NOT_COMPARABLE = ("randomised smoothing certifies the smoothed classifier (the majority vote of the model under "
                  "Gaussian noise), not the model the attacks ran on, so certified and broken samples would belong "
                  "to two classifiers: bracket with ibp or crown, and run 'robustest certify --method smoothing' "
                  "for the smoothed classifier's certified accuracy")
_TOLERANCE = (1e-6, 1e-6)  # a checked point may lie eps * 1e-6 + 1e-6 outside the ball: the evaluation's own slack

log = logging.getLogger("robustest.evaluate")


# ------------------------------------------------------------------------------------------------ checks
def check_method(model: nn.Module, input_shape: tuple[int, ...], method: str, norm: str = "linf") -> str:
    """The checked ``method`` (ibp, crown, smoothing) for ``model`` on images of ``input_shape`` (C x H x W), before
    any work: a one-line ConfigError naming the unsupported layer (bound propagation) or asking for the L2 norm
    (smoothing certifies an L2 radius)."""
    method = str(check_choice("method", str(method).lower(), METHODS))
    if method == "smoothing":
        if norm != "l2":
            raise ConfigError(f"randomised smoothing certifies an L2 radius: use norm l2 (--norm l2), not {norm}")
        return method
    with eval_mode(model):  # tracing runs one forward: BatchNorm's running statistics stay as they are
        certify.check_certifiable(model, tuple(input_shape))
    return method


def _smoothing_settings(method: str, sigma: Any, n0: Any, n: Any, alpha: Any) -> dict[str, Any]:
    """Smoothing's checked settings ({} for bound propagation, which takes none of them)."""
    given = {k: v for k, v in (("sigma", sigma), ("n0", n0), ("n", n), ("alpha", alpha)) if v is not None}
    if method != "smoothing":
        if given:
            raise ConfigError(f"{', '.join(given)} apply to method smoothing only, not {method}")
        return {}
    if sigma is None:
        raise ConfigError("method smoothing needs sigma, the noise's standard deviation in pixel scale (--sigma)")
    out = {"sigma": float(check_float("sigma", sigma, 0.0, lo_open=True)),
           "n0": int(check_int("n0", SMOOTHING_DEFAULTS["n0"] if n0 is None else n0, 1)),
           "n": int(check_int("n", SMOOTHING_DEFAULTS["n"] if n is None else n, 1)),
           "alpha": float(check_float("alpha", SMOOTHING_DEFAULTS["alpha"] if alpha is None else alpha, 0.0, 1.0,
                                      lo_open=True, hi_open=True))}
    if not math.isfinite(out["sigma"]):
        raise ConfigError(f"sigma must be a finite number, got {sigma!r}")
    return out


# ------------------------------------------------------------------------------------------------ certify
@dataclass
class CertifyResult:
    """Outcome of :func:`run_certify` on N samples (per-sample tensors 1-D, length N, CPU, in data order).

    ``index`` (positions in the data set), ``y``, ``clean_pred`` (the model's prediction on the clean image),
    ``certified`` (bool): bound propagation proved the ball, or (smoothing) the smoothed classifier predicts the
    label with a certified L2 radius >= ``eps``. Bound propagation: ``lower_margin``, the lower bound of
    ``min_{j != y} z_y - z_j`` over the ball (> 0 means certified). Smoothing: ``prediction`` (the smoothed
    classifier's class, -1 where it abstains), ``radius`` (certified L2 radius, 0 where it abstains) and
    ``p_lower``. ``settings`` (what ran), ``timings`` (seconds).
    """

    method: str
    eps: float
    norm: str
    index: torch.Tensor
    y: torch.Tensor
    clean_pred: torch.Tensor
    certified: torch.Tensor
    lower_margin: torch.Tensor | None = None
    prediction: torch.Tensor | None = None
    radius: torch.Tensor | None = None
    p_lower: torch.Tensor | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])

    @property
    def clean_correct(self) -> torch.Tensor:
        return self.clean_pred == self.y

    @property
    def clean_accuracy(self) -> float:
        """The model's accuracy on the clean images."""
        return float(self.clean_correct.double().mean()) if self.num_samples else 0.0

    @property
    def certified_accuracy(self) -> float:
        """The share of samples certified (for smoothing: correct and certified at radius ``eps``)."""
        return float(self.certified.double().mean()) if self.num_samples else 0.0

    def __repr__(self) -> str:
        return one_line(self, method=self.method, norm=self.norm, eps=self.eps, n=self.num_samples,
                        clean_accuracy=self.clean_accuracy, certified_accuracy=self.certified_accuracy)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per sample: index, label, clean_pred, clean_correct, certified, then lower_margin (bound
        propagation) or smoothed_pred, radius, p_lower (smoothing)."""
        cols = zip(self.index.tolist(), self.y.tolist(), self.clean_pred.tolist(), self.certified.tolist())
        rows = [{"index": i, "label": y, "clean_pred": p, "clean_correct": int(p == y), "certified": int(c)}
                for i, y, p, c in cols]
        if self.lower_margin is not None:
            for row, m in zip(rows, self.lower_margin.tolist()):
                row["lower_margin"] = m
        if self.prediction is not None and self.radius is not None and self.p_lower is not None:
            for row, p, r, pl in zip(rows, self.prediction.tolist(), self.radius.tolist(), self.p_lower.tolist()):
                row.update(smoothed_pred=p, radius=r, p_lower=pl)
        return rows

    def to_results(self) -> dict[str, Any]:
        """The results of ``robustest certify`` (docs/CERTIFY.md), without the results header and the model and
        data description the CLI adds; JSON-ready."""
        n, cert, correct = self.num_samples, int(self.certified.sum()), int(self.clean_correct.sum())
        out: dict[str, Any] = {
            "method": self.method, "norm": self.norm, "eps": self.eps, "num_samples": n,
            "certified_accuracy": self.certified_accuracy, "clean_accuracy": self.clean_accuracy,
            "counts": {"certified": cert, "not_certified": n - cert, "clean_correct": correct,
                       "misclassified_clean": n - correct},
        }
        if self.lower_margin is not None:
            out["lower_margin"] = _quantiles(self.lower_margin)
        if self.prediction is not None and self.radius is not None:
            smoothed = self.prediction == self.y
            out["smoothing"] = {**{k: self.settings[k] for k in ("sigma", "n0", "n", "alpha")},
                                "smoothed_accuracy": float(smoothed.double().mean()) if n else 0.0,
                                "abstained": int((self.prediction == certify.ABSTAIN).sum()),
                                "radius": _quantiles(self.radius[smoothed])}
        return out


def _quantiles(t: torch.Tensor) -> dict[str, float]:
    return describe(t, ("mean", "median", "min", "max")) if t.numel() else {}


def run_certify(model: nn.Module, data: DataLike, eps: float, *, norm: str = "linf", method: str = "crown",
                sigma: float | None = None, n0: int | None = None, n: int | None = None, alpha: float | None = None,
                seed: int = 0, batch_size: int | None = None, block_size: int = 4096,
                progress: bool = False) -> CertifyResult:
    """The certificate of every sample of labelled ``data`` (images N x C x H x W in [0, 1], int64 labels) at radius
    ``eps`` (pixel scale) of the ``norm`` ball.

    ``method``: ``ibp`` or ``crown`` (bound propagation: the model itself is certified on the L-inf ball clipped to
    [0, 1] or the L2 ball; an unsupported layer is refused with one line before any work) or ``smoothing``
    (randomised smoothing, ``norm`` must be ``l2``: the smoothed classifier of noise ``sigma`` is certified where it
    predicts the label with a certified L2 radius >= ``eps``; ``n0`` selection and ``n`` estimation draws, level
    ``1 - alpha``; defaults :data:`SMOOTHING_DEFAULTS`). ``batch_size``: images per bound-propagation batch or noisy
    images per forward pass (default :data:`DEFAULT_BATCH`). The data are read in blocks of ``block_size`` images;
    smoothing draws block b's noise from ``seed + b * BATCH_SEED_STRIDE``. The model runs in eval mode, restored
    afterwards.
    """
    t0 = time.perf_counter()
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    norm = str(check_choice("norm", norm, ("linf", "l2")))
    eps = float(check_eps("eps", eps, norm))
    method = str(check_choice("method", str(method).lower(), METHODS))
    smooth = _smoothing_settings(method, sigma, n0, n, alpha)
    seed = int(check_seed("seed", seed))
    batch = DEFAULT_BATCH[method] if batch_size is None else int(check_int("batch_size", batch_size, 1))
    block = int(check_int("block_size", block_size, 1))
    total = num_samples(data)
    if total == 0:
        raise DataError("the data set is empty: check the split and the path")
    check_method(model, image_shape(data), method, norm)
    device = model_device(model)
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("index", "y", "clean_pred", "certified", "lower_margin",
                                                             "prediction", "radius", "p_lower")}
    t_clean = t_cert = 0.0
    blocks = iter_batches(data, block, device, with_index=True)
    for b, (idx, xb, yb) in enumerate(_progress(blocks, enabled=progress, desc="certify", unit="block",
                                                total=-(-total // block))):
        if yb is None:
            raise DataError("certify needs labels: pass (x, y) or a labelled data set")
        t1 = time.perf_counter()
        xb = check_images(xb).float()
        with eval_mode(model), torch.no_grad():
            logits = torch.cat([forward(model, xb[s:s + batch]).float() for s in range(0, xb.shape[0], batch)])
        yb = check_labels(yb, xb.shape[0], int(logits.shape[1])).long()
        t2 = time.perf_counter()
        t_clean += t2 - t1
        parts["index"].append(idx.long().cpu())
        parts["y"].append(yb.cpu())
        parts["clean_pred"].append(logits.argmax(1).cpu())
        if method == "smoothing":
            sc = certify.smooth_certify(model, xb, sigma=smooth["sigma"], n0=smooth["n0"], n=smooth["n"],
                                        alpha=smooth["alpha"], batch_size=batch,
                                        seed=(seed + b * BATCH_SEED_STRIDE) % 2**63)
            parts["certified"].append((sc.prediction == yb.cpu()) & (sc.radius >= eps))
            parts["prediction"].append(sc.prediction)
            parts["radius"].append(sc.radius)
            parts["p_lower"].append(sc.p_lower)
        else:
            cert = getattr(certify, method)(model, xb, yb, eps, norm, batch_size=batch)
            parts["certified"].append(cert.certified.cpu())
            parts["lower_margin"].append(cert.lower_margin.cpu())
        t_cert += time.perf_counter() - t2
    cat = {k: torch.cat(v) if v else None for k, v in parts.items()}
    settings = {"method": method, "norm": norm, "eps": eps, "seed": seed, "batch_size": batch, "block_size": block,
                "device": str(device), **smooth}
    timings = {"clean_s": t_clean, "certify_s": t_cert, "total_s": time.perf_counter() - t0}
    return CertifyResult(method=method, eps=eps, norm=norm, index=cat["index"], y=cat["y"],
                         clean_pred=cat["clean_pred"], certified=cat["certified"].bool(),
                         lower_margin=cat["lower_margin"], prediction=cat["prediction"], radius=cat["radius"],
                         p_lower=cat["p_lower"], settings=settings, timings=timings)


#: the command line of run_certify's options (``robustest certify``; defaults: the signature's)
CERTIFY_OPTIONS = {
    "norm": spec("choice", "the ball", choices=("linf", "l2")),
    "method": spec("choice", "ibp (fast, loose), crown (tighter) or smoothing (the smoothed classifier, --norm l2)",
                   choices=METHODS),
    "sigma": spec("positive", "standard deviation of the Gaussian noise, pixel scale (required with smoothing)",
                  metavar="S"),
    "n0": spec("positive-int", "noise samples that select the class", metavar="N0",
               shown=str(SMOOTHING_DEFAULTS["n0"])),
    "n": spec("positive-int", "noise samples that estimate its probability (Cohen et al.'s n)", metavar="N",
              flag="n-samples", shown=str(SMOOTHING_DEFAULTS["n"])),
    "alpha": spec("significance", "the certificate holds with probability 1 - A", metavar="A",
                  shown=str(SMOOTHING_DEFAULTS["alpha"])),
    "batch_size": spec("positive-int", "images per bound-propagation batch or noisy images per forward pass",
                       metavar="B", shown=", ".join(f"{v} {k}" for k, v in DEFAULT_BATCH.items())),
    "block_size": spec("positive-int", "images read and certified per block", metavar="N"),
}


def certified_outcomes(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, norm: str, method: str,
                       batch_size: int | None = None) -> torch.Tensor:
    """bool [N] on the CPU: which images of ``x`` (N x C x H x W in [0, 1], labels ``y``) a bound-propagation
    ``method`` (ibp, crown) certifies at ``eps`` on the ``norm`` ball (a suite's stored certified outcomes)."""
    method = str(check_choice("method", method, BRACKET_METHODS))
    return getattr(certify, method)(model, x, y, eps, norm, batch_size=batch_size).certified.bool().cpu()


# ------------------------------------------------------------------------------------------------ bracket
@dataclass
class Bracket:
    """Certificate and attacks side by side on N samples (tensors 1-D, length N, CPU, in data order): ``index``,
    ``certified`` (the certificate), ``broken`` (a clean error or a checked adversarial point), ``clean_correct``,
    the ball (``method``, ``eps``, ``norm``), ``lower_margin`` (the certificate's, when known) and
    ``unverified`` (samples the evaluation counted broken whose point did not pass the check; they are
    undecided here). :attr:`labels` names each sample (:data:`LABELS`); :attr:`sound` is False when a sample is
    both certified and broken, and :meth:`flag` is then the ``unsound-certificate`` flag.
    """

    index: torch.Tensor
    certified: torch.Tensor
    broken: torch.Tensor
    clean_correct: torch.Tensor
    method: str = ""
    eps: float = 0.0
    norm: str = "linf"
    lower_margin: torch.Tensor | None = None
    unverified: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_outcomes(cls, certified: Any, broken: Any, clean_correct: Any, *, index: Any = None,
                      **ball: Any) -> Bracket:
        """A bracket of given per-sample outcomes (bool [N] each; a clean error counts as broken whatever
        ``broken`` says); ``index`` defaults to 0..N-1; ``ball``: method, eps, norm, lower_margin, unverified."""
        cert, brk, ok = (torch.as_tensor(t, dtype=torch.bool).flatten().cpu() for t in (certified, broken,
                                                                                         clean_correct))
        n = int(cert.numel())
        if brk.numel() != n or ok.numel() != n:
            raise ConfigError(f"certified, broken and clean_correct need one value per sample: {n}, {brk.numel()}, "
                              f"{ok.numel()}")
        idx = torch.arange(n) if index is None else torch.as_tensor(index, dtype=torch.long).flatten().cpu()
        if idx.numel() != n:
            raise ConfigError(f"index needs one value per sample ({n}), got {idx.numel()}")
        return cls(index=idx, certified=cert, broken=brk | ~ok, clean_correct=ok, **ball)

    @property
    def num_samples(self) -> int:
        return int(self.certified.numel())

    @property
    def unsound(self) -> torch.Tensor:
        """bool [N]: certified AND broken, a contradiction."""
        return self.certified & self.broken

    @property
    def sound(self) -> bool:
        return not bool(self.unsound.any())

    @property
    def labels(self) -> list[str]:
        """Per sample: ``certified``, ``undecided``, ``broken`` or ``unsound`` (certified and broken)."""
        code = torch.where(self.certified, 0, 1) + torch.where(self.broken, 2, 0)  # 0 cert, 1 undec, 3 brk, 2 both
        names = {0: "certified", 1: "undecided", 2: "unsound", 3: "broken"}
        return [names[c] for c in code.tolist()]

    def counts(self) -> dict[str, int]:
        """Samples per label, and the broken ones split into ``broken_by_attack`` (clean-correct) and
        ``misclassified`` (clean errors)."""
        cert, brk = self.certified, self.broken
        return {"certified": int((cert & ~brk).sum()), "undecided": int((~cert & ~brk).sum()),
                "broken": int((brk & ~cert).sum()), "unsound": int((cert & brk).sum()),
                "broken_by_attack": int((brk & ~cert & self.clean_correct).sum()),
                "misclassified": int((~self.clean_correct & ~cert).sum())}

    def shares(self) -> dict[str, float]:
        """:meth:`counts` as fractions of N (0.0 for N = 0)."""
        n = self.num_samples
        return {k: (v / n if n else 0.0) for k, v in self.counts().items()}

    @property
    def certified_accuracy(self) -> float:
        """The certified share (unsound samples excluded): a lower bound of the true robust accuracy."""
        return self.shares()["certified"]

    @property
    def robust_accuracy(self) -> float:
        """The share not broken (certified or undecided): an upper bound of the true robust accuracy."""
        s = self.shares()
        return s["certified"] + s["undecided"]

    @property
    def clean_accuracy(self) -> float:
        n = self.num_samples
        return float(self.clean_correct.sum()) / n if n else 0.0

    def flag(self) -> Flag | None:
        """The ``unsound-certificate`` flag when a sample is both certified and broken, else None."""
        bad = self.unsound
        if not bool(bad.any()):
            return None
        what = self.method.upper() or "the certificate"
        return Flag("unsound-certificate", "unreliable",
                    f"{int(bad.sum())} samples are certified by {what} ({self.norm} eps={self.eps:g}) AND broken by a "
                    "checked point inside the ball (or misclassified clean): the certificate or the model's "
                    "evaluation is wrong, so neither figure can be trusted",
                    "report it with the samples (samples.csv: bracket = unsound); check that the model is "
                    "deterministic", tuple(int(i) for i in self.index[bad].tolist()))

    def to_dict(self) -> dict[str, Any]:
        """The ``bracket`` section of ``robustest eval --certify``'s results.json (docs/RESULTS_SCHEMA.md)."""
        return {"method": self.method, "eps": self.eps, "norm": self.norm, "num_samples": self.num_samples,
                "counts": self.counts(), "shares": self.shares(), "certified_accuracy": self.certified_accuracy,
                "robust_accuracy": self.robust_accuracy, "clean_accuracy": self.clean_accuracy,
                "unverified_breaks": int(self.unverified), "sound": self.sound,
                "unsound_samples": [int(i) for i in self.index[self.unsound].tolist()]}

    def __repr__(self) -> str:
        c = self.counts()
        return one_line(self, method=self.method, norm=self.norm, eps=self.eps, n=self.num_samples,
                        certified=c["certified"], undecided=c["undecided"], broken=c["broken"], unsound=c["unsound"])


def checked_breaks(model: nn.Module, x: torch.Tensor, y: torch.Tensor, adv: torch.Tensor | None, eps: float,
                   norm: str = "linf", *, forwards: int = 1, batch_size: int = 256
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(broken, clean_correct)``, bool [N] each on the CPU, checked on the model itself: a sample is broken when
    it is misclassified clean, or when its adversarial point ``adv[i]`` (N x C x H x W; None: no attack) lies in
    [0, 1] and within ``eps`` of ``x[i]`` in ``norm`` (the evaluation's tolerance) and is misclassified. Each image
    is judged by the majority of ``forwards`` forward passes (:func:`robustest.evaluate.runner.judge`), in eval mode
    (restored), without gradients."""
    x = check_images(x).float()
    y = check_labels(y, x.shape[0]).long()
    if adv is not None and tuple(adv.shape) != tuple(x.shape):
        raise ConfigError(f"adv must have the images' shape {tuple(x.shape)}, got {tuple(adv.shape)}")
    norm = str(check_choice("norm", norm, ("linf", "l2")))
    batch = int(check_int("batch_size", batch_size, 1))
    device = model_device(model)
    tol = float(eps) * _TOLERANCE[0] + _TOLERANCE[1]
    broken, correct = [], []
    with eval_mode(model), torch.no_grad():
        for s in range(0, x.shape[0], batch):
            xb, yb = x[s:s + batch].to(device), y[s:s + batch].to(device)
            wrong = judge(model, xb, yb, forwards, batch)[1]
            hit = wrong.clone()
            if adv is not None:
                ab = adv[s:s + batch].to(device=device, dtype=xb.dtype)
                flat = ab.flatten(1)
                valid = (flat >= 0).all(1) & (flat <= 1).all(1) & (lp_norm(ab - xb, norm) <= float(eps) + tol)
                hit |= valid & judge(model, ab, yb, forwards, batch)[1]
            broken.append(hit.cpu())
            correct.append((~wrong).cpu())
    empty = torch.zeros(0, dtype=torch.bool)
    return (torch.cat(broken) if broken else empty), (torch.cat(correct) if correct else empty)


def bracket(model: nn.Module, x: torch.Tensor, y: torch.Tensor, certificate: Certificate,
            adv: torch.Tensor | None = None, *, index: Any = None, claimed_broken: torch.Tensor | None = None,
            forwards: int = 1, batch_size: int = 256) -> Bracket:
    """The bracket of a bound-propagation ``certificate`` (:func:`robustest.certify.ibp` / ``crown`` of ``x``, ``y``)
    and the attacks' points ``adv`` (N x C x H x W, the worst case found per sample: the clean image where none
    broke it; None: the clean errors only), each break checked by :func:`checked_breaks` on the certificate's ball.
    ``claimed_broken`` (bool [N]): what the evaluation counted broken, to count the breaks the check did not
    confirm. A sample both certified and broken is logged as an error and makes :attr:`Bracket.sound` False."""
    if isinstance(certificate, SmoothCertificate):
        raise ConfigError(NOT_COMPARABLE)
    if not isinstance(certificate, Certificate):
        raise ConfigError(f"certificate must be a robustest.certify.Certificate (ibp or crown), got "
                          f"{type(certificate).__name__}")
    cert = certificate.certified.bool().cpu()
    broken, correct = checked_breaks(model, x, y, adv, certificate.eps, certificate.norm, forwards=forwards,
                                     batch_size=batch_size)
    if cert.numel() != broken.numel():
        raise ConfigError(f"the certificate holds {cert.numel()} samples but x holds {broken.numel()}")
    unverified = 0
    if claimed_broken is not None:
        unverified = int((claimed_broken.bool().cpu() & correct & ~broken).sum())
    out = Bracket.from_outcomes(cert, broken, correct, index=index, method=certificate.method, eps=certificate.eps,
                                norm=certificate.norm, lower_margin=certificate.lower_margin.cpu(),
                                unverified=unverified)
    if not out.sound:
        flag = out.flag()
        log.error(f"SOUNDNESS ERROR: {flag.message if flag else ''}")
    return out


def bracket_eval(model: nn.Module, data: DataLike, result: Any, method: str, *,
                 batch_size: int | None = None) -> Bracket:
    """The bracket of an evaluation: the ``method`` (ibp or crown) certificate of the samples ``result``
    (:class:`robustest.evaluate.EvalResult` of ``model`` on ``data``, kept with ``keep_adv=True``) evaluated, at its
    radius (the largest of a curve) and norm, and its adversarial points checked (:func:`bracket`). A soundness
    error adds the ``unsound-certificate`` flag to ``result.flags``, so every gate reading them fails. Timings
    (``certify_s``, ``bracket_s``) are in :attr:`Bracket.timings`."""
    method = str(method).lower()
    if method == "smoothing":
        raise ConfigError(NOT_COMPARABLE)
    method = str(check_choice("method", method, BRACKET_METHODS))
    if result.adv is None:
        raise ConfigError("the bracket checks the evaluation's adversarial points: evaluate with keep_adv=True")
    t0 = time.perf_counter()
    x, y = take(data, result.index)
    if y is None or not torch.equal(y.long().cpu(), result.y.long().cpu()):
        raise DataError("the evaluation's labels differ from the data's: bracket the data it evaluated")
    x = check_images(x).float()
    cert = getattr(certify, method)(model, x, y, result.eps, result.norm, batch_size=batch_size)
    t1 = time.perf_counter()
    claimed = ~result.robust.bool() & result.clean_correct.bool()
    out = bracket(model, x, y, cert, result.adv, index=result.index, claimed_broken=claimed,
                  forwards=getattr(result, "forwards", 1), batch_size=256 if batch_size is None else batch_size)
    out.timings = {"certify_s": t1 - t0, "bracket_s": time.perf_counter() - t1}
    flag = out.flag()
    if flag is not None:
        result.flags.append(flag)
    return out
