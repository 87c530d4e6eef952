"""The certify pipeline from Python (robustest.evaluate.certify_pipeline): what ``robustest certify`` runs."""

from __future__ import annotations

import csv

import pytest
import torch
from torch import nn

from robustest.core.errors import ConfigError, OutputError
from robustest.evaluate.certify_pipeline import certify_pipeline


def Margin() -> nn.Module:  # noqa: N802 - reads as the model's name
    """Logits (0, 4 * (x0 - 0.5)) of a 1-pixel image: class 1 above 0.5; IBP's lower margin is exact,
    |4 * (x0 - 0.5)| - 4 * eps for the true class."""
    lin = nn.Linear(1, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[0.0], [4.0]]))
        lin.bias.copy_(torch.tensor([0.0, -2.0]))
    return nn.Sequential(nn.Flatten(), lin)


@pytest.fixture
def points():
    x = torch.tensor([0.9, 0.6, 0.1, 0.45]).view(4, 1, 1, 1)
    y = torch.tensor([1, 1, 0, 1])  # the last is misclassified
    return x, y


def test_the_pipeline_certifies_writes_samples_and_records_the_description(points, tmp_path):
    run = certify_pipeline(Margin(), points, 0.2, out=tmp_path / "c", method="ibp", progress=False,
                           describe={"model": {"model": "m:f"}, "data": {"dataset": "points"}})
    # margins 4 * |x0 - 0.5| - 4 * 0.2 on the right ones: 0.8, -0.4, 0.8; the misclassified one: -0.2 - 0.8
    assert run.result.certified.tolist() == [True, False, True, False]
    assert torch.allclose(run.result.lower_margin, torch.tensor([0.8, -0.4, 0.8, -1.0]), atol=1e-5)
    assert run.files == ["results.json", "samples.csv", "report.html"]
    rows = list(csv.DictReader((tmp_path / "c" / "samples.csv").open()))
    assert [(r["index"], r["certified"], r["clean_correct"]) for r in rows] == [
        ("0", "1", "1"), ("1", "0", "1"), ("2", "1", "1"), ("3", "0", "0")]
    res = run.to_results()
    assert res["certified_accuracy"] == 0.5 and res["clean_accuracy"] == 0.75
    assert res["model"] == {"model": "m:f"} and res["data"] == {"dataset": "points", "num_samples": 4}
    assert res["files"] == run.files and res["peak_rss_mib"] > 0
    assert run.summary_line("points") == "points (4 images), linf eps=0.2, ibp: certified 50.00%, clean 75.00%"
    assert run.summary_line().startswith("custom (4 images), ")
    smooth = certify_pipeline(Margin(), points, 0.2, out=tmp_path / "s", method="smoothing", norm="l2", sigma=0.25,
                              n0=10, n=20, progress=False)
    assert smooth.summary_line("points").startswith("points (4 images), l2 eps=0.2, smoothing (sigma=0.25): certified ")


def test_a_refused_argument_writes_nothing(points, tmp_path):
    with pytest.raises(ConfigError):
        certify_pipeline(Margin(), points, 0.2, out=tmp_path / "never", method="bogus", progress=False)
    assert not (tmp_path / "never").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="exists and is not a folder"):
        certify_pipeline(Margin(), points, 0.2, out=tmp_path / "file", method="ibp", progress=False)
