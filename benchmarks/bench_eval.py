"""Benchmark: robustest's standard ensemble (robustest.evaluate.evaluate) vs torchattacks' AutoAttack on the same model
and images: robust accuracy (ours must be <= theirs + 1 point), time (ratio from the same run) and each attack's
share of the breaks.

Contenders, all in one process on the same images:

* ``robustest standard``: ``evaluate(version="standard")`` = APGD-CE (100 steps) -> APGD-T (9 targets x
  100 steps) -> FAB-T (9 targets x 100 steps) -> Square (5000 queries), AutoAttack's standard settings.
* ``robustest fast``: ``version="fast"`` = APGD-CE (100 steps) -> APGD-T (3 targets x 100 steps).
* ``robustest auto``: ``version="auto"`` (the default) = fast, the checks, a Square probe (1000 queries) on at most
  100 survivors, FAB-T and Square on every survivor only where the probe broke a sample. Target on models without
  gradient masking: robust accuracy within 0.5 points of standard (or lower) at <= 0.2x its CPU time, no flag.
* ``torchattacks AA``: ``torchattacks.AutoAttack(version="standard", n_classes=K, seed=0)`` as shipped (3.5.1: its
  APGD, APGD-T and FAB default to 10 steps, not AutoAttack's 100; Square 5000 queries with a rescaled schedule).
* ``torchattacks AA (paper)``: the same four torchattacks attacks with AutoAttack's standard settings (100 steps,
  Square without rescaling), i.e. the work our standard version does (``--paper``).

The torchattacks cascades run exactly like its MultiAttack (each attack on the images still correctly classified)
but attack by attack here, so that each attack's time and breaks can be reported. Every contender's images are
checked to lie in the eps-ball and [0, 1]; robust accuracy is recomputed from its images.

    python benchmarks/bench_eval.py --checkpoint OUT/model.pt --dataset mnist --data-dir ../shared/data --n 500 \\
        --linf 0.1 0.3 --l2 2.0 --threads 1 --paper

Prints one markdown table per threat model. Process CPU time with ``--threads 1`` measures the work done even when
other processes share the cores; wall time on a shared machine is noise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from robustest import data  # noqa: E402
from robustest.core.modelcall import forward  # noqa: E402
from robustest.evaluate import evaluate  # noqa: E402
from robustest.models.checkpoints import load_checkpoint  # noqa: E402


def clock():
    return time.perf_counter(), time.process_time()


def since(t):
    w, c = clock()
    return w - t[0], c - t[1]


def check(model, x, y, adv, eps, norm):
    d = (adv - x).flatten(1)
    size = d.abs().amax(1) if norm == "linf" else d.norm(dim=1)
    inside = bool((size <= eps * (1 + 1e-5) + 1e-6).all()) and float(adv.min()) >= 0 and float(adv.max()) <= 1
    with torch.no_grad():
        acc = float((forward(model, adv).argmax(1) == y).double().mean())
    return acc, inside


def run_ours(model, x, y, eps, norm, version, bs):
    t = clock()
    r = evaluate(model, (x, y), eps, norm=norm, version=version, seed=0, batch_size=bs, keep_adv=True)
    wall, cpu = since(t)
    acc, inside = check(model, x, y, r.adv.to(x.device), eps, norm)
    assert abs(acc - r.robust_accuracy) < 1e-9, (acc, r.robust_accuracy)
    total = max(1, sum(r.breaks.values()))
    parts = {k: (r.breaks[k] / total, r.timings[f"{k}_s"]) for k in r.attacks}
    flags = ", ".join(f"{f.name}:{f.severity}" for f in r.flags) or "-"
    return {"acc": acc, "clean": r.clean_accuracy, "wall": wall, "cpu": cpu, "inside": inside, "parts": parts,
            "flags": flags}


def torchattacks_list(model, eps, norm, k, paper):
    import torchattacks

    if not paper:
        aa = torchattacks.AutoAttack(model, norm="Linf" if norm == "linf" else "L2", eps=eps, version="standard",
                                     n_classes=k, seed=0)
        return list(zip(["apgd-ce", "apgd-t", "fab-t", "square"], aa._autoattack.attacks))
    n = "Linf" if norm == "linf" else "L2"
    return [("apgd-ce", torchattacks.APGD(model, norm=n, eps=eps, steps=100, n_restarts=1, seed=0, loss="ce")),
            ("apgd-t", torchattacks.APGDT(model, norm=n, eps=eps, steps=100, n_restarts=1, seed=0, n_classes=k)),
            ("fab-t", torchattacks.FAB(model, norm=n, eps=eps, steps=100, n_restarts=1, seed=0, multi_targeted=True,
                                       n_classes=k)),
            ("square", torchattacks.Square(model, norm=n, eps=eps, n_queries=5000, n_restarts=1, seed=0,
                                           resc_schedule=False))]


def run_torchattacks(model, x, y, eps, norm, k, paper):
    t = clock()
    atks = torchattacks_list(model, eps, norm, k, paper)
    final = x.clone()
    with torch.no_grad():
        robust = forward(model, x).argmax(1) == y
    clean = float(robust.double().mean())
    parts, breaks = {}, {}
    for name, atk in atks:  # torchattacks' MultiAttack, one attack at a time
        idx = robust.nonzero().flatten()
        if idx.numel() == 0:
            breaks[name], parts[name] = 0, 0.0
            continue
        t0 = time.perf_counter()
        adv = atk(x[idx], y[idx])
        with torch.no_grad():
            wrong = forward(model, adv).argmax(1) != y[idx]
        final[idx[wrong]] = adv[wrong].detach()
        robust[idx[wrong]] = False
        breaks[name], parts[name] = int(wrong.sum()), time.perf_counter() - t0
    wall, cpu = since(t)
    acc, inside = check(model, x, y, final, eps, norm)
    total = max(1, sum(breaks.values()))
    return {"acc": acc, "clean": clean, "wall": wall, "cpu": cpu, "inside": inside,
            "parts": {k2: (breaks[k2] / total, parts[k2]) for k2 in breaks}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--offset", type=int, default=0, help="first test image")
    p.add_argument("--linf", type=float, nargs="*", default=[0.1, 0.3])
    p.add_argument("--l2", type=float, nargs="*", default=[2.0])
    p.add_argument("--batch-size", type=int, default=None, help="robustest attack batch (default: all --n at once)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="device of the model and images (cuda: read the wall times)")
    p.add_argument("--paper", action="store_true", help="also run torchattacks with AutoAttack's paper settings")
    p.add_argument("--no-fast", action="store_true", help="skip robustest's fast version")
    p.add_argument("--no-auto", action="store_true", help="skip robustest's auto version")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = load_checkpoint(args.checkpoint, map_location=args.device).eval()
    te = data.load(args.dataset, root=args.data_dir, split="test")
    x, y = (t[args.offset:args.offset + args.n].clone().to(args.device) for t in te.tensors)
    with torch.no_grad():
        k = forward(model, x[:1]).shape[1]
    bs = args.batch_size or x.shape[0]
    try:
        import torchattacks

        ta_version = torchattacks.__version__
    except Exception as exc:  # noqa: BLE001 - peer missing or broken
        print(f"torchattacks unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
        ta_version = None
    print(f"{args.dataset}, {x.shape[0]} test images from {args.offset}, {k} classes, checkpoint {args.checkpoint}, "
          f"device {args.device}, torch threads {args.threads}, torchattacks {ta_version}")
    for norm, radii in (("linf", args.linf), ("l2", args.l2)):
        for eps in radii:
            rows = [("robustest standard", run_ours(model, x, y, eps, norm, "standard", bs))]
            if not args.no_fast:
                rows.append(("robustest fast", run_ours(model, x, y, eps, norm, "fast", bs)))
            if not args.no_auto:
                rows.append(("robustest auto", run_ours(model, x, y, eps, norm, "auto", bs)))
            if ta_version:
                rows.append(("torchattacks AA", run_torchattacks(model, x, y, eps, norm, k, paper=False)))
                if args.paper:
                    rows.append(("torchattacks AA (paper)", run_torchattacks(model, x, y, eps, norm, k, paper=True)))
            ref = rows[0][1]
            print(f"\n### {norm} eps {eps:g} (clean accuracy {ref['clean']:.4f})\n")
            print("| contender | robust acc | wall s | CPU s | CPU x robustest standard | in ball | flags | share of "
                  "breaks (seconds) |")
            print("|---|---|---|---|---|---|---|---|")
            for name, r in rows:
                parts = ", ".join(f"{a} {100 * s:.1f}% ({sec:.1f}s)" for a, (s, sec) in r["parts"].items())
                print(f"| {name} | {r['acc']:.4f} | {r['wall']:.1f} | {r['cpu']:.1f} | {r['cpu'] / ref['cpu']:.3f} | "
                      f"{r['inside']} | {r.get('flags', '')} | {parts} |")
            auto = dict(rows).get("robustest auto")
            if auto is not None:
                ok = auto["acc"] <= ref["acc"] + 0.005 and auto["cpu"] <= 0.2 * ref["cpu"]
                print(f"\nrobustest auto {auto['acc']:.4f} within 0.5 points of standard {ref['acc']:.4f} (or lower) "
                      f"at {auto['cpu'] / ref['cpu']:.3f}x its CPU time (target <= 0.2x): {'ok' if ok else 'NOT MET'}")
            for name, r in rows[1:]:
                if name.startswith("torchattacks"):
                    verdict = "ok" if ref["acc"] <= r["acc"] + 0.01 else "NOT MET"
                    print(f"\nrobustest standard {ref['acc']:.4f} <= {name} {r['acc']:.4f} + 0.01: {verdict}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
