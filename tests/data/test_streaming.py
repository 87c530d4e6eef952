"""Compact data sets, bounded readers, published -C layouts, sampler-carrying iteration and DataLoader training."""

from __future__ import annotations

import pickle
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from robustest import data
from robustest.core import batching
from robustest.core.errors import DataError
from robustest.data import FolderDataset, ImageDataset
from robustest.train import channel_stats, fit


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# ------------------------------------------------------------------------------------------ ImageDataset
@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "NHW"])
def test_image_dataset_converts_per_batch_like_the_full_tensor(layout) -> None:
    rng = np.random.default_rng(0)
    shape = {"NCHW": (10, 3, 5, 6), "NHWC": (10, 5, 6, 3), "NHW": (10, 5, 6)}[layout]
    raw = rng.integers(0, 256, shape, dtype=np.uint8)
    ds = ImageDataset(raw, np.arange(10) % 3, layout=layout)
    x, y = ds.tensors
    c = 1 if layout == "NHW" else 3
    assert x.shape == (10, c, 5, 6) and x.dtype == torch.float32 and x.is_contiguous()
    ref = torch.from_numpy(raw.astype(np.float32) / 255.0)
    ref = ref[:, None] if layout == "NHW" else (ref.permute(0, 3, 1, 2) if layout == "NHWC" else ref)
    assert torch.equal(x, ref)
    idx = torch.tensor([7, 2, 2, 9])
    xb, yb = ds.get_batch(idx)
    assert torch.equal(xb, x[idx]) and torch.equal(yb, y[idx])
    assert torch.equal(ds[3][0], x[3]) and int(ds[3][1]) == 0
    assert len(ds.head(4)) == 4 and torch.equal(ds.head(4).tensors[0], x[:4])
    assert torch.equal(ds.subset(idx).tensors[0], x[idx])
    with pytest.raises(DataError, match="out of range"):
        ds.get_batch(torch.tensor([-1]))  # never wraps around
    assert len(repr(ds)) < 120


def test_mnist_stays_uint8_and_limit_reads_only_the_first_rows(mnist_root) -> None:
    ds = data.load("mnist", mnist_root, split="test", limit=50)
    assert isinstance(ds, ImageDataset) and ds.stored_dtype == "uint8" and len(ds) == 50
    full = data.load("mnist", mnist_root, split="test")
    assert torch.equal(ds.tensors[0], full.get_batch(slice(0, 50))[0])
    assert full._x.nbytes == 10000 * 28 * 28  # one byte per pixel held, not four


def test_npy_folder_is_memory_mapped(tmp_path) -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (20, 8, 8, 3), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.arange(20) % 4)
    ds = data.load("npy", tmp_path)
    assert isinstance(ds._x, np.memmap) and ds.image_shape == (3, 8, 8)
    assert torch.equal(ds.tensors[0], torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255)
    raw = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "x.npy").write_bytes(raw[: len(raw) - 100])
    with pytest.raises(DataError, match="truncated") as exc:
        data.load("npy", tmp_path)
    one_line(exc)


# ------------------------------------------------------------------------------------- bounded readers
def test_declared_size_is_refused_before_reading(tmp_path, monkeypatch) -> None:
    f = tmp_path / "big.npz"
    np.savez_compressed(f, x=np.zeros((4000, 32, 32, 3), np.uint8), y=np.zeros(4000, np.int64))  # 12 MB, 40 KB file
    monkeypatch.setenv("ROBUSTEST_MAX_ARRAY_BYTES", str(2**20))
    with pytest.raises(DataError, match="declares .* GiB.*--limit") as exc:
        data.load("npz", f)
    one_line(exc)
    ds = data.load("npz", f, limit=10)  # only 10 rows are decompressed
    assert len(ds) == 10


def test_npy_given_where_an_npz_is_expected(tmp_path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((3, 4, 4), np.uint8))
    for name in ("npz", "mnist"):
        with pytest.raises(DataError, match="single .npy array") as exc:
            data.load(name, tmp_path / "x.npy")
        one_line(exc)
    renamed = tmp_path / "x.npz"
    (tmp_path / "x.npy").rename(renamed)
    with pytest.raises(DataError, match="single .npy array"):
        data.load("npz", renamed)


def test_npz_with_object_arrays_and_garbage_refused(tmp_path) -> None:
    f = tmp_path / "obj.npz"
    np.savez(f, x=np.array([object()] * 3), y=np.zeros(3))
    with pytest.raises(DataError, match="pickled"):
        data.load("npz", f)
    g = tmp_path / "junk.npz"
    g.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DataError, match="truncated or corrupt"):
        data.load("npz", g)


def test_cifar_pickle_that_declares_a_huge_array_is_refused(tmp_path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()

    class Bomb:  # pickles to numpy's _reconstruct(ndarray, (huge,), b'b'): allocates before any data is read
        def __reduce__(self):
            from numpy._core.multiarray import _reconstruct

            return (_reconstruct, (np.ndarray, (10**10,), b"b"))

    raw = pickle.dumps({b"data": Bomb(), b"labels": [0]}, protocol=2)
    assert len(raw) < 300
    for name in ("test_batch",):
        (folder / name).write_bytes(raw)
    with pytest.raises(DataError, match="refused to load an array") as exc:
        data.load("cifar10", tmp_path, split="test")
    one_line(exc)


def test_class_count_is_bounded(tmp_path) -> None:
    f = tmp_path / "d.npz"
    np.savez(f, x=np.zeros((2, 4, 4), np.uint8), y=np.array([0, 10_000_000]))
    with pytest.raises(DataError, match="more than 100,000 classes") as exc:
        data.load("npz", f)
    one_line(exc)
    np.savez(f, x=np.zeros((2, 4, 4), np.uint8), y=np.array([0, 7]))
    with pytest.raises(DataError, match=r"label 7 outside \[0, 5\)"):
        data.load("npz", f, num_classes=5)
    assert len(data.load("npz", f, num_classes=8)) == 2


# ------------------------------------------------------------------------------------------- folders
def _png(path, arr) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


def test_folder_decodes_lazily_with_resize_crop_and_workers(tmp_path) -> None:
    rng = np.random.default_rng(2)
    for cls in ("a", "b"):
        for i, (h, w) in enumerate(((20, 30), (16, 16), (40, 24))):
            _png(tmp_path / cls / f"{i}.png", rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    with pytest.raises(DataError, match="different sizes.*--resize") as exc:
        data.load("folder", tmp_path)
    one_line(exc)
    ds = data.load("folder", tmp_path, resize=(12, 14), center_crop=(10, 10))
    assert isinstance(ds, FolderDataset) and len(ds) == 6 and ds.image_shape == (3, 10, 10)
    x0 = torch.cat([xb for xb, _ in batching.iter_batches(ds, 4)])
    ds.num_workers = 2
    x2 = torch.cat([xb for xb, _ in batching.iter_batches(ds, 4)])
    assert x0.shape == (6, 3, 10, 10) and torch.equal(x0, x2)
    assert torch.equal(batching.labels_of(ds), torch.tensor([0, 0, 0, 1, 1, 1]))
    with pytest.raises(DataError, match="larger than"):
        data.load("folder", tmp_path, resize=(8, 8), center_crop=(10, 10))


def test_a_damaged_image_found_while_streaming_is_one_line(tmp_path) -> None:
    for i in range(40):
        _png(tmp_path / "c" / f"{i:02d}.png", np.zeros((4, 4), np.uint8))
    (tmp_path / "c" / "03.png").write_bytes(b"\x89PNG broken")  # not among the probed headers
    ds = data.load("folder", tmp_path)
    for workers in (0, 1):
        ds.num_workers = workers
        with pytest.raises(DataError, match="03.png: cannot decode image") as exc:
            list(batching.iter_batches(ds, 8))
        one_line(exc)


# ----------------------------------------------------------------------------------- -C data sets
def _cifar_c(root, n=4, corruptions=("fog", "snow")):
    rng = np.random.default_rng(3)
    root.mkdir(parents=True, exist_ok=True)
    stacks = {}
    for c in corruptions:
        stacks[c] = rng.integers(0, 256, (5 * n, 32, 32, 3), dtype=np.uint8)
        np.save(root / f"{c}.npy", stacks[c])
    labels = np.tile(np.arange(n) % 10, 5).astype(np.uint8)
    np.save(root / "labels.npy", labels)
    return stacks, labels


def test_cifar10c_layout(tmp_path) -> None:
    stacks, labels = _cifar_c(tmp_path / "CIFAR-10-C")
    ds = data.load("cifar10-c", tmp_path / "CIFAR-10-C", corruption="fog", severity=3)
    assert len(ds) == 4 and ds.image_shape == (3, 32, 32)
    ref = torch.from_numpy(stacks["fog"][8:12]).permute(0, 3, 1, 2).float() / 255
    assert torch.equal(ds.tensors[0], ref) and ds.tensors[1].tolist() == labels[8:12].tolist()
    assert len(data.load("cifar10-c", tmp_path / "CIFAR-10-C", corruption="snow", severity=1, limit=2)) == 2
    cases = [({"corruption": "fog", "severity": 6}, "severity must be an integer 1-5"),
             ({"corruption": "fog"}, "needs a severity"),
             ({"severity": 2}, "needs a corruption .*fog, snow"),
             ({"corruption": "frost", "severity": 2}, "no corruption 'frost'.*fog, snow")]
    for kw, pattern in cases:
        with pytest.raises(DataError, match=pattern) as exc:
            data.load("cifar10-c", tmp_path / "CIFAR-10-C", **kw)
        one_line(exc)
    (tmp_path / "CIFAR-10-C" / "labels.npy").unlink()
    with pytest.raises(DataError, match="labels.npy is missing"):
        data.load("cifar10-c", tmp_path / "CIFAR-10-C", corruption="fog", severity=1)
    with pytest.raises(DataError, match="has no corruptions"):
        data.load("digits", corruption="fog")


def test_cifar100c_mnistc_imagenetc_and_tinyimagenetc(tmp_path) -> None:
    _cifar_c(tmp_path / "c100", corruptions=("glass_blur",))
    assert len(data.load("cifar100-c", tmp_path / "c100", corruption="glass_blur", severity=5)) == 4
    m = tmp_path / "mnist_c" / "shot_noise"
    m.mkdir(parents=True)
    np.save(m / "test_images.npy", np.zeros((6, 28, 28, 1), np.uint8))
    np.save(m / "test_labels.npy", np.arange(6))
    ds = data.load("mnist-c", tmp_path / "mnist_c", split="test", corruption="shot_noise")
    assert len(ds) == 6 and ds.image_shape == (1, 28, 28)
    with pytest.raises(DataError, match="single severity"):
        data.load("mnist-c", tmp_path / "mnist_c", split="test", corruption="shot_noise", severity=2)
    for name in ("imagenet-c", "tinyimagenet-c"):
        root = tmp_path / name
        for cls in ("n01", "n02"):
            _png(root / "fog" / "2" / cls / "a.png", np.zeros((9, 9, 3), np.uint8))
        ds = data.load(name, root, corruption="fog", severity=2, resize=(8, 8))
        assert isinstance(ds, FolderDataset) and len(ds) == 2 and ds.image_shape == (3, 8, 8)
        with pytest.raises(DataError, match="no severity folder 4"):
            data.load(name, root, corruption="fog", severity=4)


# --------------------------------------------------------------------------- iteration with indices
def test_shuffled_loader_indices_refer_to_the_data_set(digits_train) -> None:
    ds = digits_train
    x_all, y_all = ds.tensors
    loader = DataLoader(TensorDataset(x_all, y_all), batch_size=50, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    seen = []
    for idx, xb, yb in batching.iter_batches(loader, with_index=True):
        assert torch.equal(xb, x_all[idx]) and torch.equal(yb, y_all[idx])
        seen.append(idx)
    seen_t = torch.cat(seen)
    assert not torch.equal(seen_t, torch.arange(len(seen_t)))  # it did shuffle
    assert torch.equal(seen_t.sort().values, torch.arange(len(x_all)))
    xs, ys = batching.take(loader, torch.tensor([5, 1, 1000]))
    assert torch.equal(xs, x_all[[5, 1, 1000]]) and torch.equal(ys, y_all[[5, 1, 1000]])
    sub = DataLoader(TensorDataset(x_all, y_all), batch_size=8,
                     sampler=torch.utils.data.SubsetRandomSampler([3, 9, 27]))
    got = torch.cat([i for i, _, _ in batching.iter_batches(sub, with_index=True)])
    assert sorted(got.tolist()) == [3, 9, 27]


def test_iterable_dataset_is_numbered_in_stream_order() -> None:
    class Stream(IterableDataset):
        def __iter__(self):
            for i in range(5):
                yield torch.full((1, 2, 2), i / 10), i % 2

    got = list(batching.iter_batches(DataLoader(Stream(), batch_size=2), with_index=True))
    assert torch.cat([i for i, _, _ in got]).tolist() == [0, 1, 2, 3, 4]


def test_analysis_on_a_shuffled_loader_names_the_right_samples(trained_digits_model, digits_test) -> None:
    from robustest import weakrobust as wr

    x, y = digits_test.tensors
    plain = wr.analyze(trained_digits_model, (x, y), n_neighbors=8, eps=0.3, seed=1)
    loader = DataLoader(TensorDataset(x, y), batch_size=37, shuffle=True,
                        generator=torch.Generator().manual_seed(4))
    shuffled = wr.analyze(trained_digits_model, loader, n_neighbors=8, eps=0.3, seed=1)
    order = torch.argsort(shuffled.index)
    assert torch.equal(shuffled.index[order], plain.index)
    assert torch.equal(shuffled.label[order], y) and torch.equal(shuffled.score[order], plain.score)
    weak = wr.select_weak(shuffled, k=10)
    xs, ys = weak.take(loader)
    assert torch.equal(ys, y[weak.indices]) and torch.equal(xs, x[weak.indices])


# --------------------------------------------------------------------------------- DataLoader training
class _Counting(Dataset):
    def __init__(self, base: Dataset) -> None:
        self.base, self.calls, self.flips = base, 0, 0

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i):
        self.calls += 1
        x, y = self.base[i]
        if torch.rand(()) < 0.5:  # random augmentation: a horizontal flip
            self.flips += 1
            x = x.flip(-1)
        return x, y


def test_fit_iterates_the_loader_every_epoch(digits_train) -> None:
    from robustest import models

    base = TensorDataset(*(t[:200] for t in digits_train.tensors))
    counting = _Counting(base)
    epochs_seen = []

    class Sampler(torch.utils.data.RandomSampler):
        def set_epoch(self, epoch: int) -> None:
            epochs_seen.append(epoch)

    loader = DataLoader(counting, batch_size=32, sampler=Sampler(counting))
    torch.manual_seed(0)
    model = models.create("digits_cnn", input_size=8)
    hist = fit(model, loader, epochs=3, seed=0, progress=False)
    assert len(hist.epochs) == 3 and epochs_seen == [1, 2, 3]
    assert counting.calls >= 3 * 200 and 0 < counting.flips < counting.calls
    counting2 = _Counting(base)  # a plain Dataset goes through a shuffling loader built by fit
    fit(models.create("digits_cnn", input_size=8), counting2, epochs=2, seed=0, progress=False)
    assert counting2.calls >= 2 * 200


def test_fit_on_a_compact_dataset_equals_fit_on_its_tensors(digits_train) -> None:
    from robustest import models

    ds = ImageDataset((digits_train.tensors[0][:300] * 255).round().to(torch.uint8), digits_train.tensors[1][:300])
    xs, ys = ds.tensors
    a, b = models.create("digits_cnn", input_size=8), models.create("digits_cnn", input_size=8)
    b.load_state_dict(a.state_dict())
    fit(a, ds, epochs=2, seed=3, progress=False)
    fit(b, (xs, ys), epochs=2, seed=3, progress=False)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_channel_stats_match_the_full_tensor(digits_train) -> None:
    x = digits_train.tensors[0]
    mean, std = channel_stats(digits_train, batch_size=100)
    assert mean == pytest.approx(x.double().mean(dim=(0, 2, 3)).tolist(), abs=1e-9)
    assert std == pytest.approx(x.double().std(dim=(0, 2, 3)).tolist(), abs=1e-9)


def test_load_options_are_validated() -> None:
    with pytest.raises(DataError, match="limit must be a positive integer"):
        data.load("digits", limit=0)
    with pytest.raises(DataError, match="workers"):
        data.load("digits", workers=-1)
    with pytest.raises(DataError, match="resize"):
        data.load("digits", resize=(0, 3))
    with pytest.raises(DataError, match="unknown data set"):
        data.load("cifar-11")


def test_zip_inside_npz_is_not_read_beyond_limit(tmp_path) -> None:
    """A deflate bomb: 200 MB of zeros in a tiny npz; with --limit only the requested rows are inflated."""
    f = tmp_path / "bomb.npz"
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        header = np.lib.format.header_data_from_array_1_0(np.zeros((1, 100, 100), np.uint8))
        header["shape"] = (20000, 100, 100)
        with zf.open("x.npy", "w", force_zip64=True) as fh:
            np.lib.format.write_array_header_1_0(fh, header)
            chunk = bytes(10**6)
            for _ in range(200):
                fh.write(chunk)
        zf.writestr("y.npy", _npy_bytes(np.zeros(20000, np.int64)))
    assert f.stat().st_size < 2_000_000
    import tracemalloc

    tracemalloc.start()
    ds = data.load("npz", f, limit=5)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(ds) == 5 and peak < 20 * 2**20


def _npy_bytes(a: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()
