"""The corrupt pipeline: write a -C data set of a split, each corruption a resumable step, and the first image under
every corruption and severity for the report (what ``robustest corrupt`` runs).

Example::

    run = corrupt_pipeline(test, "out", ["fog", "gaussian_noise"], [1, 3, 5], split="test")
    write_results("out", "corrupt", settings, run.to_results(), {**run.timings, "total_s": seconds})

(``run.timings`` hold the parts; results.json also records the whole run's ``total_s``.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from robustest.core.atomic import check_writable
from robustest.core.batching import image_shape, num_samples, take
from robustest.core.errors import ConfigError
from robustest.core.memory import peak_rss_mib
from robustest.core.steps import Steps, data_fingerprint, fingerprint
from robustest.corruptions.export import SEVERITIES, export
from robustest.corruptions.registry import corrupt, default_table

__all__ = ["CorruptRun", "check_corruptible", "corrupt_pipeline"]


@dataclass
class CorruptRun:
    """What :func:`corrupt_pipeline` wrote: ``files`` per corruption (file, sha256, rows), the ``clean`` first image
    [1, C, H, W] and ``samples``: that image under every corruption and severity (uint8 [1, C, H, W] each, corruption
    by corruption), the image shape, count, format, split, ``timings`` and the parameter ``table`` used."""

    files: dict[str, dict[str, Any]]
    clean: torch.Tensor
    samples: list[torch.Tensor]
    shape: tuple[int, int, int]
    num_images: int
    fmt: str
    split: str
    timings: dict[str, float]
    table: str

    def summary_line(self, source: str, severities: Sequence[int]) -> str:
        """What was written, in one line: files, ``severities``, images of ``source`` (the data set and split),
        their shape and the parameter table (what ``robustest corrupt`` prints)."""
        c, h, w = self.shape
        return (f"{len(self.files)} corruption file(s) x {len(severities)} severities x {self.num_images} images "
                f"({source}, {c}x{h}x{w}, {self.table} table)")

    def to_results(self) -> dict[str, Any]:
        """The results of the corrupt verb: count and shape, the arrays of the format, how to load a file back, the
        files per corruption, peak memory and every file written."""
        npz = self.fmt == "npz"
        return {
            "num_images": self.num_images,
            "image_shape": list(self.shape),
            "arrays": {f"x_{self.split}": "uint8 rows = severities x images (severity-major), H x W[ x 3]",
                       f"y_{self.split}": "labels per row", "severity": "severity per row",
                       "index": "position of the row's image in the source split"} if npz else
            {"<corruption>.npy": "uint8 5N x H x W x C, severity 1 first", "labels.npy": "5N labels"},
            "load_with": (f"robustest.data.load('npz', '<file>', split='{self.split}')" if npz else
                          "robustest.data.load('cifar10-c', OUT, corruption=NAME, severity=S)"),
            "corruptions": self.files,
            "peak_rss_mib": peak_rss_mib(),
            "files": {"report": "report.html", **{k: v["file"] for k, v in self.files.items()}},
        }


def check_corruptible(data: Any, fmt: str, severities: Sequence[int]) -> tuple[int, int, int]:
    """The image shape (C, H, W) of ``data`` when :func:`corrupt_pipeline` can write it in ``fmt``: a one-line
    ConfigError for other than 1 (grayscale) or 3 (RGB) channels, or the CIFAR-10-C layout (npy) without all five
    severities."""
    c, h, w = image_shape(data)
    if c not in (1, 3):
        raise ConfigError(f"the data has {c} channels; corruptions need 1 (grayscale) or 3 (RGB)")
    if fmt == "npy" and list(severities) != [1, 2, 3, 4, 5]:
        raise ConfigError("--format npy writes the CIFAR-10-C layout, which holds severities 1-5: pass "
                          "--severities 1-5")
    return c, h, w


def corrupt_pipeline(data: Any, out: str | Path, names: Sequence[str], severities: Sequence[int] = SEVERITIES, *,
                     fmt: str = "npz", split: str = "test", table: str = "cifar", batch_size: int = 256, seed: int = 0,
                     device: torch.device | str = "cpu", progress: bool = True,
                     note: Callable[[str], None] | None = None) -> CorruptRun:
    """Write the corruptions ``names`` of the labelled images ``data`` (N x C x H x W in [0, 1], C = 1 or 3) at
    ``severities`` into the folder ``out``, created if missing (:func:`robustest.corruptions.export.export`;
    ``fmt="npy"`` needs severities 1-5), each corruption a step a rerun of the same settings and data skips
    (``note`` says when saved steps of other settings are dropped). ``table``: the parameter table, "cifar",
    "imagenet" or "auto" (cifar up to 64 px, imagenet above: :func:`robustest.corruptions.default_table`). Raises
    ConfigError as :func:`check_corruptible` does."""
    c, h, w = check_corruptible(data, fmt, severities)
    if table == "auto":
        table = default_table(h, w)
    out = check_writable(out)
    run_settings = {"names": list(names), "severities": list(severities), "table": table, "seed": seed,
                    "batch_size": batch_size, "format": fmt, "split": split}
    steps = Steps(out, fingerprint("corrupt", run_settings, data_fingerprint(data)), log=note)
    files = export(data, out, names, severities, fmt=fmt, split=split, table=table, batch_size=batch_size, seed=seed,
                   device=device, show_progress=progress, run_step=steps.run)
    timings = {f"{name}_s": rec.pop("seconds", 0.0) for name, rec in files.items()}
    n = num_samples(data)
    clean = take(data, torch.arange(1))[0]
    # the first image under every corruption and severity, for the report (batch 0 of the files: seed + 0)
    first = take(data, torch.arange(min(n, batch_size)))[0].to(device)
    samples = [torch.round(corrupt(first, name, sev, seed=seed, table=table)[:1] * 255).to(torch.uint8).cpu()
               for name in names for sev in severities]
    return CorruptRun(files, clean, samples, (c, h, w), n, fmt, split, timings, table)
