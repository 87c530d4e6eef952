"""Report helpers: PNG plots, image grids, self-contained HTML, CSV."""

from __future__ import annotations

import base64
import csv
import io
import os
import re

import numpy as np
import pytest
import torch
from PIL import Image

from robustest import report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(png: bytes) -> tuple[int, int]:
    assert png.startswith(PNG_MAGIC)
    with Image.open(io.BytesIO(png)) as im:
        im.verify()
    with Image.open(io.BytesIO(png)) as im:
        return im.size


def test_histogram_single_and_overlaid(tmp_path):
    png = report.save_histogram(torch.randn(200), tmp_path / "h.png", title="FOL", xlabel="value", bins=20)
    assert (tmp_path / "h.png").read_bytes() == png
    w, h = png_size(png)
    assert w > 100 and h > 100
    multi = report.save_histogram({"clean": np.random.default_rng(0).normal(size=50), "adv": [1.0, 2.0, np.nan]},
                                  None, log=True)
    png_size(multi)
    png_size(report.save_histogram([], None))  # empty data still gives a (blank) plot
    png_size(report.save_histogram([np.inf, np.nan], None))
    assert os.listdir(tmp_path) == ["h.png"]


def test_image_grid_gray_and_rgb(tmp_path):
    gray = torch.rand(10, 1, 8, 8)
    png = report.save_image_grid(gray, tmp_path / "g.png", captions=[f"y={i}" for i in range(10)], ncols=4,
                                 title="tests")
    assert (tmp_path / "g.png").read_bytes() == png
    w1, h1 = png_size(png)
    rgb = torch.rand(3, 3, 32, 32)
    w2, h2 = png_size(report.save_image_grid(rgb, None))
    assert w1 > 50 and h1 > 50 and w2 > 50 and h2 > 20
    assert h1 > w1 * 0.5  # 3 rows of 4
    # out-of-range values are clamped for display, the input tensor is untouched
    wild = torch.linspace(-1, 2, 64).view(1, 1, 8, 8)
    before = wild.clone()
    png_size(report.save_image_grid(wild, None))
    assert torch.equal(wild, before)
    png_size(report.save_image_grid(torch.zeros(0, 1, 4, 4), None))


def test_gray_grid_pixels_follow_the_image(tmp_path):
    """A white image on the left and a black one on the right must render as such (no colour map)."""
    x = torch.stack([torch.ones(1, 16, 16), torch.zeros(1, 16, 16)])
    with Image.open(io.BytesIO(report.save_image_grid(x, None, ncols=2, scale=2.0))) as im:
        arr = np.asarray(im.convert("L"), dtype=float)
    h, w = arr.shape
    row = arr[h // 2]
    assert row[: w // 2].max() > 200 and row[w // 2:].min() < 50
    assert np.asarray(Image.open(io.BytesIO(report.save_image_grid(x, None))).convert("RGB"))[..., 0].std() > 0


def test_bars_and_lines(tmp_path):
    groups = {"clean": {"noise": 0.9, "blur": 0.8}, "robust": {"noise": 0.95, "fog": 0.7}}
    errs = {"clean": {"noise": 0.01, "blur": 0.02}}
    png = report.save_bars(groups, tmp_path / "b.png", title="acc", ylabel="accuracy", errors=errs)
    assert (tmp_path / "b.png").read_bytes() == png
    png_size(png)
    png_size(report.save_bars({"one": {"a": 1.0}}, None))
    series = {"BE-ST": ([1, 2, 3], [0.5, 0.6, 0.7]), "random": ((1, 2, 3), (0.4, 0.45, 0.5))}
    png = report.save_lines(series, tmp_path / "l.png", title="robustness", xlabel="%", ylabel="acc")
    assert (tmp_path / "l.png").read_bytes() == png
    png_size(png)
    png_size(report.save_lines({}, None))


def test_html_report_is_self_contained(tmp_path):
    png = report.save_histogram([1, 2, 3], None)
    rep = report.HtmlReport("Run <1>")
    out = (rep.heading("Results").heading("Sub", level=3).paragraph("a < b & c")
           .table([{"metric": "acc", "value": 0.91234567}, {"metric": "n", "value": 12, "extra": None},
                   {"metric": "big", "value": 123456.7}])
           .preformatted("x = 1\n<tag>").image(png, "histogram <fol>"))
    assert out is rep
    path = rep.write(tmp_path / "sub" / "report.html")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert "<title>Run &lt;1&gt;</title>" in text and "<h3>Sub</h3>" in text
    assert "a &lt; b &amp; c" in text and "<tag>" not in text
    assert "<th>metric</th><th>value</th><th>extra</th>" in text
    assert "<td>0.9123</td>" in text and "<td>-</td>" in text and "<td>1.235e+05</td>" in text
    # the image is embedded, nothing refers to another file or the network
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert m and base64.b64decode(m.group(1)) == png
    assert not re.search(r'(src|href)="(?!data:)', text)
    assert "http://" not in text and "https://" not in text
    assert "histogram &lt;fol&gt;" in text
    assert os.listdir(tmp_path / "sub") == ["report.html"]
    assert rep.render() == text


def test_write_csv(tmp_path):
    rows = [{"name": "fgsm", "acc": 0.123456789, "n": 3}, {"name": "pgd", "acc": torch.tensor(0.5), "extra": "x"}]
    p = report.write_csv(tmp_path / "r.csv", rows)
    with open(p, newline="") as fh:
        got = list(csv.DictReader(fh))
    assert list(got[0]) == ["name", "acc", "n", "extra"]
    assert got[0] == {"name": "fgsm", "acc": "0.123457", "n": "3", "extra": ""}
    assert got[1]["name"] == "pgd" and float(got[1]["acc"]) == 0.5
    p2 = report.write_csv(tmp_path / "c.csv", rows, columns=["n", "name"])
    assert p2.read_text().splitlines() == ["n,name", "3,fgsm", ",pgd"]
    report.write_csv(tmp_path / "e.csv", [], columns=["a", "b"])
    assert (tmp_path / "e.csv").read_text() == "a,b\n"
    assert sorted(os.listdir(tmp_path)) == ["c.csv", "e.csv", "r.csv"]


def test_write_csv_quotes_commas(tmp_path):
    p = report.write_csv(tmp_path / "q.csv", [{"a": "x,y", "b": 'say "hi"'}])
    with open(p, newline="") as fh:
        assert list(csv.DictReader(fh)) == [{"a": "x,y", "b": 'say "hi"'}]


@pytest.mark.parametrize("fn", ["save_histogram", "save_image_grid"])
def test_figures_are_closed(fn):
    import matplotlib.pyplot as plt

    before = len(plt.get_fignums())
    arg = torch.rand(2, 1, 4, 4) if fn == "save_image_grid" else [1.0, 2.0]
    for _ in range(3):
        getattr(report, fn)(arg, None)
    assert len(plt.get_fignums()) == before
