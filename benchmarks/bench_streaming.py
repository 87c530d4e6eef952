"""Streaming a large image folder through `analyze` and `score --metric fol`: peak memory and wall time against
the same images held in memory as one float32 tensor.

Writes (once, cached) N synthetic 64x64 RGB PNGs in a class-per-folder tree, builds a small CNN (LeNet-5 for
3 x 64 x 64), and runs each job in a fresh process so that its peak resident memory is its own:

* ``folder``: ``robustest analyze/score --dataset folder --data-dir DIR [--workers W]`` (lazy Pillow decoding);
* ``tensor``: the same images decoded into one float32 N x 3 x 64 x 64 tensor first (what every loader did
  before), then the same library call on it.

    python benchmarks/bench_streaming.py --n 50000 --root /tmp/png50k --threads 1 --workers 1

Reports wall time, peak RSS (MiB) and the folder/tensor time ratio per job; ``--json FILE`` saves them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def make_images(root: Path, n: int, size: int = 64, classes: int = 10, seed: int = 0) -> None:
    """N smooth synthetic colour images (gradients, a disc and noise: PNGs of realistic size), 10 classes."""
    from PIL import Image

    done = root / f".complete-{n}"
    if done.is_file():
        return
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for i in range(n):
        c = i % classes
        d = root / f"class{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        cx, cy, r = rng.uniform(0.2, 0.8, 2).tolist() + [rng.uniform(0.1, 0.3)]
        disc = ((xx - cx) ** 2 + (yy - cy) ** 2 < r * r).astype(np.float32)
        base = np.stack([xx * (c + 1) / classes, yy, disc], axis=-1)
        img = np.clip(base * 200 + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(d / f"{i:06d}.png", optimize=False)
    done.write_text("ok")


def child(args: argparse.Namespace) -> None:
    """One job in this process; prints a JSON line with its time and peak RSS."""
    import torch

    torch.set_num_threads(args.threads)
    from robustest import data, metrics, models, weakrobust

    t_total = time.perf_counter()
    ds = data.load("folder", args.root, workers=args.workers)
    torch.manual_seed(0)
    model = models.create("lenet5", num_classes=10, in_channels=3, input_size=64).eval()
    if args.mode == "tensor":
        from robustest.core.batching import as_tensors

        x, y = as_tensors(ds)  # every image decoded into one float32 tensor first
        ds = (x, y)
    t0 = time.perf_counter()
    if args.job == "analyze":
        res = weakrobust.analyze(model, ds, n_neighbors=args.neighbors, eps=0.1)
        check = float(res.score.double().sum())
    else:
        res = metrics.score(model, ds, "fol", eps=0.03, batch_size=512)
        check = float(res.scores.double().sum())
    t_job = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"job": args.job, "mode": args.mode, "workers": args.workers, "seconds": t_job,
                      "seconds_with_loading": time.perf_counter() - t_total, "peak_rss_mib": rss,
                      "checksum": check}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=50000)
    p.add_argument("--root", default="/tmp/robustest-png50k")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--neighbors", type=int, default=4)
    p.add_argument("--jobs", default="analyze,score")
    p.add_argument("--json", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--job", default="analyze", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="folder", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    root = Path(args.root)
    t0 = time.perf_counter()
    make_images(root, args.n)
    print(f"{args.n} PNGs in {root} ({time.perf_counter() - t0:.0f} s to make or find)", flush=True)
    rows = []
    for job in args.jobs.split(","):
        for mode, workers in (("folder", 0), ("folder", args.workers), ("tensor", 0)):
            if mode == "folder" and workers == 0 and args.workers == 0 and rows and rows[-1]["mode"] == "folder":
                continue
            cmd = [sys.executable, __file__, "--child", "--job", job, "--mode", mode, "--root", str(root),
                   "--threads", str(args.threads), "--workers", str(workers), "--neighbors", str(args.neighbors)]
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            rows.append(row)
            print(f"{job:8s} {mode:6s} workers={workers}: {row['seconds']:7.1f} s  "
                  f"(with loading {row['seconds_with_loading']:7.1f} s)  peak RSS {row['peak_rss_mib']:7.0f} MiB",
                  flush=True)
        tensor = next(r for r in rows if r["job"] == job and r["mode"] == "tensor")
        for r in rows:
            if r["job"] == job and r["mode"] == "folder":
                r["ratio_vs_tensor"] = r["seconds"] / tensor["seconds"]
                r["ratio_vs_tensor_with_loading"] = r["seconds_with_loading"] / tensor["seconds_with_loading"]
                print(f"  {job} folder workers={r['workers']} / tensor: {r['ratio_vs_tensor']:.2f}x "
                      f"(job), {r['ratio_vs_tensor_with_loading']:.2f}x (with loading); same results: "
                      f"{abs(r['checksum'] - tensor['checksum']) < 1e-6 * max(1.0, abs(tensor['checksum']))}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
