"""A real Hugging Face ``datasets.Dataset`` (dict columns, Arrow-backed, not a torch Dataset) works in every
function that takes data, with the figures the same data gives as (x, y) tensors. Skipped without ``datasets``."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest
import torch

datasets = pytest.importorskip("datasets")

from robustest import attacks, metrics, models  # noqa: E402
from robustest.core.batching import as_tensors, image_shape, is_columnar, iter_batches, take  # noqa: E402
from robustest.core.distributed import Shard  # noqa: E402
from robustest.core.errors import DataError  # noqa: E402
from robustest.evaluate import accuracy, evaluate  # noqa: E402
from robustest.train import fit, hardening  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # two shared cores: one intra-op thread

N = 64


@pytest.fixture
def xy(digits_test) -> tuple[torch.Tensor, torch.Tensor]:
    """64 digits: float32 N x 1 x 8 x 8 in [0, 1] (multiples of 1/16: exact in any float type), int64 [N]."""
    x, y = digits_test.tensors
    return x[:N].clone(), y[:N].clone()


def _from_dict(x: torch.Tensor, y: torch.Tensor, image_key: str = "image") -> datasets.Dataset:
    return datasets.Dataset.from_dict({image_key: x.tolist(), "label": y.tolist()})


def _to_pixel_values(batch: dict) -> dict:
    """A batch transform as the Hugging Face tutorials write them: image column in, ``pixel_values`` out."""
    return {"pixel_values": [torch.tensor(im, dtype=torch.float32) for im in batch["image"]],
            "labels": batch["label"]}


def _forms(x: torch.Tensor, y: torch.Tensor) -> dict[str, datasets.Dataset]:
    """The same samples in each form a Hugging Face data set takes."""
    plain = _from_dict(x, y)
    mapped = plain.map(lambda b: {"pixel_values": b["image"]}, batched=True, remove_columns=["image"])
    mapped.set_format("torch")
    return {"lists": plain, "torch": plain.with_format("torch"), "transform": plain.with_transform(_to_pixel_values),
            "map+set_format": mapped}


def _pil_dataset(arrays: np.ndarray, labels: list[int], mode: str) -> datasets.Dataset:
    from PIL import Image

    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])})
    images = [Image.fromarray(a, mode) for a in arrays]
    return datasets.Dataset.from_dict({"img": images, "label": labels}, features=features)


def test_every_form_reads_as_the_tensors(xy):
    x, y = xy
    for name, ds in _forms(x, y).items():
        assert is_columnar(ds), name
        gx, gy = as_tensors(ds)
        assert gx.dtype == torch.float32 and torch.equal(gx, x) and torch.equal(gy, y), name
        assert image_shape(ds) == (1, 8, 8), name
        tx, ty = take(ds, torch.tensor([5, 0, 63]))
        assert torch.equal(tx, x[[5, 0, 63]]) and torch.equal(ty, y[[5, 0, 63]]), name
        seen = [(i, xb) for i, xb, _ in iter_batches(ds, batch_size=10, with_index=True)]
        assert torch.equal(torch.cat([i for i, _ in seen]), torch.arange(N)), name
        assert torch.equal(torch.cat([xb for _, xb in seen]), x), name
    assert not is_columnar((x, y)) and not is_columnar(x.numpy()) and not is_columnar({"image": x})


def test_shards_read_their_own_part_with_data_set_positions(xy):
    x, y = xy
    ds = _from_dict(x, y).with_format("torch")
    parts = [list(iter_batches(ds, batch_size=16, with_index=True, shard=Shard(r, 3))) for r in range(3)]
    idx = torch.cat([i for part in parts for i, _, _ in part])
    assert torch.equal(idx, torch.arange(N))
    for part in parts:
        for i, xb, yb in part:
            assert torch.equal(xb, x[i]) and torch.equal(yb, y[i])


@pytest.mark.parametrize("mode, shape", [("L", (N, 8, 8)), ("RGB", (N, 8, 8, 3))])
def test_pil_images_with_class_labels_read_as_levels_over_255(mode, shape):
    gen = np.random.default_rng(0)
    arrays = gen.integers(0, 256, shape, dtype=np.uint8)
    labels = (np.arange(N) % 3).tolist()
    t = torch.from_numpy(arrays)
    want = (t[:, None] if mode == "L" else t.permute(0, 3, 1, 2)).float() / 255
    ds = _pil_dataset(arrays, labels, mode)
    for name, form in (("PIL", ds), ("torch", ds.with_format("torch")), ("numpy", ds.with_format("numpy"))):
        gx, gy = as_tensors(form)
        assert torch.equal(gx, want) and gy.tolist() == labels, (mode, name)
    model = models.create("digits_cnn", num_classes=3, in_channels=want.shape[1]).eval()
    assert accuracy(model, ds) == accuracy(model, (want, torch.tensor(labels)))


def test_integer_pixel_lists_are_levels_and_float_lists_are_kept():
    levels = torch.randint(0, 256, (6, 1, 4, 4), generator=torch.Generator().manual_seed(1))
    ds = datasets.Dataset.from_dict({"image": levels.tolist(), "label": [0] * 6})
    assert torch.equal(as_tensors(ds)[0], levels.float() / 255)
    hw = datasets.Dataset.from_dict({"image": levels[:, 0].tolist(), "label": [0] * 6})  # H x W images
    assert torch.equal(as_tensors(hw)[0], levels.float() / 255)


def test_a_data_set_without_an_image_key_is_one_line_naming_its_keys():
    ds = datasets.Dataset.from_dict({"features": [[0.1, 0.2]], "y_true": [1]})
    with pytest.raises(DataError) as info:
        accuracy(models.create("digits_cnn").eval(), ds)
    assert str(info.value) == ("a data set item is a dict with keys ['features', 'y_true']: robustest reads the images "
                               "from one of pixel_values, image, images, img, x and the labels from one of labels, "
                               "label, targets, target, y")


def test_mixed_sizes_and_class_names_are_one_line_errors():
    from PIL import Image

    ims = [Image.new("L", (8, 8)), Image.new("L", (6, 8))]
    with pytest.raises(DataError, match=r"^the 'image' images have different sizes \(8x6, 8x8, \.\.\.\): resize"):
        as_tensors(datasets.Dataset.from_dict({"image": ims, "label": [0, 1]}))
    named = datasets.Dataset.from_dict({"image": [[[0.5]]] * 2, "label": ["cat", "dog"]})
    with pytest.raises(DataError, match="integer class indices, got str values such as 'cat': map"):
        as_tensors(named)


def test_accuracy_refuses_pixels_as_evaluate_does_with_the_same_line(xy):
    x, y = xy
    model = models.create("digits_cnn").eval()
    cases = {"0..255 floats": (x * 255, y), "uint8 tensor": ((x * 255).to(torch.uint8), y),
             "0..255 float lists": _from_dict(x * 255, y), "labels past the logits": (x, y + 10)}
    for name, data in cases.items():
        messages = []
        for run in (lambda d=data: accuracy(model, d), lambda d=data: evaluate(model, d, 0.1, version="fast")):
            with pytest.raises(DataError) as info:
                run()
            messages.append(str(info.value))
        assert messages[0] == messages[1] and "\n" not in messages[0], name


def test_accuracy_evaluate_attacks_and_scores_take_it(xy, trained_digits_model):
    x, y = xy
    m = trained_digits_model
    ref_acc = accuracy(m, (x, y))
    forms = _forms(x, y)
    for name, ds in forms.items():
        assert accuracy(m, ds) == ref_acc, name
    k = 16  # the attack ensemble on 16 samples keeps the test fast
    ref = evaluate(m, (x[:k], y[:k]), 0.1, version="fast", seed=0)
    ev = evaluate(m, _from_dict(x[:k], y[:k]).with_transform(_to_pixel_values), 0.1, version="fast", seed=0)
    assert 0 < ref.robust_accuracy < ref.clean_accuracy
    assert ev.clean_accuracy == ref.clean_accuracy and ev.robust_accuracy == ref.robust_accuracy
    assert torch.equal(ev.robust, ref.robust) and torch.equal(ev.index, ref.index) and ev.broken_by == ref.broken_by
    ds = forms["torch"]
    assert torch.equal(attacks.attack("fgsm", m, ds, eps=0.1).adv, attacks.attack("fgsm", m, (x, y), eps=0.1).adv)
    assert torch.equal(metrics.score(m, ds, "gini").scores, metrics.score(m, (x, y), "gini").scores)


def _twins() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    a = models.create("mlp", num_classes=10, in_channels=1, input_size=8)
    return a, copy.deepcopy(a)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for p, q in zip(a.state_dict().values(), b.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_fit_and_harden_take_it_with_the_tensors_training(xy):
    x, y = xy
    ds = _from_dict(x, y).with_transform(_to_pixel_values)
    a, b = _twins()
    fit(a, (x, y), epochs=1, batch_size=16, seed=0, progress=False)
    fit(b, ds, epochs=1, batch_size=16, seed=0, progress=False)
    _same_weights(a, b)
    a, b = _twins()
    ra = hardening.harden(a, (x, y), method="fast-at", eps=0.1, epochs=1, batch_size=16)
    rb = hardening.harden(b, ds, method="fast-at", eps=0.1, epochs=1, batch_size=16)
    _same_weights(a, b)
    assert rb.num_samples == N and rb.epochs[0]["loss"] == ra.epochs[0]["loss"]


def test_the_hugging_face_block_of_your_model_md_runs(tmp_path, monkeypatch, capsys):
    doc = Path(__file__).resolve().parents[2] / "docs" / "YOUR_MODEL.md"
    (code,) = re.findall(r"```py\n(.*?)```", doc.read_text(), flags=re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(doc), "exec"), {"__name__": "your_model_hf"})
    out = capsys.readouterr().out
    pil, fmt = re.search(r"PIL (\S+) torch format (\S+)", out).groups()
    assert pil == fmt and float(pil) > 0.5 and "robust accuracy" in out
