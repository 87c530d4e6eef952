"""Training, evaluation and safe checkpoints."""

from __future__ import annotations

import json
import math
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from robustest import evaluate as ev
from robustest import models
from robustest.core.errors import CheckpointError, ConfigError, DataError
from robustest.models.checkpoints import load_checkpoint, save_checkpoint
from robustest.train import History, TrainData, fit
from robustest.train.recipes import Recipe


def small_train(ds: TensorDataset, n: int = 400) -> TensorDataset:
    return TensorDataset(ds.tensors[0][:n], ds.tensors[1][:n])


def fresh_model(seed: int = 0, **kw) -> nn.Module:
    torch.manual_seed(seed)
    return models.create("digits_cnn", num_classes=10, in_channels=1, input_size=8, **kw)


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ------------------------------------------------------------------------------------------------ fit
def test_fit_reduces_loss_and_records_history(digits_train, digits_test):
    model = fresh_model()
    before_loss, before_acc = ev.loss_and_accuracy(model, digits_test)
    hist = fit(model, small_train(digits_train), epochs=3, batch_size=32, recipe=Recipe(lr=2e-3), progress=False)
    assert isinstance(hist, History) and len(hist.epochs) == 3
    assert [e.epoch for e in hist.epochs] == [1, 2, 3]
    assert hist.epochs[-1].loss < hist.epochs[0].loss
    assert all(0.0 <= e.accuracy <= 1.0 and e.seconds >= 0 and e.lr == pytest.approx(2e-3) for e in hist.epochs)
    assert all(e.val_loss is None and e.val_accuracy is None for e in hist.epochs)
    assert hist.best_epoch is None and hist.seconds > 0 and hist.last is hist.epochs[-1]
    after_loss, after_acc = ev.loss_and_accuracy(model, digits_test)
    assert after_loss < before_loss and after_acc > max(0.6, before_acc + 0.3)
    assert not model.training  # the model ends in eval mode
    d = hist.to_dict()
    assert set(d) == {"epochs", "best_epoch", "seconds"}
    assert set(d["epochs"][0]) == {"epoch", "loss", "accuracy", "lr", "seconds", "val_loss", "val_accuracy"}


def test_fit_is_deterministic_given_the_seed(digits_train):
    data = small_train(digits_train, 160)
    a, b, c = fresh_model(), fresh_model(), fresh_model()
    ha = fit(a, data, epochs=2, seed=5, progress=False)
    hb = fit(b, data, epochs=2, seed=5, progress=False)
    fit(c, data, epochs=2, seed=6, progress=False)
    assert same_weights(a, b)
    assert [e.loss for e in ha.epochs] == [e.loss for e in hb.epochs]
    assert not same_weights(a, c)  # the seed drives shuffling and dropout


@pytest.mark.parametrize("form", ["pair", "dataloader"])
def test_fit_accepts_data_forms(digits_train, form):
    data = small_train(digits_train, 128)
    train = (data.tensors[0], data.tensors[1]) if form == "pair" else DataLoader(data, batch_size=50)
    hist = fit(fresh_model(), train, epochs=1, batch_size=32, progress=False)
    assert len(hist.epochs) == 1 and math.isfinite(hist.last.loss)


@pytest.mark.parametrize("optimizer, schedule", [("sgd", None), ("adam", "cosine"), ("sgd", "step")])
def test_fit_optimizers_and_schedules(digits_train, optimizer, schedule):
    data = small_train(digits_train, 128)
    hist = fit(fresh_model(), data, epochs=2, batch_size=32,
               recipe=Recipe(lr=0.01, optimizer=optimizer, schedule=schedule, weight_decay=1e-4), progress=False)
    assert math.isfinite(hist.last.loss)
    if schedule is not None:
        assert hist.last.lr < 0.01  # decayed by the end of training
    else:
        assert hist.last.lr == pytest.approx(0.01)


def test_fit_with_validation_and_keep_best(digits_train):
    x, y = digits_train.tensors[0][:300], digits_train.tensors[1][:300]
    # validation labels shifted by one: the better the model learns, the worse it does here, so the best
    # validation epoch is an early one and restoring it must change the weights back
    val = (x[:150], (y[:150] + 1) % 10)
    model = fresh_model()
    hist = fit(model, (x, y), epochs=4, recipe=Recipe(lr=3e-3), val=val, keep="best", progress=False)
    vals = [e.val_accuracy for e in hist.epochs]
    assert all(v is not None and 0 <= v <= 1 for v in vals)
    assert all(e.val_loss is not None and e.val_loss > 0 for e in hist.epochs)
    assert hist.best_epoch == 1 + int(np.argmax(vals)) and hist.best_epoch < 4
    assert ev.accuracy(model, val) == pytest.approx(max(vals))  # the best weights are back
    assert ev.accuracy(model, (x, y)) < hist.last.accuracy - 0.1
    assert hist.to_dict()["best_epoch"] == hist.best_epoch
    assert not model.training


@pytest.mark.parametrize("kwargs, pattern", [
    ({"epochs": -1}, "epochs"),
    ({"epochs": 1, "batch_size": 0}, "batch_size"),
    ({"epochs": 1, "recipe": Recipe(lr=0.0)}, "lr"),
    ({"epochs": 1, "recipe": Recipe(optimizer="rmsprop")}, "optimizer"),
    ({"epochs": 1, "recipe": Recipe(schedule="linear")}, "schedule"),
    ({"epochs": 1, "recipe": {"lr": 0.1}}, r"recipe must be a robustest.train.recipes.Recipe \(or None for the "
                                            r"defaults\), got dict"),
    ({"epochs": 1, "keep": "best"}, "val"),
    ({"epochs": 1, "keep": "first"}, "keep must be 'best'"),
    ({"epochs": 1, "resume": True}, "resume=True needs the state_dir"),
    ({"epochs": 1, "device": "nonsense"}, "device"),
])
def test_fit_bad_arguments(digits_train, kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern) as exc:
        fit(fresh_model(), small_train(digits_train, 64), progress=False, **kwargs)
    assert "\n" not in str(exc.value)


def test_fit_needs_labels(digits_train):
    with pytest.raises(ConfigError, match="labels"):
        fit(fresh_model(), digits_train.tensors[0][:32], epochs=1, progress=False)


def test_fit_validates_inputs_up_front(digits_train):
    """Regression: labels outside the model's classes or images outside [0, 1] must be DataErrors, not
    IndexErrors from the loss or silent training on the wrong scale."""
    x, y = digits_train.tensors[0][:32], digits_train.tensors[1][:32]
    model = fresh_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for bad, pattern in [((x, y + 10), r"outside \[0, 10\)"), ((x * 255, y), r"\[0, 1\]"),
                         ((x, y.float()), "integer"), ((x[:, 0], y), "N x C x H x W")]:
        with pytest.raises(DataError, match=pattern):
            fit(model, bad, epochs=1, progress=False)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing trained


def test_fit_zero_epochs_is_a_no_op(digits_train):
    model = fresh_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hist = fit(model, small_train(digits_train, 64), epochs=0, progress=False)
    assert hist.epochs == [] and same_weights(model, model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ------------------------------------------------------------------------------------ evaluate/predict
def test_accuracy_evaluate_predict(trained_digits_model, digits_test):
    model = trained_digits_model
    x, y = digits_test.tensors
    logits = ev.predict(model, digits_test, batch_size=100)
    assert logits.shape == (360, 10) and logits.device.type == "cpu"
    with torch.no_grad():
        torch.testing.assert_close(logits, model(x))
    acc = ev.accuracy(model, digits_test, batch_size=7)
    assert acc == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    assert acc >= 0.9
    loss, acc2 = ev.loss_and_accuracy(model, (x, y))
    assert acc2 == acc
    assert loss == pytest.approx(float(nn.functional.cross_entropy(logits, y)), rel=1e-4)
    torch.testing.assert_close(ev.predict(model, x), logits)  # a bare tensor works for predict


@pytest.mark.parametrize("fn", ["accuracy", "loss_and_accuracy", "predict"])
def test_eval_functions_restore_model_mode(trained_digits_model, digits_test, fn):
    model = trained_digits_model.train()
    outs = [getattr(ev, fn)(model, digits_test) for _ in range(2)]
    assert model.training and all(m.training for m in model.modules())
    if fn == "predict":
        torch.testing.assert_close(outs[0], outs[1])  # eval mode inside: dropout off, deterministic
    else:
        assert outs[0] == outs[1]
    model.eval()
    ev.accuracy(model, digits_test)
    assert not model.training


def test_evaluate_errors(trained_digits_model, digits_test):
    with pytest.raises(ConfigError, match="labels"):
        ev.loss_and_accuracy(trained_digits_model, digits_test.tensors[0])
    with pytest.raises(ConfigError, match="empty"):
        ev.loss_and_accuracy(trained_digits_model, (torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long)))


# ----------------------------------------------------------------------------------------- checkpoints
def test_checkpoint_round_trip(tmp_path, trained_digits_model, digits_test):
    model = models.create("digits_cnn", num_classes=10, in_channels=1, input_size=8, mean=0.3, std=0.4)
    model.net.load_state_dict(trained_digits_model.state_dict())
    model.eval()
    meta = {"dataset": "digits", "test_accuracy": 0.97, "epochs": [1, 2], "nested": {"a": None, "b": True}}
    p = save_checkpoint(tmp_path / "sub" / "model.pt", model, metadata=meta)
    assert sorted(os.listdir(tmp_path / "sub")) == ["model.pt"]  # atomic write: no temp files left
    loaded = load_checkpoint(p)
    assert not loaded.training
    assert loaded.robustest_metadata == meta
    assert models.spec_of(loaded) == models.spec_of(model)
    x = digits_test.tensors[0]
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    payload = torch.load(p, weights_only=True)  # plain data only
    assert payload["format"] == "robustest-checkpoint" and payload["spec"]["name"] == "digits_cnn"
    loaded2 = load_checkpoint(str(p), map_location=torch.device("cpu"))
    assert same_weights(loaded, loaded2)


def test_checkpoint_with_explicit_spec_and_no_metadata(tmp_path):
    torch.manual_seed(1)
    net = models.lenet1()  # a builder called directly carries no spec: saved as weights of its class
    save_checkpoint(tmp_path / "plain.pt", net)
    with pytest.raises(CheckpointError, match="built outside robustest.*--model pkg.module:factory"):
        load_checkpoint(tmp_path / "plain.pt")
    from robustest.models.checkpoints import restore_weights

    other = models.lenet1()
    assert same_weights(restore_weights(other, tmp_path / "plain.pt"), net)
    spec = {"name": "lenet1", "num_classes": 10, "in_channels": 1, "input_size": 28}
    save_checkpoint(tmp_path / "m.pt", net, spec=spec)
    loaded = load_checkpoint(tmp_path / "m.pt")
    assert same_weights(loaded, net) and loaded.robustest_metadata == {}


def test_checkpoint_metadata_with_numpy_values_loads(tmp_path, digits_model):
    """Regression: NumPy scalars/arrays in metadata wrote a checkpoint that weights_only loading refused."""
    meta = {"acc": np.float64(0.5), "n": np.int64(3), "arr": np.arange(3), "t": (1, 2), "path": tmp_path,
            "tensor": torch.tensor([1.0, 2.0])}
    save_checkpoint(tmp_path / "m.pt", digits_model, metadata=meta)
    got = load_checkpoint(tmp_path / "m.pt").robustest_metadata
    assert got["acc"] == 0.5 and type(got["acc"]) is float
    assert got["n"] == 3 and got["arr"] == [0, 1, 2] and list(got["t"]) == [1, 2] and got["path"] == str(tmp_path)
    assert torch.equal(got["tensor"], torch.tensor([1.0, 2.0]))


def test_checkpoint_metadata_with_objects_refused_at_save(tmp_path, digits_model):
    with pytest.raises(ConfigError, match="metadata") as exc:
        save_checkpoint(tmp_path / "m.pt", digits_model, metadata={"model": nn.Linear(2, 2)})
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "m.pt").exists() and os.listdir(tmp_path) == []


def assert_refused(path, pattern: str) -> str:
    with pytest.raises(CheckpointError, match=pattern) as exc:
        load_checkpoint(path)
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg
    return msg


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_whole_pickled_model_refused(tmp_path, digits_model):
    torch.save(digits_model, tmp_path / "whole.pt")
    assert_refused(tmp_path / "whole.pt", "pickled Python objects")
    torch.save(digits_model, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    assert_refused(tmp_path / "legacy.pt", "pickled Python objects")
    marker = tmp_path / "pwned"
    torch.save({"format": "robustest-checkpoint", "x": _Evil(marker)}, tmp_path / "evil.pt")
    assert_refused(tmp_path / "evil.pt", "pickled Python objects")
    with open(tmp_path / "plain.pkl", "wb") as fh:
        pickle.dump(_Evil(marker), fh)
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "plain.pkl")
    assert not marker.exists()


def test_random_and_empty_files_refused(tmp_path):
    (tmp_path / "rand.pt").write_bytes(np.random.default_rng(0).bytes(2000))
    msg = assert_refused(tmp_path / "rand.pt", "not a robustest checkpoint")
    assert "whole saved model" not in msg  # a corrupt file is not mistaken for a pickled model
    (tmp_path / "empty.pt").write_bytes(b"")
    assert_refused(tmp_path / "empty.pt", "not a robustest checkpoint")
    (tmp_path / "text.pt").write_text("hello\n")
    assert_refused(tmp_path / "text.pt", "not a robustest checkpoint")
    with zipfile.ZipFile(tmp_path / "z.pt", "w") as zf:
        zf.writestr("x/data.txt", "nothing")
    assert_refused(tmp_path / "z.pt", "not a robustest checkpoint")
    assert_refused(tmp_path / "missing.pt", "does not exist")


def test_truncated_checkpoint_refused(tmp_path, digits_model):
    p = save_checkpoint(tmp_path / "m.pt", digits_model)
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) // 2])
    assert_refused(p, "not a robustest checkpoint")


def test_bare_state_dict_and_other_payloads_refused(tmp_path, digits_model):
    torch.save(digits_model.state_dict(), tmp_path / "sd.pt")
    assert_refused(tmp_path / "sd.pt", "bare state_dict")
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    assert_refused(tmp_path / "list.pt", "not a robustest checkpoint")
    good = torch.load(save_checkpoint(tmp_path / "g.pt", digits_model), weights_only=True)
    for change, pattern in [({"version": 99}, "newer"), ({"spec": None}, "no model spec"),
                            ({"spec": {"name": "vgg"}}, "cannot rebuild"),
                            ({"state_dict": {"w": torch.zeros(1)}}, "do not fit"),
                            ({"spec": dict(good["spec"], num_classes=4)}, "do not fit")]:
        torch.save({**good, **change}, tmp_path / "bad.pt")
        assert_refused(tmp_path / "bad.pt", pattern)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit is deprecated upstream but still loads
def test_torchscript_needs_explicit_option(tmp_path, trained_digits_model, digits_test):
    x = digits_test.tensors[0][:16]
    scripted = torch.jit.trace(trained_digits_model.eval(), x[:1])
    torch.jit.save(scripted, str(tmp_path / "ts.pt"))
    assert_refused(tmp_path / "ts.pt", "TorchScript")
    loaded = load_checkpoint(tmp_path / "ts.pt", torchscript=True)
    assert loaded.robustest_metadata == {} and not loaded.training
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), trained_digits_model(x))
    # torchscript=True still loads ordinary checkpoints the safe way
    p = save_checkpoint(tmp_path / "m.pt", trained_digits_model)
    assert same_weights(load_checkpoint(p, torchscript=True), trained_digits_model)


def test_save_overwrites_atomically(tmp_path, digits_model, trained_digits_model):
    p = tmp_path / "m.pt"
    save_checkpoint(p, digits_model, metadata={"v": 1})
    save_checkpoint(p, trained_digits_model, metadata={"v": 2})
    loaded = load_checkpoint(p)
    assert loaded.robustest_metadata == {"v": 2} and same_weights(loaded, trained_digits_model)
    assert os.listdir(tmp_path) == ["m.pt"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_load_to_missing_cuda_is_a_config_error(tmp_path, digits_model):
    """Regression: map_location='cuda' without CUDA reported a valid file as 'not a robustest checkpoint'."""
    p = save_checkpoint(tmp_path / "m.pt", digits_model)
    with pytest.raises(ConfigError, match="CUDA is not available"):
        load_checkpoint(p, map_location="cuda")
    assert same_weights(load_checkpoint(p, map_location="cpu"), digits_model)


def test_fit_stops_with_one_line_when_the_loss_is_not_finite(exploding_model) -> None:
    from robustest.core.errors import TrainingDiverged

    x, y = torch.rand(16, 1, 8, 8), torch.arange(16) % 3
    with pytest.raises(TrainingDiverged, match=r"training diverged at epoch 1: the loss is nan"):
        fit(exploding_model, (x, y), epochs=1, progress=False)


def test_train_data_splits_each_global_batch_between_ranks() -> None:
    from robustest.core.distributed import Shard

    x, y = torch.rand(21, 1, 4, 4), torch.arange(21) % 3
    whole = [idx for idx, _, _ in TrainData((x, y), 8, seed=4).indexed_epoch(1, 3)]
    parts = []
    for rank in (0, 1):
        src = TrainData((x, y), 8, seed=4, shard=Shard(rank, 2))
        got = []
        for idx, xb, yb in src.indexed_epoch(1, 3):
            assert torch.equal(xb, x[idx]) and torch.equal(yb, y[idx])
            got.append((idx, src.batch_weight))
        assert len(got) == src.steps_per_epoch == 3
        parts.append(got)
    for k, full in enumerate(whole):  # batches of 8, 8, 5: each rank holds its contiguous half
        a, b = parts[0][k][0], parts[1][k][0]
        assert torch.equal(torch.cat([a, b]), full)
        # the weights make DDP's average of the two ranks' mean losses the global batch's mean loss
        wa, wb = parts[0][k][1], parts[1][k][1]
        assert abs((wa + wb) / 2 - 1.0) < 1e-9 and abs(wa / len(a) - 2 / len(full)) < 1e-9
        assert abs(wb / len(b) - 2 / len(full)) < 1e-9
    single = TrainData((x[:17], y[:17]), 8, seed=4, shard=Shard(0, 2))  # tail of 1 < 2 ranks: skipped
    assert single.steps_per_epoch == 2 and len(list(single.indexed_epoch(1, 3))) == 2


def test_resume_with_another_number_of_ranks_is_one_line(tmp_path) -> None:
    x, y = torch.rand(32, 1, 4, 4), torch.arange(32) % 3
    state = tmp_path / "train_state.pt"

    def net() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))

    fit(net(), (x, y), epochs=2, batch_size=8, progress=False, state_dir=tmp_path)
    st = torch.load(state, weights_only=True)
    settings = json.loads(st["settings"])
    st["settings"] = json.dumps({**settings, "world_size": 2}, sort_keys=True)  # as a 2-rank DDP run writes it
    torch.save(st, state)
    with pytest.raises(ConfigError, match=r"training by 2 process\(es\) and this run has 1: .*--nproc-per-node 2"):
        fit(net(), (x, y), epochs=2, batch_size=8, progress=False, state_dir=tmp_path, resume=True)
