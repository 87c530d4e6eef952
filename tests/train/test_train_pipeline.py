"""The train pipeline (robustest.train.train_pipeline): a sized zoo model, fit, test figures, model.pt."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from robustest.core.errors import ConfigError
from robustest.evaluate import loss_and_accuracy
from robustest.models.checkpoints import load_model
from robustest.report import format_value
from robustest.train.recipes import Recipe
from robustest.train.train_pipeline import same_data, sized_zoo_model, train_pipeline


def _ds(n: int = 8, label: int = 0, value: float = 0.5) -> TensorDataset:
    return TensorDataset(torch.full((n, 1, 4, 4), value), torch.full((n,), label))


def test_same_data_compares_size_labels_and_images():
    a = _ds()
    assert same_data(a, _ds())
    assert not same_data(a, _ds(n=7))  # another size
    assert not same_data(a, _ds(label=1))  # the same images, other labels
    assert not same_data(a, _ds(value=0.25))  # the same labels, other images
    pair = (torch.zeros(3, 1, 2, 2), torch.zeros(3, dtype=torch.long))  # an (x, y) pair holds 3 samples, not 2
    assert not same_data(pair, (torch.zeros(2, 1, 2, 2), torch.zeros(2, dtype=torch.long)))
    assert same_data(pair, (pair[0].clone(), pair[1].clone()))


def test_sized_zoo_model_takes_its_shape_classes_and_statistics_from_the_data(digits_train, digits_test):
    model = sized_zoo_model("digits_cnn", digits_train, digits_test, seed=3)
    spec = model.robustest_spec
    assert (spec["in_channels"], spec["input_size"], spec["num_classes"]) == (1, 8, 10)
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    again = sized_zoo_model("digits_cnn", digits_train, digits_test, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    wide = sized_zoo_model("digits_cnn", digits_train, digits_test, num_classes=12, normalize=False)
    assert wide.robustest_spec["num_classes"] == 12 and wide.robustest_spec.get("mean") is None
    one_class = TensorDataset(torch.rand(4, 1, 8, 8), torch.zeros(4, dtype=torch.long))
    assert sized_zoo_model("digits_cnn", one_class, one_class).robustest_spec["num_classes"] == 2  # at least 2


def test_sized_zoo_model_refuses_non_square_images():
    flat = TensorDataset(torch.rand(4, 1, 8, 6), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ConfigError, match="must be square.*8x6"):
        sized_zoo_model("digits_cnn", flat, flat)


def test_train_pipeline_fits_measures_and_saves(tmp_path, digits_train, digits_test):
    train = TensorDataset(*digits_train[:200])
    model = sized_zoo_model("digits_cnn", train, digits_test, seed=0)
    notes: list[str] = []
    run = train_pipeline(model, train, digits_test, out=tmp_path / "new", epochs=2, batch_size=50,
                         recipe=Recipe(), recipe_name=None, seed=1, progress=False,
                         metadata={"dataset": "digits"}, note=notes.append)
    assert notes == []  # separate splits: nothing to say
    assert len(run.history.epochs) == 2 and (run.num_train, run.num_test) == (200, len(digits_test))
    assert (run.test_loss, run.test_accuracy) == pytest.approx(loss_and_accuracy(run.model, digits_test))
    assert run.same_split is False and set(run.timings) == {"train_s", "eval_s"}
    res = run.to_results()
    assert list(res) == ["model", "recipe", "num_train", "num_test", "history", "test_loss", "test_accuracy",
                         "test_split_is_training_data", "peak_rss_mib", "files"]
    assert res["files"] == {"model": "model.pt", "report": "report.html"} and res["peak_rss_mib"] > 0
    assert res["recipe"] == {"name": None, "epochs": 2, "batch_size": 50, **Recipe().check(2).to_dict()}
    saved = torch.load(tmp_path / "new" / "model.pt", weights_only=True)  # the folder made
    assert saved["metadata"] == {"dataset": "digits", "epochs": 2, "test_accuracy": run.test_accuracy, "seed": 1}
    reloaded = load_model(str(tmp_path / "new" / "model.pt"))
    assert loss_and_accuracy(reloaded, digits_test)[1] == run.test_accuracy
    last = run.history.last
    assert run.summary_line("digits_cnn", "digits") == (
        f"trained digits_cnn on digits: 200 images, 2 epochs, train loss {format_value(last.loss)}, train accuracy "
        f"{format_value(last.accuracy, 'accuracy')}, test accuracy {format_value(run.test_accuracy, 'accuracy')} "
        f"({format_value(run.history.seconds, 'train_s')} s)")


def test_sized_zoo_model_reads_labels_through_the_batches_when_the_data_has_no_label_tensor():
    from torch.utils.data import Dataset

    class Pairs(Dataset):  # no label tensor to look at: labels come from the items
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int):
            return torch.full((1, 8, 8), i / 6), i % 4

    model = sized_zoo_model("digits_cnn", Pairs(), Pairs(), normalize=False)
    assert model.robustest_spec["num_classes"] == 4


def test_train_pipeline_says_before_training_when_the_test_data_is_the_training_data(tmp_path, digits_train):
    train = TensorDataset(*digits_train[:60])
    notes: list[str] = []
    model = sized_zoo_model("mlp", train, train, seed=0)
    run = train_pipeline(model, train, train, out=tmp_path, epochs=1, batch_size=30, recipe=Recipe(),
                         progress=False, note=notes.append)
    assert notes == ["the test data is the training data (no separate test split): the reported test accuracy is "
                     "measured on the training data"]
    assert run.same_split is True and run.to_results()["test_split_is_training_data"] is True
    quiet = train_pipeline(sized_zoo_model("mlp", train, train, seed=0), train, train, out=tmp_path / "q", epochs=1,
                           batch_size=30, recipe=Recipe(), progress=False)  # no note given: silent
    assert quiet.same_split is True
