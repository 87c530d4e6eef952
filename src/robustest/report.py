"""Reports: results files, plots and self-contained HTML.

* :func:`save_histogram`, :func:`save_lines`, :func:`save_bars` draw PNG plots with matplotlib (Agg).
* :func:`save_image_grid` writes a grid of images (N x C x H x W in [0, 1]) with optional captions.
* :class:`HtmlReport` assembles headings, paragraphs, tables and images (embedded as base64) into one
  self-contained ``report.html``.
* :func:`write_csv` writes rows of dicts as CSV, atomically.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robustest.runtime import atomic_write_bytes, atomic_write_text

__all__ = ["HtmlReport", "figure_png", "save_bars", "save_histogram", "save_image_grid", "save_lines", "write_csv"]


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def figure_png(fig: Any) -> bytes:
    """Render a matplotlib figure to PNG bytes and close it."""
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _to_numpy(v: Any) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        return v.detach().float().cpu().numpy()
    return np.asarray(v, dtype=float)


def save_histogram(values: Any | Mapping[str, Any], path: str | os.PathLike[str] | None, *, title: str = "",
                   xlabel: str = "", bins: int = 50, log: bool = False) -> bytes:
    """Histogram of one array, or of several (dict label -> values) overlaid. Returns the PNG bytes and,
    when ``path`` is given, writes them there atomically."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    series = values if isinstance(values, Mapping) else {"": values}
    finite = [a[np.isfinite(a)] for a in (_to_numpy(v).ravel() for v in series.values())]
    allv = np.concatenate(finite) if finite else np.zeros(0)
    edges = np.histogram_bin_edges(allv, bins=bins) if allv.size else bins
    for (label, _), arr in zip(series.items(), finite):
        ax.hist(arr, bins=edges, alpha=0.55 if len(series) > 1 else 0.9, label=label or None, log=log)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    if len(series) > 1:
        ax.legend(fontsize=8)
    png = figure_png(fig)
    if path is not None:
        atomic_write_bytes(path, png)
    return png


def save_lines(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], path: str | os.PathLike[str] | None,
               *, title: str = "", xlabel: str = "", ylabel: str = "") -> bytes:
    """Line plot of ``label -> (xs, ys)``; returns PNG bytes, written to ``path`` when given."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), marker="o", label=label)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=8)
    png = figure_png(fig)
    if path is not None:
        atomic_write_bytes(path, png)
    return png


def save_bars(groups: Mapping[str, Mapping[str, float]], path: str | os.PathLike[str] | None, *, title: str = "",
              ylabel: str = "", errors: Mapping[str, Mapping[str, float]] | None = None) -> bytes:
    """Grouped bar chart: ``groups[series][category] = value`` (optional matching ``errors``)."""
    plt = _plt()
    cats: list[str] = []
    for d in groups.values():
        cats += [c for c in d if c not in cats]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(cats) * max(1, len(groups))), 3.8))
    width = 0.8 / max(1, len(groups))
    xs = np.arange(len(cats))
    for i, (name, d) in enumerate(groups.items()):
        vals = [d.get(c, np.nan) for c in cats]
        err = [errors[name].get(c, 0.0) for c in cats] if errors and name in errors else None
        ax.bar(xs + i * width - 0.4 + width / 2, vals, width, yerr=err, label=name, capsize=2)
    ax.set_xticks(xs)
    ax.set_xticklabels(cats, rotation=45, ha="right", fontsize=8)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    if len(groups) > 1:
        ax.legend(fontsize=8)
    png = figure_png(fig)
    if path is not None:
        atomic_write_bytes(path, png)
    return png


def save_image_grid(x: torch.Tensor, path: str | os.PathLike[str] | None, *, captions: Sequence[str] | None = None,
                    ncols: int = 8, title: str = "", scale: float = 1.2) -> bytes:
    """Grid of images ``x`` (N x C x H x W in [0, 1], C = 1 or 3) with optional per-image captions.

    Returns PNG bytes; written to ``path`` when given.
    """
    plt = _plt()
    imgs = x.detach().float().cpu().clamp(0, 1)
    n = max(1, imgs.shape[0])
    ncols = max(1, min(ncols, n))
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(ncols * scale, nrows * scale * (1.25 if captions else 1.0)),
                             squeeze=False)
    for i, ax in enumerate(axes.ravel()):
        ax.axis("off")
        if i >= imgs.shape[0]:
            continue
        im = imgs[i]
        if im.shape[0] == 1:
            ax.imshow(im[0].numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        else:
            ax.imshow(im[:3].permute(1, 2, 0).numpy(), interpolation="nearest")
        if captions is not None and i < len(captions):
            ax.set_title(str(captions[i]), fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    png = figure_png(fig)
    if path is not None:
        atomic_write_bytes(path, png)
    return png


def write_csv(path: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None
              ) -> Path:
    """Write ``rows`` (dicts) to ``path`` as CSV, atomically. Columns default to the union of keys in order."""
    if columns is None:
        columns = []
        for r in rows:
            columns += [k for k in r if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: _cell(r.get(k)) for k in columns})
    return atomic_write_text(path, buf.getvalue())


def _cell(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


class HtmlReport:
    """A self-contained HTML report built section by section.

    >>> rep = HtmlReport("RobOT run")
    >>> rep.heading("Robustness"); rep.table(rows, columns); rep.image(png_bytes, "caption")
    >>> rep.write("out/report.html")
    """

    def __init__(self, title: str) -> None:
        self.title = title
        self._parts: list[str] = []

    def heading(self, text: str, level: int = 2) -> HtmlReport:
        self._parts.append(f"<h{level}>{html.escape(text)}</h{level}>")
        return self

    def paragraph(self, text: str) -> HtmlReport:
        self._parts.append(f"<p>{html.escape(text)}</p>")
        return self

    def preformatted(self, text: str) -> HtmlReport:
        self._parts.append(f"<pre>{html.escape(text)}</pre>")
        return self

    def table(self, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> HtmlReport:
        if columns is None:
            columns = []
            for r in rows:
                columns += [k for k in r if k not in columns]
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(_fmt_cell(r.get(c)))}</td>" for c in columns) + "</tr>" for r in rows
        )
        self._parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        return self

    def image(self, png: bytes, caption: str = "") -> HtmlReport:
        data = base64.b64encode(png).decode("ascii")
        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        alt = html.escape(caption)
        self._parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{alt}">{cap}</figure>')
        return self

    def render(self) -> str:
        style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
                 "table{border-collapse:collapse;margin:1em 0;font-size:14px}"
                 "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f2f2f2}"
                 "td:first-child,th:first-child{text-align:left}figure{margin:1em 0}img{max-width:100%}"
                 "figcaption{font-size:13px;color:#555}pre{background:#f6f6f6;padding:.6em;overflow-x:auto}")
        body = "\n".join(self._parts)
        return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(self.title)}</title>"
                f"<style>{style}</style></head><body><h1>{html.escape(self.title)}</h1>\n{body}\n</body></html>\n")

    def write(self, path: str | os.PathLike[str]) -> Path:
        return atomic_write_text(path, self.render())


def _fmt_cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e4 else f"{v:.4g}"
    return str(v)
