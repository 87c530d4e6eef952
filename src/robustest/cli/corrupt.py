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
import re
import sys
import time

import torch

from robustest.cli._common import add_data_args, add_run_args, load_data, out_dir, peak_rss_mib, positive_int
from robustest.corruptions.export import export
from robustest.errors import ConfigError
from robustest.runtime import atomic_write_json, image_shape, resolve_device
from robustest.steps import Steps, data_fingerprint, fingerprint

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
    p.add_argument("--format", choices=("npz", "npy"), default="npz",
                   help="npz: one Keras-style <corruption>.npz per corruption (default); npy: the CIFAR-10-C "
                        "layout (<corruption>.npy with severities 1-5 stacked + labels.npy), readable as "
                        "--dataset cifar10-c")
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
    c, h, w = image_shape(ds)
    if c not in (1, 3):
        raise ConfigError(f"the data has {c} channels; corruptions need 1 (grayscale) or 3 (RGB)")
    if args.format == "npy" and severities != [1, 2, 3, 4, 5]:
        raise ConfigError("--format npy writes the CIFAR-10-C layout, which holds severities 1-5: pass "
                          "--severities 1-5")
    n = len(ds)
    table = corruptions.default_table(h, w) if args.table == "auto" else args.table
    out = out_dir(args)
    settings = {"names": names, "severities": severities, "table": table, "seed": args.seed,
                "batch_size": args.batch_size, "format": args.format, "split": args.split}
    steps = Steps(out, fingerprint("corrupt", settings, data_fingerprint(ds)),
                  log=lambda msg: print(f"note: {msg}", file=sys.stderr))
    files = export(ds, out, names, severities, fmt=args.format, split=args.split, table=table,
                   batch_size=args.batch_size, seed=args.seed, device=device, show_progress=not args.no_progress,
                   run_step=steps.run)
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
        "format_written": args.format,
        "arrays": {f"x_{args.split}": "uint8 rows = severities x images (severity-major), H x W[ x 3]",
                   f"y_{args.split}": "labels per row", "severity": "severity per row",
                   "index": "position of the row's image in the source split"} if args.format == "npz" else
        {"<corruption>.npy": "uint8 5N x H x W x C, severity 1 first", "labels.npy": "5N labels"},
        "load_with": (f"robustest.data.load('npz', '<file>', split='{args.split}')" if args.format == "npz" else
                      "robustest.data.load('cifar10-c', OUT, corruption=NAME, severity=S)"),
        "corruptions": files,
        "total_seconds": time.perf_counter() - t_start,
        "peak_rss_mib": peak_rss_mib(),
    }
    atomic_write_json(out / "manifest.json", manifest)
    print(f"wrote {len(files)} corruption file(s) x {len(severities)} severities x {n} images "
          f"({args.dataset} {args.split}, {c}x{h}x{w}, {table} table) to {out} "
          f"in {manifest['total_seconds']:.1f}s")
    return 0
