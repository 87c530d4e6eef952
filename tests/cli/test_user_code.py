"""The user's own code through the CLI: a model factory that raises, a forward that raises on the first batch,
and a hardened own model reloaded with one flag. Each failure of the user's code is bad input (exit 2) with one
line naming that code, never an internal error."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

from cli_runner import run_cli

USER_CODE = textwrap.dedent('''
    import torch
    from torch import nn


    def raising(**kwargs):
        raise ValueError("bad width")


    class Exploding(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            if bool(x.abs().sum() > 0):  # a blank probe image passes, real images do not
                raise RuntimeError("forward exploded")
            return self.head(x.flatten(1))


    def exploding():
        return Exploding()


    def small(num_classes=10):
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))
''')


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    """A folder holding usermods.py (on sys.path) and exploding.pt (weights of usermods:exploding)."""
    (tmp_path / "usermods.py").write_text(USER_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "usermods", raising=False)
    import usermods

    torch.save(usermods.exploding().state_dict(), tmp_path / "exploding.pt")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("usermods", None)


def one_line(code: int, err: str, status: int = 2) -> str:
    assert code == status, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and ": warning: " not in line]
    assert len(lines) == 1, err
    return lines[0]


VERBS = {
    "eval": ["eval", "--dataset", "digits", "--limit", "16", "--eps", "0.1", "--version", "fast"],
    "score": ["score", "--dataset", "digits", "--limit", "16", "--metric", "gini"],
    "harden": ["harden", "--dataset", "digits", "--limit", "32", "--eps", "0.1", "--epochs", "1"],
    "suite": ["suite", "build", "--dataset", "digits", "--limit", "40", "--eps", "0.1", "--k", "10"],
}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_raising_factory_is_bad_input_naming_the_factory(verb, user_pkg, capsys, tmp_path):
    code, _, err = run_cli(capsys, *VERBS[verb], "--model", "usermods:raising", "--random-init",
                           "--out", tmp_path / "out")
    line = one_line(code, err)
    name = verb.split()[0]
    assert line == (f"robustest {name}: error: the model factory usermods:raising raised ValueError: bad width: fix "
                    "the factory (run it in Python to see the traceback)")


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_forward_raising_on_the_first_batch_is_bad_input_naming_the_model(verb, user_pkg, capsys, tmp_path):
    code, _, err = run_cli(capsys, *VERBS[verb], "--model", "usermods:exploding", "--weights",
                           user_pkg / "exploding.pt", "--out", tmp_path / "out")
    line = one_line(code, err)
    assert line == (f"robustest {verb}: error: the model built by usermods:exploding raised RuntimeError: forward "
                    "exploded on the first batch of the data: fix its forward (run it in Python on a batch to see "
                    "the traceback)")
    assert not (tmp_path / "out" / "results.json").exists()


def test_train_with_a_raising_factory_is_bad_input(user_pkg, capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", "--dataset", "digits", "--limit", "32", "--model", "usermods:raising",
                           "--epochs", "1", "--out", tmp_path / "out")
    assert "the model factory usermods:raising raised ValueError: bad width" in one_line(code, err)


# ------------------------------------------------------------------------- a hardened own model, one flag
@pytest.fixture
def hardened(user_pkg, capsys, tmp_path):
    """model.pt of usermods:small hardened for one epoch from its random weights."""
    code, _, err = run_cli(capsys, "harden", "--dataset", "digits", "--limit", "48", "--eps", "0.1", "--epochs", "1",
                           "--model", "usermods:small", "--model-args", '{"num_classes": 10}', "--from-scratch",
                           "--out", tmp_path / "hard", "--no-progress")
    assert code == 0, err
    return tmp_path / "hard" / "model.pt"


EVAL = ["eval", "--dataset", "digits", "--limit", "16", "--eps", "0.1", "--version", "fast", "--no-progress"]


def test_a_hardened_own_model_reloads_with_its_factory_and_weights(hardened, capsys, tmp_path):
    payload = torch.load(hardened, weights_only=True)  # a safe checkpoint that names its factory
    assert payload["spec"] == {"kind": "factory", "factory": "usermods:small", "args": {"num_classes": 10}}
    code, _, err = run_cli(capsys, *EVAL, "--model", "usermods:small", "--weights", hardened, "--out", tmp_path / "e2")
    assert code == 0, err  # the factory's arguments come from the file
    res = json.loads((tmp_path / "e2" / "results.json").read_text())
    assert 0 <= res["robust_accuracy"] <= res["clean_accuracy"]


def test_weights_alone_never_run_the_code_the_file_names(hardened, capsys, tmp_path, monkeypatch):
    import robustest.models.checkpoints as ck

    def imported(*a, **k):
        raise AssertionError("imported the factory a file named")

    monkeypatch.setattr(ck, "_import_factory", imported)
    code, _, err = run_cli(capsys, *EVAL, "--weights", hardened, "--out", tmp_path / "e1")
    assert one_line(code, err) == (f"robustest eval: error: {hardened} holds weights of a model built by "
                                   "'usermods:small': name that code yourself, --model usermods:small --weights "
                                   "model.pt (robustest never runs code a file names)")


def test_checkpoint_of_an_own_model_points_to_weights(hardened, capsys, tmp_path):
    code, _, err = run_cli(capsys, *EVAL, "--checkpoint", hardened, "--out", tmp_path / "e")
    assert one_line(code, err) == ("robustest eval: error: " f"{hardened} holds weights of a model built by your "
                                   "'usermods:small': load them with --model usermods:small --weights model.pt, "
                                   "which imports and runs that factory")


def test_bare_weights_alone_ask_for_the_model(user_pkg, capsys, tmp_path):
    code, _, err = run_cli(capsys, *EVAL, "--weights", user_pkg / "exploding.pt", "--out", tmp_path / "e")
    assert one_line(code, err) == (f"robustest eval: error: {user_pkg / 'exploding.pt'} holds bare weights, which do "
                                   "not say which model they belong to: name it, --model pkg.module:factory "
                                   "--weights exploding.pt")


def test_weights_alone_of_a_zoo_checkpoint_load_it(capsys, tmp_path):
    from robustest import models
    from robustest.models.checkpoints import save_checkpoint

    torch.manual_seed(0)
    save_checkpoint(tmp_path / "zoo.pt", models.create("digits_cnn", input_size=8))
    code, _, err = run_cli(capsys, *EVAL, "--weights", tmp_path / "zoo.pt", "--out", tmp_path / "e")
    assert code == 0, err
