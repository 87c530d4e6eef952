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
import hashlib
import io
import time
from typing import Any

import numpy as np
import torch

from robustest.cli._common import (
    add_data_args,
    add_run_args,
    data_settings,
    fmt,
    int_list,
    load_data,
    log,
    name_list,
    out_dir,
    parse_list,
    peak_rss_mib,
    positive_int,
)
from robustest.errors import ConfigError
from robustest.results import write_results
from robustest.runtime import atomic_write_bytes, progress, resolve_device

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
    add_run_args(p)
    p.set_defaults(func=run)


def parse_severities(text: str) -> list[int]:
    """'1-5' -> [1..5]; '3' -> [3]; '1,3,5' -> [1, 3, 5]; '1-2,4' -> [1, 2, 4] (sorted, unique; each in 1-5).
    Raises ConfigError on anything else."""
    return parse_list(text, int, ranges=True, what="severity", lo=1, hi=5, sort=True)


def run(args: argparse.Namespace) -> int:
    from robustest import corruptions

    t_start = time.perf_counter()
    names = corruptions.resolve_names(args.corruptions)
    severities = args.severities
    device = resolve_device(None, args.device) if args.device else torch.device("cpu")
    ds = load_data(args)
    x, y = ds.tensors[0], ds.tensors[1]
    n, c, h, w = x.shape
    if c not in (1, 3):
        raise ConfigError(f"the data has {c} channels; corruptions need 1 (grayscale) or 3 (RGB)")
    table = corruptions.default_table(h, w) if args.table == "auto" else args.table
    out = out_dir(args)
    t_load = time.perf_counter() - t_start
    label_dtype = np.uint8 if int(y.min()) >= 0 and int(y.max()) < 256 else np.int64
    y_np = y.numpy().astype(label_dtype)
    files: dict[str, dict[str, Any]] = {}
    timings: dict[str, float] = {"load_s": t_load}
    samples = []  # the first image under every corruption and severity, for the report
    for name in progress(names, enabled=not args.no_progress, desc="corrupt", unit="corruption"):
        t0 = time.perf_counter()
        per_sev = []
        for sev in severities:
            chunks = []
            for start in range(0, n, args.batch_size):
                xb = x[start:start + args.batch_size].to(device)
                yb = corruptions.corrupt(xb, name, sev, seed=args.seed + start, table=table)
                chunks.append(torch.round(yb * 255).to(torch.uint8).cpu())
            per_sev.append(torch.cat(chunks))
        samples += [t[:1] for t in per_sev]
        arr = torch.cat(per_sev).permute(0, 2, 3, 1).numpy()  # S*N x H x W x C
        if c == 1:
            arr = arr[..., 0]
        payload = {
            f"x_{args.split}": np.ascontiguousarray(arr),
            f"y_{args.split}": np.tile(y_np, len(severities)),
            "severity": np.repeat(np.asarray(severities, dtype=np.uint8), n),
            "index": np.tile(np.arange(n, dtype=np.int64), len(severities)),
        }
        buf = io.BytesIO()
        np.savez_compressed(buf, **payload)
        raw = buf.getvalue()
        path = atomic_write_bytes(out / f"{name}.npz", raw)
        files[name] = {"file": path.name, "sha256": hashlib.sha256(raw).hexdigest(), "rows": int(arr.shape[0])}
        timings[f"{name}_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start
    settings = {**data_settings(args), "corruptions": names, "severities": severities, "table": table,
                "batch_size": args.batch_size, "seed": args.seed, "device": str(device)}
    results = {
        "num_images": n,
        "image_shape": [c, h, w],
        "arrays": {f"x_{args.split}": "uint8 rows = severities x images (severity-major), H x W[ x 3]",
                   f"y_{args.split}": "labels per row", "severity": "severity per row",
                   "index": "position of the row's image in the source split"},
        "load_with": f"robustest.data.load('npz', '<file>', split='{args.split}')",
        "corruptions": files,
        "peak_rss_mib": peak_rss_mib(),
        "files": {"report": "report.html", **{k: v["file"] for k, v in files.items()}},
    }
    doc = write_results(out, "corrupt", settings, results, timings)
    _report(doc, x[:1], samples).write(out / "report.html")
    log.info(f"wrote {len(files)} corruption file(s) x {len(severities)} severities x {n} images "
             f"({args.dataset} {args.split}, {c}x{h}x{w}, {table} table) to {out} "
             f"in {fmt(timings['total_s'], 'total_s')} s")
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
