"""Cost of the local robustness analysis against its floor.

``robustest.weakrobust.analyze`` on MNIST training images with Q neighbours each (LeNet-5) is timed against
the floor: Q + 1 plain forward passes over the same images in batches of the same size (no noise, no
scoring), which any implementation has to pay. Peak memory is the process's peak RSS growth during the
analysis (data and model are loaded before the baseline is taken).

    python benchmarks/bench_analyze.py --data-dir ../shared/data --n 60000 --neighbors 50
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import torch

from robustest import data as datasets
from robustest import models as zoo
from robustest import weakrobust as wr
from robustest.models.checkpoints import load_checkpoint
from robustest.train import fit


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


@torch.no_grad()
def floor(model: torch.nn.Module, x: torch.Tensor, passes: int, batch_size: int) -> float:
    t0 = time.perf_counter()
    for _ in range(passes):
        for s in range(0, x.shape[0], batch_size):
            model(x[s:s + batch_size])
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--checkpoint", default=None, help="LeNet-5 checkpoint (default: train one for 1 epoch on 5k)")
    p.add_argument("--n", type=int, default=60000, help="training images analysed (default: all 60000)")
    p.add_argument("--neighbors", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    train = datasets.load("mnist", root=args.data_dir, split="train")
    x, y = train.tensors[0][: args.n].contiguous(), train.tensors[1][: args.n].contiguous()
    if args.checkpoint:
        model = load_checkpoint(args.checkpoint)
    else:
        torch.manual_seed(0)
        model = zoo.create("lenet5", mean=[0.1307], std=[0.3081])
        fit(model, (train.tensors[0][:5000], train.tensors[1][:5000]), epochs=1, progress=False)
    model.eval()
    q = args.neighbors
    # the floor forwards exactly as many images as analyze: n * (Q + 1), in the batch size analyze uses
    chunk = wr.NOISE_BLOCK * max(1, args.batch_size // (wr.NOISE_BLOCK * (q + 1)))
    fwd_batch = chunk * (q + 1)
    floor(model, x[:fwd_batch], 1, fwd_batch)  # warm-up
    base_rss = current_rss_mib()
    times_a, times_f = [], []
    peak = 0.0
    for _ in range(args.repeat):  # interleaved, best of each: the machine is shared and noisy
        t0 = time.perf_counter()
        an = wr.analyze(model, (x, y), n_neighbors=q, batch_size=args.batch_size)
        times_a.append(time.perf_counter() - t0)
        if not times_f:
            peak = rss_mib()  # before the floor runs, which hold nothing but one batch either
        times_f.append(floor(model, x, q + 1, fwd_batch))
    peak_all = rss_mib()
    ta, tf = min(times_a), min(times_f)
    growth = peak - base_rss
    print(f"n={args.n} Q={q} batch={args.batch_size} (forward batch {fwd_batch}) threads={torch.get_num_threads()}")
    print(f"analyze runs {[round(t, 1) for t in times_a]}s, floor runs {[round(t, 1) for t in times_f]}s")
    print(f"analyze {ta:.2f}s  floor ({q + 1} forward passes) {tf:.2f}s  ratio {ta / tf:.3f}")
    print(f"peak RSS after the floor runs too: {peak_all:.0f} MiB; current RSS {current_rss_mib():.0f} MiB")
    print(f"peak RSS {peak:.0f} MiB (baseline before analyze {base_rss:.0f} MiB, growth <= {growth:.0f} MiB); "
          f"clean acc {float(an.clean_correct.float().mean()):.4f}")
    print()
    print("| images | Q | analyze (s) | floor: Q+1 forwards (s) | ratio | peak RSS (MiB) | RSS growth (MiB) |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.n} | {q} | {ta:.1f} | {tf:.1f} | {ta / tf:.2f} | {peak:.0f} | {growth:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
