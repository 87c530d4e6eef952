"""Training: the one home of how models are trained.

* :class:`Recipe` (:mod:`.recipes`): the optimiser, schedule, loss, precision and data options of a training, one
  value that :func:`fit`, :func:`harden`, ``weakrobust.enhance`` and the RobOT config take.
* :func:`fit` (:mod:`.fitting`): supervised training with a :class:`Recipe`, seeded and
  resumable, under torchrun with DistributedDataParallel; each batch's loss is the ``cross-entropy`` objective
  of :mod:`.objectives`, the registry of every training objective (harden's methods, fit's and enhance's losses).
* :mod:`.engine`: the one epoch loop fit, harden and enhance run through (:func:`~.engine.run_epochs` over an
  :class:`~.engine.EpochLoop`'s hooks: batches, divergence check, validation, resume state);
  :class:`TrainData` batches any data source.
* :mod:`.state`: the one resume format fit, harden and enhance write after every epoch and continue from.
* :func:`harden` (:mod:`.hardening`): adversarial training with any objective of :mod:`.objectives` (pgd-at,
  trades, fosc, fol-budget, fast-at, n-fgsm, grad-align, or one registered from outside), counting its compute
  (:class:`robustest.core.compute.ComputeCount`), with robust early stopping and the catastrophic-overfitting guard
  (:mod:`.early_stopping`) and a resumable state.
* :mod:`.harden_pipeline`: what ``robustest harden`` runs (measure, harden, measure, save:
  :class:`~.harden_pipeline.HardenRun`), and its report (:mod:`.harden_report`).
* :mod:`.schedules`: the per-batch learning-rate schedule, the eps warm-up, dynamic AT's FOSC criterion.
"""

from __future__ import annotations

from robustest.train import objectives
from robustest.train.early_stopping import holdout_split
from robustest.train.engine import TrainData
from robustest.train.fitting import EpochStats, History, channel_stats, fit
from robustest.train.hardening import HardenResult, check_trainable, harden, harden_settings
from robustest.train.recipes import Recipe
from robustest.train.schedules import eps_schedule, fosc_schedule

__all__ = ["EpochStats", "HardenResult", "History", "Recipe", "TrainData", "channel_stats", "check_trainable",
           "eps_schedule", "fit", "fosc_schedule", "harden", "harden_settings", "holdout_split", "objectives"]
