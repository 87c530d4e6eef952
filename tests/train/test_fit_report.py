"""The report of train (robustest.train.fit_report)."""

from __future__ import annotations

from robustest.results import document
from robustest.train.fit_report import fit_report


def _doc(epochs: list[dict], same: bool = False) -> dict:
    res = {"model": {"name": "digits_cnn"}, "num_train": 100, "num_test": 20, "test_accuracy": 0.9, "test_loss": 0.3,
           "test_split_is_training_data": same, "history": {"epochs": epochs, "best_epoch": None}}
    return document("train", {}, res, {"total_s": 1.0}, world_size=1)


def test_the_report_draws_the_epochs_and_warns_when_test_is_train():
    epochs = [{"epoch": 1, "loss": 1.0, "accuracy": 0.5, "seconds": 1.0},
              {"epoch": 2, "loss": 0.5, "accuracy": 0.8, "seconds": 1.0}]
    html = fit_report(_doc(epochs, same=True), "digits_cnn", "digits").render()
    assert "robustest train: digits_cnn on digits" in html and "Training accuracy per epoch." in html
    assert "measured on the training data" in html and "val_loss" not in html  # no validation column without values
    plain = fit_report(_doc([]), "digits_cnn", "digits").render()
    assert "Epochs" not in plain and "measured on the training data" not in plain
