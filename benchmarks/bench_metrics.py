"""Benchmark: FOL throughput on MNIST LeNet-5 against its floor and against a per-sample loop.

* floor: one batched forward + backward (input gradient of the summed cross-entropy) over the same
  images with the same batch size: the least work any FOL implementation must do;
* ours: ``robustest.metrics.fol`` (own seed, and with a distinct seed x0 so the inner product is used);
* loop: a per-sample implementation like RobOT's reference code (one forward/backward and the norm per
  image). It is timed on ``--loop-subset`` images and extrapolated linearly to the full set.

Then, unless ``--no-coverage``, the coverage metrics, LSA and DSA are timed against dnn-tip 0.1.1 on the same
activations of the same model (``bench_coverage.compare``: profile from ``--cov-train`` training images,
scores for the test images), with a check that the values agree.

Targets: ours / floor <= 1.15, loop / ours >= 20. Two estimates: whole-set timings (``--repeats``
interleaved runs, minimum kept) and paired per-batch ratios (every method timed on the same batch back to
back, median over batches), which stay steady when the machine is shared. Usage::

    python benchmarks/bench_metrics.py --data-dir ../shared/data [--checkpoint model.pt]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from robustest import data, metrics, models
from robustest.core.modelcall import eval_mode, frozen_params


def floor(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bs: int) -> None:
    with eval_mode(model), frozen_params(model):
        for s in range(0, len(x), bs):
            xb = x[s:s + bs].clone().requires_grad_(True)
            loss = F.cross_entropy(model(xb), y[s:s + bs], reduction="sum")
            torch.autograd.grad(loss, xb)


def loop_fol(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, x0: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-sample FOL (L-inf) as the reference code computes it: one gradient call per image."""
    out = torch.empty(len(x), device=x.device)
    with eval_mode(model), frozen_params(model):
        for i in range(len(x)):
            xi = x[i:i + 1].clone().requires_grad_(True)
            loss = F.cross_entropy(model(xi), y[i:i + 1])
            (g,) = torch.autograd.grad(loss, xi)
            g = g.flatten()
            out[i] = eps * g.abs().sum() - ((x[i] - x0[i]).flatten() * g).sum()
    return out


def timed(fn: Callable[[], object]) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--checkpoint", default=None, help="LeNet-5 checkpoint (default: train 1 epoch here)")
    ap.add_argument("--n", type=int, default=10000, help="test images (default: 10000)")
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--loop-subset", type=int, default=1000, help="images timed for the per-sample loop")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--paired-loop", type=int, default=25, help="images of each batch timed with the loop")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (the coverage comparison stays on the CPU)")
    ap.add_argument("--no-mkldnn", action="store_true",
                    help="disable oneDNN convolutions for every method (its per-call overhead weighs on batch-1 loops)")
    ap.add_argument("--no-coverage", action="store_true", help="skip the coverage / surprise-adequacy comparison")
    ap.add_argument("--cov-train", type=int, default=10000, help="training images for the coverage profile")
    ap.add_argument("--sa-train", type=int, default=5000, help="training images for the SA reference")
    ap.add_argument("--dsa-test", type=int, default=1000, help="test images for dnn-tip's (slow) DSA")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.no_mkldnn:
        torch.backends.mkldnn.enabled = False
    torch.manual_seed(0)
    test = data.load("mnist", root=args.data_dir, split="test")
    if args.checkpoint:
        from robustest.models.checkpoints import load_checkpoint

        model = load_checkpoint(args.checkpoint)
    else:
        from robustest.evaluate import accuracy
        from robustest.train import fit

        train = data.load("mnist", root=args.data_dir, split="train")
        model = models.create("lenet5")
        t = time.perf_counter()
        fit(model, train, epochs=1, batch_size=64, seed=0, progress=False)
        print(f"trained LeNet-5 for 1 epoch in {time.perf_counter() - t:.1f}s, "
              f"test accuracy {accuracy(model, test):.4f}")
    model.eval()
    x, y = test.tensors[0][: args.n].contiguous(), test.tensors[1][: args.n].contiguous()
    g = torch.Generator().manual_seed(0)
    x_adv = (x + 0.3 * torch.sign(torch.rand(x.shape, generator=g) - 0.5)).clamp(0, 1)  # x' != x0
    device = torch.device(args.device)
    cpu_model = copy.deepcopy(model).cpu()
    model, x, y, x_adv = model.to(device), x.to(device), y.to(device), x_adv.to(device)
    n, bs, m = len(x), args.batch_size, min(args.loop_subset, len(x))

    # correctness first: the three implementations agree
    ours_small = metrics.fol(model, x_adv[:m], y[:m], x0=x[:m], eps=0.3, batch_size=bs)
    ref_small = loop_fol(model, x_adv[:m], y[:m], x[:m], 0.3)
    diff = (ours_small - ref_small).abs()
    print(f"ours vs per-sample loop on {m} images (both float32): max |diff| {float(diff.max()):.2e}, "
          f"median relative {float((diff / ref_small.abs().clamp_min(1e-12)).median()):.2e} "
          f"(FOL median {float(ref_small.median()):.3g})")

    runs: dict[str, list[float]] = {"floor": [], "fol_own_seed": [], "fol_with_x0": [], "loop_subset": []}
    floor(model, x[:bs], y[:bs], bs)  # warm-up
    for _ in range(args.repeats):
        runs["floor"].append(timed(lambda: floor(model, x_adv, y, bs)))
        runs["fol_own_seed"].append(timed(lambda: metrics.fol(model, x_adv, y, eps=0.3, batch_size=bs)))
        runs["fol_with_x0"].append(timed(lambda: metrics.fol(model, x_adv, y, x0=x, eps=0.3, batch_size=bs)))
        runs["loop_subset"].append(timed(lambda: loop_fol(model, x_adv[:m], y[:m], x[:m], 0.3)))
    paired = paired_ratios(model, x, x_adv, y, bs, args.paired_loop, args.repeats)
    best = {k: min(v) for k, v in runs.items()}
    med = {k: statistics.median(v) for k, v in runs.items()}
    loop_full = best["loop_subset"] * n / m
    r_floor_own = best["fol_own_seed"] / best["floor"]
    r_floor_x0 = best["fol_with_x0"] / best["floor"]
    r_loop = loop_full / best["fol_with_x0"]
    onednn = "on" if torch.backends.mkldnn.enabled else "off"
    print(f"\nMNIST LeNet-5, {n} test images, batch {bs}, device {device}, {torch.get_num_threads()} threads, "
          f"oneDNN {onednn}, "
          f"min of {args.repeats} interleaved repeats (median in brackets)\n")
    print("| measurement | seconds | images/s | ratio |")
    print("|---|---|---|---|")
    print(f"| floor: batched forward+backward | {best['floor']:.3f} ({med['floor']:.3f}) | "
          f"{n / best['floor']:.0f} | 1.00 |")
    print(f"| robustest fol, x0 = x' | {best['fol_own_seed']:.3f} ({med['fol_own_seed']:.3f}) | "
          f"{n / best['fol_own_seed']:.0f} | {r_floor_own:.3f} x floor (target <= 1.15) |")
    print(f"| robustest fol, x0 != x' | {best['fol_with_x0']:.3f} ({med['fol_with_x0']:.3f}) | "
          f"{n / best['fol_with_x0']:.0f} | {r_floor_x0:.3f} x floor (target <= 1.15) |")
    print(f"| per-sample loop ({m} timed, x{n / m:.0f} extrapolated) | {loop_full:.3f} "
          f"({med['loop_subset'] * n / m:.3f}) | {n / loop_full:.0f} | robustest is {r_loop:.1f}x faster "
          f"(target >= 20) |")

    print(f"\nPaired per-batch medians ({args.repeats} x {n // bs} batches of {bs}; each batch timed with every "
          f"method back to back in random order, loop on {args.paired_loop} images of the batch, scaled):\n")
    print("| ratio | median | 10th-90th percentile |")
    print("|---|---|---|")
    for name, vals in paired.items():
        q = torch.tensor(vals, dtype=torch.float64).quantile(torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
        print(f"| {name} | {float(q[1]):.3f} | {float(q[0]):.3f} - {float(q[2]):.3f} |")

    if not args.no_coverage:
        if importlib.util.find_spec("dnn_tip") is None:
            print("\ncoverage / surprise adequacy: dnn-tip is not installed (pip install --no-deps dnn-tip==0.1.1 "
                  "psutil), comparison skipped")
        else:
            from bench_coverage import compare

            print(f"\nCoverage and surprise adequacy vs dnn-tip 0.1.1, same model, {len(x)} test images:")
            xtr = data.load("mnist", root=args.data_dir, split="train").tensors[0][: args.cov_train]
            compare(cpu_model, xtr, x.cpu(), sa_train=args.sa_train, dsa_test=args.dsa_test)


def paired_ratios(model: torch.nn.Module, x0: torch.Tensor, x: torch.Tensor, y: torch.Tensor, bs: int,
                  loop_n: int, repeats: int) -> dict[str, list[float]]:
    """Per batch, time every method on the same batch back to back (random order) and keep the ratios.

    Load changes on a shared machine affect neighbouring measurements alike, so the median of these ratios
    is far steadier than ratios of whole-set totals.
    """
    gen = torch.Generator().manual_seed(1)
    out: dict[str, list[float]] = {"fol (x0 = x') / floor": [], "fol (x0 != x') / floor": [],
                                    "per-sample loop / fol (x0 != x')": []}
    for _ in range(repeats):
        for s in range(0, len(x) - bs + 1, bs):
            xb, x0b, yb = x[s:s + bs], x0[s:s + bs], y[s:s + bs]
            jobs = {
                "floor": lambda xb=xb, yb=yb, x0b=x0b: floor(model, xb, yb, bs),
                "own": lambda xb=xb, yb=yb, x0b=x0b: metrics.fol(model, xb, yb, eps=0.3, batch_size=bs),
                "x0": lambda xb=xb, yb=yb, x0b=x0b: metrics.fol(model, xb, yb, x0=x0b, eps=0.3, batch_size=bs),
                "loop": lambda xb=xb, yb=yb, x0b=x0b: loop_fol(model, xb[:loop_n], yb[:loop_n], x0b[:loop_n], 0.3),
            }
            order = torch.randperm(len(jobs), generator=gen).tolist()
            names = list(jobs)
            t = {names[i]: timed(jobs[names[i]]) for i in order}
            out["fol (x0 = x') / floor"].append(t["own"] / t["floor"])
            out["fol (x0 != x') / floor"].append(t["x0"] / t["floor"])
            out["per-sample loop / fol (x0 != x')"].append(t["loop"] * bs / loop_n / t["x0"])
    return out


if __name__ == "__main__":
    main()
