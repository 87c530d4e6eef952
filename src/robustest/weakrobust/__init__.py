"""Weak-robust validation: local robustness analysis of training samples, the weak-robust validation set,
validation under attacks and corruptions, and targeted enhancement (METHODS.md part B).

* :func:`analyze` draws ``Q`` noisy neighbours of every sample and scores how often / how confidently they
  are mispredicted (statistical, black-box). :func:`adversarial_radius` is the white-box counterpart: the
  smallest L-inf PGD budget that flips each sample, found by a batched bisection.
* :func:`select_weak` turns an :class:`Analysis` into a :class:`WeakSet`: the paper's weak set (top-K, top
  fraction, the "most neighbours misclassified" threshold, optionally class-balanced; ``weak``), the same among
  correctly classified samples (``weak-correct``), a sample stratified by the local robustness score and
  weighted by stratum share (``stratified``), or a random subset (``random``).
* :func:`validate` measures the error of a model on a set of samples (the weak set, a random subset, a
  test split) under gradient attacks and common corruptions and labels every perturbation type a strength
  or a weakness.
* :func:`enhance` trains with AugMix-style mixing + Jensen-Shannon consistency + an adversarial copy of each
  image, with the augmentation pool extended by the corruptions found to be weaknesses; that loss is the
  ``augmix-jsd-adv`` objective (:mod:`.enhance_objective`), registered in :mod:`robustest.train.objectives` when
  this package is imported and looked up there by enhance.

Neighbour noise (reproducibility): the data set is cut into fixed blocks of :data:`NOISE_BLOCK` consecutive
samples; block ``b`` draws its noise from a generator seeded with ``SeedSequence([seed, b])``. Results
therefore depend on ``seed`` and the sample's position only, never on ``batch_size`` (up to floating-point
differences of the forward pass itself). CPU and CUDA generators differ, so the noise differs by device.

Package layout: ``analysis`` (Analysis, analyze, adversarial_radius), ``weakset`` (WeakSet, select_weak),
``validation`` (ValidationResult, validate), ``augment`` (the AugMix operations and pool, the mixing, the
JSD loss), ``enhance_objective`` (enhance's training objective), ``enhance`` (EnhanceResult, enhance),
``enhance_pipeline`` (what robustest enhance runs: measured before and after), ``reports``
(the reports of analyze and validate).
"""

from __future__ import annotations

from robustest.train import objectives as _objectives
from robustest.weakrobust import enhance_objective as _enhance_objective
from robustest.weakrobust.analysis import NOISE_BLOCK, Analysis, adversarial_radius, analyze, default_batch_size
from robustest.weakrobust.augment import AUGMIX_OPS, augmentation_pool
from robustest.weakrobust.enhance import EnhanceResult, enhance
from robustest.weakrobust.validation import ATTACKS, ValidationResult, default_eps_grid, validate
from robustest.weakrobust.weakset import (
    DEFAULT_SUBSET_SIZE,
    STRATEGIES,
    WeakSet,
    select_weak,
)

__all__ = [
    "ATTACKS",
    "AUGMIX_OPS",
    "DEFAULT_SUBSET_SIZE",
    "NOISE_BLOCK",
    "STRATEGIES",
    "Analysis",
    "EnhanceResult",
    "ValidationResult",
    "WeakSet",
    "adversarial_radius",
    "analyze",
    "augmentation_pool",
    "default_batch_size",
    "default_eps_grid",
    "enhance",
    "select_weak",
    "validate",
]

_objectives.register(_enhance_objective.OBJECTIVE)  # enhance's loss, looked up by name as fit's cross-entropy is
