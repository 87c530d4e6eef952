"""Benchmark: FOL-guided fuzzing batched over seeds vs one seed at a time (same algorithm, same run).

Three measurements on the same model (LeNet-5 on MNIST by default) and the same seeds:

1. ``batched``: ``robustest.fuzzing.fol_fuzz`` over ``--seeds`` seeds with ``--batch-size`` seeds at once;
2. ``single (reference-style)``: the same algorithm written the way the reference code runs it - one seed at a
   time, a Python list as work list, a second-order autograd pass per step - on the first ``--single-seeds``
   seeds (timing every seed would take too long; seeds/second is what is compared);
3. ``single (fol_fuzz, batch_size=1)``: the library itself with one seed per batch, on the same subset.

The step factors u come from the same seeded table in all three, so they fuzz identically up to float
rounding; the script prints how many tests each produced on the subset. It prints seeds/second, the ratios and
a markdown table, plus tests per seed of the batched run.

    python benchmarks/bench_fuzzing.py --checkpoint /tmp/lenet5/model.pt --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from robustest import data, models
from robustest.fuzzing import fol_fuzz
from robustest.models.checkpoints import load_checkpoint
from robustest.train import fit
from robustest.train.recipes import Recipe


def fol_fuzz_one_at_a_time(model: torch.nn.Module, x: torch.Tensor, steps: int = 40, lr: float = 0.1,
                           max_rel_l2: float = 0.5, seed: int = 0, grad_threshold: float = 1e-3) -> dict:
    """RobOT A3 one seed at a time (the reference code's structure), with fol_fuzz's u table."""
    n = x.shape[0]
    n_steps = 2 * (steps // 2)
    gen = torch.Generator().manual_seed(seed)
    u_table = (torch.rand(n, n_steps, generator=gen, dtype=torch.float64) + 0.5).to(x.device, x.dtype)
    tests = []
    grad_steps = 0
    for p in model.parameters():
        p.requires_grad_(False)
    for i in range(n):
        x0 = x[i:i + 1]
        with torch.no_grad():
            c = model(x0).argmax(1)
        xg = x0.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(F.cross_entropy(model(xg), c, reduction="sum"), xg)
        if float(g.norm()) <= grad_threshold:
            continue
        x0n = float(x0.norm())
        work = [x0.clone()]
        fol_max, it, k = 0.0, 0, 0
        while work and it < steps // 2:
            cur = work.pop(0)
            it += 1
            for _ in range(2):
                xg = cur.clone().requires_grad_(True)
                logits = model(xg)
                (g,) = torch.autograd.grad(F.cross_entropy(logits, c, reduction="sum"), xg, create_graph=True)
                obj = g.norm() - logits.softmax(1)[0, c[0]]
                (d,) = torch.autograd.grad(obj, xg)
                cur = (cur + lr * u_table[i, k] * d).clamp(0, 1).detach()
                k += 1
                grad_steps += 1
                xg = cur.clone().requires_grad_(True)
                logits = model(xg)
                (g,) = torch.autograd.grad(F.cross_entropy(logits, c, reduction="sum"), xg)
                fol = float(g.norm())
                dist = float((cur - x0).norm()) / x0n
                if fol > fol_max and dist < max_rel_l2:
                    fol_max = fol
                    if len(work) < steps // 2 - it:
                        work.append(cur)
                if int(logits.argmax(1)) != int(c) and dist < max_rel_l2:
                    tests.append((i, k, fol))
    return {"tests": len(tests), "gradient_steps": grad_steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="mnist", choices=["mnist", "digits"],
                    help="seeds from this test split (digits: 8x8, needs no files)")
    ap.add_argument("--checkpoint", default=None,
                    help="model.pt (default: LeNet-5 trained 1 epoch on 12k MNIST images / digits_cnn 30 epochs)")
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--single-seeds", type=int, default=50)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    ap.add_argument("--coverage-iterations", type=int, default=50,
                    help="coverage_fuzz (KMNC, k=10) iterations on the first 100 seeds (0: skip)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ap.add_argument("--no-mkldnn", action="store_true",
                    help="disable oneDNN convolutions for every variant (its per-call overhead weighs on batch 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.no_mkldnn:
        torch.backends.mkldnn.enabled = False

    root = args.data_dir if args.dataset == "mnist" else None
    if args.checkpoint:
        model = load_checkpoint(args.checkpoint)
    else:
        xtr, ytr = data.load(args.dataset, root=root, split="train").tensors
        torch.manual_seed(0)
        if args.dataset == "mnist":
            model = models.create("lenet5", num_classes=10, in_channels=1, input_size=28)
            fit(model, (xtr[:12000], ytr[:12000]), epochs=1, batch_size=128, recipe=Recipe(lr=2e-3), seed=0,
                         progress=False)
        else:
            model = models.create("digits_cnn", num_classes=10, in_channels=1, input_size=8)
            fit(model, (xtr, ytr), epochs=30, batch_size=64, seed=0, progress=False)
    model.eval().to(args.device)
    x, y = data.load(args.dataset, root=root, split="test").tensors
    x, y = x[: args.seeds].to(args.device), y[: args.seeds].to(args.device)
    sub = x[: args.single_seeds]

    fol_fuzz(model, x[:8], None, steps=4, batch_size=8)  # warm-up (allocator, kernels)
    fol_fuzz_one_at_a_time(model, x[:2], steps=4)
    t = time.perf_counter()
    full = fol_fuzz(model, x, y, steps=args.steps, batch_size=args.batch_size, seed=0)
    t_full = time.perf_counter() - t
    t = time.perf_counter()
    bsub = fol_fuzz(model, sub, None, steps=args.steps, batch_size=args.batch_size, seed=0)
    t_bsub = time.perf_counter() - t
    t = time.perf_counter()
    ref = fol_fuzz_one_at_a_time(model, sub, steps=args.steps, seed=0)
    t_ref = time.perf_counter() - t
    t = time.perf_counter()
    one = fol_fuzz(model, sub, None, steps=args.steps, batch_size=1, seed=0)
    t_one = time.perf_counter() - t

    n, m = x.shape[0], sub.shape[0]
    rate_full, rate_bsub = n / t_full, m / t_bsub
    rate_ref, rate_one = m / t_ref, m / t_one
    s = full.stats
    res = {
        "dataset": args.dataset, "device": args.device,
        "seeds": n, "single_seeds": m, "steps": args.steps, "batch_size": args.batch_size, "threads": args.threads,
        "onednn": torch.backends.mkldnn.enabled,
        "batched_seconds": t_full, "batched_seeds_per_s": rate_full,
        "batched_subset_seconds": t_bsub, "batched_subset_seeds_per_s": rate_bsub,
        "single_ref_seconds": t_ref, "single_ref_seeds_per_s": rate_ref,
        "single_fol_fuzz_seconds": t_one, "single_fol_fuzz_seeds_per_s": rate_one,
        "speedup_vs_ref": rate_full / rate_ref, "speedup_vs_batch1": rate_full / rate_one,
        "tests_subset": {"batched": len(bsub), "single_ref": ref["tests"], "single_fol_fuzz": len(one)},
        "gradient_steps_per_s": {"batched": full.stats["gradient_steps"] / t_full,
                                 "batched_subset": bsub.stats["gradient_steps"] / t_bsub,
                                 "single_ref": ref["gradient_steps"] / t_ref,
                                 "single_fol_fuzz": one.stats["gradient_steps"] / t_one},
        "run_1000": {k: s[k] for k in ("seeds_tried", "seeds_skipped", "tests", "tests_per_seed",
                                       "tests_per_seed_max", "seeds_with_tests", "iterations", "gradient_steps")},
    }
    print(json.dumps(res, indent=2))
    print()
    gs = res["gradient_steps_per_s"]
    print("| variant | seeds | wall s | seeds/s | seeds/s ratio | gradient steps/s | steps/s ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    rows = [(f"fol_fuzz batched (batch {args.batch_size})", n, t_full, rate_full, gs["batched"]),
            ("fol_fuzz batched, subset", m, t_bsub, rate_bsub, gs["batched_subset"]),
            ("one seed at a time, reference-style", m, t_ref, rate_ref, gs["single_ref"]),
            ("fol_fuzz batch_size=1", m, t_one, rate_one, gs["single_fol_fuzz"])]
    for name, k, sec, rate, steps_s in rows:
        print(f"| {name} | {k} | {sec:.2f} | {rate:.2f} | {rate_full / rate:.1f}x | {steps_s:.0f} | "
              f"{gs['batched'] / steps_s:.1f}x |")
    print()
    print(f"tests on the {m}-seed subset: batched {len(bsub)}, reference-style {ref['tests']}, batch_size=1 {len(one)}")
    print(f"run on {n} seeds: {s['seeds_tried']} tried, {s['seeds_skipped']} skipped (||grad|| <= 1e-3), "
          f"{s['tests']} tests, {s['tests_per_seed']:.2f} tests per tried seed (max {s['tests_per_seed_max']}), "
          f"{s['seeds_with_tests']} seeds with >= 1 test")
    if args.coverage_iterations > 0:
        from robustest.fuzzing import coverage_fuzz
        from robustest.metrics.coverage import CoverageProfile

        xtr = data.load(args.dataset, root=root, split="train").tensors[0]
        profile = CoverageProfile.build(model, xtr[:10000])
        t = time.perf_counter()
        nc = min(100, n)
        cov = coverage_fuzz(model, x[:nc], y[:nc], profile, metric="kmnc", iterations=args.coverage_iterations,
                            batch_size=64, seed=0)
        t_cov = time.perf_counter() - t
        cs = cov.stats
        res["coverage_fuzz"] = {"seeds": nc, "iterations": cs["iterations"], "seconds": t_cov,
                                "kmnc_seeds": cs["coverage_seeds"], "kmnc_final": cs["coverage_final"],
                                "mutants_valid": cs["mutants_valid"], "mutants_generated": cs["mutants_generated"],
                                "queue_added": cs["queue_added"], "tests": cs["tests"]}
        print(f"coverage_fuzz on {nc} seeds, {cs['iterations']} iterations x 64 mutants: KMNC (k=10) "
              f"{cs['coverage_seeds']:.4f} (seeds alone) -> {cs['coverage_final']:.4f}, "
              f"{cs['mutants_valid']}/{cs['mutants_generated']} valid mutants, {cs['queue_added']} queued, "
              f"{cs['tests']} failing tests, {t_cov:.1f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2)


if __name__ == "__main__":
    main()
