"""Benchmark: is robustest's evaluation fooled by models that FAKE robustness (gradient masking; Athalye, Carlini &
Wagner 2018; Tramer et al. 2020)? Each masked model of ``tests/masked_zoo.py`` wraps one plain MNIST CNN that is
not robust at all; an adaptive attack written for each (BPDA, EOT, a loss on log-probabilities, the margin loss)
measures what the wrapper really withstands, and the pipeline of ``robustest eval``
(``robustest.evaluate.eval_pipeline.eval_pipeline``, its gate included) is run on the same images.

    python benchmarks/bench_masked.py --data-dir ../shared/data/mnist.npz --n 200 --linf 0.1 0.3 \\
        --versions fast standard auto --set both --threads 1 --out OUT

Model: ``--checkpoint`` (a robustest checkpoint), else ``mnist_small`` trained with ``robustest.train.fit`` on the
first ``--train-limit`` MNIST training images for ``--epochs`` epochs and saved to OUT/model.pt.

Masked models (``--set``): ``original`` = quantisation 3 levels, 3x3 median, shift 3 px + noise 0.1, softmax
output, a cut graph after a 3x3 blur, logits x 1000, thermometer 16 levels; ``other`` = the same kinds with other
parameters (4 levels, 5x5 median, shift 2 px + noise 0.15, softmax at temperature 0.25, 5x5 blur, logits x 10^4,
thermometer 10 levels); ``both``. The plain model is the control row (no flag expected).

Per row and L-inf eps, on the first ``--n`` test images: ``adaptive`` = robust accuracy under the adaptive attack
(``masked_zoo.adaptive_attack``: margin-loss PGD, ``--adaptive-steps`` steps, then targeted runs on the
``--adaptive-targets`` most likely other classes; clean and adversarial both correct, for the random model by a
majority of 11 forwards); for each version of ``--versions``: robustest's robust accuracy, its flags (as
name:severity; "-" when none), the verb's gate at ``--fail-under`` (passes iff robust accuracy >= fail_under and no
flag is "unreliable"), process CPU seconds, and ``fooled`` = robust > adaptive + 3 points AND the gate passed: the
failure the project must eliminate. A version that does not exist (ConfigError "unknown version") is "n/a"; any
other exception of the pipeline is caught and shown as its type and first line (a finding). Prints markdown tables,
writes OUT/results.json. Process CPU time with ``--threads 1`` measures the work even on shared cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import masked_zoo as mz  # noqa: E402
from robustest import data, models  # noqa: E402
from robustest.core.errors import ConfigError  # noqa: E402
from robustest.evaluate.eval_pipeline import eval_pipeline  # noqa: E402
from robustest.models.checkpoints import load_checkpoint, save_checkpoint  # noqa: E402
from robustest.train import fit  # noqa: E402

FOOLED_POINTS = 3.0
VOTES = 11

# (kind, constructor keywords): the parameters, and the same kinds with different ones
SETS = {
    "original": [("quantized", {"levels": 3}), ("median", {"k": 3}), ("shift_noise", {"shift": 3, "sigma": 0.1}),
                 ("softmax", {"temperature": 1.0}), ("nograd", {"k": 3}), ("scaled", {"scale": 1000.0}),
                 ("thermometer", {"levels": 16})],
    "other": [("quantized", {"levels": 4}), ("median", {"k": 5}), ("shift_noise", {"shift": 2, "sigma": 0.15}),
              ("softmax", {"temperature": 0.25}), ("nograd", {"k": 5}), ("scaled", {"scale": 1e4}),
              ("thermometer", {"levels": 10})],
}


def clock():
    return time.perf_counter(), time.process_time()


def since(t):
    w, c = clock()
    return w - t[0], c - t[1]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def flag_text(flag) -> str:
    return f"{flag.name}:{flag.severity}"


def get_model(args, out: Path):
    if args.checkpoint:
        model = load_checkpoint(args.checkpoint, map_location=args.device).eval()
        return model, {"checkpoint": args.checkpoint}
    name = "mnist_small" if "mnist_small" in models.names() else "lenet5"
    model = models.create(name)
    train = data.load("mnist", root=args.data_dir, split="train", limit=args.train_limit)
    t = clock()
    fit(model, train, epochs=args.epochs, seed=args.seed, device=args.device, progress=False)
    wall, cpu = since(t)
    path = save_checkpoint(out / "model.pt", model, metadata={"train_limit": args.train_limit,
                                                               "epochs": args.epochs, "seed": args.seed})
    print(f"trained {name} on {args.train_limit} MNIST images, {args.epochs} epoch(s): {cpu:.1f} CPU s, "
          f"{wall:.1f} wall s; saved {path}")
    return model.to(args.device).eval(), {"trained": name, "checkpoint": str(path), "train_cpu_s": cpu,
                                          "train_wall_s": wall}


def build_rows(base, which: str):
    rows = [("plain", "plain", base)]
    for set_name in (["original", "other"] if which == "both" else [which]):
        for kind, kw in SETS[set_name]:
            label = f"{kind}({', '.join(f'{k}={v:g}' for k, v in kw.items())})"
            rows.append((label, kind, mz.KINDS[kind](base, **kw).eval()))
    return rows


def run_version(model, x, y, eps, version, seed, fail_under, adaptive):
    t = clock()
    try:
        with tempfile.TemporaryDirectory() as out:  # the verb's samples.csv, not kept
            run = eval_pipeline(model, (x, y), eps, out=out, version=version, seed=seed, fail_under=fail_under)
    except ConfigError as exc:
        if "unknown version" in str(exc):
            return {"status": "n/a", "error": first_line(exc)}
        wall, cpu = since(t)
        return {"status": "error", "error": first_line(exc), "cpu_s": cpu, "wall_s": wall}
    except Exception as exc:  # noqa: BLE001 - robustest crashing on a masked model is a finding
        wall, cpu = since(t)
        return {"status": "error", "error": first_line(exc), "cpu_s": cpu, "wall_s": wall}
    wall, cpu = since(t)
    r = run.result
    flags = list(r.flags)
    robust, gate = float(r.robust_accuracy), bool(run.passed)
    fooled = gate and 100 * robust > 100 * adaptive + FOOLED_POINTS
    return {"status": "ok", "robust": robust, "clean": float(r.clean_accuracy), "flags": [flag_text(f) for f in flags],
            "gate": gate, "fooled": fooled, "cpu_s": cpu, "wall_s": wall}


def cells(v) -> list[str]:
    if v["status"] == "n/a":
        return ["n/a"] * 5
    if v["status"] == "error":
        return [f"ERROR ({v['error'].split(':')[0]})", "-", "error", f"{v['cpu_s']:.1f}", "no"]
    return [f"{100 * v['robust']:.1f}", ", ".join(v["flags"]) or "-", "pass" if v["gate"] else "fail",
            f"{v['cpu_s']:.1f}", "**FOOLED**" if v["fooled"] else "no"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=os.environ.get("ROBUSTEST_DATA") or str(ROOT.parent / "shared" / "data"),
                   help="MNIST folder or mnist.npz (default: $ROBUSTEST_DATA, else ../shared/data)")
    p.add_argument("--n", type=int, default=200, help="test images")
    p.add_argument("--linf", type=float, nargs="+", default=[0.1, 0.3])
    p.add_argument("--versions", nargs="+", default=["fast", "standard", "auto"])
    p.add_argument("--set", choices=["original", "other", "both"], default="both", dest="which")
    p.add_argument("--train-limit", type=int, default=10000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--checkpoint", default=None, help="robustest checkpoint of the base model (else train one)")
    p.add_argument("--out", default="bench_masked_out")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fail-under", type=float, default=0.5)
    p.add_argument("--adaptive-steps", type=int, default=100, help="PGD steps per run of the adaptive attack")
    p.add_argument("--adaptive-targets", type=int, default=3, help="targeted runs after the untargeted one")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base, model_info = get_model(args, out)
    te = data.load("mnist", root=args.data_dir, split="test", limit=args.n)
    x, y = (t.clone().to(args.device) for t in te.tensors)
    rows = build_rows(base, args.which)
    print(f"mnist, {x.shape[0]} test images, versions {' '.join(args.versions)}, set {args.which}, fail_under "
          f"{args.fail_under}, adaptive PGD {args.adaptive_steps} steps x (1 + {args.adaptive_targets} targets), "
          f"torch threads {args.threads}")
    results = []
    for eps in args.linf:
        table = []
        for label, kind, model in rows:
            forwards = VOTES if kind == "shift_noise" else 1
            t = clock()
            adv = mz.adaptive_attack(kind, model, x, y, eps, steps=args.adaptive_steps, seed=args.seed,
                                     targets=args.adaptive_targets)
            a_wall, a_cpu = since(t)
            inside = float((adv - x).abs().max()) <= eps + 1e-6 and float(adv.min()) >= 0 and float(adv.max()) <= 1
            adaptive = mz.robust_accuracy_of(model, x, y, adv, forwards=forwards, seed=args.seed + 1)
            clean = mz.robust_accuracy_of(model, x, y, x, forwards=forwards, seed=args.seed + 1)
            per = {v: run_version(model, x, y, eps, v, args.seed, args.fail_under, adaptive) for v in args.versions}
            rec = {"model": label, "kind": kind, "eps": eps, "clean": clean, "adaptive": adaptive,
                   "adaptive_in_ball": inside, "adaptive_cpu_s": a_cpu, "adaptive_wall_s": a_wall, "versions": per}
            results.append(rec)
            table.append(rec)
            for v, r in per.items():
                if r["status"] == "error":
                    print(f"  robustest {v} on {label} eps {eps:g}: {r['error']}", file=sys.stderr)
            sys.stderr.flush()
        print(f"\n### L-inf eps {eps:g}\n")
        head = ["model", "eps", "clean %", "adaptive %"]
        for v in args.versions:
            head += [f"{v} robust %", f"{v} flags", f"{v} gate", f"{v} CPU s", f"{v} fooled"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for rec in table:
            row = [rec["model"], f"{rec['eps']:g}", f"{100 * rec['clean']:.1f}", f"{100 * rec['adaptive']:.1f}"]
            for v in args.versions:
                row += cells(rec["versions"][v])
            print("| " + " | ".join(row) + " |")
        sys.stdout.flush()
    print("\n### summary\n")
    print("| version | rows | fooled | errors | n/a |")
    print("|---|---|---|---|---|")
    summary = {}
    for v in args.versions:
        st = [r["versions"][v] for r in results]
        fooled_rows = [f"{r['model']} eps {r['eps']:g}" for r in results if r["versions"][v].get("fooled")]
        summary[v] = {"rows": len(st), "fooled": len(fooled_rows), "errors": sum(s["status"] == "error" for s in st),
                      "n/a": sum(s["status"] == "n/a" for s in st), "fooled_rows": fooled_rows}
        s = summary[v]
        print(f"| {v} | {s['rows']} | {s['fooled']} | {s['errors']} | {s['n/a']} |")
    errors = sorted({(v, r["model"], r["versions"][v]["error"]) for r in results for v in args.versions
                     if r["versions"][v]["status"] == "error"})
    if errors:
        print("\nerrors of robustest's evaluate (a finding):\n")
        for v, label, e in errors:
            print(f"- {v} on {label}: {e}")
    settings = dict(vars(args))
    settings.update({"torch": torch.__version__, "fooled_points": FOOLED_POINTS, "votes": VOTES})
    (out / "results.json").write_text(json.dumps({"settings": settings, "model": model_info, "rows": results,
                                                  "summary": summary}, indent=1))
    print(f"\nwrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
