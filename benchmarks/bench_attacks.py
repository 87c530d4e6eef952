"""Benchmark: PGD-40 (L-inf) on MNIST test images with a LeNet-5, robustest vs torchattacks vs ART vs the floor.

The floor is the unavoidable work of PGD: ``steps`` batched forward + backward passes with respect to the input
(parameters frozen), nothing else. All contenders attack the same model with the same settings (eps, step size,
steps, random start, batch size) in the same process, interleaved over ``--repeat`` rounds; the best round of each
is reported (the machine is shared and noisy, ratios from the same run are what count). Contenders are
interleaved batch by batch, so load changes hit all of them alike.

    python benchmarks/bench_attacks.py --data-dir ../shared/data --n 10000

Prints a markdown table: wall and process-CPU seconds, ratios to the floor and to robustest, robust accuracy.
With ``--threads 1`` the process CPU time measures the work done even when other processes share the cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from robustest import attacks, data, models  # noqa: E402
from robustest.core.modelcall import eval_mode, frozen_params  # noqa: E402
from robustest.models.checkpoints import load_checkpoint  # noqa: E402
from robustest.train import fit  # noqa: E402


def get_model(args: argparse.Namespace) -> torch.nn.Module:
    if args.checkpoint:
        return load_checkpoint(args.checkpoint).eval()
    tr = data.load("mnist", root=args.data_dir, split="train")
    x, y = tr.tensors
    torch.manual_seed(0)
    model = models.create("lenet5", mean=[0.1307], std=[0.3081])
    fit(model, (x[: args.train_n], y[: args.train_n]), epochs=1, seed=0, progress=False)
    return model.eval()


def floor(model, x, y, steps, bs):
    # the inputs PGD sees are perturbed images; the gradient's cost depends a little on the input values, so the
    # floor runs at a random start point of the eps-ball (drawn outside the timed region by the caller)
    with eval_mode(model), frozen_params(model):
        for s in range(0, x.shape[0], bs):
            xb, yb = x[s:s + bs], y[s:s + bs]
            for _ in range(steps):
                xr = xb.detach().requires_grad_(True)
                (g,) = torch.autograd.grad(F.cross_entropy(model(xr), yb, reduction="sum"), xr)
    return None


def ours(model, x, y, eps, alpha, steps, bs):
    return attacks.pgd(model, x, y, eps=eps, alpha=alpha, steps=steps, seed=0, batch_size=bs)


def make_torchattacks(model, eps, alpha, steps):
    try:
        import torchattacks
    except Exception as exc:  # noqa: BLE001 - peer not installed or not importable
        print(f"torchattacks unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    atk = torchattacks.PGD(model, eps=eps, alpha=alpha, steps=steps, random_start=True)

    def run(model, x, y, eps, alpha, steps, bs):
        torch.manual_seed(0)
        return torch.cat([atk(x[s:s + bs], y[s:s + bs]) for s in range(0, x.shape[0], bs)])

    return run


def make_art(model, eps, alpha, steps, bs, shape):
    try:
        import numpy as np
        from art.attacks.evasion import ProjectedGradientDescentPyTorch
        from art.estimators.classification import PyTorchClassifier
    except Exception as exc:  # noqa: BLE001
        print(f"ART unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    clf = PyTorchClassifier(model=model, loss=torch.nn.CrossEntropyLoss(), input_shape=tuple(shape), nb_classes=10,
                            clip_values=(0.0, 1.0), device_type="cpu")
    atk = ProjectedGradientDescentPyTorch(clf, norm=np.inf, eps=eps, eps_step=alpha, max_iter=steps, targeted=False,
                                          num_random_init=1, batch_size=bs, verbose=False)

    def run(model, x, y, eps, alpha, steps, bs):
        return torch.from_numpy(atk.generate(x.numpy(), y=y.numpy()))

    return run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--checkpoint", default=None, help="LeNet-5 checkpoint (default: train one for 1 epoch)")
    p.add_argument("--train-n", type=int, default=10000, help="training images for the default model")
    p.add_argument("--n", type=int, default=10000, help="test images attacked")
    p.add_argument("--eps", type=float, default=0.3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--alpha", type=float, default=0.01)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--skip", default="", help="comma-separated contenders to skip: torchattacks,art")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = get_model(args)
    te = data.load("mnist", root=args.data_dir, split="test")
    x, y = te.tensors[0][: args.n].contiguous(), te.tensors[1][: args.n].contiguous()
    eps, alpha, steps, bs = args.eps, args.alpha, args.steps, args.batch_size
    skip = set(filter(None, args.skip.split(",")))
    contenders = {"floor (40 fwd+bwd)": floor, "robustest pgd": ours}
    if "torchattacks" not in skip and (run := make_torchattacks(model, eps, alpha, steps)):
        contenders["torchattacks PGD"] = run
    if "art" not in skip and (run := make_art(model, eps, alpha, steps, bs, x.shape[1:])):
        contenders["ART PGD"] = run
    with torch.no_grad():
        clean_acc = float((model(x).argmax(1) == y).double().mean())
    # fine-grained interleaving: every batch is attacked by every contender in turn (rotating order), so load
    # changes on the shared machine hit all contenders alike; each round's per-contender total is one sample
    times: dict[str, list[float]] = {k: [] for k in contenders}
    cpu_times: dict[str, list[float]] = {k: [] for k in contenders}
    outs: dict[str, list[torch.Tensor]] = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(args.repeat):
        tot = dict.fromkeys(names, 0.0)
        cpu = dict.fromkeys(names, 0.0)
        for b, s in enumerate(range(0, x.shape[0], bs)):
            xb, yb = x[s:s + bs], y[s:s + bs]
            order = names[b % len(names):] + names[:b % len(names)]
            for name in order:
                fn = contenders[name]
                if fn is floor:
                    xs = (xb + torch.empty_like(xb).uniform_(-eps, eps)).clamp_(0, 1)
                t0, c0 = time.perf_counter(), time.process_time()
                out = fn(model, xs, yb, steps, bs) if fn is floor else fn(model, xb, yb, eps, alpha, steps, bs)
                tot[name] += time.perf_counter() - t0
                cpu[name] += time.process_time() - c0
                if out is not None and r == 0:
                    outs[name].append(out)
        for name in names:
            times[name].append(tot[name])
            cpu_times[name].append(cpu[name])
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:.2f}s wall {cpu[k]:.2f}s cpu" for k, v in tot.items()),
              file=sys.stderr, flush=True)
    robust: dict[str, float | None] = {}
    for name, parts in outs.items():
        if parts:
            out = torch.cat(parts)
            assert float((out - x).abs().max()) <= eps + 1e-5 and float(out.min()) >= 0 and float(out.max()) <= 1
            with torch.no_grad():
                robust[name] = float((model(out).argmax(1) == y).double().mean())
    best = {k: min(v) for k, v in times.items()}
    best_cpu = {k: min(v) for k, v in cpu_times.items()}
    fl, me = "floor (40 fwd+bwd)", "robustest pgd"
    print(f"\nPGD-{steps} L-inf, eps {eps}, step {alpha}, random start, {args.n} MNIST test images, LeNet-5 "
          f"(clean accuracy {clean_acc:.4f}), batch {bs}, torch threads {torch.get_num_threads()}, "
          f"best of {args.repeat} rounds, contenders interleaved per batch\n")
    print("| contender | wall s (best) | wall s (median) | CPU s (best) | x floor (wall) | x floor (CPU) "
          "| x robustest (wall) | x robustest (CPU) | robust acc |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k, v in times.items():
        ra = robust.get(k)
        print(f"| {k} | {best[k]:.2f} | {statistics.median(v):.2f} | {best_cpu[k]:.2f} | {best[k] / best[fl]:.3f} "
              f"| {best_cpu[k] / best_cpu[fl]:.3f} | {best[k] / best[me]:.3f} | {best_cpu[k] / best_cpu[me]:.3f} "
              f"| {'-' if ra is None else f'{ra:.4f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
