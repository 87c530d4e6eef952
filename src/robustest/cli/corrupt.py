"""``robustest corrupt``: write a -C data set (common corruptions at chosen severities) of a data set split.

Writes one ``OUT/<corruption>.npz`` per corruption, Keras-style uint8 arrays:

* ``x_<split>``: the corrupted images of every chosen severity stacked severity by severity
  (S*N x H x W for grayscale, S*N x H x W x 3 for colour; values round(255 * x));
* ``y_<split>``: the labels, repeated for each severity (uint8 when they fit, else int64);
* ``severity``: the severity of every row (uint8); ``index``: the row's position in the source split.

``robustest.data.load("npz", "OUT/fog.npz", split=SPLIT)`` reads a file back. ``OUT/results.json``
records the settings in effect, the parameter table, image shape, the files with their SHA-256 and timings
(schema: docs/schemas/corrupt.schema.json); ``OUT/report.html`` shows one image under every corruption and
severity. Images are corrupted in batches of ``--batch-size`` with seed ``--seed + first index of the
batch``; the severities of one image share their random field.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from robustest.cli.args import add_data_args, add_run_args, int_list, name_list, positive_int
from robustest.cli.loading import load_data
from robustest.cli.output import log, write_run, written
from robustest.cli.settings import data_settings
from robustest.core.devices import resolve_device

ORDER = 40


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("corrupt", help="write common-corruption (-C) versions of a data set", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_args(p, split="test")
    p.add_argument("--corruptions", type=name_list("corruption"), default=["all"], metavar="LIST",
                   help="'all', groups (noise, blur, weather, digital, common, held-out) or names, comma-separated "
                        "(default: all 19)")
    p.add_argument("--severities", type=int_list(what="severity", lo=1, hi=5, sort=True), default=[1, 2, 3, 4, 5],
                   metavar="LIST", help="severities 1-5: a range 1-5, one 3, a list 1,3,5 or both 1-2,5 (default: 1-5)")
    p.add_argument("--table", choices=("auto", "cifar", "imagenet"), default="auto",
                   help="parameter table (default: auto = cifar up to 64 px, imagenet above)")
    p.add_argument("--batch-size", type=positive_int, default=256, help="images per batch (default: 256)")
    p.add_argument("--format", choices=("npz", "npy"), default="npz",
                   help="npz: one Keras-style <corruption>.npz per corruption (default); npy: the CIFAR-10-C "
                        "layout (<corruption>.npy with severities 1-5 stacked + labels.npy), readable as "
                        "--dataset cifar10-c")
    add_run_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from robustest import corruptions
    from robustest.corruptions.corrupt_pipeline import corrupt_pipeline

    t_start = time.perf_counter()
    names = corruptions.resolve_names(args.corruptions)
    device = resolve_device(None, args.device) if args.device else torch.device("cpu")
    ds = load_data(args)
    t_load = time.perf_counter() - t_start
    crun = corrupt_pipeline(ds, args.out, names, args.severities, fmt=args.format, split=args.split, table=args.table,
                            batch_size=args.batch_size, seed=args.seed, device=device, progress=not args.no_progress,
                            note=log.warning)  # checks the images before it makes --out
    out = Path(args.out)
    settings = {**data_settings(args), "corruptions": names, "severities": args.severities, "table": crun.table,
                "batch_size": args.batch_size, "seed": args.seed, "device": str(device), "format": args.format}
    doc = write_run(out, "corrupt", t_start, settings, crun.to_results(), {"load_s": t_load, **crun.timings},
                    lambda doc: _report(doc, crun.clean, crun.samples))
    log.info(crun.summary_line(f"{args.dataset} {args.split}", args.severities))
    written(out, doc["files"], t_start)
    return 0


def _report(doc: dict[str, Any], clean: torch.Tensor, samples: list[torch.Tensor]):
    """report.html of a -C set: the files, and the first image under every corruption and severity."""
    from robustest.report import HtmlReport, save_image_grid

    s = doc["settings"]
    rep = HtmlReport.from_results(doc, f"robustest corrupt: {s['dataset']} ({s['split']})")
    rep.paragraph(f"{len(doc['corruptions'])} corruption(s) x {len(s['severities'])} severities x "
                  f"{doc['num_images']} images of shape {'x'.join(map(str, doc['image_shape']))}, "
                  f"{s['table']} parameter table. Read a file back with {doc['load_with']}.")
    rows = [{"corruption": k, "file": v["file"], "rows": v["rows"], "seconds": doc["timings"].get(f"{k}_s"),
             "sha256": v["sha256"][:16] + "..."} for k, v in doc["corruptions"].items()]
    rep.table(rows, ["corruption", "file", "rows", "seconds", "sha256"])
    if samples:
        sev = s["severities"]
        names = list(doc["corruptions"])
        rows = []
        caps = []
        for i, name in enumerate(names):  # each row: the clean image, then the corruption at every severity
            rows += [clean.float()] + [t.float() / 255 for t in samples[i * len(sev):(i + 1) * len(sev)]]
            caps += [name] + [f"severity {v}" for v in sev]
        rep.heading("The first image under every corruption and severity")
        rep.image(save_image_grid(torch.cat(rows), None, captions=caps, ncols=len(sev) + 1, scale=1.3),
                  "One row per corruption: the clean image (captioned with the corruption's name), then the "
                  "corrupted image at each severity.")
    return rep
