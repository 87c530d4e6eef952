"""Runtime helpers: batching, modes, validation, devices, atomic writes, seeding."""

from __future__ import annotations

import json
import math
import os
import stat

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from robustest.core import atomic, batching, devices, distributed, inputs, modelcall, progress, seeding, tasks
from robustest.core.errors import ConfigError, DataError


class PairDataset(Dataset):
    """A plain (non-Tensor) Dataset returning (image, int label)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], int(self.y[i])


class ImageOnlyDataset(PairDataset):
    def __getitem__(self, i: int):
        return self.x[i]


@pytest.fixture
def xy():
    x = torch.rand(10, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    y = torch.arange(10) % 3
    return x, y


def collect(it):
    return list(it)


# ---------------------------------------------------------------------------------------------- batching
@pytest.mark.parametrize("kind", ["pair", "list", "tensordataset", "dataset", "dataloader"])
def test_iter_batches_order_and_with_index(xy, kind):
    x, y = xy
    data = {"pair": (x, y), "list": [x, y], "tensordataset": TensorDataset(x, y), "dataset": PairDataset(x, y),
            "dataloader": DataLoader(TensorDataset(x, y), batch_size=4)}[kind]
    batches = collect(batching.iter_batches(data, batch_size=4))
    assert [len(b[0]) for b in batches] == [4, 4, 2]
    assert torch.equal(torch.cat([b[0] for b in batches]), x)
    assert torch.equal(torch.cat([b[1] for b in batches]).long(), y)
    indexed = collect(batching.iter_batches(data, batch_size=4, with_index=True))
    assert torch.equal(torch.cat([b[0] for b in indexed]), torch.arange(10))
    assert all(b[0].dtype == torch.int64 for b in indexed)
    for idx, xb, _ in indexed:
        assert torch.equal(xb, x[idx])
    assert batching.num_samples(data) == 10


def test_iter_batches_bare_tensor_and_device(xy):
    x, _ = xy
    batches = collect(batching.iter_batches(x, batch_size=3, device="cpu"))
    assert [len(b[0]) for b in batches] == [3, 3, 3, 1]
    assert all(b[1] is None for b in batches)
    assert all(b[0].device.type == "cpu" for b in batches)
    idx = collect(batching.iter_batches(x, batch_size=3, with_index=True))
    assert idx[-1][0].tolist() == [9]
    assert batching.num_samples(x) == 10


def test_iter_batches_image_only_dataset_and_loader(xy):
    x, _ = xy
    out = collect(batching.iter_batches(ImageOnlyDataset(x, x), batch_size=6))
    assert [b[1] for b in out] == [None, None]
    assert torch.equal(torch.cat([b[0] for b in out]), x)
    out = collect(batching.iter_batches(DataLoader(x, batch_size=6), batch_size=99))
    assert torch.equal(torch.cat([b[0] for b in out]), x) and out[0][1] is None


def test_iter_batches_slices_not_copies(xy):
    x, y = xy
    xb, _ = next(batching.iter_batches((x, y), batch_size=4))
    assert xb.data_ptr() == x.data_ptr()  # a view of the input, no per-sample copy


def test_iter_batches_errors(xy):
    x, y = xy
    with pytest.raises(ConfigError, match="batch_size"):
        collect(batching.iter_batches((x, y), batch_size=0))
    with pytest.raises(DataError, match="10 samples but y has 9"):
        collect(batching.iter_batches((x, y[:9]), batch_size=4))


def test_as_tensors_variants(xy):
    x, y = xy
    for data in ((x, y), TensorDataset(x, y), PairDataset(x, y), DataLoader(TensorDataset(x, y), batch_size=3)):
        ax, ay = batching.as_tensors(data)
        assert torch.equal(ax, x) and torch.equal(ay.long(), y)
    ax, ay = batching.as_tensors(x)
    assert ax is x and ay is None
    ax, ay = batching.as_tensors((x, [0] * 10))
    assert ay.tolist() == [0] * 10
    for short in (y[:9], [0] * 11):  # one label per image, or a one-line error naming both counts
        with pytest.raises(DataError, match=rf"^x has 10 samples but y has {len(short)}: give one label per image$"):
            batching.as_tensors((x, short))


def test_as_tensors_single_tensor_dataset(xy):
    """Regression: a one-tensor TensorDataset used to recurse until RecursionError."""
    x, _ = xy
    ax, ay = batching.as_tensors(TensorDataset(x))
    assert torch.equal(ax, x) and ay is None
    batches = collect(batching.iter_batches(TensorDataset(x), batch_size=4))
    assert torch.equal(torch.cat([b[0] for b in batches]), x) and batches[0][1] is None


def test_as_tensors_unsupported_types_are_a_data_error(xy):
    """Regression: NumPy pairs and other objects used to recurse until RecursionError."""
    x, y = xy
    for bad in ((x.numpy(), y.numpy()), "data", 3, None):
        with pytest.raises(DataError, match="unsupported data") as exc:
            batching.as_tensors(bad)
        assert "\n" not in str(exc.value)
        with pytest.raises(DataError):
            collect(batching.iter_batches(bad, batch_size=4))


def test_as_tensors_empty_dataset():
    with pytest.raises(DataError, match="empty"):
        batching.as_tensors(PairDataset(torch.zeros(0, 1, 2, 2), torch.zeros(0)))


def test_shard_bounds():
    assert distributed.Shard().bounds(10) == (0, 10)
    parts = [distributed.Shard(r, 3).bounds(10) for r in range(3)]
    assert parts == [(0, 4), (4, 8), (8, 10)]
    assert distributed.Shard(3, 4).bounds(3) == (3, 3)  # more ranks than samples: empty tail
    assert distributed.Shard(0, 2).bounds(0) == (0, 0)
    assert distributed.Shard.current() == distributed.Shard(0, 1)
    covered = [i for r in range(4) for i in range(*distributed.Shard(r, 4).bounds(11))]
    assert covered == list(range(11))


def test_iter_batches_with_shard(xy):
    """Rank parts are contiguous and start on multiples of the batch size, so every rank sees exactly the
    batches one process would (10 samples in batches of 3: rank 0 reads [0, 6), rank 1 [6, 10))."""
    x, y = xy
    out = collect(batching.iter_batches((x, y), batch_size=3, with_index=True, shard=distributed.Shard(1, 2)))
    assert [b[0].tolist() for b in out] == [[6, 7, 8], [9]]
    out = collect(batching.iter_batches(PairDataset(x, y), batch_size=3, with_index=True,
                                        shard=distributed.Shard(1, 2)))
    assert torch.cat([b[0] for b in out]).tolist() == [6, 7, 8, 9]
    assert torch.equal(torch.cat([b[1] for b in out]), x[6:])
    whole = [b[0].tolist() for b in collect(batching.iter_batches((x, y), batch_size=3, with_index=True))]
    parts = [b[0].tolist() for r in range(2) for b in collect(
        batching.iter_batches((x, y), batch_size=3, with_index=True, shard=distributed.Shard(r, 2)))]
    assert parts == whole
    spanned = collect(batching.iter_batches((x, y), batch_size=3, with_index=True, span=(2, 9)))
    assert [b[0].tolist() for b in spanned] == [[2, 3, 4], [5, 6, 7], [8]]


def test_iter_batches_align_balances_the_rank_parts(xy):
    """With batches larger than a rank's fair share, parts aligned to batches leave rank 1 idle; a small
    ``align`` splits the samples evenly (10 samples, batches of 8, align 2: [0, 6) and [6, 10))."""
    x, y = xy
    by_batch = [collect(batching.iter_batches((x, y), batch_size=8, with_index=True, shard=distributed.Shard(r, 2)))
                for r in range(2)]
    assert [sum(len(b[0]) for b in part) for part in by_batch] == [8, 2]
    aligned = [collect(batching.iter_batches((x, y), batch_size=8, with_index=True, shard=distributed.Shard(r, 2),
                                            align=2)) for r in range(2)]
    assert [[b[0].tolist() for b in part] for part in aligned] == [[[0, 1, 2, 3, 4, 5]], [[6, 7, 8, 9]]]
    with pytest.raises(ConfigError, match="align"):
        collect(batching.iter_batches((x, y), batch_size=8, align=0))


# ------------------------------------------------------------------------------------------------ modes
def make_net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_eval_mode_restores_each_module():
    net = make_net().train()
    net[1].eval()  # a mixed state must come back exactly
    before = [m.training for m in net.modules()]
    with modelcall.eval_mode(net) as m:
        assert m is net and not any(mod.training for mod in net.modules())
    assert [m.training for m in net.modules()] == before
    with pytest.raises(RuntimeError, match="boom"), modelcall.eval_mode(net):
        raise RuntimeError("boom")
    assert [m.training for m in net.modules()] == before


def test_frozen_params_restores_flags():
    net = make_net()
    net[0].weight.requires_grad_(False)
    before = [p.requires_grad for p in net.parameters()]
    x = torch.rand(3, 4, requires_grad=True)
    with modelcall.frozen_params(net), modelcall.eval_mode(net):
        assert not any(p.requires_grad for p in net.parameters())
        net(x).sum().backward()
        assert x.grad is not None and all(p.grad is None for p in net.parameters())
    assert [p.requires_grad for p in net.parameters()] == before
    with pytest.raises(ValueError), modelcall.frozen_params(net):
        raise ValueError
    assert [p.requires_grad for p in net.parameters()] == before


# ------------------------------------------------------------------------------------------- validation
def test_check_images_accepts_and_returns():
    x = torch.rand(2, 1, 3, 3)
    assert inputs.check_images(x) is x
    one = inputs.check_images(torch.rand(1, 3, 3), allow_3d=True)
    assert one.shape == (1, 1, 3, 3)
    assert inputs.check_images(torch.zeros(0, 1, 3, 3)).shape[0] == 0
    inputs.check_images(torch.ones(1, 1, 2, 2, dtype=torch.float64))
    u8 = torch.full((1, 1, 2, 2), 255, dtype=torch.uint8)
    assert inputs.check_images(u8, allow_uint8=True) is u8
    with pytest.raises(DataError, match="N x C x H x W"):
        inputs.check_images(u8[0], allow_uint8=True)
    with pytest.raises(DataError, match="floating point"):
        inputs.check_images(u8.to(torch.int16), allow_uint8=True)


@pytest.mark.parametrize("bad, pattern", [
    (np.zeros((1, 1, 2, 2)), "torch.Tensor"),
    (torch.zeros(1, 2, 2), "N x C x H x W"),
    (torch.zeros(1, 1, 2, 2, dtype=torch.uint8), "floating point"),
    (torch.full((1, 1, 2, 2), float("nan")), "NaN"),
    (torch.full((1, 1, 2, 2), float("inf")), "infinite"),
    (torch.full((1, 1, 2, 2), 2.0), r"\[0, 1\]"),
    (torch.full((1, 1, 2, 2), -0.1), r"\[0, 1\]"),
])
def test_check_images_errors(bad, pattern):
    with pytest.raises(DataError, match=pattern) as exc:
        inputs.check_images(bad, name="imgs")
    assert "imgs" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_check_images_finds_one_bad_value_among_valid_ones(dtype, bad):
    # the check is one min/max pass: a single NaN or infinity among valid pixels must still be caught
    x = torch.rand(3, 2, 5, 5).to(dtype)
    x[2, 1, 4, 3] = bad
    with pytest.raises(DataError, match="NaN or infinite"):
        inputs.check_images(x)


def test_checked_inputs_from_tensors_and_datasets():
    x, y = torch.rand(4, 1, 3, 3), torch.tensor([0, 1, 2, 1])
    assert batching.checked_inputs(x) == (x, None)
    assert batching.checked_inputs(x, y)[1] is y
    xs, ys = batching.checked_inputs(TensorDataset(x, y))
    assert torch.equal(xs, x) and torch.equal(ys, y)
    other = torch.tensor([2, 2, 2, 2])
    assert torch.equal(batching.checked_inputs(TensorDataset(x, y), other)[1], other)  # given labels win
    with pytest.raises(DataError, match=r"\[0, 1\]"):
        batching.checked_inputs(x * 2)
    with pytest.raises(DataError, match=r"shape \[4\]"):
        batching.checked_inputs(x, y[:3])


def test_check_labels():
    y = torch.tensor([0, 2, 1])
    assert inputs.check_labels(y, 3, num_classes=3) is y
    inputs.check_labels(y.int(), 3)
    inputs.check_labels(torch.zeros(0, dtype=torch.long), 0, num_classes=3)
    cases = [
        ([0, 1, 2], 3, None, "torch.Tensor"),
        (torch.tensor([[0, 1, 2]]), 3, None, "one-hot"),
        (torch.tensor([0, 1]), 3, None, r"shape \[3\]"),
        (torch.tensor([0.0, 1.0, 2.0]), 3, None, "integer"),
        (torch.tensor([True, False, True]), 3, None, "integer"),
        (torch.tensor([0, 1, 3]), 3, 3, r"outside \[0, 3\)"),
        (torch.tensor([0, -1, 2]), 3, 3, r"outside \[0, 3\)"),
    ]
    for bad, n, k, pattern in cases:
        with pytest.raises(DataError, match=pattern):
            inputs.check_labels(bad, n, num_classes=k)


# ---------------------------------------------------------------------------------------------- devices
def test_resolve_device():
    net = nn.Linear(2, 2)
    assert devices.resolve_device(net) == torch.device("cpu")
    assert devices.resolve_device() == torch.device("cpu")
    assert devices.resolve_device(net, "cpu") == torch.device("cpu")
    assert devices.resolve_device(None, torch.device("cpu")) == torch.device("cpu")
    auto = devices.resolve_device(None, "auto")
    assert auto.type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="unknown device"):
        devices.resolve_device(net, "tpu-ish")
    assert devices.model_device(nn.ReLU()) == torch.device("cpu")
    assert devices.model_device(nn.BatchNorm1d(2, affine=False)) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_config_error():
    for dev in ("cuda", "cuda:0", torch.device("cuda")):
        with pytest.raises(ConfigError, match="CUDA is not available"):
            devices.resolve_device(nn.Linear(2, 2), dev)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device_from_model():  # pragma: no cover - runs only with a GPU
    net = nn.Linear(2, 2).cuda()
    assert devices.resolve_device(net).type == "cuda"
    x = torch.rand(5, 1, 2, 2)
    xb, _ = next(batching.iter_batches(x, batch_size=5, device="cuda"))
    assert xb.is_cuda


# ---------------------------------------------------------------------------------------------- seeding
def test_seed_everything_and_generators():
    import random

    seeding.seed_everything(123)
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    seeding.seed_everything(123)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a
    seeding.seed_everything(2**40 + 5)  # large seeds are fine for every generator
    g1, g2 = seeding.make_generator(7), seeding.make_generator(7)
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))
    assert seeding.make_generator(None).device.type == "cpu"
    assert not torch.equal(torch.rand(4, generator=seeding.make_generator(1)),
                           torch.rand(4, generator=seeding.make_generator(2)))


# ----------------------------------------------------------------------------------------- atomic writes
def test_atomic_writes(tmp_path):
    p = atomic.atomic_write_bytes(tmp_path / "a" / "b.bin", b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    atomic.atomic_write_text(tmp_path / "t.txt", "héllo")
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "héllo"
    obj = {"nan": float("nan"), "inf": math.inf, "t": torch.tensor([1.5, 2.0]), "np": np.float32(0.5),
           "arr": np.arange(3), "tup": (1, 2), "path": tmp_path, 3: "int key"}
    atomic.atomic_write_json(tmp_path / "r.json", obj)
    back = json.loads((tmp_path / "r.json").read_text())
    assert back == {"nan": None, "inf": None, "t": [1.5, 2.0], "np": 0.5, "arr": [0, 1, 2], "tup": [1, 2],
                    "path": str(tmp_path), "3": "int key"}
    atomic.atomic_save({"w": torch.ones(2)}, tmp_path / "s.pt")
    assert torch.equal(torch.load(tmp_path / "s.pt", weights_only=True)["w"], torch.ones(2))
    atomic.atomic_write_text(tmp_path / "t.txt", "replaced")
    assert (tmp_path / "t.txt").read_text() == "replaced"
    assert sorted(os.listdir(tmp_path)) == ["a", "r.json", "s.pt", "t.txt"]  # no temp files left


def test_atomic_write_failure_leaves_old_file_and_no_temp(tmp_path):
    p = tmp_path / "r.json"
    atomic.atomic_write_json(p, {"a": 1})
    with pytest.raises(TypeError):
        atomic.atomic_write_json(p, {"a": object()})
    assert json.loads(p.read_text()) == {"a": 1}
    with pytest.raises(TypeError):
        atomic.atomic_write_bytes(p, "not bytes")  # type: ignore[arg-type]
    assert json.loads(p.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["r.json"]


def test_atomic_write_respects_umask(tmp_path):
    """Regression: files came out 0600 (mkstemp's mode) instead of following the umask like open()."""
    old = os.umask(0o022)
    try:
        p = atomic.atomic_write_text(tmp_path / "r.txt", "x")
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o644


def test_progress():
    items = [1, 2, 3]
    assert progress.progress(items, enabled=False) is items
    assert list(progress.progress(items, enabled=True, desc="x")) == items


def test_load_plain_reads_tagged_files_and_refuses_others(tmp_path):
    import pickle

    from robustest.core.atomic import atomic_save
    from robustest.core.reading import load_plain

    good = tmp_path / "good.pt"
    atomic_save({"format": "robustest-thing", "x": torch.arange(3)}, good)
    assert torch.equal(load_plain(good, fmt="robustest-thing", what="thing file", fix="make one")["x"], torch.arange(3))
    with pytest.raises(DataError, match="is not a thing file: make one"):
        load_plain(good, fmt="robustest-other", what="thing file", fix="make one")
    with pytest.raises(DataError, match="does not exist: make one"):
        load_plain(tmp_path / "missing.pt", fmt="robustest-thing", what="thing file", fix="make one")
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps(DataError("x")))  # an arbitrary class: refused by weights_only loading
    with pytest.raises(DataError, match="cannot be read safely"):
        load_plain(evil, fmt="robustest-thing", what="thing file", fix="make one")


def test_run_tasks_returns_results_in_task_order_and_raises_a_task_error():
    import threading

    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            names: set[str] = set()

            def task(i: int, names: set[str] = names) -> int:
                names.add(threading.current_thread().name)
                return 3 * i

            assert tasks.run_tasks(9, task) == [3 * i for i in range(9)]
            assert tasks.run_tasks(0, task) == []
            assert any(n.startswith("robustest-tasks") for n in names) == (threads == 2)

            def failing(i: int) -> int:
                if i == 5:
                    raise ValueError("task 5 failed")
                return i

            with pytest.raises(ValueError, match="task 5 failed"):
                tasks.run_tasks(8, failing)
    finally:
        torch.set_num_threads(before)
