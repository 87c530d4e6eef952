"""A model the zoo has never seen, with its own normalisation, through every verb: as pkg.module:factory with a
state_dict, as a TorchScript archive, and as a torch.export program; plus the model sources in Python."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from robustest import data
from robustest.cli import main
from robustest.core.errors import CheckpointError, ConfigError
from robustest.models import checkpoints
from robustest.train import fit
from robustest.train.recipes import Recipe

NETS = textwrap.dedent('''
    import torch
    from torch import nn


    class Net(nn.Module):
        """A model with its own normalisation inside, as torchvision users write them."""

        def __init__(self, num_classes=10, width=8):
            super().__init__()
            self.register_buffer("mean", torch.tensor([0.3]).view(1, 1, 1, 1))
            self.register_buffer("std", torch.tensor([0.35]).view(1, 1, 1, 1))
            self.features = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
            self.head = nn.Linear(width * 16, num_classes)

        def forward(self, x):
            return self.head(self.features((x - self.mean) / self.std).flatten(1))


    def build(num_classes=10, width=8):
        return Net(num_classes, width)
''')
FACTORY = ["--model", "mynets:build", "--model-args", '{"width": 6}']


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder with mynets.py, its trained weights (weights.pt), a TorchScript archive and a .pt2 program."""
    import sys

    root = tmp_path_factory.mktemp("your_model")
    (root / "mynets.py").write_text(NETS)
    sys.path.insert(0, str(root))
    try:
        import mynets  # noqa: F401  (the module the factory names)

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        net = sys.modules["mynets"].build(width=6)
        torch.manual_seed(0)
        x, y = data.load("digits", split="train").tensors
        fit(net, (x[:400], y[:400]), epochs=6, recipe=Recipe(lr=3e-3), seed=0, progress=False)
        torch.save(net.state_dict(), root / "weights.pt")
        torch.jit.script(net.eval()).save(str(root / "net.ts"))
        ep = torch.export.export(net.eval(), (x[:2],), dynamic_shapes=({0: torch.export.Dim("batch")},))
        torch.export.save(ep, str(root / "net.pt2"))
        torch.set_num_threads(threads)
        yield root, net
    finally:
        sys.path.remove(str(root))


@pytest.fixture
def in_workspace(workspace, monkeypatch):
    root, net = workspace
    monkeypatch.chdir(root)  # the factory is imported from the current folder
    monkeypatch.setattr(torch, "get_num_threads", torch.get_num_threads)
    torch.set_num_threads(1)
    return root, net


# ------------------------------------------------------------------------------------------- Python API
def test_every_source_loads_the_same_model(in_workspace) -> None:
    root, net = in_workspace
    x = data.load("digits", split="test").tensors[0][:16]
    ref = net(x)
    by_factory = checkpoints.load_model(factory="mynets:build", factory_args={"width": 6}, weights=root / "weights.pt")
    by_script = checkpoints.load_model(root / "net.ts", torchscript=True)
    by_export = checkpoints.load_model(root / "net.pt2")
    for m in (by_factory, by_script, by_export):
        torch.testing.assert_close(m(x), ref)
    assert by_factory.robustest_source == {"kind": "factory", "factory": "mynets:build", "args": {"width": 6}}
    with pytest.raises(CheckpointError, match="TorchScript archive.*--torchscript"):
        checkpoints.load_model(root / "net.ts")
    with pytest.raises(CheckpointError, match=r"other shapes \(e.g. .features.0.weight.: \[6, 1, 3, 3\].*--model-args"):
        checkpoints.load_model(factory="mynets:build", factory_args={"width": 5}, weights=root / "weights.pt")
    with pytest.raises(ConfigError, match="has no 'nope'"):
        checkpoints.load_model(factory="mynets:nope")
    with pytest.raises(ConfigError, match="cannot import 'nomodule'"):
        checkpoints.load_model(factory="nomodule:build")


def test_fine_tuned_copies_save_and_rebuild(in_workspace, tmp_path) -> None:
    root, _ = in_workspace
    x, y = data.load("digits", split="train").tensors
    for kw in ({"factory": "mynets:build", "factory_args": {"width": 6}, "weights": root / "weights.pt"},
               {"source": root / "net.pt2"}, {"source": root / "net.ts", "torchscript": True}):
        model = checkpoints.load_model(**kw)
        tuned = checkpoints.clone_model(model)
        fit(tuned, (x[:64], y[:64]), epochs=1, seed=0, progress=False)
        assert checkpoints.state_fingerprint(tuned) != checkpoints.state_fingerprint(model)
        path = checkpoints.save_checkpoint(tmp_path / "tuned.pt", tuned, metadata={"note": "tuned"})
        if "factory" in kw:
            with pytest.raises(CheckpointError, match="--model mynets:build"):
                checkpoints.load_model(path)
            back = checkpoints.load_model(path, factory="mynets:build")
        else:
            back = checkpoints.load_model(path, torchscript=kw.get("torchscript", False))
        assert checkpoints.state_fingerprint(back) == checkpoints.state_fingerprint(tuned)
        assert back.robustest_metadata == {"note": "tuned"}


def test_fit_check_names_the_shapes(in_workspace) -> None:
    root, _ = in_workspace
    scripted = checkpoints.load_model(root / "net.ts", torchscript=True)
    from robustest.core.modelchecks import check_model_fits

    with pytest.raises(ConfigError, match="cannot take the data's 1x16x16 images") as exc:
        check_model_fits(scripted, torch.rand(4, 1, 16, 16))
    assert "\n" not in str(exc.value)


# --------------------------------------------------------------------------------------------- the CLI
def _run(args, capsys) -> tuple[int, str]:
    rc = main(args)
    cap = capsys.readouterr()
    return rc, cap.err


@pytest.mark.parametrize("how", ["factory", "torchscript"])
def test_every_verb_with_your_model(in_workspace, tmp_path, capsys, how) -> None:
    root, _ = in_workspace
    model = FACTORY + ["--weights", str(root / "weights.pt")] if how == "factory" else \
        ["--checkpoint", str(root / "net.ts"), "--torchscript"]
    d = ["--dataset", "digits", "--limit", "60", "--no-progress"]
    out = tmp_path / how
    assert _run(["score", *model, *d, "--metric", "fol", "--eps", "0.1", "--out", str(out / "fol")], capsys)[0] == 0
    rc, err = _run(["score", *model, *d, "--metric", "kmnc", "--train-limit", "100", "--out", str(out / "kmnc")],
                   capsys)
    if how == "factory":
        assert rc == 0 and json.loads((out / "kmnc" / "summary.json").read_text())["set_coverage"] > 0
    else:  # hooks cannot see inside a TorchScript model: one line naming the alternative
        assert rc == 2 and "--model pkg.module:factory" in err and err.count("\n") == 1
    assert _run(["generate", *model, *d, "--method", "pgd", "--eps", "0.1", "--steps", "3",
                 "--out", str(out / "gen")], capsys)[0] == 0
    assert _run(["analyze", *model, *d, "--neighbors", "4", "--out", str(out / "ana")], capsys)[0] == 0
    assert _run(["validate", *model, *d, "--analysis", str(out / "ana" / "analysis.pt"), "--k", "10",
                 "--perturbations", "fgsm,fog", "--severities", "1", "--test-limit", "20",
                 "--out", str(out / "val")], capsys)[0] == 0
    rc, err = _run(["enhance", *model, "--dataset", "digits", "--limit", "64", "--epochs", "1", "--adv-steps", "2",
                    "--eval-limit", "20", "--no-progress", "--out", str(out / "enh")], capsys)
    assert rc == 0, err
    tiny = ["--dataset", "digits", "--train-limit", "200", "--test-limit", "40", "--eps", "0.15", "--epochs", "1",
            "--whitebox-limit", "10", "--pool-limit", "60", "--no-whitebox", "--no-progress"]
    robot_model = (FACTORY + ["--weights", str(root / "weights.pt")] if how == "factory"
                   else ["--checkpoint", str(root / "net.ts"), "--torchscript"])
    rc, err = _run(["run", *robot_model, *tiny, "--rounds", "1", "--strategy", "random", "--budget", "10", "--out",
                    str(out / "run")], capsys)
    assert rc == 0, err
    res = json.loads((out / "run" / "results.json").read_text())
    assert res["data"]["model"]["kind"] == ("factory" if how == "factory" else "torchscript")
    rc, err = _run(["run", *robot_model, *tiny, "--rounds", "1", "--strategy", "random", "--budget", "10", "--resume",
                    "--out", str(out / "run")], capsys)
    assert rc == 0, err  # resume reloads the round into a copy of your model
    rc, err = _run(["compare", *robot_model, *tiny, "--strategies", "best,random", "--budgets", "10",
                    "--out", str(out / "cmp")], capsys)
    assert rc == 0, err


def test_train_your_factory(in_workspace, tmp_path, capsys) -> None:
    rc, err = _run(["train", "--dataset", "digits", "--limit", "200", "--model", "mynets:build", "--model-args",
                    '{"width": 4}', "--epochs", "1", "--no-progress", "--out", str(tmp_path / "t")], capsys)
    assert rc == 0, err
    with pytest.raises(CheckpointError, match="--model mynets:build"):
        checkpoints.load_model(tmp_path / "t" / "model.pt")
    m = checkpoints.load_model(tmp_path / "t" / "model.pt", factory="mynets:build")
    assert m.robustest_source["args"] == {"width": 4}


def test_resume_refuses_a_replaced_model(in_workspace, tmp_path, capsys) -> None:
    root, net = in_workspace
    tiny = ["--dataset", "digits", "--train-limit", "200", "--test-limit", "40", "--eps", "0.15", "--epochs", "1",
            "--pool-limit", "60", "--no-whitebox", "--no-progress", "--strategy", "random", "--budget", "10",
            "--out", str(tmp_path / "r")]
    w = tmp_path / "w.pt"
    torch.save(net.state_dict(), w)
    assert _run(["run", *FACTORY, "--weights", str(w), *tiny, "--rounds", "1"], capsys)[0] == 0
    other = {k: v + 0.01 if v.is_floating_point() else v for k, v in net.state_dict().items()}
    torch.save(other, w)  # same path, other content
    rc, err = _run(["run", *FACTORY, "--weights", str(w), *tiny, "--rounds", "2", "--resume"], capsys)
    assert rc == 2 and "model weights differ" in err


def test_pt2_program_through_score_and_kmnc_refusal(in_workspace, tmp_path, capsys) -> None:
    root, _ = in_workspace
    d = ["--dataset", "digits", "--limit", "30", "--no-progress"]
    assert _run(["score", "--checkpoint", str(root / "net.pt2"), *d, "--metric", "gini",
                 "--out", str(tmp_path / "g")], capsys)[0] == 0
    rc, err = _run(["score", "--checkpoint", str(root / "net.pt2"), *d, "--metric", "nc",
                    "--out", str(tmp_path / "n")], capsys)
    assert rc == 2 and "torch.export program" in err and "--model pkg.module:factory" in err


def test_fixed_batch_pt2_names_its_batch_and_no_pt2_is_trained(in_workspace, tmp_path, capsys) -> None:
    """A program exported without a dynamic batch takes exactly its batch: the error names that batch size, not
    the image shape; harden refuses any .pt2 (an inference program) in one line."""
    root, net = in_workspace
    x = data.load("digits", split="train").tensors[0][:4]
    torch.export.save(torch.export.export(net.eval(), (x,)), str(tmp_path / "fixed.pt2"))
    d = ["--dataset", "digits", "--limit", "30", "--no-progress"]
    rc, err = _run(["score", "--checkpoint", str(tmp_path / "fixed.pt2"), *d, "--metric", "gini",
                    "--out", str(tmp_path / "f")], capsys)
    assert rc == 2 and "batches of exactly 4 images" in err and "Dim('batch')" in err and err.count("\n") == 1
    rc, err = _run(["harden", "--checkpoint", str(root / "net.pt2"), *d, "--eps", "0.1", "--epochs", "1",
                    "--val-size", "3", "--out", str(tmp_path / "h")], capsys)
    assert rc == 2 and "cannot be trained" in err and err.count("\n") == 1


def test_a_factory_without_weights_needs_random_init(in_workspace, tmp_path, capsys) -> None:
    """--model pkg:factory without --weights would silently run random weights (chance accuracy, exit 0): refused in
    one line unless --random-init says so."""
    d = ["--dataset", "digits", "--limit", "20", "--no-progress", "--metric", "gini"]
    rc, err = _run(["score", "--model", "mynets:build", *d, "--out", str(tmp_path / "r")], capsys)
    assert rc == 2 and "would run random weights" in err and "--random-init" in err and err.count("\n") == 1
    assert not (tmp_path / "r" / "results.json").exists()
    rc, err = _run(["score", "--model", "mynets:build", "--random-init", *d, "--out", str(tmp_path / "ok")], capsys)
    assert rc == 0, err
    rc, err = _run(["score", "--checkpoint", "x.pt", "--random-init", *d, "--out", str(tmp_path / "x")], capsys)
    assert rc == 2 and "starts from random weights" in err


def test_bad_model_options_are_one_line(in_workspace, tmp_path, capsys) -> None:
    d = ["--dataset", "digits", "--limit", "10", "--out", str(tmp_path / "x")]
    for args, pattern in ((["--model", "mynets"], "package.module:function"),
                          (["--model", "mynets:build", "--model-args", "[1]"], "JSON object"),
                          (["--model-args", "{}"], "applies to --model"),
                          ([], "no model given"),
                          (["--model", "mynets:build", "--model-args", '{"depth": 3}'], "check --model-args")):
        try:
            rc, err = _run(["score", *args, *d, "--metric", "gini"], capsys)
        except SystemExit as exc:  # argparse-level errors
            rc, err = exc.code, capsys.readouterr().err
        assert rc == 2 and pattern in err and err.strip().count("\n") == 0, (args, err)
