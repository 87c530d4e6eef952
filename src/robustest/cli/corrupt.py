"""``robustest corrupt``: write a -C data set (common corruptions at chosen severities) of a data set split.

Writes one ``OUT/<corruption>.npz`` per corruption, Keras-style uint8 arrays:

* ``x_<split>``: the corrupted images of every chosen severity stacked severity by severity
  (S*N x H x W for grayscale, S*N x H x W x 3 for colour; values round(255 * x));
* ``y_<split>``: the labels, repeated for each severity (uint8 when they fit, else int64);
* ``severity``: the severity of every row (uint8); ``index``: the row's position in the source split.

``robustest.data.load("npz", "OUT/fog.npz", split=SPLIT)`` reads a file back. ``OUT/manifest.json``
records the arguments, the parameter table, image shape, files with SHA-256 and timings. Images are
corrupted in batches of ``--batch-size`` with seed ``--seed + first index of the batch``; the severities
of one image share their random field.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import re
import time

import numpy as np
import torch

from robustest.cli._common import add_data_args, add_run_args, load_data, out_dir, peak_rss_mib, positive_int
from robustest.errors import ConfigError
from robustest.runtime import atomic_write_bytes, atomic_write_json, progress, resolve_device

ORDER = 40


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("corrupt", help="write common-corruption (-C) versions of a data set", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_args(p, split="test")
    p.add_argument("--corruptions", default="all", metavar="LIST",
                   help="'all', a group (noise, blur, weather, digital, common, held-out) or comma-separated "
                        "names (default: all 19)")
    p.add_argument("--severities", default="1-5", metavar="S",
                   help="severities: a range '1-5', one '3' or a list '1,3,5' (default: 1-5)")
    p.add_argument("--table", choices=("auto", "cifar", "imagenet"), default="auto",
                   help="parameter table (default: auto = cifar up to 64 px, imagenet above)")
    p.add_argument("--batch-size", type=positive_int, default=256, help="images per batch (default: 256)")
    add_run_args(p)
    p.set_defaults(func=run)


def parse_severities(text: str) -> list[int]:
    """'1-5' -> [1..5]; '3' -> [3]; '1,3,5' -> [1, 3, 5] (sorted, unique; each in 1-5)."""
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise ConfigError(f"--severities range {part!r} is empty: write it low-high, e.g. 1-5")
            vals = range(lo, hi + 1)
        elif part.isdigit():
            vals = range(int(part), int(part) + 1)
        else:
            raise ConfigError(f"--severities {text!r} is not a range (1-5), a number (3) or a list (1,3,5)")
        for v in vals:
            if not 1 <= v <= 5:
                raise ConfigError(f"severity {v} is outside 1-5")
            out.add(v)
    if not out:
        raise ConfigError("--severities is empty: give e.g. 1-5")
    return sorted(out)


def run(args: argparse.Namespace) -> int:
    from robustest import corruptions

    t_start = time.perf_counter()
    names = corruptions.resolve_names(args.corruptions)
    severities = parse_severities(args.severities)
    device = resolve_device(None, args.device) if args.device else torch.device("cpu")
    ds = load_data(args)
    x, y = ds.tensors[0], ds.tensors[1]
    n, c, h, w = x.shape
    if c not in (1, 3):
        raise ConfigError(f"the data has {c} channels; corruptions need 1 (grayscale) or 3 (RGB)")
    table = corruptions.default_table(h, w) if args.table == "auto" else args.table
    out = out_dir(args)
    label_dtype = np.uint8 if int(y.min()) >= 0 and int(y.max()) < 256 else np.int64
    y_np = y.numpy().astype(label_dtype)
    files = {}
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
        files[name] = {"file": path.name, "sha256": hashlib.sha256(raw).hexdigest(), "rows": int(arr.shape[0]),
                       "seconds": time.perf_counter() - t0}
    manifest = {
        "format": "robustest-corruptions",
        "version": 1,
        "dataset": args.dataset,
        "data_dir": args.data_dir,
        "split": args.split,
        "limit": args.limit,
        "num_images": n,
        "image_shape": [c, h, w],
        "table": table,
        "severities": severities,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "device": str(device),
        "arrays": {f"x_{args.split}": "uint8 rows = severities x images (severity-major), H x W[ x 3]",
                   f"y_{args.split}": "labels per row", "severity": "severity per row",
                   "index": "position of the row's image in the source split"},
        "load_with": f"robustest.data.load('npz', '<file>', split='{args.split}')",
        "corruptions": files,
        "total_seconds": time.perf_counter() - t_start,
        "peak_rss_mib": peak_rss_mib(),
    }
    atomic_write_json(out / "manifest.json", manifest)
    print(f"wrote {len(files)} corruption file(s) x {len(severities)} severities x {n} images "
          f"({args.dataset} {args.split}, {c}x{h}x{w}, {table} table) to {out} "
          f"in {manifest['total_seconds']:.1f}s")
    return 0
