"""Adversarial measurement: the paper's FGSM / PGD adversarial examples, the fixed adversarial test set built
once against the original model (METHODS.md A4) and the white-box robust accuracy of the current model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from robustest import attacks as _atk
from robustest.core.atomic import atomic_save
from robustest.core.errors import ConfigError
from robustest.core.modelcall import predict
from robustest.core.reading import load_plain
from robustest.core.reprs import counts, one_line, shape
from robustest.core.validation import check_eps
from robustest.evaluate.clean import accuracy, labelled_tensors

__all__ = ["FIXED_SET_FORMAT", "FixedAdversarialSet", "adversarial_examples", "build_fixed_set",
           "fixed_set_accuracy", "whitebox_accuracy"]

FIXED_SET_FORMAT = "robustest-fixed-adversarial-set"


@dataclass
class FixedAdversarialSet:
    """A fixed adversarial test set: the successful FGSM and PGD examples of an evaluation split generated
    against the ORIGINAL model (so that model scores 0 % on it by construction).

    ``x``: N x C x H x W in [0, 1]; ``y``: int64 [N] true labels; ``source_index``: int64 [N] index of each
    example's clean image in the evaluation split; ``method``: list of N attack names ("fgsm"/"pgd").
    ``num_source`` is the size of the split it was built from; ``settings`` the attack parameters.
    """

    x: torch.Tensor
    y: torch.Tensor
    source_index: torch.Tensor
    method: list[str]
    eps: float
    num_source: int
    settings: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def counts(self) -> dict[str, int]:
        """Number of examples per attack."""
        out: dict[str, int] = {}
        for m in self.method:
            out[m] = out.get(m, 0) + 1
        return out

    def __repr__(self) -> str:
        return one_line(self, n=len(self), by_attack=counts(self.counts()), eps=self.eps,
                        num_source=self.num_source, x=shape(self.x))

    def save(self, path: str | Path) -> Path:
        """Atomically write the set (``torch.save`` of plain data; loads with ``weights_only=True``)."""
        payload = {"format": FIXED_SET_FORMAT, "version": 1, "x": self.x.detach().float().cpu(),
                   "y": self.y.detach().long().cpu(), "source_index": self.source_index.detach().long().cpu(),
                   "method": list(self.method), "eps": float(self.eps), "num_source": int(self.num_source),
                   "settings": dict(self.settings)}
        return atomic_save(payload, path)

    @classmethod
    def load(cls, path: str | Path) -> FixedAdversarialSet:
        """Read a set written by :meth:`save` (refuses anything else with a one-line DataError)."""
        p = load_plain(path, fmt=FIXED_SET_FORMAT, what="fixed adversarial set", fix="build one with build_fixed_set")
        return cls(x=p["x"], y=p["y"], source_index=p["source_index"], method=list(p["method"]),
                   eps=float(p["eps"]), num_source=int(p["num_source"]), settings=dict(p.get("settings") or {}))


def adversarial_examples(model: Any, data: Any, eps: float, *,
                         attacks: tuple[str, ...] | list[str] = ("fgsm", "pgd"), pgd_steps: int = 10,
                         pgd_alpha: float | None = None, seed: int = 0, batch_size: int = 256,
                         successful_only: bool = True
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """The paper's adversarial examples of ``data`` against ``model``: FGSM with a uniform random start in
    the L-inf eps-ball and PGD (``pgd_steps`` steps of ``pgd_alpha`` = eps/6 by default, random start).

    Returns ``(x_adv, y, source_index, method)`` on CPU: N x C x H x W images, int64 [N] true labels, int64
    [N] index into ``data`` and a list of N attack names, FGSM examples first. With ``successful_only``
    only examples the model misclassifies are kept. Seeded: same ``seed``, same examples.
    """
    eps = check_eps("eps", eps)
    x, y = labelled_tensors(data)
    alpha = eps / 6 if pgd_alpha is None else float(pgd_alpha)
    xs, ys, idx, meth = [], [], [], []
    for k, name in enumerate(attacks):
        if name == "fgsm":
            res = _atk.attack("fgsm", model, (x, y), batch_size=batch_size, eps=eps, random_start=True,
                              seed=seed * 1009 + k)
        elif name == "pgd":
            res = _atk.attack("pgd", model, (x, y), batch_size=batch_size, eps=eps, alpha=alpha, steps=pgd_steps,
                              random_start=True, seed=seed * 1009 + k)
        else:
            raise ConfigError(f"unknown pool attack {name!r}: use 'fgsm' and/or 'pgd'")
        keep = res.success.cpu() if successful_only else torch.ones(x.shape[0], dtype=torch.bool)
        sel = torch.nonzero(keep).flatten()
        xs.append(res.adv.detach().cpu()[sel])
        ys.append(y.cpu()[sel])
        idx.append(sel)
        meth += [name] * int(sel.numel())
    return torch.cat(xs), torch.cat(ys), torch.cat(idx).long(), meth


def build_fixed_set(model: Any, data: Any, eps: float, *, pgd_steps: int = 10, pgd_alpha: float | None = None,
                    seed: int = 0, batch_size: int = 256) -> FixedAdversarialSet:
    """Build the fixed adversarial test set of the evaluation split ``data`` against ``model`` (the ORIGINAL
    model): its successful FGSM (random start) and PGD (``pgd_steps`` x eps/6, random start) examples.

    Build it once and reuse it for every retrained model (:meth:`FixedAdversarialSet.save` / ``load``).
    """
    x, y, idx, meth = adversarial_examples(model, data, eps, pgd_steps=pgd_steps, pgd_alpha=pgd_alpha, seed=seed,
                                           batch_size=batch_size, successful_only=True)
    n = int(labelled_tensors(data)[0].shape[0])
    settings = {"attacks": ["fgsm (uniform random start)", "pgd"], "pgd_steps": pgd_steps,
                "pgd_alpha": eps / 6 if pgd_alpha is None else pgd_alpha, "seed": seed}
    return FixedAdversarialSet(x=x, y=y, source_index=idx, method=meth, eps=float(eps), num_source=n,
                               settings=settings)


def fixed_set_accuracy(model: Any, fixed: FixedAdversarialSet, *, batch_size: int = 256) -> float:
    """Accuracy of ``model`` on a fixed adversarial set (NaN when the set is empty)."""
    if len(fixed) == 0:
        return float("nan")
    return float(accuracy(model, (fixed.x, fixed.y), batch_size=batch_size))


def whitebox_accuracy(model: Any, data: Any, eps: float, *, pgd_steps: int = 20, pgd_restarts: int = 2,
                      apgd_steps: int = 50, seed: int = 0, batch_size: int = 256) -> dict[str, float]:
    """White-box robust accuracy of ``model`` itself on ``data`` at L-inf radius ``eps``.

    Returns ``{"pgd": acc, "apgd": acc, "worst": acc}``: accuracy under PGD (``pgd_steps`` steps of
    eps/4 from a random start, best of ``pgd_restarts`` restarts), under APGD-CE (``apgd_steps``), and the per-sample
    worst case (a sample counts only if it is classified correctly clean and under both attacks).
    ``apgd_steps=0`` skips APGD (its entry is then None). Seeded.
    """
    eps = check_eps("eps", eps)
    x, y = labelled_tensors(data)
    n = x.shape[0]
    if n == 0:
        return {"pgd": float("nan"), "apgd": None, "worst": float("nan")}
    correct = predict(model, x, batch_size=batch_size).argmax(1) == y.cpu()
    res = _atk.attack("pgd", model, (x, y), batch_size=batch_size, eps=eps, alpha=eps / 4, steps=pgd_steps,
                      random_start=True, restarts=pgd_restarts, seed=seed)
    ok_pgd = ~res.success.cpu()
    out: dict[str, Any] = {"pgd": int(ok_pgd.sum()) / n}
    robust = correct & ok_pgd
    if apgd_steps > 0:
        res2 = _atk.attack("apgd", model, (x, y), batch_size=batch_size, eps=eps, steps=apgd_steps, seed=seed + 1)
        ok_apgd = ~res2.success.cpu()
        out["apgd"] = int(ok_apgd.sum()) / n
        robust &= ok_apgd
    else:
        out["apgd"] = None
    out["worst"] = int(robust.sum()) / n
    return out
