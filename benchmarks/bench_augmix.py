"""Time and largest allocation of each AugMix operation of robustest.weakrobust on one batch, with kornia's own
op where it has a different one (equalize) and the pairwise-comparison equalize robustest used before.

    python benchmarks/bench_augmix.py [--n 64] [--size 32] [--channels 3] [--threads 2] [--repeats 20]

The largest allocation is the biggest single CPU allocation the torch profiler records during one call: the
pairwise form builds N x C x P x P comparisons (P = H W pixels), the histogram form O(N C (P + 256)) values.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def pairwise_equalize(x: torch.Tensor) -> torch.Tensor:
    """The previous equalize for images up to 1024 pixels: each pixel's level compared with every other's."""
    n, c = x.shape[:2]
    q = (x.reshape(n, c, -1) * 255).round()
    return (q.unsqueeze(-1) >= q.unsqueeze(-2)).float().mean(-1).reshape_as(x).clamp(0, 1)


def measure(fn, x: torch.Tensor, repeats: int) -> tuple[float, float]:
    """(median seconds over ``repeats`` calls, largest single allocation in MiB during one call)."""
    from torch.profiler import ProfilerActivity, profile

    fn(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(x)
    largest = max((e.cpu_memory_usage for e in prof.events()), default=0)
    return float(np.median(times)), largest / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--channels", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import kornia

    from robustest.weakrobust import AUGMIX_OPS

    x = torch.rand(args.n, args.channels, args.size, args.size, generator=torch.Generator().manual_seed(0))
    rows = [(name, lambda t, op=op: op(t, np.random.default_rng(0), 3.0)) for name, op in AUGMIX_OPS.items()]
    rows += [("equalize, pairwise (previous)", pairwise_equalize), ("kornia.enhance.equalize (PIL's)",
                                                                     kornia.enhance.equalize)]
    print(f"{args.n} x {args.channels} x {args.size} x {args.size}, {args.threads} threads, "
          f"median of {args.repeats}\n")
    print("| operation | time (ms) | largest allocation (MiB) |\n|---|---:|---:|")
    for name, fn in rows:
        if name.startswith("equalize, pairwise") and args.size * args.size > 4096:
            print(f"| {name} | skipped (P x P too large) | - |")
            continue
        t, mib = measure(fn, x, args.repeats)
        print(f"| {name} | {t * 1e3:.2f} | {mib:.2f} |")


if __name__ == "__main__":
    main()
