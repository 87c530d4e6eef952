"""Benchmark: robustest's bound propagation against an independent implementation (auto_LiRPA) on the same nets and
MNIST images: fidelity of the IBP and CROWN margin bounds, and CROWN's speed on ``mnist_small``.

    python benchmarks/bench_certify.py --lirpa PATH/TO/auto_LiRPA/checkout --data-dir ../shared/data/mnist.npz \\
        --n 100 --threads 1 --out OUT

auto_LiRPA is read from ``--lirpa`` (a source checkout: its package index release needs torch < 1.13) or from the
environment; without it the benchmark says so and stops (exit 0), since there is nothing to compare with.

Fidelity: on the first ``--n-fidelity`` images, auto_LiRPA run on one sample at a time (in a batch it bounds every
neuron unstable for any sample of the batch, so its figure for a sample moves with the batch; robustest's never
does), for each net (random initialisation, seed 0; ``mnist_small``, ``lenet1``, ``lenet5``, ``mlp``,
``digits_cnn`` on the MNIST images average-pooled to 8x8, ``madry_cnn`` on the first 4 images only, as CROWN on
it is slow in both libraries) and each ball (L-inf 0.01 and 0.1 clipped to [0, 1]; L2 0.3), the lower
bounds of the margins ``z_y - z_j`` from ``robustest.certify.margin_bounds`` and from auto_LiRPA's
``compute_bounds(C=spec, method=IBP|CROWN)`` with ``compare_crown_with_ibp=True`` (robustest's ``crown`` keeps the
tighter of CROWN's and IBP's bound, intermediate and final, as that option does). Reported: the largest absolute
difference, the largest relative difference ``|a - b| / max(|b|, 1e-3)``, and, when they differ by more than
1e-4, which library is tighter everywhere (the bound that is larger is the tighter one; both are sound).

Speed: CROWN on ``mnist_small`` and ``--n`` MNIST test images in one batch, ``--threads`` threads, best of
``--repeats`` runs alternating the two libraries in the same process (auto_LiRPA's graph is built once,
outside the timing). Prints markdown tables and writes OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from robustest import data, models  # noqa: E402
from robustest.certify import margin_bounds, margin_spec  # noqa: E402


def _lirpa(path: str | None):
    if path:
        sys.path.insert(0, path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import auto_LiRPA  # noqa: PLC0415
    except ImportError as exc:
        return None, str(exc)
    return auto_LiRPA, None


def _strip_dropout(net: nn.Module) -> nn.Module:
    for name, child in net.named_children():
        if isinstance(child, nn.Dropout):
            setattr(net, name, nn.Identity())
        else:
            _strip_dropout(child)
    return net


def _lirpa_bounds(lirpa, net, x, y, eps, norm, method, k):
    """auto_LiRPA's bounds, one sample at a time: in a batch it bounds every neuron unstable for any of its samples,
    so its figures for a sample move with the batch; alone, they are the sample's own."""
    bm = lirpa.BoundedModule(net, torch.zeros(1, *x.shape[1:]), device="cpu",
                             bound_opts={"compare_crown_with_ibp": True})
    out = []
    for i in range(x.shape[0]):
        xi = x[i:i + 1]
        ptb = (lirpa.PerturbationLpNorm(norm=float("inf"), eps=eps, x_L=(xi - eps).clamp(0, 1),
                                        x_U=(xi + eps).clamp(0, 1))
               if norm == "linf" else lirpa.PerturbationLpNorm(norm=2, eps=eps))
        lb, _ = bm.compute_bounds(x=(lirpa.BoundedTensor(xi, ptb),), C=margin_spec(y[i:i + 1], k), method=method)
        out.append(lb.detach())
    return torch.cat(out)


def fidelity(lirpa, images, labels, n: int) -> list[dict]:
    rows = []
    nets = [("mnist_small", 28, None), ("lenet1", 28, None), ("lenet5", 28, None), ("mlp", 28, None),
            ("digits_cnn", 8, None), ("madry_cnn", 28, 4)]
    for name, size, limit in nets:
        torch.manual_seed(0)
        net = _strip_dropout(models.create(name)).eval()
        x = images[:n] if size == 28 else F.adaptive_avg_pool2d(images[:n], size)
        y = labels[:n]
        if limit:
            x, y = x[:limit], y[:limit]
        k = 10
        off = margin_spec(y, k).abs().sum(-1) > 0
        for norm, eps in (("linf", 0.01), ("linf", 0.1), ("l2", 0.3)):
            for ours, theirs in (("ibp", "IBP"), ("crown", "CROWN")):
                with torch.no_grad():
                    mine = margin_bounds(net, x, y, eps, norm, ours)[off]
                ref = _lirpa_bounds(lirpa, net, x, y, eps, norm, theirs, k)[off]
                diff = (mine - ref).abs()
                rel = diff / ref.abs().clamp(min=1e-3)
                tighter = "-"
                if float(rel.max()) > 1e-4:
                    tighter = ("robustest" if bool((mine >= ref - 1e-5).all()) else
                               "auto_LiRPA" if bool((ref >= mine - 1e-5).all()) else "mixed")
                rows.append({"net": name, "n": int(x.shape[0]), "norm": norm, "eps": eps, "method": ours,
                             "max_abs": float(diff.max()), "max_rel": float(rel.max()), "tighter": tighter,
                             "mean_robustest": float(mine.mean()), "mean_auto_lirpa": float(ref.mean())})
                r = rows[-1]
                print(f"| {name} | {r['n']} | {norm} {eps:g} | {ours} | {r['max_abs']:.2e} | {r['max_rel']:.2e} | "
                      f"{tighter} |", flush=True)
    return rows


def speed(lirpa, images, labels, repeats: int) -> dict:
    torch.manual_seed(0)
    net = models.create("mnist_small").eval()
    x, y = images, labels
    eps = 0.01
    spec = margin_spec(y, 10)
    ptb = lirpa.PerturbationLpNorm(norm=float("inf"), eps=eps, x_L=(x - eps).clamp(0, 1), x_U=(x + eps).clamp(0, 1))
    bm = lirpa.BoundedModule(net, torch.zeros(1, *x.shape[1:]), device="cpu")
    bx = lirpa.BoundedTensor(x, ptb)
    ours, theirs = [], []
    for _ in range(repeats):
        t = time.process_time()
        with torch.no_grad():
            margin_bounds(net, x, y, eps, "linf", "crown")
        ours.append(time.process_time() - t)
        t = time.process_time()
        with torch.no_grad():
            bm.compute_bounds(x=(bx,), C=spec, method="CROWN")
        theirs.append(time.process_time() - t)
    out = {"n": int(x.shape[0]), "eps": eps, "robustest_s": min(ours), "auto_lirpa_s": min(theirs),
           "ratio": min(theirs) / min(ours), "threads": torch.get_num_threads()}
    print(f"\nCROWN, mnist_small, {out['n']} MNIST images, L-inf {eps}, {out['threads']} thread(s), best of {repeats} "
          f"(process CPU s): robustest {out['robustest_s']:.2f} s, auto_LiRPA {out['auto_lirpa_s']:.2f} s, "
          f"robustest {out['ratio']:.2f}x faster", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lirpa", default=None, help="path of an auto_LiRPA source checkout (else the installed one)")
    p.add_argument("--data-dir", default=None, help="MNIST folder or mnist.npz")
    p.add_argument("--n", type=int, default=100, help="MNIST test images (default 100)")
    p.add_argument("--n-fidelity", type=int, default=20, help="images of the fidelity comparison (default 20)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="bench_certify_out")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lirpa, why = _lirpa(args.lirpa)
    if lirpa is None:
        print(f"auto_LiRPA is not importable ({why}): nothing to compare with; pass --lirpa PATH")
        return 0
    warnings.simplefilter("ignore")
    te = data.load("mnist", root=args.data_dir, split="test", limit=args.n)
    x, y = (t.clone() for t in te.tensors)
    x, y = (x.float() / 255 if x.dtype == torch.uint8 else x.float()), y.long()
    print("| net | n | ball | method | max abs diff | max rel diff | tighter |\n|---|---|---|---|---|---|---|")
    rows = fidelity(lirpa, x, y, args.n_fidelity)
    timing = speed(lirpa, x, y, args.repeats)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"fidelity": rows, "speed": timing}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
