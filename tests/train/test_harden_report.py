"""The harden report's pieces (robustest.train.harden_report); the whole report: tests/train/test_harden_pipeline.py."""

from __future__ import annotations

from robustest.train.harden_report import GUARD_REASONS, guard_reason, summary_figures


def test_summary_figures_name_the_image_counts():
    r = {"num_eval": 100, "num_whitebox": 30, "clean_accuracy": 0.9, "whitebox_accuracy": 0.5,
         "whitebox_pgd_accuracy": 0.6, "whitebox_apgd_accuracy": 0.5}
    assert summary_figures(r) == {"clean accuracy (100 images)": 0.9, "white-box accuracy (30 images)": 0.5,
                                  "PGD accuracy (30 images)": 0.6, "APGD-CE accuracy (30 images)": 0.5,
                                  "AutoAttack accuracy (30 images)": None, "certified accuracy (100 images)": None}


def test_guard_reason_names_the_rule_of_the_stopping_epoch():
    class Res:
        epochs = [{"guard": None}, {"guard": "masked"}]
        guard_epoch = 2

    assert guard_reason(Res()) == GUARD_REASONS["masked"].split(" (")[0]
    Res.epochs = [{}, {}]
    assert guard_reason(Res()) == "the validation robust accuracy collapse"  # an epoch without a rule: collapsed
