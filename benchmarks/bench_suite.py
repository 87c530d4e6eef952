"""Evidence for regression suites (docs/SUITE.md): coverage and width of the stratified interval, the paired
test's power, and the check's cost, over a family of models.

For every model of the weak-robust evidence family (``benchmarks/weakrobust_evidence.py``: MLPs, CNNs,
digits_cnn, ResNet-20; plain, noise-augmented, AugMix and adversarially fine-tuned members) the script records,
once, the per-sample robust outcome of ``robustest.evaluate.evaluate`` (``--version``, default ``fast``) on every test
image, the time of that full evaluation, the time of the same evaluation on a suite of each K, and the local
robustness analysis of the test split for each seed. A suite of K samples is then a subset of those outcomes
(what ``suite check`` would measure on it, up to the last bits of a convolution), so thousands of suites cost
nothing more:

* coverage: the share of suites whose 95 % interval contains the model's robust accuracy on the whole split,
  for the stratified suite (``robustest.suite.build.stratified_draw``, Korn-Graubard interval) and for a random
  suite of the same K (the same estimator with one stratum: Clopper-Pearson at the effective size); their mean
  widths and the root-mean-square error of the point estimates;
* power of the paired test (semi-synthetic): candidate outcomes = the baseline's with a drop of d points made by
  flipping robust samples to broken, plus optional churn (as many samples flipped each way); the share of suites
  on which the verdict is "regression" (``--alpha``, max_drop 0), and at d = 0 the false alarm rate;
* real pairs: every ordered pair of family members as (baseline, candidate), strata from the baseline's
  analysis; the share of suites flagging a regression (default max_drop 0.02) by the true drop on the split;
* cost: seconds of the evaluation on a suite of K against the whole split.

Resumable: OUT/models/<name>.pt per model; the statistics are recomputed from them every run.

    python benchmarks/bench_suite.py --dataset digits --out /tmp/bench_suite_digits
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robustest import data as datasets
from robustest import weakrobust as wr
from robustest.core.atomic import atomic_save, atomic_write_json, atomic_write_text
from robustest.evaluate import evaluate
from robustest.suite.build import stratified_draw
from robustest.suite.stats import paired_difference, stratified_estimate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weakrobust_evidence import EXTRA, FAMILY, build_model  # noqa: E402


def log(*a: Any) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="digits")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--train-size", type=int, default=None, help="a seeded random subset of the training split")
    p.add_argument("--test-size", type=int, default=None, help="the first N test images (default: all)")
    p.add_argument("--models", default=None, help="comma-separated family members (default: the 14 of FAMILY)")
    p.add_argument("--eps", type=float, default=0.1)
    p.add_argument("--version", choices=("fast", "standard"), default="fast")
    p.add_argument("--sizes", type=int, nargs="+", default=[60, 100, 200])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="analysis seeds")
    p.add_argument("--draws", type=int, default=20, help="suites drawn per seed and K")
    p.add_argument("--strata", type=int, default=4)
    p.add_argument("--neighbors", type=int, default=20)
    p.add_argument("--noise-eps", type=float, default=0.5)
    p.add_argument("--drops", type=float, nargs="+", default=[0.0, 0.03, 0.05])
    p.add_argument("--churn", type=float, nargs="+", default=[0.0, 0.03])
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--pair-draws", type=int, default=5, help="suites per seed and K for the real pairs")
    p.add_argument("--adv-eps", type=float, default=0.1, help="eps of the adversarially fine-tuned members")
    p.add_argument("--seed", type=int, default=0, help="training and attack seed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    family = {c["name"]: c for c in FAMILY + EXTRA}
    args.models = [c["name"] for c in FAMILY] if args.models is None else [m.strip() for m in args.models.split(",")]
    unknown = [m for m in args.models if m not in family]
    if unknown:
        p.error(f"unknown model {unknown[0]!r}: use names from {', '.join(family)}")
    args.family = family
    return args


def load_split(args: argparse.Namespace) -> tuple[torch.Tensor, ...]:
    tr = datasets.load(args.dataset, root=args.data_dir, split="train")
    te = datasets.load(args.dataset, root=args.data_dir, split="test",
                       limit=args.test_size)
    x, y = tr.tensors if hasattr(tr, "tensors") else (None, None)
    if x is None:
        from robustest.core.batching import as_tensors

        x, y = as_tensors(tr)
    if args.train_size is not None and args.train_size < len(y):
        idx = torch.randperm(len(y), generator=torch.Generator().manual_seed(args.seed))[: args.train_size]
        x, y = x[idx], y[idx]
    from robustest.core.batching import as_tensors

    xt, yt = as_tensors(te)
    return x.float(), y.long(), xt.float(), yt.long()


def model_record(name: str, args: argparse.Namespace, x, y, xt, yt) -> dict[str, Any]:
    """Train one member; its full-split outcomes, analyses, and the evaluation time of suites of each K."""
    t0 = time.perf_counter()
    k_cls = int(max(int(y.max()), int(yt.max())) + 1)
    model = build_model(args.family[name], x, y, k_cls, args.adv_eps, args.seed)
    t_train = time.perf_counter() - t0
    t1 = time.perf_counter()
    full = evaluate(model, (xt, yt), args.eps, version=args.version, seed=args.seed)
    t_full = time.perf_counter() - t1
    analyses = {}
    for s in args.seeds:
        an = wr.analyze(model, (xt, yt), n_neighbors=args.neighbors, eps=args.noise_eps, seed=s)
        analyses[str(s)] = an.to_dict()
    suite_s = {}
    an0 = wr.Analysis.from_dict(analyses[str(args.seeds[0])])
    for k in args.sizes:
        if k > len(yt):
            continue
        pos, *_ = stratified_draw(an0, k, args.strata, seed=0)
        t2 = time.perf_counter()
        evaluate(model, (xt[an0.index[pos]], yt[an0.index[pos]]), args.eps, version=args.version, seed=args.seed)
        suite_s[str(k)] = time.perf_counter() - t2
    return {"name": name, "robust": full.robust.bool(), "clean": full.clean_correct.bool(),
            "robust_accuracy": full.robust_accuracy, "clean_accuracy": full.clean_accuracy, "full_s": t_full,
            "suite_s": suite_s, "train_s": t_train, "analyses": analyses}


def _random_draw(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    return torch.sort(torch.randperm(n, generator=gen)[:k]).values


def statistics(recs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    n = len(recs[0]["robust"])
    sizes = [k for k in args.sizes if k <= n]
    cov: dict[str, Any] = {}
    for k in sizes:
        rows = {"stratified": {"hit": [], "width": [], "err": []}, "random": {"hit": [], "width": [], "err": []}}
        per_model = []
        for r in recs:
            truth = r["robust_accuracy"]
            hits_m = []
            for s in args.seeds:
                an = wr.Analysis.from_dict(r["analyses"][str(s)])
                for d in range(args.draws):
                    draw_seed = 1000 * s + d
                    pos, stratum_all, _, desc, _ = stratified_draw(an, k, args.strata, seed=draw_seed)
                    sizes_h = torch.bincount(stratum_all, minlength=len(desc))
                    e = stratified_estimate(r["robust"][an.index[pos]], stratum_all[pos], sizes_h)
                    rows["stratified"]["hit"].append(e.ci_low <= truth <= e.ci_high)
                    hits_m.append(e.ci_low <= truth <= e.ci_high)
                    rows["stratified"]["width"].append(e.ci_high - e.ci_low)
                    rows["stratified"]["err"].append(e.value - truth)
                    rp = _random_draw(n, k, torch.Generator().manual_seed(draw_seed + 7))
                    e = stratified_estimate(r["robust"][rp], torch.zeros(k, dtype=torch.long), torch.tensor([n]))
                    rows["random"]["hit"].append(e.ci_low <= truth <= e.ci_high)
                    rows["random"]["width"].append(e.ci_high - e.ci_low)
                    rows["random"]["err"].append(e.value - truth)
            per_model.append({"model": r["name"], "robust_accuracy": truth, "coverage": float(np.mean(hits_m))})
        cov[str(k)] = {m: {"coverage": float(np.mean(v["hit"])), "mean_width": float(np.mean(v["width"])),
                           "rmse": float(np.sqrt(np.mean(np.square(v["err"])))),
                           "bias": float(np.mean(v["err"])), "suites": len(v["hit"])} for m, v in rows.items()}
        cov[str(k)]["per_model"] = per_model
    # semi-synthetic power
    power: dict[str, Any] = {}
    for k in sizes:
        for drop in args.drops:
            for churn in args.churn:
                flags, drops_seen = [], []
                for mi, r in enumerate(recs):
                    base = r["robust"].clone()
                    rob, brk = base.nonzero().flatten(), (~base).nonzero().flatten()
                    n_drop, n_churn = round(drop * n), round(churn * n)
                    if n_drop + n_churn > len(rob) or n_churn > len(brk):
                        continue
                    for s in args.seeds:
                        an = wr.Analysis.from_dict(r["analyses"][str(s)])
                        for d in range(args.draws):
                            g = torch.Generator().manual_seed(10_000 * mi + 1000 * s + d)
                            cand = base.clone()
                            down = rob[torch.randperm(len(rob), generator=g)[: n_drop + n_churn]]
                            up = brk[torch.randperm(len(brk), generator=g)[:n_churn]]
                            cand[down] = False
                            cand[up] = True
                            pos, stratum_all, _, desc, _ = stratified_draw(an, k, args.strata, seed=1000 * s + d)
                            sizes_h = torch.bincount(stratum_all, minlength=len(desc))
                            idx = an.index[pos]
                            c = paired_difference(base[idx], cand[idx], stratum_all[pos], sizes_h)
                            flags.append(c.p_value < args.alpha and c.drop > 0.0)
                            drops_seen.append(float(base.double().mean() - cand.double().mean()))
                if flags:
                    power[f"K={k} drop={drop:g} churn={churn:g}"] = {
                        "k": k, "drop": drop, "churn": churn, "flagged": float(np.mean(flags)), "suites": len(flags)}
    # real pairs
    bins = [(-1.0, 0.0), (0.0, 0.02), (0.02, 0.05), (0.05, 0.10), (0.10, 1.0)]
    pairs: dict[str, Any] = {}
    for k in sizes:
        tally = {f"({lo:g}, {hi:g}]": [] for lo, hi in bins}
        for i, rb in enumerate(recs):
            for j, rc in enumerate(recs):
                if i == j:
                    continue
                true_drop = rb["robust_accuracy"] - rc["robust_accuracy"]
                key = next(f"({lo:g}, {hi:g}]" for lo, hi in bins if lo < true_drop <= hi)
                for s in args.seeds:
                    an = wr.Analysis.from_dict(rb["analyses"][str(s)])
                    for d in range(args.pair_draws):
                        pos, stratum_all, _, desc, _ = stratified_draw(an, k, args.strata, seed=1000 * s + d)
                        sizes_h = torch.bincount(stratum_all, minlength=len(desc))
                        idx = an.index[pos]
                        c = paired_difference(rb["robust"][idx], rc["robust"][idx], stratum_all[pos], sizes_h)
                        tally[key].append(c.p_value < args.alpha and c.drop > 0.02)
        pairs[str(k)] = {b: {"flagged": float(np.mean(v)) if v else None, "checks": len(v)} for b, v in tally.items()}
    cost = {str(k): {"mean_fraction": float(np.mean([r["suite_s"][str(k)] / r["full_s"] for r in recs
                                                       if str(k) in r["suite_s"]])),
                     "max_fraction": float(np.max([r["suite_s"][str(k)] / r["full_s"] for r in recs
                                                   if str(k) in r["suite_s"]]))} for k in sizes}
    models = [{"model": r["name"], "clean_accuracy": r["clean_accuracy"], "robust_accuracy": r["robust_accuracy"],
               "full_eval_s": r["full_s"], **{f"suite_{k}_s": v for k, v in r["suite_s"].items()}} for r in recs]
    return {"n_test": n, "models": models, "coverage": cov, "power": power, "real_pairs": pairs, "cost": cost}


def markdown(st: dict[str, Any]) -> str:
    lines = ["| model | clean acc | robust acc (full split) | full eval s |", "|---|---|---|---|"]
    lines += [f"| {m['model']} | {m['clean_accuracy']:.3f} | {m['robust_accuracy']:.3f} | {m['full_eval_s']:.1f} |"
              for m in st["models"]]
    lines += ["", "| K | suite | coverage of the 95 % interval | mean width | RMSE | bias | suites |",
              "|---|---|---|---|---|---|---|"]
    for k, v in st["coverage"].items():
        for m in ("stratified", "random"):
            c = v[m]
            lines.append(f"| {k} | {m} | {c['coverage']:.3f} | {c['mean_width']:.3f} | {c['rmse']:.4f} | "
                         f"{c['bias']:+.4f} | {c['suites']} |")
    lines += ["", "| K | drop (points) | churn | share flagged | suites |", "|---|---|---|---|---|"]
    for v in st["power"].values():
        lines.append(f"| {v['k']} | {100 * v['drop']:g} | {100 * v['churn']:g} % | {v['flagged']:.3f} | "
                     f"{v['suites']} |")
    lines += ["", "| K | true drop on the split | share of checks flagged | checks |", "|---|---|---|---|"]
    for k, v in st["real_pairs"].items():
        for b, c in v.items():
            f = "-" if c["flagged"] is None else f"{c['flagged']:.3f}"
            lines.append(f"| {k} | {b} | {f} | {c['checks']} |")
    lines += ["", "| K | suite eval / full eval (mean) | (max) |", "|---|---|---|"]
    lines += [f"| {k} | {v['mean_fraction']:.3f} | {v['max_fraction']:.3f} |" for k, v in st["cost"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    (out / "models").mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("family", "out", "threads")}
    marker = out / "settings.json"
    if marker.is_file() and json.loads(marker.read_text()) != json.loads(json.dumps(settings)):
        raise SystemExit(f"{out} holds a run with other settings: choose another --out")
    atomic_write_json(marker, settings)
    x, y, xt, yt = load_split(args)
    recs = []
    for name in args.models:
        path = out / "models" / f"{name}.pt"
        if path.is_file():
            recs.append(torch.load(path, weights_only=True))
            continue
        log(f"{name}: training and evaluating")
        rec = model_record(name, args, x, y, xt, yt)
        atomic_save(rec, path)
        recs.append(rec)
        log(f"{name}: robust {rec['robust_accuracy']:.3f}, full eval {rec['full_s']:.1f}s, suites {rec['suite_s']}")
    t0 = time.perf_counter()
    st = statistics(recs, args)
    st["statistics_s"] = time.perf_counter() - t0
    atomic_write_json(out / "summary.json", st)
    md = markdown(st)
    atomic_write_text(out / "summary.md", md)
    print(md)
    return st


if __name__ == "__main__":
    main()
