"""Does a validation set chosen by local robustness predict test robustness? (METHODS B2, docs/WEAKROBUST.md)

A family of models that differ in robustness (architectures, widths, epochs, noise augmentation, AugMix,
adversarial fine-tuning) is trained on one training set. For every model the script records, once, the
per-sample outcome of every perturbation (5 gradient attacks at an eps grid, common corruptions at some
severities) on EVERY training sample and every test sample, and the local robustness analysis of the training
set for every subset seed. A validation set of any strategy is then a subset of the training outcomes
(``ValidationResult.subset``, weighted for a stratified set): exactly the errors ``validate`` would measure
on it, up to the random starts of the attacks, without rerunning anything. Strategies compared at equal K:
``weak`` (the paper's rule: the K weakest), ``weak-correct`` (the K weakest correctly classified),
``stratified`` (K across score strata, weighted; proportional allocation, and Neyman allocation as
``stratified-neyman``) and ``random``; ``all`` (the whole training set) is the
reference every training subset estimates.

The two claimed uses:

1. Ranking models by robustness: Spearman's rho across models between the validation-set signal (mean
   adversarial error, mCE, and each perturbation type's error, averaged over types) and the same on the test
   split; mean over subset seeds (x --draws draws per seed for stratified and random sets), and a 95 %
   bootstrap interval over models (resampling models with replacement; the mean rho recomputed on every
   resample). Paired differences to ``random`` on the same resamples.
2. Per-model profile: within each model, Spearman's rho across perturbation types between validation-set and
   test error, and the share of types whose strength/weakness label (error above its family's mean) agrees
   with the label on the test split; mean over models and seeds, bootstrap over models.

Also the estimation error: mean absolute difference between each subset's mean adversarial error / mCE and
the whole training set's (what an unbiased subset estimates), over models and seeds.

Resumable: each model's outcomes are saved to OUT/models/<name>.pt when done; rerunning the same command
reuses them (another command with the same --out is refused). The statistics are recomputed from the saved
files every run (seconds).

    python benchmarks/weakrobust_evidence.py --dataset digits --out /tmp/wr_evidence_digits
    python benchmarks/weakrobust_evidence.py --dataset mnist --data-dir ../shared/data --train-size 3000 \\
        --test-size 1000 --out /tmp/wr_evidence_mnist
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import rankdata
from torch import nn

from robustest import corruptions as corr
from robustest import data as datasets
from robustest import models as zoo
from robustest import weakrobust as wr
from robustest.core.atomic import atomic_save, atomic_write_json, atomic_write_text
from robustest.core.errors import ConfigError
from robustest.train import fit
from robustest.train.recipes import Recipe

STRATEGIES = ("weak", "weak-correct", "stratified", "stratified-neyman", "random")
"""Compared at equal K; stratified-neyman is select_weak(strategy="stratified", allocation="neyman")."""
SLOW_CORRUPTIONS = ("frost", "snow", "spatter")  # the slowest on the CPU; --corruptions all includes them


def log(*a: Any) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# ----------------------------------------------------------------------------------------------- models
class WidthMLP(nn.Module):
    """Two hidden layers of ``width`` units (any image size)."""

    def __init__(self, c: int, h: int, k: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(c * h * h, width), nn.ReLU(), nn.Linear(width, width),
                                 nn.ReLU(), nn.Linear(width, k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class WidthCNN(nn.Module):
    """conv ``width``, conv ``2 width`` (3x3, same), max-pool 2, FC 64, K (any image size >= 2)."""

    def __init__(self, c: int, h: int, k: int, width: int) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(c, width, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * (h // 2) ** 2, 64), nn.ReLU(), nn.Linear(64, k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


FAMILY: list[dict[str, Any]] = [
    {"name": "mlp-w32-e2", "arch": "mlp", "width": 32, "epochs": 2},
    {"name": "mlp-w32-e20", "arch": "mlp", "width": 32, "epochs": 20},
    {"name": "mlp-w256-e3", "arch": "mlp", "width": 256, "epochs": 3},
    {"name": "mlp-w256-e30", "arch": "mlp", "width": 256, "epochs": 30},
    {"name": "mlp-w256-e10+adv", "arch": "mlp", "width": 256, "epochs": 10, "adv_ft": 3},
    {"name": "cnn-w4-e3", "arch": "cnn", "width": 4, "epochs": 3},
    {"name": "cnn-w16-e10", "arch": "cnn", "width": 16, "epochs": 10},
    {"name": "cnn-w64-e10", "arch": "cnn", "width": 64, "epochs": 10},
    {"name": "digits_cnn-e1", "arch": "digits_cnn", "epochs": 1},
    {"name": "digits_cnn-e20", "arch": "digits_cnn", "epochs": 20},
    {"name": "digits_cnn-e20-noise", "arch": "digits_cnn", "epochs": 20, "noise_aug": 0.6},
    {"name": "digits_cnn-e10+augmix", "arch": "digits_cnn", "epochs": 10, "augmix_ft": 3},
    {"name": "digits_cnn-e10+adv", "arch": "digits_cnn", "epochs": 10, "adv_ft": 3},
    {"name": "resnet20-e5", "arch": "resnet20", "epochs": 5},
]
"""The default family (14 models)."""

EXTRA: list[dict[str, Any]] = [
    {"name": "mlp-w64-e1", "arch": "mlp", "width": 64, "epochs": 1},
    {"name": "mlp-w64-e5-noise", "arch": "mlp", "width": 64, "epochs": 5, "noise_aug": 0.6},
    {"name": "mlp-w128-e5+augmix", "arch": "mlp", "width": 128, "epochs": 5, "augmix_ft": 1},
    {"name": "cnn-w4-e10+adv", "arch": "cnn", "width": 4, "epochs": 10, "adv_ft": 2},
    {"name": "cnn-w8-e5", "arch": "cnn", "width": 8, "epochs": 5},
]
"""Further members, cheap on 28x28 images, for --models (the MNIST run)."""


def build_model(cfg: dict[str, Any], x: torch.Tensor, y: torch.Tensor, k: int, adv_eps: float,
                seed: int) -> nn.Module:
    """Train one family member on (x, y) (seeded)."""
    torch.manual_seed(seed)
    c, h = x.shape[1], x.shape[2]
    if cfg["arch"] == "mlp":
        m: nn.Module = WidthMLP(c, h, k, cfg["width"])
    elif cfg["arch"] == "cnn":
        m = WidthCNN(c, h, k, cfg["width"])
    else:
        m = zoo.create(cfg["arch"], num_classes=k, in_channels=c, input_size=h)
    xt, yt = x, y
    if cfg.get("noise_aug"):
        g = torch.Generator().manual_seed(seed + 1)
        xn = (x + (torch.rand(x.shape, generator=g) - 0.5) * cfg["noise_aug"]).clamp(0, 1)
        xt, yt = torch.cat([x, xn]), torch.cat([y, y])
    fit(m, (xt, yt), epochs=cfg["epochs"], batch_size=64, recipe=Recipe(lr=1e-3), seed=seed, progress=False)
    if cfg.get("adv_ft"):
        wr.enhance(m, (x, y), (), epochs=cfg["adv_ft"], augmix=False, adversarial=True, eps=adv_eps,
                   adv_steps=5, seed=seed)
    if cfg.get("augmix_ft"):
        wr.enhance(m, (x, y), (), epochs=cfg["augmix_ft"], augmix=True, adversarial=False, seed=seed)
    return m.eval()


# ------------------------------------------------------------------------------------------- per model
def model_outcomes(cfg: dict[str, Any], args: argparse.Namespace, x, y, xt, yt, k: int) -> dict[str, Any]:
    """Train a model, then every per-sample outcome (train and test) and the analyses for every seed."""
    t0 = time.perf_counter()
    model = build_model(cfg, x, y, k, args.adv_eps, args.seed)
    t_train = time.perf_counter() - t0
    common = dict(perturbations=list(wr.ATTACKS) + args.corruptions, eps=args.attack_eps,
                  severities=tuple(args.severities), seed=args.seed,
                  attack_kwargs={a: {"steps": args.attack_steps} for a in ("pgd", "bim", "mifgsm")})
    t1 = time.perf_counter()
    tr = wr.validate(model, (x, y), None, **common)
    te = wr.validate(model, (xt, yt), None, **common)
    t_val = time.perf_counter() - t1
    t2 = time.perf_counter()
    analyses = [wr.analyze(model, (x, y), n_neighbors=args.neighbors, eps=args.noise_eps, seed=s).to_dict()
                for s in args.seeds]
    t_an = time.perf_counter() - t2
    return {"format": "weakrobust-evidence-model", "name": cfg["name"], "cfg": cfg,
            "keys": [list(key) for key in tr.keys], "train_wrong": tr.wrong, "test_wrong": te.wrong,
            "analyses": analyses, "clean_test_acc": 1 - float(te.wrong[0].float().mean()),
            "clean_train_acc": 1 - float(tr.wrong[0].float().mean()),
            "seconds": {"train": t_train, "validate": t_val, "analyze": t_an}}


# ------------------------------------------------------------------------------------------- statistics
def spearman_last(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rho along the last axis (average ranks for ties; NaN where either side is constant)."""
    ra, rb = rankdata(a, axis=-1), rankdata(b, axis=-1)
    ra = ra - ra.mean(-1, keepdims=True)
    rb = rb - rb.mean(-1, keepdims=True)
    den = np.sqrt((ra**2).sum(-1) * (rb**2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(-1) / np.where(den > 0, den, 1), np.nan)


def interval(v: np.ndarray) -> list[float]:
    v = v[np.isfinite(v)]
    return [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] if v.size else [float("nan")] * 2


def signals(res: wr.ValidationResult) -> tuple[dict[str, float], dict[str, str], float, float]:
    """(per-type errors without clean, labels by the family-mean rule, mean adversarial error, mCE)."""
    pt = {t: e for t, (f, e) in res.per_type().items() if f != "clean"}
    return pt, res.labels(), float(res.mean_adv_error), float(res.mce)


def evaluate(recs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """All the statistics from the saved per-model outcomes."""
    names = [r["name"] for r in recs]
    m_count = len(recs)
    keys = [tuple(k) for k in recs[0]["keys"]]
    types = list(dict.fromkeys(t for f, t, _lvl in keys if f != "clean"))
    n_train = recs[0]["train_wrong"].shape[1]
    test, full = [], []
    for r in recs:
        lab_y = torch.zeros(r["test_wrong"].shape[1], dtype=torch.long)
        test.append(signals(wr.ValidationResult(keys, r["test_wrong"], torch.arange(len(lab_y)), lab_y)))
        full.append(signals(wr.ValidationResult(keys, r["train_wrong"], torch.arange(n_train),
                                                torch.zeros(n_train, dtype=torch.long))))
    t_adv = np.array([t[2] for t in test])
    t_cor = np.array([t[3] for t in test])
    t_pt = np.array([[t[0][ty] for ty in types] for t in test])  # [M, T]
    t_lab = [t[1] for t in test]
    rng = np.random.default_rng(12345)
    boot = rng.integers(0, m_count, size=(args.bootstrap, m_count))  # the same resamples for every strategy

    # validation signals per (strategy, K): arrays [R, M] / [R, M, T], R = seeds (weak, weak-correct: the set is
    # fixed by the analysis) or seeds x draws (stratified, random: --draws samples per analysis seed, draw d of
    # seed s drawn with seed s + 1000 d); 'all' = the whole training set
    sets: dict[tuple[str, int], dict[str, np.ndarray]] = OrderedDict()
    for k in [*args.sizes, n_train]:
        for strat in (STRATEGIES if k != n_train else ("all",)):
            sampled = strat.startswith("strat") or strat == "random"
            runs = [(i, s + 1000 * d) for i, s in enumerate(args.seeds) for d in range(args.draws if sampled else 1)]
            adv = np.zeros((len(runs), m_count))
            cor, pt = np.zeros_like(adv), np.zeros((len(runs), m_count, len(types)))
            prof_rho, agree = np.zeros_like(adv), np.zeros_like(adv)
            for j, r in enumerate(recs):
                base = wr.ValidationResult(keys, r["train_wrong"], torch.arange(n_train),
                                           torch.zeros(n_train, dtype=torch.long))
                ans = [wr.Analysis.from_dict(a) for a in r["analyses"]]
                for i, (a_i, seed) in enumerate(runs):
                    if strat == "all":
                        sub = base
                    else:
                        name = "stratified" if strat.startswith("strat") else strat
                        ws = wr.select_weak(ans[a_i], k=k, strategy=name, strata=args.strata, seed=seed,
                                            allocation="neyman" if strat.endswith("neyman") else "proportional")
                        sub = base.subset(ws.indices, weights=ws.weights)
                    p, lab, a, c = signals(sub)
                    adv[i, j], cor[i, j] = a, c
                    pt[i, j] = [p[ty] for ty in types]
                    prof_rho[i, j] = spearman_last(pt[i, j], t_pt[j])
                    agree[i, j] = np.mean([lab[ty] == t_lab[j][ty] for ty in types])
            sets[(strat, k)] = {"adv": adv, "cor": cor, "pt": pt, "prof_rho": prof_rho, "agree": agree}

    def rank_stats(v: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Per signal: rho per seed [S] and the seeds' mean rho on every bootstrap resample [B]."""
        out = {}
        for sig, vals, tv in (("adversarial", v["adv"], t_adv), ("corruption", v["cor"], t_cor)):
            out[sig] = (spearman_last(vals, tv[None]), np.nanmean(spearman_last(vals[:, boot], tv[boot][None]), 0))
        pt_seed = np.nanmean(spearman_last(np.moveaxis(v["pt"], 2, 1), t_pt.T[None]), 1)  # [S]: mean over types
        ptb = spearman_last(np.moveaxis(v["pt"], 2, 1)[:, :, boot], t_pt.T[:, boot][None])  # [S, T, B]
        out["per-type"] = (pt_seed, np.nanmean(np.nanmean(ptb, 1), 0))
        return out

    rank = {key: rank_stats(v) for key, v in sets.items()}
    ranking, profile, estimation = [], [], []
    for (strat, k), v in sets.items():
        rs = rank[(strat, k)]
        for sig, (per_seed, bvals) in rs.items():
            row = {"strategy": strat, "k": k, "signal": sig, "rho_mean": float(np.nanmean(per_seed)),
                   "rho_per_draw": [float(r) for r in per_seed], "ci95": interval(bvals)}
            if strat != "all" and strat != "random":
                diff = bvals - rank[("random", k)][sig][1]
                row["minus_random"] = float(np.nanmean(per_seed) - np.nanmean(rank[("random", k)][sig][0]))
                row["minus_random_ci95"] = interval(diff)
            ranking.append(row)
        pm, am = np.nanmean(v["prof_rho"], 0), v["agree"].mean(0)  # per model, mean over seeds
        profile.append({"strategy": strat, "k": k, "rho_types_mean": float(np.nanmean(pm)),
                        "rho_types_ci95": interval(np.nanmean(pm[boot], 1)),
                        "label_agreement_mean": float(am.mean()), "label_agreement_ci95": interval(am[boot].mean(1)),
                        "rho_types_per_draw": [float(np.nanmean(r)) for r in v["prof_rho"]],
                        "label_agreement_per_draw": [float(r.mean()) for r in v["agree"]]})
        f_adv = np.array([f[2] for f in full])
        f_cor = np.array([f[3] for f in full])
        estimation.append({"strategy": strat, "k": k,
                           "mae_adv_vs_train": float(np.abs(v["adv"] - f_adv[None]).mean()),
                           "mae_mce_vs_train": float(np.abs(v["cor"] - f_cor[None]).mean()),
                           "bias_adv_vs_train": float((v["adv"] - f_adv[None]).mean()),
                           "bias_mce_vs_train": float((v["cor"] - f_cor[None]).mean()),
                           "mae_adv_vs_test": float(np.abs(v["adv"] - t_adv[None]).mean()),
                           "mae_mce_vs_test": float(np.abs(v["cor"] - t_cor[None]).mean())})
    models = [{"name": r["name"], "clean_test_acc": r["clean_test_acc"], "clean_train_acc": r["clean_train_acc"],
               "test_adv_error": float(t_adv[j]), "test_mce": float(t_cor[j]), "train_adv_error": full[j][2],
               "train_mce": full[j][3], "seconds": r["seconds"]} for j, r in enumerate(recs)]
    return {"models": models, "types": types, "n_train": n_train, "n_test": int(recs[0]["test_wrong"].shape[1]),
            "ranking": ranking, "profile": profile, "estimation": estimation, "model_names": names}


def markdown(ev: dict[str, Any]) -> str:
    f = lambda v: "nan" if v != v else f"{v:.2f}"  # noqa: E731
    ci = lambda c: f"[{f(c[0])}, {f(c[1])}]"  # noqa: E731
    lines = ["Models (test: the test split; train: every training sample):", "",
             "| model | clean test acc | test adv err | test mCE | train adv err | train mCE | train+validate s |",
             "|---|---|---|---|---|---|---|"]
    for m in ev["models"]:
        s = m["seconds"]
        lines.append(f"| {m['name']} | {m['clean_test_acc']:.3f} | {m['test_adv_error']:.3f} | {m['test_mce']:.3f} | "
                     f"{m['train_adv_error']:.3f} | {m['train_mce']:.3f} | "
                     f"{s['train'] + s['validate'] + s['analyze']:.0f} |")
    lines += ["", "Claim 1, ranking models: Spearman rho across models, validation set vs test split (mean over "
              "seeds and draws [95 % bootstrap interval over models]; minus random: paired difference to random at the "
              "same K):", "",
              "| K | strategy | adversarial | corruption | per-type | adv. minus random | corr. minus random | "
              "per-type minus random |", "|---|---|---|---|---|---|---|---|"]
    by = {(r["strategy"], r["k"], r["signal"]): r for r in ev["ranking"]}
    for (strat, k) in dict.fromkeys((r["strategy"], r["k"]) for r in ev["ranking"]):
        cells = [f"{f(by[(strat, k, s)]['rho_mean'])} {ci(by[(strat, k, s)]['ci95'])}"
                 for s in ("adversarial", "corruption", "per-type")]
        diffs = [(f"{by[(strat, k, s)]['minus_random']:+.2f} {ci(by[(strat, k, s)]['minus_random_ci95'])}"
                  if "minus_random" in by[(strat, k, s)] else "-") for s in ("adversarial", "corruption", "per-type")]
        lines.append(f"| {k if strat != 'all' else str(k) + ' (all)'} | {strat} | " + " | ".join(cells + diffs) + " |")
    lines += ["", "Claim 2, per-model profile: within a model, Spearman rho across perturbation types (validation "
              "set vs test split) and the share of strength/weakness labels that agree with the test split's "
              "(mean over models, seeds and draws [95 % bootstrap interval over models]):", "",
              "| K | strategy | rho across types | label agreement |", "|---|---|---|---|"]
    for r in ev["profile"]:
        lines.append(f"| {r['k']} | {r['strategy']} | {f(r['rho_types_mean'])} {ci(r['rho_types_ci95'])} | "
                     f"{f(r['label_agreement_mean'])} {ci(r['label_agreement_ci95'])} |")
    lines += ["", "Estimation: mean |validation-set error - error on every training sample| (and mean signed "
              "difference, bias), over models, seeds and draws:", "",
              "| K | strategy | adv. MAE | adv. bias | mCE MAE | mCE bias |", "|---|---|---|---|---|---|"]
    for r in ev["estimation"]:
        if r["strategy"] == "all":
            continue
        lines.append(f"| {r['k']} | {r['strategy']} | {r['mae_adv_vs_train']:.3f} | {r['bias_adv_vs_train']:+.3f} | "
                     f"{r['mae_mce_vs_train']:.3f} | {r['bias_mce_vs_train']:+.3f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- driver
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="digits", help="any robustest.data loader name (default: digits)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--train-size", type=int, default=None, help="a seeded random subset of the training split")
    p.add_argument("--test-size", type=int, default=None, help="the first N test images (default: all)")
    p.add_argument("--models", default=None, help="comma-separated family members (default: all)")
    p.add_argument("--sizes", type=int, nargs="+", default=[25, 50, 100], help="K of the validation sets")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="subset seeds (analysis noise + draws)")
    p.add_argument("--neighbors", type=int, default=20)
    p.add_argument("--noise-eps", type=float, default=0.5, help="neighbour noise width, U[-eps/2, eps/2]")
    p.add_argument("--attack-eps", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    p.add_argument("--attack-steps", type=int, default=5)
    p.add_argument("--adv-eps", type=float, default=0.1, help="eps of the adversarially fine-tuned members")
    p.add_argument("--severities", type=int, nargs="+", default=[1, 3, 5])
    p.add_argument("--corruptions", default=None,
                   help="comma-separated, or 'all' (default: all but frost, snow, spatter, the slowest)")
    p.add_argument("--draws", type=int, default=10,
                   help="stratified and random sets drawn per analysis seed (statistics only: cheap)")
    p.add_argument("--strata", type=int, default=10)
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0, help="training and perturbation seed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    names = [c for c in corr.names()]
    if args.corruptions in (None, ""):
        args.corruptions = [c for c in names if c not in SLOW_CORRUPTIONS]
    elif args.corruptions == "all":
        args.corruptions = names
    else:
        args.corruptions = [c.strip() for c in args.corruptions.split(",") if c.strip()]
        bad = [c for c in args.corruptions if c not in names]
        if bad:
            raise ConfigError(f"unknown corruption {bad[0]!r}: use names from robustest info --corruptions")
    family = {c["name"]: c for c in FAMILY + EXTRA}
    chosen = ([c["name"] for c in FAMILY] if args.models is None
              else [m.strip() for m in args.models.split(",") if m.strip()])
    for m in chosen:
        if m not in family:
            raise ConfigError(f"unknown model {m!r}: use names from {', '.join(family)}")
    if len(chosen) < 3:
        raise ConfigError("--models needs at least 3 models to rank")
    args.models = chosen
    if min(args.sizes) < 1 or args.bootstrap < 1 or args.strata < 1 or args.draws < 1 or not args.seeds:
        raise ConfigError("--sizes, --bootstrap, --draws and --strata must be >= 1 and --seeds not empty")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    config = {k: v for k, v in vars(args).items() if k not in ("out", "threads", "bootstrap", "models", "draws")}
    cfg_path = out / "config.json"
    if cfg_path.is_file() and json.loads(cfg_path.read_text()) != json.loads(json.dumps(config)):
        raise ConfigError(f"{out} holds a run with other settings: use another --out")
    atomic_write_json(cfg_path, config)
    train = datasets.load(args.dataset, root=args.data_dir, split="train")
    test = datasets.load(args.dataset, root=args.data_dir, split="test")
    x, y = train.tensors[0], train.tensors[1].long()
    if args.train_size is not None and args.train_size < len(y):
        idx = torch.randperm(len(y), generator=torch.Generator().manual_seed(args.seed))[: args.train_size]
        x, y = x[idx], y[idx]
    xt, yt = test.tensors[0], test.tensors[1].long()
    if args.test_size is not None:
        xt, yt = xt[: args.test_size], yt[: args.test_size]
    k = int(max(int(y.max()), int(yt.max())) + 1)
    if max(args.sizes) > len(y):
        raise ConfigError(f"--sizes reach {max(args.sizes)} but the training set has {len(y)} samples")
    log(f"{args.dataset}: {len(y)} training and {len(yt)} test images, {len(args.models)} models")
    recs = []
    for name in args.models:
        path = out / "models" / f"{name}.pt"
        if path.is_file():
            rec = torch.load(path, weights_only=True)
            log(f"{name}: done before, reused")
        else:
            cfg = next(c for c in FAMILY + EXTRA if c["name"] == name)
            rec = model_outcomes(cfg, args, x, y, xt, yt, k)
            atomic_save(rec, path)
            s = rec["seconds"]
            log(f"{name}: clean test acc {rec['clean_test_acc']:.3f}; train {s['train']:.0f} s, validate "
                f"{s['validate']:.0f} s, analyze {s['analyze']:.0f} s")
        recs.append(rec)
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # nan-means of undefined rho (a constant signal) are expected and reported
        warnings.simplefilter("ignore", RuntimeWarning)
        ev = evaluate(recs, args)
    ev["seconds"] = {"statistics": time.perf_counter() - t0, "this_run": time.perf_counter() - t_start,
                     "models": float(sum(sum(r["seconds"].values()) for r in recs))}
    ev["config"] = {**config, "models": args.models, "bootstrap": args.bootstrap, "draws": args.draws}
    atomic_write_json(out / "evidence.json", ev)
    md = markdown(ev)
    atomic_write_text(out / "evidence.md", md + "\n")
    print(md)
    log(f"model compute {ev['seconds']['models']:.0f} s; statistics {ev['seconds']['statistics']:.0f} s")
    return ev


if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:
        print(f"weakrobust_evidence: error: {exc}", file=sys.stderr)
        sys.exit(2)
