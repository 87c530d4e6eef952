"""The one resume format of fit, harden and enhance (robustest.train.state): what it writes, what it refuses."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from robustest.core.errors import ConfigError, DataError
from robustest.train import fit, harden
from robustest.train.state import FORMAT, VERSION, StateFile, data_digest, restore_rng, rng_state


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(32, 1, 4, 4, generator=torch.Generator().manual_seed(0)), torch.arange(32) % 3


def test_fit_and_harden_write_the_one_format(tmp_path) -> None:
    x, y = _data()
    fit(_net(), (x, y), epochs=1, batch_size=8, progress=False, state_dir=tmp_path / "f")
    harden(_net(), (x, y), "pgd-at", eps=0.1, epochs=1, steps=1, batch_size=16, state_dir=tmp_path / "h")
    for path, kind in ((tmp_path / "f" / "train_state.pt", "fit"), (tmp_path / "h" / "harden_state.pt", "harden")):
        st = torch.load(path, weights_only=True)
        assert (st["format"], st["version"], st["kind"], st["epoch"]) == (FORMAT, VERSION, kind, 1)
        assert {"settings", "fingerprint", "model", "optimizer", "schedule", "scaler", "rng", "history", "best",
                "seconds", "extra"} <= set(st)
        assert len(st["fingerprint"]) == 64 and len(st["history"]) == 1
    assert set(torch.load(tmp_path / "f" / "train_state.pt", weights_only=True)["rng"]["generators"]) == {"data"}


def _saved(tmp_path, **change) -> StateFile:
    sf = StateFile.of(tmp_path / "s.pt", "fit", {"epochs": 2}, label="state 's.pt'")
    net = _net()
    sf.save(1, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), history=[])
    st = torch.load(sf.path, weights_only=True)
    torch.save({**st, **change}, sf.path)
    return sf


@pytest.mark.parametrize(("change", "error", "words"), [
    ({"kind": "harden"}, ConfigError, "holds the state of a harden run, not of fit: delete it to start again"),
    ({"version": VERSION + 1}, DataError, "written by a newer robustest: upgrade, or delete it"),
    ({"version": 0}, ConfigError, "holds a state of version 0"),
    ({"format": "robustest-fit-state-1"}, ConfigError, r"earlier format \(robustest-fit-state-1\)"),
    ({"format": "something-else"}, ConfigError, "is not a training state robustest wrote"),
    ({"fingerprint": "0" * 64}, ConfigError, r"holds training with other settings \(epochs, data, recipe\)"),
])
def test_a_state_this_run_cannot_continue_is_refused_in_one_line(tmp_path, change, error, words) -> None:
    sf = _saved(tmp_path, **change)
    with pytest.raises(error, match=words) as exc:
        sf.load()
    assert "\n" not in str(exc.value) and str(exc.value).startswith("state 's.pt'")


def test_the_state_round_trips(tmp_path) -> None:
    sf = _saved(tmp_path)
    assert sf.load()["epoch"] == 1
    other = StateFile.of(sf.path, "fit", {"epochs": 3}, label="f")
    with pytest.raises(ConfigError, match="other settings"):
        other.load()
    x, y = _data()
    assert data_digest(x, y) == data_digest(x.clone(), y.clone()) != data_digest(x, y + 1)
    g = torch.Generator().manual_seed(3)
    rec = rng_state(None, {"data": g})
    a = torch.rand(4, generator=g), torch.rand(4)
    restore_rng(rec, None, {"data": g})
    assert torch.equal(a[0], torch.rand(4, generator=g)) and torch.equal(a[1], torch.rand(4))
