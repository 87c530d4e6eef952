"""Every zoo model through every verb: trained with ``robustest train`` on a tiny synthetic npz of its native
channels at a small size it takes, saved as a checkpoint, then ``score --metric fol``, ``generate --method
pgd``, ``analyze``, ``validate`` (one attack, one corruption) and ``enhance`` (1 epoch) from that checkpoint.
``corrupt`` reads data only and is covered elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from robustest import cli, models

# (name, channels, size, --model-option values): the native channels, the smallest convenient size each takes,
# and options that keep the deep networks small where they have them
CASES = [
    ("digits_cnn", 1, 8, []), ("mlp", 1, 8, []), ("lenet1", 1, 16, []), ("lenet5", 1, 12, []),
    ("convnet", 1, 16, []), ("mnist_small", 1, 8, []), ("madry_cnn", 1, 8, []),
    ("resnet20", 3, 8, []), ("wrn", 3, 8, ["depth=10", "width=1"]),
    ("preact_resnet18", 3, 8, []), ("densenet_bc", 3, 8, ["depth=16", "growth=6"]), ("resnet18", 3, 32, []),
    ("resnet50", 3, 32, []), ("vit_tiny", 3, 8, []),
]
FAST = {"resnet20"}  # the default suite runs this one (about 7 s); the slow sweep runs the others


def test_the_cases_cover_the_zoo():
    assert sorted(c[0] for c in CASES) == models.names()
    for name, channels, size, _ in CASES:
        assert models.native(name)[0] == channels
        models.check_input(name, channels, size)


def run(capsys, *argv) -> str:
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    assert code == 0, f"robustest {argv[0]} failed: {err}"
    return out


def synthetic(path: Path, channels: int, size: int, n: int = 12, classes: int = 3) -> Path:
    rng = np.random.default_rng(0)
    y = np.arange(n) % classes
    x = rng.integers(0, 256, (n, size, size, channels), dtype=np.uint8)
    x[..., 0] = np.clip(x[..., 0].astype(int) // 2 + 80 * y[:, None, None], 0, 255).astype(np.uint8)  # learnable
    np.savez(path, x_train=x, y_train=y, x_test=x[: n // 2], y_test=y[: n // 2])
    return path


def every_verb(capsys, tmp_path: Path, name: str, channels: int, size: int, options: list[str]) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = ["--dataset", "npz", "--data-dir", synthetic(tmp_path / "d.npz", channels, size)]
        opts = [a for o in options for a in ("--model-option", o)]
        run(capsys, "train", *data, "--model", name, *opts, "--epochs", "1", "--batch-size", "4", "--out",
            tmp_path / "t", "--no-progress")
        ckpt = tmp_path / "t" / "model.pt"
        spec = json.loads((tmp_path / "t" / "results.json").read_text())["model"]
        assert spec["in_channels"] == channels and spec["input_size"] == size and spec["num_classes"] == 3
        m = ["--checkpoint", ckpt, *data, "--no-progress"]
        run(capsys, "score", *m, "--metric", "fol", "--eps", "0.03", "--out", tmp_path / "s")
        fol = torch.load(tmp_path / "s" / "scores.pt", weights_only=True)
        assert torch.isfinite(torch.as_tensor(fol["scores"])).all() and len(fol["scores"]) == 6
        run(capsys, "generate", *m, "--method", "pgd", "--eps", "0.03", "--steps", "2", "--out", tmp_path / "g")
        assert (tmp_path / "g" / "tests.pt").is_file()
        run(capsys, "analyze", *m, "--split", "train", "--neighbors", "2", "--out", tmp_path / "a")
        run(capsys, "validate", *m, "--analysis", tmp_path / "a" / "analysis.pt", "--k", "4", "--perturbations",
            "pgd,fog", "--attack-eps", "0.03", "--attack-steps", "1", "--severities", "2", "--test-limit", "4",
            "--out", tmp_path / "v")
        val = json.loads((tmp_path / "v" / "results.json").read_text())
        assert val and (tmp_path / "v" / "report.html").is_file()
        run(capsys, "enhance", *m, "--epochs", "1", "--batch-size", "4", "--adv-steps", "1", "--eval-limit", "4",
            "--out", tmp_path / "e")
        assert (tmp_path / "e" / "model.pt").is_file()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("name, channels, size, options", [c for c in CASES if c[0] in FAST])
def test_zoo_model_through_every_verb(capsys, tmp_path, name, channels, size, options):
    every_verb(capsys, tmp_path, name, channels, size, options)


@pytest.mark.slow
@pytest.mark.parametrize("name, channels, size, options", [c for c in CASES if c[0] not in FAST])
def test_zoo_model_through_every_verb_slow(capsys, tmp_path, name, channels, size, options):
    every_verb(capsys, tmp_path, name, channels, size, options)
