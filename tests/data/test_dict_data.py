"""Data sets and DataLoaders that yield dicts (Hugging Face style: ``pixel_values``/``image`` and
``labels``/``label``) work in every Python entry point that takes data, with the same results as the (x, y)
tensors they hold."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from robustest import attacks, metrics, testing
from robustest.core.batching import as_tensors, image_shape, iter_batches, split_batch, take
from robustest.core.errors import ConfigError, DataError
from robustest.evaluate import accuracy, evaluate, predict
from robustest.train import fit

pytestmark = pytest.mark.usefixtures("one_thread")  # two shared cores: one intra-op thread


class DictData(Dataset):
    """A map-style data set of dicts, as a Hugging Face ``Dataset`` with ``set_format('torch')`` yields them."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, image_key: str = "pixel_values",
                 label_key: str | None = "labels") -> None:
        self.x, self.y, self.image_key, self.label_key = x, y, image_key, label_key

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, object]:
        item: dict[str, object] = {self.image_key: self.x[i], "attention_note": "ignored"}
        if self.label_key is not None:
            item[self.label_key] = int(self.y[i])
        return item


class TupleData(DictData):
    """The same items as (image, label) tuples."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], int(self.y[i])


@pytest.fixture
def xy(digits_test):
    x, y = digits_test.tensors
    return x[:48].clone(), y[:48].clone()


def _forms(x: torch.Tensor, y: torch.Tensor) -> dict[str, object]:
    return {"pixel_values/labels": DictData(x, y), "image/label": DictData(x, y, "image", "label"),
            "loader": DataLoader(DictData(x, y), batch_size=16)}


def test_split_batch_reads_the_image_and_label_keys():
    x, y = torch.zeros(2, 1, 4, 4), torch.tensor([1, 2])
    for xk, yk in (("pixel_values", "labels"), ("image", "label"), ("img", "target")):
        got_x, got_y = split_batch({yk: y, xk: x, "other": 5})
        assert got_x is x and got_y is y
    assert split_batch({"pixel_values": x})[1] is None  # unlabelled
    with pytest.raises(DataError, match="dict with keys \\['features', 'y_true'\\].*pixel_values"):
        split_batch({"features": x, "y_true": y})


def test_batching_helpers_read_dict_data(xy):
    x, y = xy
    for name, data in _forms(x, y).items():
        gx, gy = as_tensors(data)
        assert torch.equal(gx, x) and torch.equal(gy, y), name
        assert image_shape(data) == (1, 8, 8), name
        tx, ty = take(data, torch.tensor([3, 0, 7]))
        assert torch.equal(tx, x[[3, 0, 7]]) and torch.equal(ty, y[[3, 0, 7]]), name
        seen = torch.cat([i for i, _, _ in iter_batches(data, batch_size=10, with_index=True)])
        assert torch.equal(seen, torch.arange(48)), name


def test_training_and_evaluation_take_dict_data(xy, trained_digits_model):
    x, y = xy
    m = trained_digits_model
    want = accuracy(m, (x, y))
    for name, data in _forms(x, y).items():
        assert accuracy(m, data) == want, name
        assert torch.equal(predict(m, data), predict(m, (x, y))), name
    from robustest import models

    torch.manual_seed(0)
    a = models.create("mlp", num_classes=10, in_channels=1, input_size=8)
    b = models.create("mlp", num_classes=10, in_channels=1, input_size=8)
    b.load_state_dict(a.state_dict())
    fit(a, TupleData(x, y), epochs=1, batch_size=16, seed=0, progress=False)
    fit(b, DictData(x, y), epochs=1, batch_size=16, seed=0, progress=False)
    for p, q in zip(a.parameters(), b.parameters()):  # the same training as from (image, label) items
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_attacks_metrics_and_robustness_take_dict_data(xy, trained_digits_model):
    x, y = xy
    m = trained_digits_model
    ref = attacks.attack("fgsm", m, (x, y), eps=0.1)
    ref_scores = metrics.score(m, (x, y), "gini").scores
    ref_eval = evaluate(m, (x, y), 0.1, version="custom", attacks=["apgd-ce"], seed=0)
    for name, data in _forms(x, y).items():
        r = attacks.attack("fgsm", m, data, eps=0.1)
        assert torch.equal(r.adv, ref.adv), name
        assert torch.equal(metrics.score(m, data, "gini").scores, ref_scores), name
        ev = evaluate(m, data, 0.1, version="custom", attacks=["apgd-ce"], seed=0)
        assert ev.robust_accuracy == ref_eval.robust_accuracy, name
        got = testing.robust_accuracy(m, data, eps=0.1, attack="apgd-ce", limit=20)
        assert 0.0 <= got.robust_accuracy <= 1.0, name


def test_weak_robust_validation_and_hardening_take_dict_data(xy, trained_digits_model):
    from robustest.train import hardening
    from robustest.weakrobust import analyze

    x, y = xy
    m = trained_digits_model
    ref = analyze(m, (x, y), n_neighbors=4, seed=0)
    got = analyze(m, DataLoader(DictData(x, y, "image", "label"), batch_size=16), n_neighbors=4, seed=0)
    assert torch.equal(got.score, ref.score)
    import copy

    h = hardening.harden(copy.deepcopy(m), DictData(x, y), method="fast-at", eps=0.1, epochs=1, batch_size=16,
                         progress=False)
    assert h is not None


def test_unlabelled_dict_data_is_refused_where_labels_are_needed(xy, trained_digits_model):
    x, y = xy
    with pytest.raises(ConfigError, match="needs labels"):
        accuracy(trained_digits_model, DictData(x, y, label_key=None))


def test_string_labels_are_one_line_data_error():
    from robustest.models import create

    x = torch.rand(2, 1, 8, 8)
    with pytest.raises(DataError, match=r"integer class indices, got str values such as 'cat': map") as info:
        as_tensors((x, ["cat", "dog"]))
    assert "\n" not in str(info.value)
    with pytest.raises(DataError, match="integer class indices"):
        accuracy(create("digits_cnn").eval(), (x, ["cat", "dog"]))


def test_accuracy_refuses_pixels_outside_0_1_as_evaluate_does():
    from robustest.models import create

    model = create("digits_cnn").eval()
    levels = torch.randint(0, 256, (4, 1, 8, 8))
    y = torch.tensor([0, 1, 2, 3])
    with pytest.raises(DataError, match=r"must lie in \[0, 1\]"):
        accuracy(model, (levels.float(), y))
    with pytest.raises(DataError, match="floating point in"):
        accuracy(model, (levels.to(torch.uint8), y))
    assert accuracy(model, (levels.float() / 255, y)) in (0.0, 0.25, 0.5, 0.75, 1.0)
