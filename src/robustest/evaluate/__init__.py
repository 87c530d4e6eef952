"""Measurement: the one home of every accuracy robustest reports.

* :mod:`~robustest.evaluate.clean`: :func:`predict` (logits), :func:`loss_and_accuracy`, :func:`accuracy`,
  :func:`clean_accuracy` on labelled data;
* :mod:`~robustest.evaluate.adversarial`: the paper's FGSM / PGD :func:`adversarial_examples`, the
  :class:`FixedAdversarialSet` built once against the original model (:func:`build_fixed_set`,
  :func:`fixed_set_accuracy`) and :func:`whitebox_accuracy` of the current model;
* :mod:`~robustest.evaluate.corruption`: :func:`corruption_accuracy` under the common corruptions
  (:class:`CorruptionResult`), published -C data and the mCE against a baseline;
* :mod:`~robustest.evaluate.ensemble`: :func:`evaluate`, the AutoAttack-level ensemble that checks itself
  (:class:`EvalResult`); its plans (:mod:`~robustest.evaluate.plans`, :func:`ensemble_plan`), the block loop
  (:mod:`~robustest.evaluate.runner`), the model and gradient checks (:mod:`~robustest.evaluate.checks`,
  :func:`probe_model`) and the flags they raise (:mod:`~robustest.evaluate.flags`, :class:`Flag`,
  :mod:`~robustest.evaluate.findings`);
* :mod:`~robustest.evaluate.report`: :func:`measure`, all of them for one model in a :class:`RobustnessReport`.
* :mod:`~robustest.evaluate.eval_pipeline`: what ``robustest eval`` runs (the ensemble, the bracket, the gate and
  the files of one evaluation, :class:`~robustest.evaluate.eval_pipeline.EvalRun`), and its report
  (:mod:`~robustest.evaluate.eval_report`).

Every function takes a model and data in the robustest contract (images N x C x H x W in [0, 1], int64 labels
[N]), runs batched on the model's device, restores the model's mode and returns plain numbers or dataclasses that
serialise to JSON. This package imports only the layers below it (attacks, corruptions, core), never train, robot,
weakrobust, suite or cli.
"""

from __future__ import annotations

from robustest.core.modelcall import predict
from robustest.evaluate.adversarial import (
    FIXED_SET_FORMAT,
    FixedAdversarialSet,
    adversarial_examples,
    build_fixed_set,
    fixed_set_accuracy,
    whitebox_accuracy,
)
from robustest.evaluate.checks import ModelProbe, probe_model
from robustest.evaluate.clean import accuracy, clean_accuracy, loss_and_accuracy
from robustest.evaluate.corruption import CorruptionResult, corruption_accuracy
from robustest.evaluate.ensemble import EVAL_FORMAT, EvalResult, evaluate
from robustest.evaluate.flags import FLAGS, Flag
from robustest.evaluate.plans import AUTOATTACK_NAMES, EVAL_VERSIONS, ensemble_plan
from robustest.evaluate.report import RobustnessReport, measure

__all__ = [
    "AUTOATTACK_NAMES",
    "EVAL_FORMAT",
    "EVAL_VERSIONS",
    "FIXED_SET_FORMAT",
    "FLAGS",
    "CorruptionResult",
    "EvalResult",
    "Flag",
    "FixedAdversarialSet",
    "ModelProbe",
    "RobustnessReport",
    "accuracy",
    "adversarial_examples",
    "build_fixed_set",
    "clean_accuracy",
    "corruption_accuracy",
    "ensemble_plan",
    "evaluate",
    "fixed_set_accuracy",
    "loss_and_accuracy",
    "measure",
    "predict",
    "probe_model",
    "whitebox_accuracy",
]
