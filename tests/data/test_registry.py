"""Data sets behind the one registry shape: aliases are the entries' own, and a data set registered from
outside loads by name (and alias) in data.load and the CLI, until it is unregistered."""

from __future__ import annotations

import json

import numpy as np
import pytest

from robustest import data
from robustest.cli import main
from robustest.core.errors import DataError
from robustest.data.dataset import ImageDataset
from robustest.data.registry import DATASETS, DatasetInfo, canonical, register, unregister


def test_aliases_belong_to_their_data_sets():
    assert DATASETS.aliases() == {"fashion": "fashion-mnist", "fmnist": "fashion-mnist", "cifar": "cifar10",
                                  "cifar-10": "cifar10", "cifar-100": "cifar100", "images": "folder",
                                  "imagefolder": "folder", "cifar-10-c": "cifar10-c", "cifar-100-c": "cifar100-c",
                                  "tiny-imagenet-c": "tinyimagenet-c"}
    assert canonical("CIFAR_10") == "cifar10" and canonical("Digits") == "digits"
    with pytest.raises(DataError, match="^unknown data set 'svhn': choose one of cifar10, cifar10-c, "):
        canonical("svhn")
    with pytest.raises(DataError, match="^a data set name must be a string, got int$"):
        canonical(3)  # type: ignore[arg-type]


def test_a_data_set_registered_from_outside_loads_by_name_in_the_library_and_the_cli(tmp_path, capsys):
    def stripes(root, split, opts):
        n = 40 if split == "train" else 12
        x = np.zeros((n, 1, 8, 8), np.uint8)
        x[:, :, ::2] = 255 * (np.arange(n) % 2)[:, None, None, None]
        return ImageDataset(x, np.arange(n) % 2)

    register(DatasetInfo("stripes", "alternating stripes (a test set)", False, 2, (1, 8, 8), aliases=("bars",)))(
        stripes)
    try:
        ds = data.load("BARS", split="test")
        assert len(ds) == 12 and "stripes" in data.names()
        assert main(["train", "--model", "mlp", "--dataset", "stripes", "--epochs", "1", "--out",
                     str(tmp_path / "t"), "--no-progress"]) == 0
        settings = json.loads((tmp_path / "t" / "results.json").read_text())["settings"]
        assert settings["dataset"] == "stripes"
    finally:
        assert unregister("bars").info.name == "stripes"
    assert "stripes" not in data.names() and "bars" not in DATASETS
