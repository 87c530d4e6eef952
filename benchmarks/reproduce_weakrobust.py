"""Evidence experiments for weak-robust validation (METHODS.md part B).

``--setting mnist`` (default): MNIST, sized for a few CPU cores, in two parts (below; the figures in
docs/WEAKROBUST.md). ``--dataset NAME`` runs the same two parts on any robustest.data loader's data
(models built for its channels, image size and classes; ``--arch-map lenet1=digits_cnn,lenet5=digits_cnn``
replaces family architectures that cannot take the images, e.g. 8x8 digits).
``--setting cifar10-wrn40-2`` and ``--setting imagenet100-resnet50``: the paper's full settings for one GPU
(standard model, analysis, weak set, validation under the 5 attacks and 19 corruptions, AugMix and REVa
enhancement, the B3 table), resumable step by step; see _weakrobust_full.py and docs/REPRODUCING.md.
``--dry-run`` runs a full setting end to end on synthetic data of its shape.

Part ``family``: a family of MNIST models that differ in robustness (architecture, epochs, noise
augmentation, AugMix, adversarial fine-tuning), all trained on the same training subset. For each model:
local robustness analysis of the training subset, the weak-robust set (top-K by mean misprediction score),
and the error under every perturbation type (gradient attacks at an eps grid, common corruptions at
severities 1-5) on

* the weak-robust set (sizes K in --sizes: the K weakest),
* random training subsets of the same size (--draws draws from a fixed random pool of the training subset),
* the test subset (the target: test-set robustness).

Then, across models, the Spearman rank correlation (scipy.stats.spearmanr) between each validation signal
(weak set / random subset) and the test error, per perturbation family (mean adversarial error, mean
corruption error) and averaged over the individual perturbation types.

Part ``enhance``: a standard LeNet-5, then the same fine-tuning budget four ways (plain, AugMix only,
adversarial only, targeted = AugMix + JSD + PGD copy with the measured corruption weaknesses added to the
pool); accuracy on the test subset under corruptions held out from every training pool and under white-box
attacks on the fine-tuned model itself (FGSM, PGD-20, BIM-10 and the fast AutoAttack-style ensemble).
``--seeds 0,1,2`` repeats it per seed (base model, weaknesses, fine-tuning, attack seeds) and reports the mean
+- sd and each variant's difference to the plain fine-tune, paired by seed, with a 95 % t-interval.

Corrupted images are computed once per (corruption, severity) for every image that needs them (training
images are cached by index, so every model sees the same corrupted version of a given sample).

    python benchmarks/reproduce_weakrobust.py --data-dir ../shared/data --part family --out /tmp/wr_family
    python benchmarks/reproduce_weakrobust.py --data-dir ../shared/data --part enhance --out /tmp/wr_enhance
    python benchmarks/reproduce_weakrobust.py --dataset digits --part family --train-size 1437 --test-size 360 \
        --arch-map lenet1=digits_cnn,lenet5=digits_cnn --out /tmp/wr_family_digits
    python benchmarks/reproduce_weakrobust.py --setting cifar10-wrn40-2 --data-dir DIR/cifar-10-batches-py \
        --device cuda --amp bf16 --out wr-cifar10
    python benchmarks/reproduce_weakrobust.py --setting imagenet100-resnet50 --data-dir DIR/imagenet100 \
        --device cuda --amp bf16 --workers 8 --out wr-imagenet100
    python benchmarks/reproduce_weakrobust.py --setting cifar10-wrn40-2 --dry-run --out /tmp/wr-dry
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _weakrobust_full as full  # noqa: E402
from _repro import is_rank0  # noqa: E402
from robustest import corruptions as corr  # noqa: E402
from robustest import data as datasets  # noqa: E402
from robustest import models as zoo  # noqa: E402
from robustest import weakrobust as wr  # noqa: E402
from robustest.core.atomic import atomic_write_json
from robustest.core.errors import ConfigError  # noqa: E402
from robustest.core.modelcall import eval_mode  # noqa: E402
from robustest.evaluate import accuracy, evaluate  # noqa: E402
from robustest.train import fit  # noqa: E402
from robustest.train.recipes import Recipe

SLOW_CORRUPTIONS = ("frost", "snow", "spatter")  # slowest on the CPU; --all-corruptions includes them


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


class CorruptionCache:
    """Corrupted copies of images keyed by (pool, index, corruption, severity); one corrupt() call per miss
    batch, seeded by (corruption, severity) and the pool, so a sample's corrupted version never depends on
    which model asks."""

    def __init__(self, x: torch.Tensor, names: list[str], severities: tuple[int, ...], seed: int) -> None:
        self.x, self.names, self.sev, self.seed = x, names, severities, seed
        self.have = torch.zeros(x.shape[0], dtype=torch.bool)
        self.store: dict[tuple[str, int], torch.Tensor] = {
            (n, s): torch.zeros(0) for n in names for s in severities}

    def ensure(self, idx: torch.Tensor) -> None:
        miss = idx[~self.have[idx]].unique()
        if miss.numel() == 0:
            return
        for (n, s), t in self.store.items():
            if t.numel() == 0:  # stored as uint8 levels, like the -C benchmark files
                t = torch.zeros(self.x.shape, dtype=torch.uint8)
                self.store[(n, s)] = t
            for b in range(0, miss.numel(), 256):
                ib = miss[b:b + 256]
                # seed from the first index of the batch: deterministic for a given call sequence
                c = corr.corrupt(self.x[ib], n, s, seed=self.seed + 7919 * int(ib[0]) + 31 * s)
                t[ib] = (c * 255).round().to(torch.uint8)
        self.have[miss] = True

    def wrong(self, model: torch.nn.Module, idx: torch.Tensor, y: torch.Tensor) -> dict[tuple[str, int], torch.Tensor]:
        self.ensure(idx)
        out = {}
        with torch.no_grad(), eval_mode(model):
            for key, t in self.store.items():
                out[key] = torch.cat([(model(t[idx[b:b + 1024]].float() / 255).argmax(1) != y[b:b + 1024])
                                      for b in range(0, idx.numel(), 1024)])
        return out


def per_type_errors(attack_res: wr.ValidationResult, attack_pos: torch.Tensor,
                    corr_wrong: dict[tuple[str, int], torch.Tensor], corr_pos: torch.Tensor) -> dict[str, float]:
    """type -> error averaged over levels, for the samples at the given positions."""
    out = {t: e for t, (f, e) in attack_res.subset(attack_pos).per_type().items() if f == "attack"}
    acc: dict[str, list[float]] = {}
    for (n, _s), w in corr_wrong.items():
        acc.setdefault(n, []).append(float(w[corr_pos].float().mean()))
    out.update({n: float(np.mean(v)) for n, v in acc.items()})
    return out


def family_signal(errs: dict[str, float], attacks: list[str], corrs: list[str]) -> dict[str, float]:
    return {"adversarial": float(np.mean([errs[a] for a in attacks])),
            "corruption": float(np.mean([errs[c] for c in corrs]))}


# --------------------------------------------------------------------------------------- model family
def load_split(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                  torch.Generator]:
    """The training subset (--train-size, seeded) and the first --test-size test images of --dataset, and the
    generator that drew the subset (the random pool continues from it)."""
    train = datasets.load(args.dataset, root=args.data_dir, split="train")
    test = datasets.load(args.dataset, root=args.data_dir, split="test")
    g = torch.Generator().manual_seed(args.seed)
    tr_idx = torch.randperm(len(train), generator=g)[: args.train_size]
    x, y = train.tensors[0][tr_idx], train.tensors[1][tr_idx].long()
    xt, yt = test.tensors[0][: args.test_size], test.tensors[1][: args.test_size].long()
    if x.shape[2] != x.shape[3]:
        raise ConfigError(f"the zoo models take square images, {args.dataset} has {x.shape[2]}x{x.shape[3]}")
    return x, y, xt, yt, g


def arch_of(name: str, args: argparse.Namespace) -> str:
    return (args.arch_map or {}).get(name, name)


def check_archs(archs: list[str], args: argparse.Namespace, x: torch.Tensor, k: int) -> None:
    """Every architecture the run will build can take the data: one line naming the fix, before any work."""
    c, h = x.shape[1], x.shape[2]
    for a in dict.fromkeys(archs):
        try:
            zoo.create(arch_of(a, args), num_classes=k, in_channels=c, input_size=h)
        except ConfigError as exc:
            fit = ", ".join(zoo.suggest(h)) or "none in the zoo"
            raise ConfigError(f"{exc}; --dataset {args.dataset} has {c}x{h}x{h} images: map the family's "
                              f"{a} with --arch-map {a}=NAME (models for {h}x{h}: {fit})") from None


def build_model(cfg: dict, x: torch.Tensor, y: torch.Tensor, mean: list[float], std: list[float], seed: int,
                args: argparse.Namespace | None = None) -> torch.nn.Module:
    torch.manual_seed(seed)
    arch = cfg["arch"] if args is None else arch_of(cfg["arch"], args)
    k = int(y.max()) + 1 if args is None else args.num_classes
    m = zoo.create(arch, num_classes=max(k, 2), in_channels=x.shape[1], input_size=x.shape[2], mean=mean, std=std)
    xt, yt = x, y
    if cfg.get("noise_aug"):
        g = torch.Generator().manual_seed(seed + 1)
        xn = (x + (torch.rand(x.shape, generator=g) - 0.5) * cfg["noise_aug"]).clamp(0, 1)
        xt, yt = torch.cat([x, xn]), torch.cat([y, y])
    fit(m, (xt, yt), epochs=cfg["epochs"], batch_size=64, recipe=Recipe(lr=1e-3), seed=seed, progress=False)
    if cfg.get("adv_ft"):
        wr.enhance(m, (x, y), (), epochs=cfg["adv_ft"], augmix=False, adversarial=True, eps=0.15,
                   adv_steps=5, seed=seed)
    if cfg.get("augmix_ft"):
        wr.enhance(m, (x, y), (), epochs=cfg["augmix_ft"], augmix=True, adversarial=False, seed=seed)
    return m


FAMILY = [
    {"name": "mlp-1ep", "arch": "mlp", "epochs": 1},
    {"name": "mlp-4ep", "arch": "mlp", "epochs": 4},
    {"name": "lenet1-1ep", "arch": "lenet1", "epochs": 1},
    {"name": "lenet1-4ep", "arch": "lenet1", "epochs": 4},
    {"name": "lenet5-1ep", "arch": "lenet5", "epochs": 1},
    {"name": "lenet5-4ep", "arch": "lenet5", "epochs": 4},
    {"name": "lenet5-4ep-noiseaug", "arch": "lenet5", "epochs": 4, "noise_aug": 0.6},
    {"name": "lenet5-3ep+advft", "arch": "lenet5", "epochs": 3, "adv_ft": 1},
    {"name": "lenet5-3ep+augmix", "arch": "lenet5", "epochs": 3, "augmix_ft": 1},
]


def channel_stats(x: torch.Tensor) -> tuple[list[float], list[float]]:
    return x.mean(dim=(0, 2, 3)).tolist(), x.std(dim=(0, 2, 3)).clamp(min=1e-3).tolist()


def run_family(args: argparse.Namespace, out: Path) -> dict:
    x, y, xt, yt, g = load_split(args)
    check_archs([c["arch"] for c in FAMILY[: args.max_models]], args, x, args.num_classes)
    mean, std = channel_stats(x)
    pool = torch.randperm(x.shape[0], generator=g)[: args.random_pool]
    attacks = list(wr.ATTACKS)
    corrs = [c for c in corr.names() if args.all_corruptions or c not in SLOW_CORRUPTIONS]
    sev = (1, 2, 3, 4, 5)
    kw = {a: {"steps": args.attack_steps} for a in ("pgd", "bim", "mifgsm")}
    ctrain = CorruptionCache(x, corrs, sev, args.seed)
    ctest = CorruptionCache(xt, corrs, sev, args.seed + 1)
    t0 = time.perf_counter()
    ctest.ensure(torch.arange(xt.shape[0]))
    ctrain.ensure(pool)
    log(f"corrupted test + random pool in {time.perf_counter() - t0:.0f}s")
    kmax = max(args.sizes)
    rng = np.random.default_rng(args.seed)
    draws = {k: [torch.as_tensor(rng.choice(args.random_pool, k, replace=False)) for _ in range(args.draws)]
             for k in args.sizes}
    results = {"config": {k: v for k, v in vars(args).items() if k != "func"}, "corruptions": corrs,
               "attacks": attacks, "models": []}
    done = {r["name"]: r for r in _previous(out / "family.json", results["config"]).get("models", [])}
    for cfg in FAMILY[: args.max_models]:
        if cfg["name"] in done:  # finished before an interruption: reuse it, replaying its corruption-cache calls
            rec = done[cfg["name"]]
            for key in ("weak", "weak_correct", "random"):  # JSON turned the sizes into strings
                rec[key] = {int(size): v for size, v in rec[key].items()}
            for idx in rec.get("weak_indices", {}).values():
                ctrain.ensure(torch.as_tensor(idx))
            results["models"].append(rec)
            log(f"{cfg['name']}: done before, skipped")
            continue
        tm = time.perf_counter()
        model = build_model(cfg, x, y, mean, std, args.seed, args)
        t_train = time.perf_counter() - tm
        clean_test = accuracy(model, (xt, yt))
        ta = time.perf_counter()
        an = wr.analyze(model, (x, y), n_neighbors=args.neighbors, eps=args.eps, seed=args.seed)
        t_an = time.perf_counter() - ta
        weak_sets = {"weak": wr.select_weak(an, k=kmax).indices,
                     "weak_correct": wr.select_weak(an, k=kmax, correct_only=True).indices}
        # attacks on both weak sets + random pool + test in one validate() call
        parts = list(weak_sets.values()) + [pool]
        xe = torch.cat([x[i] for i in parts] + [xt])
        ye = torch.cat([y[i] for i in parts] + [yt])
        tv = time.perf_counter()
        res = wr.validate(model, (xe, ye), None, perturbations="attacks", eps=args.eps_grid, attack_kwargs=kw,
                          seed=args.seed)
        offs, o = {}, 0
        for name, i in list(weak_sets.items()) + [("pool", pool)]:
            offs[name] = o
            o += i.numel()
        cw = {name: ctrain.wrong(model, i, y[i]) for name, i in weak_sets.items()}
        cw_pool = ctrain.wrong(model, pool, y[pool])
        cw_test = ctest.wrong(model, torch.arange(xt.shape[0]), yt)
        t_val = time.perf_counter() - tv
        test_err = per_type_errors(res, torch.arange(o, xe.shape[0]), cw_test, torch.arange(xt.shape[0]))
        rec = {"name": cfg["name"], "cfg": cfg, "clean_test_acc": clean_test, "test": test_err,
               "test_family": family_signal(test_err, attacks, corrs), "random": {},
               "frac_most_neighbours_wrong": float((an.frac_misclassified > 0.5).float().mean()),
               "clean_train_acc": float(an.clean_correct.float().mean()),
               "seconds": {"train": t_train, "analyze": t_an, "validate": t_val},
               "weak_indices": {name: i.tolist() for name, i in weak_sets.items()}}
        for name in weak_sets:
            rec[name] = {}
            for k in args.sizes:
                e = per_type_errors(res, offs[name] + torch.arange(k), cw[name], torch.arange(k))
                rec[name][k] = {"types": e, "family": family_signal(e, attacks, corrs)}
        for k in args.sizes:
            rec["random"][k] = []
            for d in draws[k]:
                e = per_type_errors(res, offs["pool"] + d, cw_pool, d)
                rec["random"][k].append({"types": e, "family": family_signal(e, attacks, corrs)})
        results["models"].append(rec)
        if is_rank0():
            atomic_write_json(out / "family.json", results)
        log(f"{cfg['name']}: clean test acc {clean_test:.3f}, test adv err {rec['test_family']['adversarial']:.3f}, "
            f"test corr err {rec['test_family']['corruption']:.3f}, weak({kmax}) adv err "
            f"{rec['weak'][kmax]['family']['adversarial']:.3f}, weak-correct({kmax}) adv err "
            f"{rec['weak_correct'][kmax]['family']['adversarial']:.3f}, train {t_train:.0f}s analyze {t_an:.0f}s "
            f"validate {t_val:.0f}s")
    results["correlations"] = correlations(results, args.sizes, attacks, corrs)
    if is_rank0():
        atomic_write_json(out / "family.json", results)
    print(markdown_family(results, args.sizes))
    return results


def _previous(path: Path, config: dict) -> dict:
    """What an interrupted run with the same settings saved at ``path`` (its finished models or variants);
    empty when there is none or the settings differ (output folder and thread count aside)."""
    if not path.is_file():
        return {}
    try:
        prev = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    skip = ("out", "threads")
    now = json.loads(json.dumps({k: v for k, v in config.items() if k not in skip}, default=str))
    before = {k: v for k, v in (prev.get("config") or {}).items() if k not in skip}
    return prev if before == now else {}


def _rho(a: list[float], b: list[float]) -> float:
    if np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def correlations(results: dict, sizes: list[int], attacks: list[str], corrs: list[str]) -> dict:
    ms = results["models"]
    out = {}
    for k in sizes:
        row = {}
        for fam, types in (("adversarial", attacks), ("corruption", corrs)):
            test = [m["test_family"][fam] for m in ms]
            nd = len(ms[0]["random"][k])
            rho_r = [_rho([m["random"][k][d]["family"][fam] for m in ms], test) for d in range(nd)]
            rr = np.array(rho_r, dtype=float)
            # per-type: average of the per-type Spearman rho over the family's types
            pt_r = np.nanmean([np.nanmean([_rho([m["random"][k][d]["types"][t] for m in ms],
                                                [m["test"][t] for m in ms]) for t in types]) for d in range(nd)])
            row[fam] = {"rho_random_mean": float(np.nanmean(rr)), "rho_random_sd": float(np.nanstd(rr)),
                        "per_type_rho_random": float(pt_r)}
            for sig in ("weak", "weak_correct"):
                rho_w = _rho([m[sig][k]["family"][fam] for m in ms], test)
                pt_w = np.nanmean([_rho([m[sig][k]["types"][t] for m in ms], [m["test"][t] for m in ms])
                                   for t in types])
                ok = rr[~np.isnan(rr)]
                row[fam][f"rho_{sig}"] = rho_w
                row[fam][f"per_type_rho_{sig}"] = float(pt_w)
                row[fam][f"frac_random_draws_ge_{sig}"] = (float(np.mean(ok >= rho_w)) if ok.size and
                                                           not np.isnan(rho_w) else float("nan"))
        out[k] = row
    return out


def markdown_family(results: dict, sizes: list[int]) -> str:
    lines = ["| model | clean test acc | test adv err | test mCE | weak adv err | weak mCE | weak-correct adv err | "
             "weak-correct mCE | random adv err | random mCE |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    k = max(sizes)
    lines.insert(0, f"Per-model errors at K = {k} (random: mean over draws)\n")
    for m in results["models"]:
        ra = np.mean([d["family"]["adversarial"] for d in m["random"][k]])
        rc = np.mean([d["family"]["corruption"] for d in m["random"][k]])
        lines.append(f"| {m['name']} | {m['clean_test_acc']:.3f} | {m['test_family']['adversarial']:.3f} | "
                     f"{m['test_family']['corruption']:.3f} | {m['weak'][k]['family']['adversarial']:.3f} | "
                     f"{m['weak'][k]['family']['corruption']:.3f} | "
                     f"{m['weak_correct'][k]['family']['adversarial']:.3f} | "
                     f"{m['weak_correct'][k]['family']['corruption']:.3f} | {ra:.3f} | {rc:.3f} |")
    lines += ["", "| K | family | rho weak | rho weak-correct | rho random (mean +- sd over draws) | "
              "share of random draws >= weak / weak-correct | per-type rho weak / weak-correct / random |",
              "|---|---|---|---|---|---|---|"]
    for k in sizes:
        for fam, r in results["correlations"][k].items():
            lines.append(f"| {k} | {fam} | {r['rho_weak']:.3f} | {r['rho_weak_correct']:.3f} | "
                         f"{r['rho_random_mean']:.3f} +- {r['rho_random_sd']:.3f} | "
                         f"{r['frac_random_draws_ge_weak']:.2f} / {r['frac_random_draws_ge_weak_correct']:.2f} | "
                         f"{r['per_type_rho_weak']:.3f} / {r['per_type_rho_weak_correct']:.3f} / "
                         f"{r['per_type_rho_random']:.3f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- enhancement
BASELINE_VARIANT = "standard (plain fine-tune)"
ENHANCE_VARIANTS = {
    BASELINE_VARIANT: {"augmix": False, "adversarial": False, "targeted": False},
    "AugMix only": {"augmix": True, "adversarial": False, "targeted": False},
    "adversarial fine-tuning only": {"augmix": False, "adversarial": True, "targeted": False},
    "targeted (AugMix+JSD+PGD+weaknesses)": {"augmix": True, "adversarial": True, "targeted": True},
}


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` -> [0, 1, 2] (argparse type): distinct non-negative integers."""
    try:
        seeds = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected distinct non-negative integers, got {text!r}")
    return seeds


def run_enhance_seed(args: argparse.Namespace, out: Path, seed: int, data: tuple, ct: CorruptionCache) -> dict:
    """One seed of the enhancement experiment: the base model (trained with ``seed``: its initialisation and
    data order), its weak set and measured weaknesses, then the four fine-tuning variants (fine-tuning seed,
    data order and attack seeds all ``seed``). Resumable: every finished variant is saved atomically to
    ``enhance_seed{seed}.json`` and skipped by a rerun with the same settings."""
    import copy

    from robustest import attacks as atk

    x, y, xt, yt = data
    mean, std = channel_stats(x)
    path = out / f"enhance_seed{seed}.json"
    config = {k: v for k, v in vars(args).items() if k != "seeds"}
    config["seed"] = seed
    prev = _previous(path, config)
    done = {r["variant"]: r for r in prev.get("rows", [])}
    if all(name in done for name in ENHANCE_VARIANTS):
        log(f"seed {seed}: done before, skipped")
        return prev
    t0 = time.perf_counter()
    base = build_model({"arch": "lenet5", "epochs": args.base_epochs}, x, y, mean, std, seed, args)
    base_acc = accuracy(base, (xt, yt))
    log(f"seed {seed}: base {arch_of('lenet5', args)} trained in {time.perf_counter() - t0:.0f}s, "
        f"test acc {base_acc:.3f}")
    # weaknesses from the weak-robust validation set of the base model (corruptions only; training pool)
    an = wr.analyze(base, (x, y), n_neighbors=args.neighbors, eps=args.eps, seed=seed)
    ws = wr.select_weak(an, k=max(args.sizes))
    cand = [c for c in corr.names() if c not in SLOW_CORRUPTIONS]
    val = wr.validate(base, (x, y), ws, perturbations=["attacks"] + cand, eps=args.eps_grid,
                      attack_kwargs={a: {"steps": args.attack_steps} for a in ("pgd", "bim", "mifgsm")},
                      seed=seed)
    weak_all = val.weaknesses()
    weak_corr = [w for w in weak_all if w in cand][: args.max_weaknesses]
    held_out = [c for c in corr.names() if c not in weak_corr]
    log(f"seed {seed}: weaknesses on the weak set: {weak_all}; training pool adds {weak_corr}; "
        f"held out: {held_out}")
    rows = []
    for name, v in ENHANCE_VARIANTS.items():
        if name in done:  # finished before an interruption
            rows.append(done[name])
            log(f"seed {seed}: {name}: done before, skipped")
            continue
        m = copy.deepcopy(base)
        te = time.perf_counter()
        res = wr.enhance(m, (x, y), weak_corr if v["targeted"] else [], epochs=args.ft_epochs,
                         augmix=v["augmix"], adversarial=v["adversarial"], eps=args.adv_eps,
                         adv_steps=args.attack_steps, jsd_weight=args.jsd_weight, recipe=Recipe(lr=5e-4), seed=seed)
        t_ft = time.perf_counter() - te
        clean = accuracy(m, (xt, yt))
        cw = ct.wrong(m, torch.arange(xt.shape[0]), yt)
        per_c: dict[str, list[float]] = {}
        for (n, _s), w in cw.items():
            if n in held_out:
                per_c.setdefault(n, []).append(1 - float(w.float().mean()))
        row = {"variant": name, "clean": clean, "held_out_corruption_acc": float(np.mean([np.mean(a) for a in
                                                                                      per_c.values()])),
               "per_corruption": {n: float(np.mean(a)) for n, a in per_c.items()}, "finetune_s": t_ft,
               "pool": res.pool}
        for e in args.eps_grid:
            for a, kw in (("fgsm", {}), ("pgd", {"steps": 20, "restarts": 1}), ("bim", {"steps": 10})):
                r = atk.attack(a, m, (xt, yt), eps=e, seed=seed, **kw)
                row[f"{a}@{e:g}"] = r.robust_accuracy
            # AutoAttack-style ensemble, fast version: APGD-CE -> APGD-T (3 target classes), white-box
            row[f"autoattack@{e:g}"] = evaluate(m, (xt, yt), eps=e, version="fast",
                                                           seed=seed).robust_accuracy
        # transferred from the base model (the reference code's evaluation), for comparison
        for e in args.eps_grid:
            adv = atk.pgd(base, xt, yt, eps=e, steps=20, seed=seed)
            row[f"pgd-transfer@{e:g}"] = accuracy(m, (adv, yt))
        rows.append(row)
        log(f"seed {seed}: {name}: {json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k not in ('per_corruption', 'pool')})}")  # noqa: E501
        if is_rank0():
            atomic_write_json(path, _seed_result(seed, base_acc, weak_all, weak_corr, held_out, rows, config))
    return _seed_result(seed, base_acc, weak_all, weak_corr, held_out, rows, config)


def _seed_result(seed: int, base_acc: float, weak_all: list[str], weak_corr: list[str], held_out: list[str],
                 rows: list[dict], config: dict) -> dict:
    return {"seed": seed, "base_test_acc": base_acc, "weaknesses": weak_all, "pool_added": weak_corr,
            "held_out": held_out, "rows": rows, "config": config}


def enhance_metrics(rows: list[dict]) -> list[str]:
    """The numeric columns of the enhancement rows, in table order: clean, held-out corruptions, then every
    ``attack@eps`` column as the rows have them."""
    return ["clean", "held_out_corruption_acc"] + [k for k in rows[0] if "@" in k]


def aggregate_enhance(per_seed: list[dict], level: float = 0.95) -> dict:
    """Per-seed enhancement results -> per variant the mean and sample sd over seeds of every metric, and each
    variant's difference to the plain fine-tune, paired by seed, with its ``level`` t-interval
    (robot.paired_vs_random with the plain fine-tune as the reference; no interval with one seed), and the
    targeted recipe's difference to each alternative in the same way.
    Returns ``{"seeds", "rows": [{variant, n_seeds, METRIC_mean, METRIC_sd}], "paired": [{strategy, metric,
    mean_diff, ci_low, ci_high, n_seeds}], "targeted_vs": [the same rows for the targeted recipe, with
    baseline: the alternative]}``."""
    from robustest.robot import paired_vs_random

    metrics = enhance_metrics(per_seed[0]["rows"])
    cells, rows = [], []
    for name in ENHANCE_VARIANTS:
        vals = {m: [] for m in metrics}
        for res in per_seed:
            r = next((r for r in res["rows"] if r["variant"] == name), None)
            if r is None:
                continue
            cells.append({"strategy": name, "budget": "-", "seed": res["seed"],
                          "robustness": {m: r[m] for m in metrics}})
            for m in metrics:
                vals[m].append(float(r[m]))
        if not vals[metrics[0]]:
            continue
        row = {"variant": name, "n_seeds": len(vals[metrics[0]])}
        for m in metrics:
            row[f"{m}_mean"] = float(np.mean(vals[m]))
            row[f"{m}_sd"] = float(np.std(vals[m], ddof=1)) if len(vals[m]) > 1 else 0.0
        rows.append(row)
    paired = paired_vs_random(cells, metrics=tuple(metrics), level=level, baseline=BASELINE_VARIANT)
    # the claim itself: the targeted recipe against each alternative, paired by seed the same way
    targeted = list(ENHANCE_VARIANTS)[-1]
    vs = []
    for alt in list(ENHANCE_VARIANTS)[:-1]:
        two = [c for c in cells if c["strategy"] in (alt, targeted)]
        vs += [{**p, "baseline": alt} for p in paired_vs_random(two, metrics=tuple(metrics), level=level,
                                                                baseline=alt)]
    for p in paired + vs:
        p.pop("budget", None)
    return {"seeds": [res["seed"] for res in per_seed], "rows": rows, "paired": paired, "targeted_vs": vs}


def _signed(v: float | None) -> str:
    return "-" if v is None else f"{v:+.3f}"


def markdown_enhance(agg: dict) -> str:
    """The enhancement tables: mean +- sd per variant, then the paired differences to the plain fine-tune with
    their intervals (``*``: the interval excludes 0)."""
    metrics = [k[: -len("_mean")] for k in agg["rows"][0] if k.endswith("_mean")]
    lines = ["| variant | " + " | ".join(metrics) + " |", "|" + "---|" * (len(metrics) + 1)]
    for r in agg["rows"]:
        one = r.get("n_seeds", 2) < 2  # one seed has no spread to show
        lines.append(f"| {r['variant']} | " + " | ".join(
            f"{r[m + '_mean']:.3f} (n = 1)" if one else f"{r[m + '_mean']:.3f} ± {r[m + '_sd']:.3f}"
            for m in metrics) + " |")
    targeted = list(ENHANCE_VARIANTS)[-1]
    for title, key, label in (
            (f"Difference to {BASELINE_VARIANT}", "paired", "strategy"),
            (f"{targeted} minus each alternative", "targeted_vs", "baseline")):
        lines += ["", f"{title}, paired by seed (mean [95 % t-interval]; * excludes 0):", "",
                  "| variant | " + " | ".join(metrics) + " |", "|" + "---|" * (len(metrics) + 1)]
        for name in ENHANCE_VARIANTS:
            ps = {p["metric"]: p for p in agg.get(key, []) if p[label] == name}
            if ps:
                lines.append(f"| {name} | " + " | ".join(_interval(ps.get(m)) for m in metrics) + " |")
    return "\n".join(lines)


def _interval(p: dict | None) -> str:
    if p is None:
        return "-"
    star = "*" if p["ci_low"] is not None and (p["ci_low"] > 0 or p["ci_high"] < 0) else ""
    return f"{_signed(p['mean_diff'])} [{_signed(p['ci_low'])}, {_signed(p['ci_high'])}]{star}"


def run_enhance(args: argparse.Namespace, out: Path) -> dict:
    """Every seed of --seeds (default: --seed) in turn, then the aggregate, saved to ``enhance.json``."""
    x, y, xt, yt, _g = load_split(args)
    check_archs(["lenet5"], args, x, args.num_classes)
    # the test images under every corruption once, shared by the seeds (held-out sets differ per seed)
    ct = CorruptionCache(xt, corr.names(), (1, 2, 3, 4, 5), args.seed + 1)
    ct.ensure(torch.arange(xt.shape[0]))
    t0 = time.perf_counter()
    per_seed = [run_enhance_seed(args, out, s, (x, y, xt, yt), ct) for s in (args.seeds or [args.seed])]
    agg = aggregate_enhance(per_seed)
    agg["per_seed"] = per_seed
    agg["wall_s"] = time.perf_counter() - t0
    if is_rank0():
        atomic_write_json(out / "enhance.json", agg)
    print(markdown_enhance(agg))
    return agg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=("mnist", *full.FULL_SETTINGS), default="mnist")
    p.add_argument("--data-dir", default=None, help="the data (default for mnist: ../shared/data)")
    p.add_argument("--part", choices=("family", "enhance"), default=None, help="mnist: which experiment (required)")
    p.add_argument("--out", required=True)
    p.add_argument("--train-size", type=int, default=2000)
    p.add_argument("--test-size", type=int, default=None, help="mnist: 500; full settings: test images used")
    p.add_argument("--random-pool", type=int, default=200)
    p.add_argument("--sizes", type=int, nargs="+", default=[25, 50, 100])
    p.add_argument("--draws", type=int, default=20)
    p.add_argument("--neighbors", type=int, default=None, help="neighbours Q (mnist 20, cifar10 50, imagenet100 20)")
    p.add_argument("--eps", type=float, default=None,
                   help="neighbour noise width, U[-eps/2, eps/2] (mnist 0.5, cifar10 0.22, imagenet100 0.2)")
    p.add_argument("--eps-grid", type=float, nargs="+", default=[0.1, 0.2])
    p.add_argument("--attack-steps", type=int, default=None, help="steps of PGD/BIM/MI-FGSM (mnist 5, full 10)")
    p.add_argument("--all-corruptions", action="store_true")
    p.add_argument("--max-models", type=int, default=len(FAMILY))
    p.add_argument("--base-epochs", type=int, default=3)
    p.add_argument("--ft-epochs", type=int, default=2)
    p.add_argument("--adv-eps", type=float, default=0.15)
    p.add_argument("--jsd-weight", type=float, default=None, help="JSD weight (mnist 6, full settings 12)")
    p.add_argument("--max-weaknesses", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0,
                   help="the training subset, the random pool and the corrupted test images; the seed of a run")
    p.add_argument("--seeds", type=parse_seeds, default=None, metavar="S,S,...",
                   help="part enhance: one run per seed (its own base model, weaknesses and fine-tuning; the "
                        "training subset and test images fixed by --seed), then mean +- sd and the paired "
                        "differences to the plain fine-tune (default: --seed alone)")
    p.add_argument("--arch-map", type=arch_map, default=None, metavar="A=B,...",
                   help="mnist setting: build zoo model B wherever the family uses A (for data A cannot take)")
    full.add_args(p)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    if is_rank0():
        out.mkdir(parents=True, exist_ok=True)
    log(" ".join(sys.argv if argv is None else ["reproduce_weakrobust.py", *argv]))
    if args.setting != "mnist":
        full.run_full(args, out)
        return 0
    if args.part is None and not args.dry_run:
        p.error("--setting mnist needs --part family or --part enhance")
    if args.dry_run:  # a synthetic MNIST-shaped npz (the mnist loader reads Keras-style npz files) and tiny sizes
        from _repro import synthetic_npz

        args.data_dir = str(synthetic_npz(out / "synthetic_mnist.npz", (1, 28, 28), 10, 64, 16))
        for key, v in MNIST_DRY_RUN.items():
            setattr(args, key, v)
    args.dataset = args.dataset or "mnist"
    for key, default in (("test_size", 500), ("neighbors", 20), ("eps", 0.5), ("attack_steps", 5),
                         ("jsd_weight", 6.0)):
        if getattr(args, key) is None:
            setattr(args, key, default)
    if args.data_dir is None and args.dataset == "mnist":
        args.data_dir = "../shared/data"
    y_all = datasets.load(args.dataset, root=args.data_dir, split="train").tensors[1]
    args.num_classes = max(int(y_all.max()) + 1, 2)
    if args.part in ("family", None):
        run_family(args, out)
    if args.part in ("enhance", None):
        run_enhance(args, out)
    return 0


def arch_map(text: str) -> dict[str, str]:
    """``A=B,C=D`` -> {A: B, C: D} (argparse type)."""
    out = {}
    for item in text.split(","):
        a, sep, b = item.partition("=")
        if not sep or not a.strip() or not b.strip():
            raise argparse.ArgumentTypeError(f"expected A=B pairs, comma-separated, got {item!r}")
        out[a.strip()] = b.strip()
    return out


# --dry-run of the MNIST setting: both parts, every stage, on 64 synthetic training images
MNIST_DRY_RUN = {"train_size": 48, "test_size": 16, "random_pool": 16, "sizes": [4, 8], "draws": 3,
                 "neighbors": 2, "eps_grid": [0.1], "attack_steps": 1, "max_models": 3, "base_epochs": 1,
                 "ft_epochs": 1, "max_weaknesses": 2}


if __name__ == "__main__":
    from robustest.core.errors import ConfigError, DataError

    try:
        sys.exit(main())
    except (ConfigError, DataError) as exc:
        print(f"reproduce_weakrobust: error: {exc}", file=sys.stderr)
        sys.exit(2)
