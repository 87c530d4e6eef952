"""Robust early stopping (Rice et al. 2020) and the catastrophic-overfitting guard of adversarial training.

With held-out labelled data (:func:`holdout_split` draws it class-stratified), every epoch ends with the clean
and robust accuracy of the model on it (:func:`validate`: PGD, or APGD-CE, which also sees masked gradients);
``keep="best"`` ends training with the weights of the epoch whose validation robust accuracy was highest,
``keep="last"`` with the last epoch's. The guard looks at the epochs trained wholly at the full radius (in the
eps warm-up, validation's radius is larger than training's, and the robust accuracy of a model still learning swings
under it). :func:`collapsed`: when an epoch's validation robust accuracy falls below :data:`CO_RATIO` of the best so
far and at least :data:`CO_MIN_DROP` under it (FGSM training has "collapsed": Wong et al. 2020 report the same
signature), training stops and the best epoch's weights are restored.
A collapse can also come before any robustness rose (single-step training from scratch at a large radius): the
model resists its own training attack while PGD breaks it, so the guard also stops training when an epoch's
training adversarial accuracy exceeds its validation robust accuracy by :data:`CO_GAP` or more (:func:`masked`);
the best epoch, if there was one, is restored. A single-step run can also go wrong slowly, robustness rising and then
hidden from the short validation attack (its score wanders a few points under the best while a longer attack finds
15 points less): in every such epoch, APGD-CE with :data:`CO_LONG_FACTOR` times the
validation's iterations runs on :data:`CO_LONG_SIZE` validation images (:func:`short_long`), and the guard
stops training when it finds :data:`CO_LONG_GAP` or more of them that the validation's own iterations did not break
(:func:`overstated`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from robustest.core.errors import ConfigError
from robustest.core.seeding import derive_seed, make_generator
from robustest.core.validation import check_int

__all__ = ["CO_GAP", "CO_LONG_FACTOR", "CO_LONG_GAP", "CO_LONG_SIZE", "CO_MIN_DROP", "CO_RATIO", "DEFAULT_VAL_SIZE",
           "KEEP", "VAL_ATTACKS", "collapsed", "holdout_split", "masked", "overstated", "short_long", "val_key",
           "validate", "validation_split"]

KEEP = ("best", "last")
#: the catastrophic-overfitting rule: validation robust accuracy below this fraction of the best so far ...
CO_RATIO = 0.5
#: ... and at least this far (absolute) below it
CO_MIN_DROP = 0.1
#: held-out training images of robust early stopping by default (Rice et al. hold out 1,000), at most a tenth
DEFAULT_VAL_SIZE = 1000
#: the collapse that never rose: the training attack's accuracy at least this far (absolute) above the validation's
CO_GAP = 0.5
#: the slow failure: APGD-CE with this many times the validation's iterations ...
CO_LONG_FACTOR = 10
#: ... on this many validation images (evenly spaced through them) ...
CO_LONG_SIZE = 200
#: ... breaking at least this share of them more than the validation's iterations do (MNIST eps 0.3, fast-at: 12-16
#: points on a failing run, at most 7 on six healthy ones)
CO_LONG_GAP = 0.1
#: the validation attacks and the record key of each one's accuracy (the score of early stopping and the guard)
VAL_ATTACKS = {"pgd": "val_pgd_accuracy", "apgd-ce": "val_apgd_accuracy"}


def collapsed(score: float, best: float) -> bool:
    """The catastrophic-overfitting rule: validation robust accuracy under ``CO_RATIO`` of the best so far and at
    least ``CO_MIN_DROP`` below it."""
    return score < CO_RATIO * best and best - score >= CO_MIN_DROP


def masked(train_adv_accuracy: float, val_accuracy: float) -> bool:
    """A collapse whether or not robustness ever rose: the epoch's accuracy on its own (single-step) training
    attack is at least :data:`CO_GAP` above the validation robust accuracy (Fast-AT from scratch at MNIST eps 0.3:
    about 0.9 against 0.05 under PGD; a healthy single-step run stays within a few tenths)."""
    return train_adv_accuracy - val_accuracy >= CO_GAP


def overstated(short_accuracy: float, long_accuracy: float) -> bool:
    """The slow failure of single-step training: the long attack of :func:`short_long` reads the model at least
    :data:`CO_LONG_GAP` below the short one on the same images (the difference rounded to 9 decimals, so that
    accuracies exactly :data:`CO_LONG_GAP` apart count whatever the float rounding of their subtraction)."""
    return round(short_accuracy - long_accuracy, 9) >= CO_LONG_GAP


def short_long(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int,
               seed: int) -> dict[str, float]:
    """APGD-CE (one restart, seeded by ``seed``) with ``steps`` and with ``CO_LONG_FACTOR * steps`` iterations on
    :data:`CO_LONG_SIZE` images of x (N x C x H x W), y (int64 [N]) evenly spaced through it (rows ``i * N // K``, so
    that data ordered by class gives every class its share), in eval mode: ``{"val_short_accuracy",
    "val_long_accuracy"}``, the long one per sample the worse of the two (an image counts as robust only if neither
    broke it), so their difference is the share that only the long attack broke."""
    from robustest.attacks import attack as run_attack

    n = int(x.shape[0])
    k = min(CO_LONG_SIZE, n)
    rows = torch.arange(k) * n // k
    xs, ys = x[rows], y[rows]
    short = run_attack("apgd", model, (xs, ys), eps=eps, steps=steps, seed=seed)
    long = run_attack("apgd", model, (xs, ys), eps=eps, steps=CO_LONG_FACTOR * steps, seed=seed)
    return {"val_short_accuracy": short.robust_accuracy,
            "val_long_accuracy": 1.0 - float((short.success | long.success).double().mean())}


def validate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int, seed: int,
             attack: str = "pgd") -> dict[str, float]:
    """Clean and robust accuracy on validation data x (N x C x H x W), y (int64 [N]), in eval mode:
    ``{"val_clean_accuracy", VAL_ATTACKS[attack]}``. ``attack``: "pgd" (``steps`` steps of eps/4, random start) or
    "apgd-ce" (APGD-CE with ``steps`` iterations, one restart: the same cost, and it sees the masked gradients
    that fixed-step PGD reads as robustness, as single-step training from scratch can leave them)."""
    from robustest.attacks import attack as run_attack

    key = val_key(attack)
    if attack == "pgd":
        res = run_attack("pgd", model, (x, y), eps=eps, alpha=eps / 4, steps=steps, random_start=True, seed=seed)
    else:
        res = run_attack("apgd", model, (x, y), eps=eps, steps=steps, seed=seed)
    return {"val_clean_accuracy": res.clean_accuracy, key: res.robust_accuracy}


def val_key(attack: str) -> str:
    """The epoch record's key of validation attack ``attack``'s accuracy (:data:`VAL_ATTACKS`); an unknown attack
    is a one-line ConfigError naming the known ones."""
    if attack not in VAL_ATTACKS:
        raise ConfigError(f"unknown validation attack {attack!r}: use one of {', '.join(VAL_ATTACKS)}")
    return VAL_ATTACKS[attack]


def holdout_split(labels: torch.Tensor, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A class-stratified hold-out: (train positions, validation positions), int64 [N - k] and [k], both sorted.

    ``labels``: int64 [N]. Each class gets a share of the ``k`` validation samples proportional to its size
    (largest remainders, ties to the smaller class index), drawn uniformly within the class by a generator
    seeded from ``seed``; the same labels, k and seed give the same split.
    """
    labels = torch.as_tensor(labels).reshape(-1).long()
    n = int(labels.numel())
    k = check_int("k", k, lo=0)
    if k > n:
        raise ConfigError(f"cannot hold out {k} of {n} samples")
    classes, counts = torch.unique(labels, return_counts=True)
    exact = counts.double() * k / max(n, 1)
    share = exact.floor().long()
    rest = k - int(share.sum())
    if rest > 0:
        order = torch.argsort(-(exact - share), stable=True)
        share[order[:rest]] += 1
    gen = make_generator(derive_seed(seed, "holdout"))
    key = torch.rand(n, generator=gen)
    # within each class, the samples with the smallest keys are held out
    order = torch.argsort(labels.double() * 2 + key)  # class first, then the random key (key < 1 < 2)
    pos_in_class = torch.empty(n, dtype=torch.long)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n) - torch.repeat_interleave(starts, counts)
    pos_in_class[order] = rank
    cls_index = torch.searchsorted(classes, labels)
    held = pos_in_class < share[cls_index]
    idx = torch.arange(n)
    return idx[~held], idx[held]


def validation_split(train: Any, val_size: int | None, keep: str = "best", seed: int = 0) -> tuple[Any, Any, int]:
    """(training data, validation data or None, the validation size): ``val_size`` images held out of ``train``
    class-stratified (:func:`holdout_split`, seeded by ``seed``). ``val_size`` None: :data:`DEFAULT_VAL_SIZE`, at
    most a tenth of the data; 0: none. One-line ConfigError when more than a tenth is asked for, or when ``keep``
    is "best" and the data is too small to hold any out."""
    from robustest.core.batching import labels_of, num_samples, take

    n = num_samples(train)
    if val_size is None:  # the default: 1000, at most a tenth of the data
        val_size = min(DEFAULT_VAL_SIZE, n // 10)
        if val_size == 0 and keep == "best":
            raise ConfigError(f"{n} training images are too few to hold out a validation split: give --keep last")
    if val_size == 0:
        return train, None, 0
    if val_size > n // 10:
        raise ConfigError(f"--val-size {val_size} is more than a tenth of the {n} training images: give at most "
                          f"{n // 10}, or 0 for no validation (with --keep last)")
    labels = labels_of(train)
    if labels is None:
        labels = take(train, torch.arange(n))[1]
    tr, va = holdout_split(labels, val_size, seed)
    return take(train, tr), take(train, va), val_size
