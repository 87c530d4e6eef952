"""The corrupt pipeline (robustest.corruptions.corrupt_pipeline): the -C files, the report's samples, the results."""

from __future__ import annotations

import pytest
import torch

from robustest import data as datasets
from robustest.core.errors import ConfigError
from robustest.corruptions import corrupt
from robustest.corruptions.corrupt_pipeline import check_corruptible, corrupt_pipeline


@pytest.fixture
def images():
    gen = torch.Generator().manual_seed(0)
    return torch.rand(6, 1, 8, 8, generator=gen), torch.arange(6) % 3


def test_check_corruptible_refuses_other_channels_and_a_partial_npy_layout(images):
    assert check_corruptible(images, "npz", [2]) == (1, 8, 8)
    with pytest.raises(ConfigError, match="the data has 2 channels"):
        check_corruptible((torch.rand(2, 2, 8, 8), torch.zeros(2, dtype=torch.long)), "npz", [1])
    with pytest.raises(ConfigError, match="--format npy writes the CIFAR-10-C layout"):
        check_corruptible(images, "npy", [1, 2])


def test_corrupt_pipeline_writes_the_files_and_the_first_image_of_each_setting(tmp_path, images):
    notes: list[str] = []
    run = corrupt_pipeline(images, tmp_path, ["gaussian_noise", "contrast"], [1, 3], split="test", seed=4,
                           progress=False, note=notes.append)
    assert set(run.files) == {"gaussian_noise", "contrast"} and run.num_images == 6 and run.shape == (1, 8, 8)
    assert all(rec["rows"] == 12 for rec in run.files.values()) and set(run.timings) == {"gaussian_noise_s",
                                                                                      "contrast_s"}
    from robustest.core.batching import take

    x, y = take(datasets.load("npz", str(tmp_path / "gaussian_noise.npz"), split="test"), torch.arange(12))
    assert x.shape == (12, 1, 8, 8) and y.tolist() == images[1].tolist() * 2
    assert torch.equal(run.clean, images[0][:1])
    want = torch.round(corrupt(images[0], "contrast", 3, seed=4, table="cifar")[:1] * 255).to(torch.uint8)
    assert len(run.samples) == 4 and torch.equal(run.samples[3], want)  # corruption by corruption, then severity
    res = run.to_results()
    assert res["image_shape"] == [1, 8, 8] and res["load_with"] == "robustest.data.load('npz', '<file>', split='test')"
    assert res["files"] == {"report": "report.html", "gaussian_noise": "gaussian_noise.npz", "contrast": "contrast.npz"}
    assert "x_test" in res["arrays"] and notes == []
    assert run.summary_line("digits test", [1, 3]) == ("2 corruption file(s) x 2 severities x 6 images (digits test, "
                                                       "1x8x8, cifar table)")
    again = corrupt_pipeline(images, tmp_path, ["gaussian_noise", "contrast"], [1, 3], split="test", seed=4,
                             progress=False, note=notes.append)
    assert again.files == run.files and notes == []  # the rerun reuses the finished corruptions
    corrupt_pipeline(images, tmp_path, ["gaussian_noise"], [1], split="test", seed=5, progress=False,
                     note=notes.append)
    assert len(notes) == 1 and "changed since the saved steps: starting afresh" in notes[0]


def test_table_auto_is_chosen_by_the_image_size(tmp_path, images):
    small = corrupt_pipeline(images, tmp_path / "s", ["contrast"], [5], table="auto", seed=1, progress=False)
    assert small.table == "cifar"  # 8 x 8: up to 64 px
    want = torch.round(corrupt(images[0], "contrast", 5, seed=1, table="cifar")[:1] * 255).to(torch.uint8)
    assert torch.equal(small.samples[0], want)
    big = (torch.rand(2, 1, 65, 65, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1]))
    large = corrupt_pipeline(big, tmp_path / "b", ["contrast"], [5], table="auto", seed=1, progress=False)
    assert large.table == "imagenet" and large.shape == (1, 65, 65)  # above 64 px
    want = torch.round(corrupt(big[0], "contrast", 5, seed=1, table="imagenet")[:1] * 255).to(torch.uint8)
    assert torch.equal(large.samples[0], want)
    assert corrupt_pipeline(images, tmp_path / "c", ["contrast"], [5], progress=False).table == "cifar"  # default
