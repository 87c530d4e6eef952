"""Report helpers: PNG plots, image grids, self-contained HTML, CSV."""

from __future__ import annotations

import base64
import csv
import io
import os
import re
from typing import Any

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
    assert '<th scope="col">metric</th><th scope="col">value</th><th scope="col">extra</th>' in text
    # one format per column: its largest value (123456.7) leaves no decimals for the others either
    assert "<td>1</td>" in text and "<td>12</td>" in text and "<td>-</td>" in text and "<td>123457</td>" in text
    assert '<div class="table-wrap"><table>' in text  # wide tables scroll inside their box, not the page
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


# ----------------------------------------------------------------------------- rounding, headers, charts
@pytest.mark.parametrize("value, key, text", [
    (0.2444444444444444, "clean_accuracy", "0.244"),
    (0.2444444444444444, "whitebox_error", "0.244"),
    (0.5, "frac_misclassified", "0.500"),
    (0.91, "acc", "0.910"),
    (12.3456, "train_s", "12"),
    (0.0123456, "score_s", "0.012"),
    (1234.5, "total_s", "1200"),
    (3.456, "per_input_ms", "3.5"),
    (0.0, "total_s", "0"),
    (512.7, "peak_rss_mib", "513"),
    (0.2444444444444444, "mean", "0.2444"),
    (123456.7, "", "123457"),
    (1e-5, "lr", "1e-05"),
    (None, "accuracy", "-"),
    (float("nan"), "accuracy", "-"),
    (True, "", "yes"),
    (7, "accuracy", "7"),
    ([1, 2, 5], "severities", "1, 2, 5"),
    ({"k": 5, "eps": 0.30000001}, "", "k=5, eps=0.3"),
    (torch.tensor(0.25), "accuracy", "0.250"),
])
def test_format_value_rounds_by_meaning(value, key, text):
    assert report.format_value(value, key) == text


@pytest.mark.parametrize("key, label", [
    ("fixed_set_accuracy_mean", "fixed set accuracy mean"),
    ("whitebox_pgd_accuracy", "white-box PGD accuracy"),
    ("total_s", "total (s)"),
    ("peak_rss_mib", "peak RSS (MiB)"),
    ("median_fol", "median FOL"),
    ("mce", "mCE"),
    ("strategy", "strategy"),
    ("fixed-set before", "fixed-set before"),
    ("Already Words", "Already Words"),
])
def test_header_label(key, label):
    assert report.header_label(key) == label


def test_hbars_grow_with_the_categories_and_keep_their_width():
    few = {"weak": {f"t{i}": i / 10 for i in range(3)}, "test": {f"t{i}": i / 20 for i in range(3)}}
    many = {"weak": {f"type_{i}": (i % 7) / 10 for i in range(60)}, "test": {f"type_{i}": 0.1 for i in range(60)}}
    w1, h1 = png_size(report.save_hbars(few, None, title="error", xlabel="top-1 error"))
    w2, h2 = png_size(report.save_hbars(many, None, title="error", xlabel="top-1 error"))
    assert h2 > 8 * h1  # one row per category: 60 rows are tall ...
    assert abs(w2 - w1) < 0.25 * w1 and w2 < 900  # ... but never wider, so the labels keep their size
    # 15 px per category at least: a 9-point label fits its row
    assert h2 / 60 >= 15
    # vertical bars with many categories switch to the horizontal layout
    wv, hv = png_size(report.save_bars(many, None, ylabel="error"))
    assert (wv, hv) == (w2, h2) or hv > wv


def test_legend_sits_outside_the_axes(monkeypatch):
    """The legend of every chart is anchored to the right of the axes, never over the bars or lines."""
    import matplotlib.pyplot as plt

    seen = []
    real = report.figure_png

    def spy(fig):
        fig.canvas.draw()
        ax = fig.axes[0]
        leg = ax.get_legend()
        if leg is not None:
            seen.append((leg.get_window_extent().x0, ax.get_window_extent().x1))
        return real(fig)

    monkeypatch.setattr(report, "figure_png", spy)
    groups = {"a": {"x": 1.0, "y": 2.0}, "b": {"x": 1.5, "y": 0.5}}
    report.save_bars(groups, None)
    report.save_hbars(groups, None)
    report.save_histogram({"a": [1, 2, 3], "b": [2, 3, 4]}, None)
    report.save_lines({"a": ([0, 1], [0, 1]), "b": ([0, 1], [1, 0])}, None)
    assert len(seen) == 4
    for legend_left, axes_right in seen:
        assert legend_left >= axes_right
    plt.close("all")


def test_report_of_a_results_document_shows_settings_timings_and_significance(tmp_path):
    doc = {"format": "robustest-compare-results", "version": 1, "world_size": 1,
           "settings": {"strategies": ["best", "random"], "eps": 0.15, "data_dir": "/a/very/long/" + "x" * 300},
           "timings": {"pool_s": 1.23456, "total_s": 65.4321}}
    rep = report.HtmlReport.from_results(doc, "compare")
    rep.significance([
        {"strategy": "best", "budget": "10%", "metric": "fixed_set_accuracy", "mean_diff": 0.08123,
         "ci_low": 0.02, "ci_high": 0.14, "n_seeds": 5},
        {"strategy": "gini", "budget": "10%", "metric": "fixed_set_accuracy", "mean_diff": -0.01,
         "ci_low": -0.05, "ci_high": 0.03, "n_seeds": 5},
        {"strategy": "kmst", "budget": "10%", "metric": "whitebox_accuracy", "mean_diff": -0.05,
         "ci_low": -0.09, "ci_high": -0.01, "n_seeds": 5},
    ])
    text = rep.render()
    assert text.count('<tr class="sig">') == 2  # best (interval above 0) and kmst (below 0), not gini
    assert "* higher than random" in text and "* lower than random" in text
    assert "<td>+0.081</td>" in text and "[+0.020, +0.140]" in text
    assert "<h2>Settings</h2>" in text and "<h2>Timings</h2>" in text
    assert "best, random" in text and "<td>1.2</td>" in text and "<td>65</td>" in text
    assert 'class="kv"' in text  # long values wrap inside a two-column table
    assert "robustest-compare-results" in text and rep.render() == text
    assert report.HtmlReport("x").significance([]).render() == report.HtmlReport("x").render()


# ----------------------------------------------------------------------------- degenerate data
_ULP = float(np.nextafter(np.float32(0.2), np.float32(1.0)))
DEGENERATE = {
    "empty": [],
    "one point": [0.2],
    "constant": [0.2] * 30,
    "constant zero": [0.0] * 5,
    "constant negative": [-3.0] * 4,
    "all NaN": [float("nan")] * 3,
    "NaN and inf": [float("nan"), float("inf"), -float("inf")],
    "one float32 ulp apart": [0.2] * 10 + [_ULP],  # eval's norms at eps: 'Too many bins for data range'
}


def _as_plots(values: list[float]) -> dict:
    """Each plot helper fed ``values``: a histogram (one array, a float32 tensor, overlaid), lines, bars, bars with
    errors, horizontal bars and an image grid of constant images."""
    t = torch.tensor(values, dtype=torch.float32)
    cats = {f"c{i}": v for i, v in enumerate(values)}
    return {
        "histogram": lambda: report.save_histogram(values, None, bins=50),
        "histogram float32": lambda: report.save_histogram(t, None),
        "histogram overlaid": lambda: report.save_histogram({"a": t, "b": values[:1]}, None, log=True),
        "lines": lambda: report.save_lines({"a": (list(range(len(values))), values)}, None),
        "lines constant x": lambda: report.save_lines({"a": ([1] * len(values), values), "b": ([], [])}, None),
        "bars": lambda: report.save_bars({"a": cats}, None),
        "bars with errors": lambda: report.save_bars({"a": cats, "b": cats}, None, errors={"a": cats}),
        "hbars": lambda: report.save_hbars({"a": cats}, None, errors={"a": cats}),
        "image grid": lambda: report.save_image_grid(t.view(-1, 1, 1, 1).expand(-1, 1, 4, 4), None),
    }


@pytest.mark.filterwarnings("error")  # no "cannot be log-scaled", no "identical low and high ylims"
@pytest.mark.parametrize("case", list(DEGENERATE))
@pytest.mark.parametrize("plot", list(_as_plots([])))
def test_every_plot_draws_degenerate_data(case, plot):
    import matplotlib.pyplot as plt

    before = len(plt.get_fignums())
    w, h = png_size(_as_plots(DEGENERATE[case])[plot]())
    assert w > 50 and h > 50
    assert len(plt.get_fignums()) == before


@pytest.mark.parametrize("values, centre", [([0.2] * 30, 0.2), ([0.2], 0.2), ([0.2] * 10 + [_ULP], 0.2),
                                            ([0.0] * 5, 0.0), ([7.0, 7.0], 7.0)])
def test_histogram_of_one_value_is_centred_on_it_and_never_negative(values, centre):
    edges = report.histogram_edges(torch.tensor(values, dtype=torch.float32), bins=50)
    assert np.all(np.diff(edges) > 0)
    assert edges[0] >= 0  # norms: no bin below 0
    assert edges[0] <= centre <= edges[-1]
    assert edges[-1] - edges[0] <= 0.1 * max(centre, 1.0) + 1e-9  # a small range, not numpy's +-0.5
    if centre > 0:
        assert (edges[0] + edges[-1]) / 2 == pytest.approx(centre, rel=1e-6)
    # negative data keep a symmetric range; spread data keep their own range and bin count
    neg = report.histogram_edges([-3.0, -3.0])
    assert (neg[0] + neg[-1]) / 2 == pytest.approx(-3.0) and neg[-1] < 0
    spread = report.histogram_edges([1.0, 2.0, np.nan], bins=4)
    assert spread.tolist() == [1.0, 1.25, 1.5, 1.75, 2.0]
    assert report.histogram_edges([]).tolist()[0] == 0.0


def _axes_of(monkeypatch, draw) -> Any:
    """The axes of the figure that ``draw`` renders, drawn, before the figure is closed."""
    seen = []
    real = report.figure_png

    def spy(fig):
        fig.canvas.draw()
        seen.append(fig.axes[0])
        return real(fig)

    monkeypatch.setattr(report, "figure_png", spy)
    draw()
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("values", [[1.0, 2.0], [0.2] * 3, [0.5, 0.6, 0.7, 0.8, 0.9]])
def test_histogram_counts_have_whole_number_ticks(monkeypatch, values):
    ax = _axes_of(monkeypatch, lambda: report.save_histogram(values, None))
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)
    assert ax.get_xlim()[0] >= -1e-9  # all values >= 0: the axis does not reach below 0 either


def test_one_point_line_is_drawn_inside_the_axes(monkeypatch):
    ax = _axes_of(monkeypatch, lambda: report.save_lines({"a": ([1], [0.5])}, None))
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    assert x0 < 1 < x1 and y0 < 0.5 < y1
    assert all(float(t).is_integer() for t in ax.get_xticks())


@pytest.mark.parametrize("mean, std, n, text", [
    (0.4, 0.1, 3, "0.400 ± 0.100"),
    (1.0, 0.0, 1, "1.000 (n = 1)"),     # one seed has no spread: never "1.000 ± 0.000"
    (0.5, None, 1, "0.500 (n = 1)"),
    (0.5, None, None, "0.500 (n = 1)"),
    (0.5, 0.0, 2, "0.500 ± 0.000"),     # two equal seeds: a measured spread of 0
    (None, 0.1, 3, "-"),
])
def test_mean_std_says_n_for_one_seed(mean, std, n, text):
    assert report.mean_std(mean, std, n) == text


def test_plural():
    assert [report.plural(n, "epoch") for n in (0, 1, 2)] == ["0 epochs", "1 epoch", "2 epochs"]
