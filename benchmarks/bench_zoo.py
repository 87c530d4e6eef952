"""Training throughput of the zoo: forward + backward of every model at its native size.

    python benchmarks/bench_zoo.py [--device cpu|cuda] [--batch 64] [--models NAMES] [--steps 2]
                                   [--warmup 1] [--threads T] [--amp] [--json OUT.json]

Each model is built at its native size (``robustest.models.native``: e.g. 3 x 32 x 32 and 10 classes for the
CIFAR networks, 3 x 224 x 224 and 1000 classes for resnet18/50 and vit_tiny), in training mode, and timed
on one fixed random batch of ``--batch`` images: forward through ``robustest.core.modelcall.forward``, cross-entropy,
backward (gradients of all parameters; no optimiser step). ``--warmup`` untimed steps, then ``--steps`` timed
ones; the median is reported as images/s, with the achieved multiply-add rate (3 x forward MACs per image
for forward + backward, the usual estimate) so GPU-hour estimates can be scaled from it. ``--amp`` runs
under ``torch.autocast`` (bfloat16) on CUDA.

No peer library is needed: where torchvision is installed, the same run also (1) loads torchvision's
resnet18/resnet50 state_dict into ours with ``load_state_dict(strict=True)`` and reports the largest
logit difference on the batch (eval mode), and (2) times torchvision's definition on the same batch, as the
ratio torchvision / ours.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from robustest import models
from robustest.core.modelcall import forward


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, warmup: int, steps: int, amp: bool
               ) -> list[float]:
    """Wall time of each timed forward + backward step."""
    model.train()
    times = []
    for i in range(warmup + steps):
        model.zero_grad(set_to_none=True)
        sync(x.device)
        t0 = time.perf_counter()
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(forward(model, x), y)
        loss.backward()
        sync(x.device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def torchvision_check(name: str, ours: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace
                      ) -> dict | None:
    if name not in ("resnet18", "resnet50") or importlib.util.find_spec("torchvision") is None:
        return None
    import torchvision

    ref = getattr(torchvision.models, name)(num_classes=1000).to(x.device)
    models.unwrap(ours).load_state_dict(ref.state_dict(), strict=True)
    with torch.no_grad():
        diff = (forward(ours.eval(), x[:8]) - ref.eval()(x[:8])).abs().max().item()
    t_ref = statistics.median(time_steps(ref, x, y, args.warmup, args.steps, args.amp))
    return {"torchvision_version": torchvision.__version__, "max_logit_diff_after_load": diff,
            "torchvision_step_s": t_ref}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--models", default=None,
                    help="comma-separated names (default: every model at its native size, wrn as its variants)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per model (median reported)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--amp", action="store_true", help="bfloat16 autocast (CUDA)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    names = args.models.split(",") if args.models else [n for n in models.names() if n != "wrn"] + models.variants()
    for n in names:
        models.resolve_name(n)  # unknown names fail before any timing
    info = {"device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "platform": platform.platform(), "python": sys.version.split()[0], "batch": args.batch,
            "steps": args.steps, "warmup": args.warmup, "amp": args.amp,
            "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    print(f"# {info}", flush=True)
    rows = []
    print("| model | input | params | MACs/image | step (s) | images/s | GMAC/s (3 x fwd) |", flush=True)
    print("|---|---|---|---|---|---|---|", flush=True)
    for name in names:
        c, s, k = models.native(name)
        prof = models.profile(name)
        torch.manual_seed(0)
        model = models.create(name).to(device)
        g = torch.Generator().manual_seed(0)
        x = torch.rand(args.batch, c, s, s, generator=g).to(device)
        y = torch.randint(0, k, (args.batch,), generator=g).to(device)
        times = time_steps(model, x, y, args.warmup, args.steps, args.amp)
        step = statistics.median(times)
        row = {"model": name, "input": [c, s, s], "classes": k, **prof, "step_s": step, "all_steps_s": times,
               "images_per_s": args.batch / step, "gmacs_per_s": 3 * prof["macs"] * args.batch / step / 1e9}
        tv = torchvision_check(name, model, x, y, args)
        if tv:
            row.update(tv, torchvision_over_ours=tv["torchvision_step_s"] / step)
        rows.append(row)
        print(f"| {name} | {c}x{s}x{s} | {prof['params'] / 1e6:.2f}M | {prof['macs'] / 1e6:.1f}M | {step:.3f} | "
              f"{row['images_per_s']:.1f} | {row['gmacs_per_s']:.1f} |"
              + (f" torchvision: max logit diff {tv['max_logit_diff_after_load']:.2e}, "
                 f"time ratio {row['torchvision_over_ours']:.2f}" if tv else ""), flush=True)
        del model, x, y
        if device.type == "cuda":
            torch.cuda.empty_cache()
    info["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    info["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if device.type == "cuda":
        info["peak_cuda_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    print(f"# load average start {info['loadavg_start']}, end {info['loadavg_end']}; "
          f"peak RSS {info['peak_rss_mib']:.0f} MiB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
