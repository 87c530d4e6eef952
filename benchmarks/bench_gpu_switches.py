"""The GPU hot-path switches on one zoo conv net: channels_last off/on (``ROBUSTEST_CHANNELS_LAST``) for the
inference forward pass (float32 and bf16 autocast) and the input-gradient pass the attacks make, and the
batch size ``--batch-size auto`` picks (forward only, and with the backward pass to the input).

    python benchmarks/bench_gpu_switches.py [--device cuda] [--model wrn] [--batch 256] [--steps 10]
                                            [--warmup 3] [--threads T] [--json OUT.json]

Each timing is the median of ``--steps`` timed passes over one fixed batch of ``--batch`` images at the
model's native size, after ``--warmup`` untimed ones, reported as images/s; ``on/off`` is the speed-up of
channels_last. On the CPU ``--device cpu`` forces channels_last on (``auto`` never switches it on there), so
the script can be checked without a GPU; its figures mean nothing for the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from robustest import models
from robustest.core.amp import autocast
from robustest.core.batchsize import auto_batch_size
from robustest.core.modelcall import forward, frozen_params


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rate(step, n: int, steps: int, warmup: int, device: torch.device) -> float:
    for _ in range(warmup):
        step()
    sync(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return n / statistics.median(times)


def build(name: str, device: torch.device) -> tuple[torch.nn.Module, tuple[int, int, int]]:
    """The zoo model ``name`` at its native size (seeded, eval mode) and its image shape C x H x W."""
    c, size, k = models.native(name)
    torch.manual_seed(0)
    return models.create(name, num_classes=k, in_channels=c, input_size=size).to(device).eval(), (c, size, size)


def measure(name: str, mode: str, args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    os.environ["ROBUSTEST_CHANNELS_LAST"] = mode
    model, shape = build(name, device)
    x = torch.rand((args.batch, *shape), generator=torch.Generator().manual_seed(0)).to(device)
    out: dict[str, float] = {}

    def fwd(amp: str | None = None) -> None:
        with torch.no_grad(), autocast(amp, device):
            forward(model, x)

    def grad() -> None:
        xg = x.clone().requires_grad_(True)
        with frozen_params(model):
            forward(model, xg).logsumexp(1).sum().backward()

    out["forward_fp32"] = rate(fwd, args.batch, args.steps, args.warmup, device)
    out["forward_bf16"] = rate(lambda: fwd("bf16"), args.batch, args.steps, args.warmup, device)
    out["input_gradient_fp32"] = rate(grad, args.batch, args.steps, args.warmup, device)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="wrn", help="a conv net of the zoo (default: wrn, 3 x 32 x 32)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: pass --device cpu", file=sys.stderr)
        return 2
    rows = {mode: measure(args.model, mode, args, device) for mode in ("off", "on" if device.type != "cuda"
                                                                       else "auto")}
    on = rows.get("auto", rows.get("on"))
    print(f"{args.model} on {device}, batch {args.batch} (images/s; channels_last off -> on)")
    for k in rows["off"]:
        print(f"  {k:22s} {rows['off'][k]:10.1f} {on[k]:10.1f}  on/off {on[k] / rows['off'][k]:.2f}x")
    os.environ["ROBUSTEST_CHANNELS_LAST"] = "auto"
    model, shape = build(args.model, device)
    data = torch.zeros(1, *shape)
    probe = {}
    for grad in (False, True):
        t0 = time.perf_counter()
        size = auto_batch_size("auto", model, data, default=256, grad=grad)
        probe["grad" if grad else "forward"] = {"batch_size": size, "seconds": time.perf_counter() - t0}
        print(f"  --batch-size auto ({'forward + input gradient' if grad else 'forward'}): {size} images "
              f"({probe['grad' if grad else 'forward']['seconds']:.1f} s to probe)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "device": str(device), "batch": args.batch,
                       "channels_last": rows, "probe": probe, "torch": torch.__version__}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
