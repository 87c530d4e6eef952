"""Reports people read: rounded figures, readable headers, plots and one self-contained ``report.html``.

* :func:`format_value` rounds a figure to what it means (accuracies and error rates to 3 decimals, seconds to
  2 significant digits, other numbers to 4 significant digits); :func:`header_label` turns a snake_case key
  into words; :func:`mean_std` writes a mean over seeds with its spread (``n = 1`` for one seed) and
  :func:`plural` a count with its noun. The CLI prints with the same functions, so a table reads the same on
  screen and in HTML.
* :func:`save_histogram`, :func:`save_lines`, :func:`save_bars`, :func:`save_hbars` draw PNG plots with
  matplotlib (Agg); legends sit outside the data. :func:`save_hbars` (one bar per category, horizontal) grows in
  height with the number of categories and keeps a fixed font size, so it stays legible at any count;
  :func:`save_stacked_bar` splits one horizontal bar into parts (certified | undecided | broken). Every plot
  draws any data: empty, all-NaN, one point, all values equal (:func:`histogram_edges`); count axes have
  whole-number ticks.
* :func:`save_image_grid` writes a grid of images (N x C x H x W in [0, 1]) with optional captions.
* :class:`HtmlReport` assembles headings, paragraphs, a gate's verdict badge (PASS, FAIL, NOT GATED), tables (in a
  horizontal-scroll wrapper, one number format per column: :func:`column_formatter`), images (embedded as
  base64; a histogram of one repeated value becomes a sentence), the settings in effect and the timings of a
  results document into one self-contained ``report.html`` (no script, nothing fetched).
* :func:`write_csv` writes rows of dicts as CSV, atomically.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robustest.core.atomic import atomic_write_bytes, atomic_write_text

__all__ = ["VERDICTS", "HtmlReport", "column_formatter", "constant_value", "figure_png", "format_value",
           "header_label", "histogram_edges", "mean_std", "plural", "save_bars", "save_hbars", "save_histogram",
           "save_image_grid", "save_lines", "save_stacked_bar", "write_csv"]

DPI = 110
#: the verdicts of a gate and their badges' words
VERDICTS = {"pass": "PASS", "fail": "FAIL", "not-gated": "NOT GATED"}
FONT = 9  # points: every label, tick and legend of a chart


# ------------------------------------------------------------------------------------------- formatting
_FRACTION_KEY = re.compile(r"(accuracy|error|rate|coverage|frac|share|mce|prob|success|^acc$|_acc$|^acc_)")
_SECONDS_KEY = re.compile(r"(_s$|^s$|seconds|_ms$|time_budget)")
_WORDS = {"fol": "FOL", "zol": "ZOL", "mce": "mCE", "pgd": "PGD", "apgd": "APGD", "fgsm": "FGSM", "cw": "C&W",
          "whitebox": "white-box", "rss": "RSS", "mib": "(MiB)", "s": "(s)", "ms": "(ms)", "kmnc": "KMNC",
          "nc": "NC", "nbc": "NBC", "snac": "SNAC", "tknc": "TKNC", "lsa": "LSA", "dsa": "DSA", "sha256": "SHA-256",
          "lr": "LR", "jsd": "JSD", "adv": "adversarial", "eps": "eps", "linf": "L-inf", "l2": "L2", "id": "ID"}


def significant(v: float, digits: int = 2) -> str:
    """``v`` rounded to ``digits`` significant digits, written without an exponent (0.0012, 1.2, 120)."""
    if v == 0 or not math.isfinite(v):
        return "0" if v == 0 else str(v)
    decimals = digits - 1 - int(math.floor(math.log10(abs(v))))
    r = round(v, decimals)
    return f"{r:.{decimals}f}" if decimals > 0 else f"{r:.0f}"


def format_value(v: Any, key: str = "") -> str:
    """A figure as text, rounded to what its ``key`` means.

    Accuracies, error rates, fractions and coverage: 3 decimals (``0.244``); seconds (keys ending in ``_s``,
    ``seconds``, ``_ms``): 2 significant digits (``1.3``, ``0.047``); MiB: whole numbers; other floats: 4
    significant digits; None and NaN: ``-``; lists: comma-separated; dicts: ``key=value`` pairs.
    """
    k = key.lower()
    if v is None:
        return "-"
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-" if v != v else ("inf" if v > 0 else "-inf")
        if _SECONDS_KEY.search(k):
            return significant(v, 2)
        if "mib" in k:
            return f"{v:.0f}"
        if _FRACTION_KEY.search(k):
            return f"{v:.3f}"
        return f"{v:.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(format_value(x, key) for x in v) if v else "-"
    if isinstance(v, Mapping):
        return ", ".join(f"{a}={format_value(b, str(a))}" for a, b in v.items()) if v else "-"
    return str(v)


def _decimals(largest: float, digits: int, most: int) -> int:
    """Decimals that give the column's ``largest`` magnitude ``digits`` significant digits, within 0..``most``."""
    return 0 if largest == 0 else min(most, max(0, digits - 1 - int(math.floor(math.log10(largest)))))


def column_formatter(values: Sequence[Any], key: str = "", kind: str | None = None) -> Callable[[Any], str]:
    """A function writing every number of a table column in one format, by ``kind`` (else read from ``key`` as
    :func:`format_value` does): ``fraction`` (3 decimals), ``signed`` (sign and 3 decimals), ``seconds`` (the
    decimals giving the column's largest value 2 significant digits, at most 3), ``number`` (4, at most 6; none
    when every value is whole). Text, None, NaN and booleans are written by :func:`format_value`."""
    k = key.lower()
    kind = kind or ("seconds" if _SECONDS_KEY.search(k) else "mib" if "mib" in k else
                    "fraction" if _FRACTION_KEY.search(k) else "number")
    finite = [abs(v) for v in map(_number, values) if v is not None and math.isfinite(v)]
    if not finite or kind == "number" and all(v.is_integer() for v in finite):  # counts stay whole
        return lambda v: format_value(v, key)
    places = {"fraction": 3, "signed": 3, "mib": 0, "seconds": _decimals(max(finite), 2, 3),
              "number": _decimals(max(finite), 4, 6)}[kind]
    sign = "+" if kind == "signed" else ""

    return lambda v: (f"{f:{sign}.{places}f}" if (f := _number(v)) is not None and math.isfinite(f)
                      else format_value(v, key))


def _number(v: Any) -> float | None:
    """A table cell as a float when it is a number (Python, NumPy or a one-element tensor; not a boolean)."""
    if isinstance(v, torch.Tensor):
        v = v.item() if v.numel() == 1 else None
    if isinstance(v, np.generic):
        v = v.item()
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def mean_std(mean: Any, std: Any, n: int | None, key: str = "accuracy") -> str:
    """A mean over ``n`` runs (seeds) with its standard deviation, rounded by ``key``: ``0.400 ± 0.100``. One run
    has no spread to show: ``0.400 (n = 1)``; no mean: ``-``."""
    if mean is None:
        return "-"
    if (n is not None and n < 2) or std is None:
        return f"{format_value(mean, key)} (n = {1 if n is None else n})"
    return f"{format_value(mean, key)} ± {format_value(std, key)}"


def plural(n: int, word: str) -> str:
    """``1 epoch``, ``2 epochs``, ``0 epochs``: a count with its noun (regular plurals only)."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def header_label(key: str) -> str:
    """A column header from a snake_case key: ``fixed_set_accuracy_mean`` -> ``fixed set accuracy mean``,
    ``whitebox_pgd_accuracy`` -> ``white-box PGD accuracy``, ``total_s`` -> ``total (s)``. Keys that already
    hold spaces or capitals are kept as they are."""
    key = str(key)
    if " " in key or key != key.lower() or "_" not in key and key not in _WORDS:
        return key
    return " ".join(_WORDS.get(w, w) for w in key.split("_") if w)


# ---------------------------------------------------------------------------------------------- plots
def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def figure_png(fig: Any) -> bytes:
    """Render a matplotlib figure to PNG bytes and close it."""
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _to_numpy(v: Any) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        return v.detach().float().cpu().numpy()
    return np.asarray(v, dtype=float)


def _legend_outside(ax: Any) -> None:
    """The legend to the right of the axes, never over the data."""
    ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


def _style(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=FONT + 1)
    ax.set_xlabel(xlabel, fontsize=FONT)
    ax.set_ylabel(ylabel, fontsize=FONT)
    ax.tick_params(labelsize=FONT)


def _done(fig: Any, path: str | os.PathLike[str] | None) -> bytes:
    png = figure_png(fig)
    if path is not None:
        atomic_write_bytes(path, png)
    return png


_NARROW = 1e-6  # a value range this small relative to the values' magnitude draws as one value
_DEGENERATE_BINS = 9  # odd: the one value sits in the middle bin


def histogram_edges(values: Any, bins: int = 50) -> np.ndarray:
    """Bin edges for the finite ``values`` that work for any data.

    Spread data get ``bins`` equal bins over their range (computed in float64, so float32 values one ulp apart
    cannot ask for more bins than the range holds). Data that are (almost) one value, such as perturbation
    norms that all equal the radius, get a few bins on a small range centred on that value (5 % of it on each
    side); when no value is negative the range is clipped at 0, so norms, counts and radii never seem to reach
    below 0. Empty data get the unit interval."""
    arr = _to_numpy(values).astype(np.float64).ravel()
    arr = arr[np.isfinite(arr)]
    if not arr.size:
        return np.linspace(0.0, 1.0, bins + 1)
    lo, hi = float(arr.min()), float(arr.max())
    if hi - lo > _NARROW * max(abs(lo), abs(hi)):
        return np.linspace(lo, hi, bins + 1)
    centre = (lo + hi) / 2
    half = 0.05 * abs(centre) if centre else 0.05
    left, right = centre - half, centre + half
    if lo >= 0 and left < 0:
        left = 0.0
    return np.linspace(left, right, _DEGENERATE_BINS + 1)


def constant_value(values: Any | Mapping[str, Any]) -> tuple[int, float] | None:
    """``(count, value)`` when the finite ``values`` (one array, or label -> array, taken together) are one value
    within the tolerance of :func:`histogram_edges` (also when there are none: ``(0, nan)``); else None."""
    arr = np.concatenate([_to_numpy(v).astype(np.float64).ravel() for v in
                          (values.values() if isinstance(values, Mapping) else [values])] or [np.zeros(0)])
    arr = arr[np.isfinite(arr)]
    if not arr.size:
        return 0, float("nan")
    lo, hi = float(arr.min()), float(arr.max())
    return (int(arr.size), (lo + hi) / 2) if hi - lo <= _NARROW * max(abs(lo), abs(hi)) else None


def _integer_ticks(axis: Any) -> None:
    """Whole-number ticks (counts, rounds, epochs), also on an axis narrower than 1 (one point: one tick)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def save_histogram(values: Any | Mapping[str, Any], path: str | os.PathLike[str] | None, *, title: str = "",
                   xlabel: str = "", bins: int = 50, log: bool = False) -> bytes:
    """Histogram of one array, or of several (dict label -> values) overlaid. Returns the PNG bytes and,
    when ``path`` is given, writes them there atomically.

    Non-finite values are left out; any data draw, also empty, all-NaN, one value or all values equal (bins
    from :func:`histogram_edges`). The count axis has whole-number ticks."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    series = values if isinstance(values, Mapping) else {"": values}
    finite = [a[np.isfinite(a)] for a in (_to_numpy(v).astype(np.float64).ravel() for v in series.values())]
    edges = histogram_edges(np.concatenate(finite) if finite else np.zeros(0), bins)
    log = log and any(a.size for a in finite)  # nothing to count: a log axis would have no range
    for (label, _), arr in zip(series.items(), finite):
        ax.hist(arr, bins=edges, alpha=0.55 if len(series) > 1 else 0.9, label=label or None, log=log)
    if not log:
        _integer_ticks(ax.yaxis)
    _style(ax, title, xlabel, "count")
    if len(series) > 1:
        _legend_outside(ax)
    return _done(fig, path)


def save_lines(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], path: str | os.PathLike[str] | None,
               *, title: str = "", xlabel: str = "", ylabel: str = "",
               marks: Mapping[str, tuple[float, float]] | None = None) -> bytes:
    """Line plot of ``label -> (xs, ys)``; returns PNG bytes, written to ``path`` when given. ``marks`` (label ->
    (x, y)) rings a point and writes its label beside it (the kept epoch), visible also on a one-point line."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    points = {label: ([_num(x) for x in xs], [_num(y) for y in ys]) for label, (xs, ys) in series.items()}
    for label, (xs, ys) in points.items():
        ax.plot(xs, ys, marker="o", label=label)
    for label, (x, y) in (marks or {}).items():
        ax.plot([_num(x)], [_num(y)], marker="o", markersize=15, markerfacecolor="none", markeredgecolor="#cf222e",
                markeredgewidth=2, linestyle="none", label=label, zorder=5)
        right = _num(x) >= np.nanmean([v for xs, _ in points.values() for v in xs] or [0.0])  # label inwards
        ax.annotate(label, (_num(x), _num(y)), xytext=(-11 if right else 11, 9), textcoords="offset points",
                    ha="right" if right else "left", fontsize=FONT, color="#cf222e", fontweight="bold")
        points[label] = ([_num(x)], [_num(y)])
        ax.margins(0.08, 0.2)  # room for the ring and its label at the edge of the data
    if all(x.is_integer() for xs, _ in points.values() for x in xs):
        _integer_ticks(ax.xaxis)  # rounds, epochs: whole numbers
    _style(ax, title, xlabel, ylabel)
    ax.grid(alpha=0.3)
    if series:
        _legend_outside(ax)
    return _done(fig, path)


def _categories(groups: Mapping[str, Mapping[str, float]]) -> list[str]:
    cats: list[str] = []
    for d in groups.values():
        cats += [c for c in d if c not in cats]
    return cats


def _num(v: Any) -> float:
    """A value to draw: None and infinities (which no axis can show) become NaN, which draws nothing."""
    f = float("nan") if v is None else float(v)
    return f if math.isfinite(f) else float("nan")


def _errs(errors: Mapping[str, Mapping[str, float]] | None, name: str, cats: Sequence[str]) -> list[float] | None:
    """Error-bar half-widths of series ``name`` (their size: a negative half-width is drawn as its absolute)."""
    if not errors or name not in errors:
        return None
    return [abs(_num(errors[name].get(c, 0.0))) for c in cats]


def save_bars(groups: Mapping[str, Mapping[str, float]], path: str | os.PathLike[str] | None, *, title: str = "",
              ylabel: str = "", errors: Mapping[str, Mapping[str, float]] | None = None) -> bytes:
    """Grouped vertical bar chart: ``groups[series][category] = value`` (optional matching ``errors``).

    Meant for a few categories (budgets, models); with more than 12 categories it draws :func:`save_hbars`
    instead, which stays legible at any count. The legend sits to the right of the axes."""
    cats = _categories(groups)
    if len(cats) > 12:
        return save_hbars(groups, path, title=title, xlabel=ylabel, errors=errors)
    plt = _plt()
    width_in = min(7.0, max(4.5, 1.2 + 0.55 * len(cats) * max(1.0, 0.7 * len(groups))))
    fig, ax = plt.subplots(figsize=(width_in, 3.4))
    width = 0.8 / max(1, len(groups))
    xs = np.arange(len(cats))
    for i, (name, d) in enumerate(groups.items()):
        vals = [_num(d.get(c)) for c in cats]
        err = _errs(errors, name, cats)
        ax.bar(xs + i * width - 0.4 + width / 2, vals, width, yerr=err, label=name, capsize=2)
    ax.set_xticks(xs)
    ax.set_xticklabels(cats, rotation=30 if len(cats) > 4 else 0, ha="right" if len(cats) > 4 else "center")
    _style(ax, title, "", ylabel)
    ax.grid(axis="y", alpha=0.3)
    if len(groups) > 1:
        _legend_outside(ax)
    return _done(fig, path)


def save_hbars(groups: Mapping[str, Mapping[str, float]], path: str | os.PathLike[str] | None, *, title: str = "",
               xlabel: str = "", errors: Mapping[str, Mapping[str, float]] | None = None) -> bytes:
    """Grouped horizontal bar chart, one row per category (first category on top).

    The figure is 6.4 inches wide and grows in height with the number of categories and series; every label
    keeps the same font size (:data:`FONT` points), so 3 or 60 perturbation types read alike. The legend sits
    to the right of the axes."""
    plt = _plt()
    cats = _categories(groups)
    n_series = max(1, len(groups))
    row_in = 0.2 + 0.13 * n_series
    fig, ax = plt.subplots(figsize=(6.4, 0.9 + row_in * max(1, len(cats))))
    height = 0.8 / n_series
    ys = np.arange(len(cats))
    for i, (name, d) in enumerate(groups.items()):
        vals = [_num(d.get(c)) for c in cats]
        err = _errs(errors, name, cats)
        ax.barh(ys + i * height - 0.4 + height / 2, vals, height, xerr=err, label=name, capsize=2)
    ax.set_yticks(ys)
    ax.set_yticklabels(cats)
    ax.set_ylim(max(1, len(cats)) - 0.5, -0.5)
    _style(ax, title, xlabel, "")
    ax.grid(axis="x", alpha=0.3)
    if len(groups) > 1:
        _legend_outside(ax)
    return _done(fig, path)


def save_stacked_bar(parts: Mapping[str, float], path: str | os.PathLike[str] | None, *, title: str = "",
                     xlabel: str = "", colors: Sequence[str] | None = None) -> bytes:
    """ONE horizontal bar split into ``parts`` (label -> value, left to right in order; e.g. shares summing to 1),
    each segment in its own colour (``colors``, one per part) and written on when it is wide enough; the legend,
    with each part's value, sits to the right. Negative, None and NaN values draw nothing. Returns PNG bytes,
    written to ``path`` when given."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 1.5))
    values = [max(0.0, v) if math.isfinite(v := _num(x)) else 0.0 for x in parts.values()]
    total = sum(values)
    left = 0.0
    for i, (label, v) in enumerate(zip(parts, values)):
        color = colors[i] if colors is not None and i < len(colors) else None
        ax.barh([0], [v], left=left, height=0.6, color=color, label=f"{label} ({format_value(v, 'share')})")
        if total and v >= 0.07 * total:
            ax.text(left + v / 2, 0, format_value(v, "share"), ha="center", va="center", fontsize=FONT,
                    color="white")
        left += v
    ax.set_xlim(0, left if left > 0 else 1.0)
    ax.set_yticks([])
    _style(ax, title, xlabel, "")
    if parts:
        _legend_outside(ax)
    return _done(fig, path)


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
    return _done(fig, path)


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


_STYLE = (
    "*{box-sizing:border-box}"
    "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'Helvetica Neue',Arial,sans-serif;font-size:15px;"
    "line-height:1.45;color:#1f2328;background:#fff;max-width:1100px;margin:0 auto;padding:1.2em 1em 2em}"
    "h1{font-size:1.45em;margin:.2em 0 .5em}"
    "h2{font-size:1.2em;margin:1.6em 0 .5em;padding-bottom:.2em;border-bottom:1px solid #d8dee4}"
    "h3{font-size:1.05em;margin:1.2em 0 .4em}"
    "h1,h2,h3,p,figcaption,li{overflow-wrap:anywhere}"
    ".table-wrap{overflow-x:auto;max-width:100%;margin:.7em 0 1em}"
    "table{border-collapse:collapse;font-size:13.5px;font-variant-numeric:tabular-nums}"
    "th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:right;vertical-align:top}"
    "th{background:#f3f5f7;font-weight:600;white-space:normal;min-width:4.5em;max-width:11em;vertical-align:bottom}"
    "td{white-space:nowrap}"
    "td:first-child,th:first-child{text-align:left}"
    "table.kv{width:100%}table.kv th{text-align:left;max-width:none;width:30%;vertical-align:top}"
    "table.kv td{white-space:normal;overflow-wrap:anywhere;text-align:left}"
    "tr.sig td{background:#e7f5ea;font-weight:600}"
    "caption{caption-side:bottom;text-align:left;font-size:13px;color:#57606a;padding-top:.3em}"
    "figure{margin:1em 0}img{display:block;max-width:100%;height:auto}"
    "figcaption{font-size:13px;color:#57606a;margin-top:.2em}"
    "pre{background:#f6f8fa;padding:.6em;overflow-x:auto}"
    ".note{font-size:13px;color:#57606a}"
    ".verdict,.headline{padding:.55em .8em;border-left:5px solid;border-radius:4px;font-size:15.5px}"
    ".verdict-pass{border-color:#1a7f37;background:#e7f5ea}.verdict-fail{border-color:#cf222e;background:#ffebe9}"
    ".verdict-not-gated{border-color:#6e7781;background:#f3f5f7}.headline{border-color:#0969da;background:#ddf4ff}"
    ".badge{display:inline-block;padding:.1em .6em;margin-right:.5em;border-radius:4px;color:#fff;font-weight:700;"
    "letter-spacing:.04em}.badge-pass{background:#1a7f37}.badge-fail{background:#cf222e}"
    ".badge-not-gated{background:#6e7781}"
    "footer{margin-top:2em;font-size:12px;color:#57606a;border-top:1px solid #d8dee4;padding-top:.5em}"
)


def _signed(v: Any) -> str:
    """A difference of accuracies: sign and 3 decimals."""
    return "-" if v is None or v != v else f"{float(v):+.3f}"


def _significant_row(row: Mapping[str, Any]) -> bool:
    lo, hi = row.get("ci_low"), row.get("ci_high")
    return lo is not None and hi is not None and (float(lo) > 0 or float(hi) < 0)


class HtmlReport:
    """A self-contained HTML report built section by section, with one look for every verb.

    >>> rep = HtmlReport("robustest score")
    >>> rep.heading("Scores"); rep.table(rows, columns); rep.image(png_bytes, "caption")
    >>> rep.write("out/report.html")

    Tables sit in a horizontal-scroll wrapper, headers are words (:func:`header_label`) and cells are rounded by
    their column (:func:`format_value`). :meth:`from_results` starts a report of a results document; its
    settings and timings are appended as the last sections when the report is rendered.
    """

    def __init__(self, title: str) -> None:
        self.title = title
        self._parts: list[str] = []
        self._doc: Mapping[str, Any] | None = None

    @classmethod
    def from_results(cls, doc: Mapping[str, Any], title: str) -> HtmlReport:
        """A report of the results document ``doc`` (see :mod:`robustest.results`): the settings in effect and
        the timings are rendered at the end, and the footer names the format, version and world size."""
        rep = cls(title)
        rep._doc = doc
        return rep

    # ---------------------------------------------------------------- sections
    def heading(self, text: str, level: int = 2) -> HtmlReport:
        self._parts.append(f"<h{level}>{html.escape(text)}</h{level}>")
        return self

    def paragraph(self, text: str) -> HtmlReport:
        self._parts.append(f"<p>{html.escape(text)}</p>")
        return self

    def note(self, text: str) -> HtmlReport:
        self._parts.append(f'<p class="note">{html.escape(text)}</p>')
        return self

    def verdict(self, status: str, text: str) -> HtmlReport:
        """A gate's verdict (``status`` pass, fail, not-gated) as a green PASS, red FAIL or grey NOT GATED badge
        on a tinted band, then ``text``."""
        if status not in VERDICTS:
            raise ValueError(f"unknown verdict {status!r}: choose one of {', '.join(VERDICTS)}")
        self._parts.append(f'<p class="verdict verdict-{status}"><span class="badge badge-{status}">'
                           f"{VERDICTS[status]}</span> {html.escape(text)}</p>")
        return self

    def headline(self, text: str) -> HtmlReport:
        """The report's conclusion in one sentence, set apart at the top."""
        self._parts.append(f'<p class="headline">{html.escape(text)}</p>')
        return self

    def histogram(self, values: Any | Mapping[str, Any], caption: str, **kwargs: Any) -> HtmlReport:
        """A histogram of ``values`` (keyword arguments: :func:`save_histogram`'s), or, when every finite value is
        the same (:func:`constant_value`), a sentence saying so: a histogram of one value shows nothing else."""
        same = constant_value(values)
        if same is None:
            return self.image(save_histogram(values, None, **kwargs), caption)
        n, v = same
        v_text = f"{v:.4f}" if v == 0 or 1e-3 <= abs(v) < 1e5 else f"{v:.4g}"  # 0.3000; 4 digits when tiny or huge
        what = {0: "no finite value", 1: f"the one value is {v_text}"}.get(n, f"all {n} values equal {v_text}")
        return self.paragraph(f"{caption[:1].upper()}{caption[1:]}: {what}.")

    def preformatted(self, text: str) -> HtmlReport:
        self._parts.append(f"<pre>{html.escape(text)}</pre>")
        return self

    def table(self, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None, *,
              caption: str = "", marked: Sequence[bool] | None = None,
              kinds: Mapping[str, str] | None = None) -> HtmlReport:
        """Rows of dicts as a table: headers from :func:`header_label`, every number of a column in one format
        (:func:`column_formatter`, keyed by the column or by its ``kinds`` entry: fraction, signed, seconds,
        number); rows flagged in ``marked`` are highlighted."""
        if columns is None:
            columns = []
            for r in rows:
                columns += [k for k in r if k not in columns]
        head = "".join(f'<th scope="col">{html.escape(header_label(c))}</th>' for c in columns)
        fmt = {c: column_formatter([r.get(c) for r in rows], str(c), (kinds or {}).get(c)) for c in columns}
        body = []
        for i, r in enumerate(rows):
            cls = ' class="sig"' if marked is not None and i < len(marked) and marked[i] else ""
            cells = "".join(f"<td>{html.escape(fmt[c](r.get(c)))}</td>" for c in columns)
            body.append(f"<tr{cls}>{cells}</tr>")
        cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
        self._parts.append(f'<div class="table-wrap"><table>{cap}<thead><tr>{head}</tr></thead>'
                           f"<tbody>{''.join(body)}</tbody></table></div>")
        return self

    def key_values(self, values: Mapping[str, Any], *, caption: str = "") -> HtmlReport:
        """A two-column table of ``key: value`` pairs (values wrap instead of widening the page)."""
        rows = "".join(f'<tr><th scope="row">{html.escape(header_label(k))}</th>'
                       f"<td>{html.escape(format_value(v, str(k)))}</td></tr>" for k, v in values.items())
        cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
        self._parts.append(f'<div class="table-wrap"><table class="kv">{cap}<tbody>{rows}</tbody></table></div>')
        return self

    def significance(self, rows: Sequence[Mapping[str, Any]]) -> HtmlReport:
        """The paired comparison of each strategy against random selection: one row per (strategy, budget,
        metric) with ``mean_diff``, ``ci_low``, ``ci_high`` and ``n_seeds``; rows whose interval excludes 0 are
        highlighted and marked (higher or lower than random)."""
        if not rows:
            return self
        table = []
        marks = []
        for r in rows:
            sig = _significant_row(r)
            marks.append(sig)
            direction = "" if not sig else ("higher" if float(r["ci_low"]) > 0 else "lower")
            table.append({**r, "mean_diff": _signed(r.get("mean_diff")),
                          "interval": f"[{_signed(r.get('ci_low'))}, {_signed(r.get('ci_high'))}]",
                          "excludes 0": f"* {direction} than random" if sig else "no"})
        cols = ["strategy", "budget", "metric", "mean_diff", "interval", "n_seeds", "excludes 0"]
        self.heading("Each strategy against random selection (paired over seeds)")
        self.table(table, cols, marked=marks, caption="mean diff = strategy minus random on the same seed; the "
                   "interval is the confidence interval of that mean. Rows marked * (highlighted) have an interval "
                   "that excludes 0: the difference is significant at that level.")
        return self

    def image(self, png: bytes, caption: str = "", alt: str | None = None) -> HtmlReport:
        data = base64.b64encode(png).decode("ascii")
        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        alt_text = html.escape(alt if alt is not None else caption)
        self._parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{alt_text}">{cap}</figure>')
        return self

    # ---------------------------------------------------------------- output
    def _results_sections(self) -> list[str]:
        if self._doc is None:
            return []
        tail = HtmlReport("")
        settings = self._doc.get("settings") or {}
        tail.heading("Settings")
        if settings:
            tail.key_values(settings, caption="The options in effect for this run (defaults resolved).")
        else:
            tail.note("no settings")
        timings = self._doc.get("timings") or {}
        if timings:
            tail.heading("Timings")
            tail.key_values(timings, caption="Wall-clock seconds.")
        fmt = html.escape(str(self._doc.get("format", "")))
        tail._parts.append(f"<footer>results.json: format {fmt}, version {html.escape(str(self._doc.get('version')))},"
                           f" world size {html.escape(str(self._doc.get('world_size')))}</footer>")
        return tail._parts

    def render(self) -> str:
        body = "\n".join(self._parts + self._results_sections())
        title = html.escape(self.title)
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{title}</title>'
                f"<style>{_STYLE}</style></head><body><h1>{title}</h1>\n{body}\n</body></html>\n")

    def write(self, path: str | os.PathLike[str]) -> Path:
        return atomic_write_text(path, self.render())
