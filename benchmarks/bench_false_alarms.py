"""Benchmark: do the evaluation's checks raise flags on ordinary and adversarially trained models (false alarms)?

Trains a few zoo models briefly (plain and PGD-trained, grayscale and colour), then runs
``robustest.evaluate.evaluate`` with each version in --versions on --n test images per model and eps, and prints
every flag raised. The checks are meant to stay silent on these models: deterministic, logits out, working
gradients (docs/EVAL.md "Checks and flags").

    python benchmarks/bench_false_alarms.py --data-dir ../shared/data/mnist.npz --n 200 --versions auto,standard \\
        --out /tmp/false-alarms

Models: ``digits_cnn`` on the built-in digits (plain, and PGD-trained at eps 0.1), ``lenet5`` and ``mnist_small``
on MNIST (plain, and ``mnist_small`` PGD-trained at eps 0.3; --extra-checkpoint adds more robustest checkpoints),
and a 3-channel ``lenet5`` on synthetic colour images (no colour benchmark set is available offline: a learnable
synthetic task of coloured rectangles). Process CPU time per evaluation is reported.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from robustest import attacks, data, models  # noqa: E402
from robustest.evaluate import evaluate  # noqa: E402
from robustest.models.checkpoints import load_checkpoint  # noqa: E402
from robustest.train import fit  # noqa: E402


def pgd_train(model, x, y, eps, epochs, seed=0):
    """A few epochs of PGD-5 training (clean + adversarial batch, Adam 1e-3): an adversarially trained model."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), 64):
            xb, yb = x[perm[i:i + 64]], y[perm[i:i + 64]]
            model.eval()
            xa = attacks.pgd(model, xb, yb, eps=eps, steps=5, seed=i)
            model.train()
            loss = torch.nn.functional.cross_entropy(model(torch.cat([xb, xa])), torch.cat([yb, yb]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def colour_shapes(n, seed):
    """Synthetic colour images 3 x 28 x 28: a filled rectangle of one of 10 (colour, position) classes on noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = torch.rand(n, 3, 28, 28, generator=g) * 0.3
    colours = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [0, 1, 1]], dtype=torch.float32)
    for c in range(10):
        idx = (y == c).nonzero().flatten()
        r0 = 4 if c < 5 else 18
        x[idx, :, r0:r0 + 10, 8:20] = colours[c % 5].view(1, 3, 1, 1)
    return x.clamp(0, 1), y


def zoo(args):
    torch.manual_seed(0)
    dtr, dte = data.load("digits", split="train"), data.load("digits", split="test")
    out = []
    m = models.create("digits_cnn", input_size=8)
    fit(m, dtr, epochs=10, progress=False)
    out.append(("digits_cnn plain", m.eval(), dte.tensors, [0.05, 0.1]))
    h = models.create("digits_cnn", input_size=8)
    fit(h, dtr, epochs=5, progress=False)
    out.append(("digits_cnn PGD-trained eps 0.1", pgd_train(h, *dtr.tensors, 0.1, 3), dte.tensors, [0.1]))
    tr = data.load("mnist", root=args.data_dir, split="train", limit=args.train_limit)
    te = data.load("mnist", root=args.data_dir, split="test", limit=args.n)
    for name in ("lenet5", "mnist_small"):
        torch.manual_seed(0)
        m = models.create(name)
        fit(m, tr, epochs=2, progress=False)
        out.append((f"{name} plain", m.eval(), te.tensors, [0.1]))
    torch.manual_seed(0)
    h = models.create("mnist_small")
    fit(h, tr, epochs=1, progress=False)
    out.append(("mnist_small PGD-trained eps 0.3", pgd_train(h, *tr.tensors, 0.3, 2), te.tensors, [0.3]))
    for path in args.extra_checkpoint:
        out.append((f"checkpoint {Path(path).name}", load_checkpoint(path).eval(), te.tensors, [0.3]))
    xc, yc = colour_shapes(2000, 0)
    torch.manual_seed(0)
    c = models.create("lenet5", in_channels=3)
    fit(c, (xc, yc), epochs=3, progress=False)
    xt, yt = colour_shapes(args.n, 1)
    out.append(("lenet5 synthetic colour", c.eval(), (xt, yt), [8 / 255, 16 / 255]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "mnist.npz"))
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--train-limit", type=int, default=10000)
    p.add_argument("--versions", default="auto,standard")

    p.add_argument("--extra-checkpoint", nargs="*", default=[])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    print("| model | eps | version | clean | robust | flags | CPU s |")
    print("|---|---|---|---|---|---|---|")
    for name, model, (x, y), radii in zoo(args):
        x, y = x[:args.n], y[:args.n]
        for eps in radii:
            for version in args.versions.split(","):
                t = time.process_time()
                r = evaluate(model, (x, y), eps, version=version, seed=0)
                cpu = time.process_time() - t
                flags = ", ".join(f"{f.name}:{f.severity}({len(f.samples)})" for f in r.flags) or "-"
                rows.append({"model": name, "eps": eps, "version": version, "clean": r.clean_accuracy,
                             "robust": r.robust_accuracy, "flags": [f.to_dict() for f in r.flags], "cpu_s": cpu,
                             "n": r.num_samples, "escalated_blocks": r.settings.get("escalated_blocks")})
                print(f"| {name} | {eps:g} | {version} | {100 * r.clean_accuracy:.1f} | {100 * r.robust_accuracy:.1f} "
                      f"| {flags} | {cpu:.1f} |", flush=True)
    alarms = sum(1 for r in rows if any(f["severity"] != "info" for f in r["flags"]))
    print(f"\n{alarms} of {len(rows)} evaluations raised a warning or unreliable flag")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "results.json").write_text(json.dumps({"rows": rows, "alarms": alarms}, indent=1))


if __name__ == "__main__":
    main()
