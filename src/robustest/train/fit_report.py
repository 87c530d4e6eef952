"""The report of ``robustest train`` (OUT/report.html): the model, the data sizes and test figures, the training
(and validation) accuracy and loss per epoch."""

from __future__ import annotations

from typing import Any

from robustest.report import HtmlReport, save_lines

__all__ = ["fit_report"]


def fit_report(doc: dict[str, Any], model: str, dataset: str) -> HtmlReport:
    """The HTML report (written by the caller) of the training run ``doc`` (results.json's content) of ``model`` on
    ``dataset``: the summary, accuracy and loss per epoch, the epoch table."""
    rep = HtmlReport.from_results(doc, f"robustest train: {model} on {dataset}")
    epochs = doc["history"]["epochs"]
    rep.key_values({"model": doc["model"].get("name") or doc["model"].get("factory") or doc["model"].get("kind"),
                    "num_train": doc["num_train"], "num_test": doc["num_test"], "epochs": len(epochs),
                    "test_accuracy": doc["test_accuracy"], "test_loss": doc["test_loss"],
                    "best_epoch": doc["history"].get("best_epoch")})
    if doc["test_split_is_training_data"]:
        rep.note("The data has no separate test split: the test figures are measured on the training data.")
    if epochs:
        xs = [e["epoch"] for e in epochs]
        for key, label in (("accuracy", "accuracy"), ("loss", "loss")):
            series = {f"train {label}": (xs, [e[key] for e in epochs])}
            if all(e.get(f"val_{key}") is not None for e in epochs):
                series[f"validation {label}"] = (xs, [e[f"val_{key}"] for e in epochs])
            rep.image(save_lines(series, None, title=f"{label} per epoch", xlabel="epoch", ylabel=label),
                      f"Training {label} per epoch.")
        rep.heading("Epochs")
        cols = [c for c in ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "lr", "seconds")
                if any(e.get(c) is not None for e in epochs)]
        rep.table(epochs, cols)
    return rep
