"""The weak-robust validation paper's full settings (METHODS.md B) for one GPU, run step by step with resume.

Settings (every value overridable from the command line of reproduce_weakrobust.py):

* ``cifar10-wrn40-2``: WRN-40-2 on CIFAR-10 trained with AugMix's CIFAR recipe (``cifar-sgd``: SGD 0.1,
  Nesterov 0.9, weight decay 5e-4 off norms/biases, batch 128, 100 epochs, cosine, crop-flip). Local
  robustness analysis of all 50,000 training images with the reference code's CIFAR parameters, Q = 50
  neighbours of U[-0.11, 0.11] noise (eps = 0.22 in analyze's convention, width eps), quantised to uint8.
* ``imagenet100-resnet50``: ResNet-50 on ImageNet-100 (a class-per-folder tree read by the ``folder`` loader,
  resized to 256 x 256 and centre-cropped to 224 x 224) trained with AugMix's ImageNet recipe
  (``imagenet-sgd``: SGD 0.1, momentum 0.9, weight decay 1e-4 off norms/biases, batch 256, 90 epochs, x0.1 at
  epochs 30 and 60, crop-flip; ImageNet mean/std inside the model). Q = 20 neighbours of U[-0.1, 0.1] noise
  (eps = 0.2), the paper's ImageNet-100 setting.

Then, for each setting, the same steps: the weak set (the K = 1,000 weakest training images by mean
misprediction score) and a random training subset of the same size; validation of the standard model on the
weak set, the random subset and the test subset under the paper's attacks (FGSM, PGD, BIM, R-FGSM, MI-FGSM at
4/255 and 8/255, 10 steps for the iterative ones) and the 19 corruptions at severities 1-5; the weaknesses the
weak set shows; two enhanced models fine-tuned from the standard one (AugMix + JSD only; REVa's targeted
recipe: AugMix + JSD + offline PGD copy at 4/255 (10 steps of 1/255) with the weaknesses added to the pool;
Adam 1e-4, JSD weight 12); the same analysis and validation for both; and the B3 table: test accuracy under
PGD-40, FGSM and BIM-10 at 4/255 transferred from the standard model (the paper's evaluation) and white-box.

Every step writes its result atomically under OUT/steps (only rank 0 writes) and is skipped when its file
exists, so a killed run continues where it stopped; training the standard model keeps a per-epoch state.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from _repro import is_rank0, log, rank, synthetic_npz

FULL_SETTINGS: dict[str, dict[str, Any]] = {
    "cifar10-wrn40-2": {
        "title": "CIFAR-10 WRN-40-2", "dataset": "cifar10", "model": "wrn-40-2", "shape": (3, 32, 32),
        "classes": 10, "recipe": "cifar-sgd", "norm": "data", "resize": None, "center_crop": None,
        "neighbors": 50, "eps": 0.22, "k": 1000, "test_size": 10000, "attack_eps": [4 / 255, 8 / 255],
        "attack_steps": 10, "severities": [1, 2, 3, 4, 5], "enhance_epochs": 10, "enhance_lr": 1e-4,
        "enhance_batch": 128, "jsd_weight": 12.0, "adv_eps": 4 / 255, "adv_steps": 10, "adv_alpha": 1 / 255,
        "eval_eps": 4 / 255, "eval_pgd_steps": 40, "eval_bim_steps": 10,
    },
    "imagenet100-resnet50": {
        "title": "ImageNet-100 ResNet-50", "dataset": "folder", "model": "resnet50", "shape": (3, 224, 224),
        "classes": 100, "recipe": "imagenet-sgd", "norm": "imagenet", "resize": (256, 256),
        "center_crop": (224, 224), "neighbors": 20, "eps": 0.2, "k": 1000, "test_size": 5000,
        "attack_eps": [4 / 255, 8 / 255], "attack_steps": 10, "severities": [1, 2, 3, 4, 5], "enhance_epochs": 5,
        "enhance_lr": 1e-4, "enhance_batch": 64, "jsd_weight": 12.0, "adv_eps": 4 / 255, "adv_steps": 10,
        "adv_alpha": 1 / 255, "eval_eps": 4 / 255, "eval_pgd_steps": 40, "eval_bim_steps": 10,
    },
}
# --dry-run: synthetic data of the setting's shape (ImageNet-100 at 64 px: 224 px is minutes per step on a
# CPU) and a handful of steps; every stage still runs, with all 5 attacks (at 4/255) and all 19 corruptions
# (at severity 5; the severity only picks a row of each parameter table).
DRY_RUN: dict[str, dict[str, Any]] = {
    "cifar10-wrn40-2": {"shape": (3, 32, 32), "n_train": 24, "n_test": 8},
    "imagenet100-resnet50": {"shape": (3, 64, 64), "folder_size": 72, "n_train": 16, "n_test": 8,
                             "resize": (72, 72), "center_crop": (64, 64)},
}
DRY_COMMON = {"epochs": 1, "batch_size": 8, "neighbors": 2, "k": 3, "test_size": 4, "attack_steps": 1,
              "attack_eps": [4 / 255], "severities": [5], "enhance_epochs": 1, "enhance_batch": 8, "adv_steps": 1,
              "eval_pgd_steps": 1, "eval_bim_steps": 1}
MODELS = ("standard", "augmix", "reva")
OVERRIDES = ("epochs", "batch_size", "neighbors", "eps", "k", "test_size", "attack_steps", "severities",
             "enhance_epochs", "enhance_lr", "jsd_weight")


def add_args(p: argparse.ArgumentParser) -> None:
    """The full settings' options (each defaults to the setting's value)."""
    g = p.add_argument_group("full settings (--setting cifar10-wrn40-2 / imagenet100-resnet50)")
    g.add_argument("--dataset", default=None, help="any robustest.data loader name (default: the setting's)")
    g.add_argument("--resize", type=int, nargs=2, default=None, metavar=("H", "W"), help="folder images: resize")
    g.add_argument("--center-crop", type=int, nargs=2, default=None, metavar=("H", "W"), help="then centre-crop")
    g.add_argument("--workers", type=int, default=0, help="image-folder decoding processes (default: 0)")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cpu)")
    g.add_argument("--amp", choices=("bf16", "fp16"), default=None, help="mixed precision for training the "
                                                                         "standard model (CUDA)")
    g.add_argument("--epochs", type=int, default=None, help="epochs of the standard model")
    g.add_argument("--batch-size", type=int, default=None, help="batch size of the standard model")
    g.add_argument("--k", type=int, default=None, help="size of the weak set and of the random subset")
    g.add_argument("--severities", type=int, nargs="+", default=None)
    g.add_argument("--enhance-epochs", type=int, default=None)
    g.add_argument("--enhance-lr", type=float, default=None)
    g.add_argument("--dry-run", action="store_true",
                   help="synthetic data of the setting's shape and a handful of steps: checks the pipeline")


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """The setting's values, then --dry-run's reductions, then the flags given."""
    s = dict(FULL_SETTINGS[args.setting])
    if args.dry_run:
        s.update(DRY_COMMON)
        s.update(DRY_RUN[args.setting])
    for key in OVERRIDES:
        v = getattr(args, key, None)
        if v is not None:
            s[key] = v
    for key in ("resize", "center_crop"):
        if getattr(args, key) is not None:
            s[key] = tuple(getattr(args, key))
    s["dataset"] = args.dataset or s["dataset"]
    return s


# ----------------------------------------------------------------------------------------------- steps
class Steps:
    """Each step's result in OUT/steps/<name>.<ext>, written atomically by rank 0 and reused when present."""

    def __init__(self, out: Path) -> None:
        self.dir = out / "steps"
        self.timings_path = out / "timings.json"
        self.timings: dict[str, float] = (json.loads(self.timings_path.read_text())
                                          if self.timings_path.is_file() else {})

    def run(self, name: str, ext: str, compute: Callable[[], Any], save: Callable[[Any, Path], Any],
            load: Callable[[Path], Any]) -> Any:
        path = self.dir / f"{name}.{ext}"
        if path.is_file():
            log(f"{name}: done before ({path.name}), skipped")
            return load(path)
        t0 = time.perf_counter()
        result = compute()
        if is_rank0():
            save(result, path)
            self.timings[name] = time.perf_counter() - t0
            from robustest.core.atomic import atomic_write_json

            atomic_write_json(self.timings_path, self.timings)
        log(f"{name}: {time.perf_counter() - t0:.1f} s")
        return result


def _save_json(obj: Any, path: Path) -> None:
    from robustest.core.atomic import atomic_write_json

    atomic_write_json(path, obj)


def _synthetic_folder(root: Path, size: int, classes: int, n_train: int, n_test: int) -> Path:
    """A class-per-folder PNG tree (root/{train,test}/<class>/*.png) of learnable synthetic images, so the dry
    run goes through the folder loader, its resize/centre-crop and the DataLoader training path."""
    from PIL import Image

    if (root / "done").is_file():
        return root
    tmp = synthetic_npz(root.parent / "synthetic_folder.npz", (3, size, size), classes, n_train, n_test)
    if is_rank0():
        with np.load(tmp) as z:
            for split in ("train", "test"):
                x, y = z[f"x_{split}"], z[f"y_{split}"]
                for i, (img, label) in enumerate(zip(x, y)):
                    d = root / split / f"class{int(label):03d}"
                    d.mkdir(parents=True, exist_ok=True)
                    Image.fromarray(img).save(d / f"{i:05d}.png")
        (root / "done").write_text("ok\n")
    return root


def load_data(s: dict[str, Any], data_dir: str | None, workers: int, explicit: bool) -> tuple[Any, Any]:
    """The training and test splits; the setting's resize/centre-crop apply to image folders (flags given on the
    command line are passed to any loader)."""
    from robustest import data as datasets

    kw: dict[str, Any] = {}
    folder = datasets.canonical(s["dataset"]) == "folder"
    for key in ("resize", "center_crop"):
        if s.get(key) is not None and (folder or explicit):
            kw[key] = tuple(s[key])
    if folder:
        kw["workers"] = workers
    train = datasets.load(s["dataset"], root=data_dir, split="train", **kw)
    test = datasets.load(s["dataset"], root=data_dir, split="test", **kw)
    return train, test


# ------------------------------------------------------------------------------------------ the pipeline
def run_full(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from robustest import corruptions as corr
    from robustest import models as zoo
    from robustest import weakrobust as wr
    from robustest.core.batching import image_shape, labels_of, take
    from robustest.evaluate import accuracy
    from robustest.models.checkpoints import clone_model, load_checkpoint, save_checkpoint
    from robustest.train import channel_stats, fit, recipes

    s = resolve(args)
    dev = torch.device(args.device) if args.device else torch.device("cpu")
    data_dir = args.data_dir
    if args.dry_run:
        d = DRY_RUN[args.setting]
        if "folder_size" in d:
            s["dataset"] = "folder"
            data_dir = str(_synthetic_folder(out / "synthetic", d["folder_size"], s["classes"], d["n_train"],
                                             d["n_test"]))
        else:
            s["dataset"] = "npz"
            data_dir = str(synthetic_npz(out / "synthetic.npz", d["shape"], s["classes"], d["n_train"],
                                         d["n_test"]))
    train, test = load_data(s, data_dir, args.workers, args.resize is not None or args.center_crop is not None)
    c, h, w = image_shape(train)
    y_train, y_test = labels_of(train), labels_of(test)
    classes = int(max(int(y_train.max()), int(y_test.max())) + 1)
    if args.dry_run:
        classes = max(classes, s["classes"])
    if h != w:
        from robustest.core.errors import ConfigError

        raise ConfigError(f"the zoo models take square images, the data is {h}x{w}: pass --resize/--center-crop")
    zoo.check_input(s["model"], c, h, max(classes, 2))  # one line naming the model and the data, before any work
    steps = Steps(out)
    n_train, n_test = len(train), len(test)
    k = min(s["k"], n_train)
    g = torch.Generator().manual_seed(args.seed)
    random_idx = torch.sort(torch.randperm(n_train, generator=g)[:k]).values
    test_idx = torch.arange(min(s["test_size"], n_test))
    log(f"{s['title']}{' (DRY RUN)' if args.dry_run else ''}: {n_train} training / {n_test} test images "
        f"{c}x{h}x{w}, {classes} classes; model {s['model']}; weak set K = {k}; {len(test_idx)} test images")

    # ---- the standard model
    def train_standard() -> torch.nn.Module:
        epochs, batch_size, recipe = recipes.layered_recipe(s["recipe"], s["epochs"],
                                                            {"amp": args.amp} if args.amp else {})
        batch_size = s.get("batch_size") or batch_size
        if s["norm"] == "imagenet" and c == 3:
            mean, std = list(zoo.IMAGENET_MEAN), list(zoo.IMAGENET_STD)
        else:
            mean, std = channel_stats(train)
        torch.manual_seed(args.seed)
        model = zoo.create(s["model"], num_classes=max(classes, 2), in_channels=c, input_size=h, mean=mean,
                           std=std).to(dev)
        state = out / "state" / ("standard_fit" if rank() == 0 else f"standard_fit.rank{rank()}")
        hist = fit(model, train, epochs, batch_size, recipe, seed=args.seed, device=dev, progress=False,
                   state_dir=state, resume=True)
        log(f"standard model: {s['epochs']} epochs in {hist.seconds:.0f} s, last train acc {hist.last.accuracy:.4f}")
        return model

    def save_model(m: torch.nn.Module, path: Path) -> None:
        save_checkpoint(path, m, metadata={"setting": args.setting, "dry_run": bool(args.dry_run)})

    def load_model(path: Path) -> torch.nn.Module:
        return load_checkpoint(path, map_location=dev)

    models_: dict[str, torch.nn.Module] = {}
    models_["standard"] = steps.run("model_standard", "pt", train_standard, save_model, load_model)

    # ---- analysis and validation of one model: the weak set, the random subset and the test subset are
    # validated in one call (one pass per perturbation type), then split
    attack_kw = {a: {"steps": s["attack_steps"]} for a in ("pgd", "bim", "mifgsm")}
    x_random, y_random = take(train, random_idx)
    x_test, y_test_sub = take(test, test_idx)

    def analyse_and_validate(name: str) -> dict[str, Any]:
        m = models_[name]
        an = steps.run(f"analysis_{name}", "pt",
                       lambda: wr.analyze(m, train, n_neighbors=s["neighbors"], eps=s["eps"], seed=args.seed,
                                          device=dev),
                       lambda a, p: a.save(p), wr.Analysis.load)
        weak = wr.select_weak(an, k=k)

        def validate() -> Any:
            x_weak, y_weak = take(train, weak.indices)
            xe, ye = torch.cat([x_weak, x_random, x_test]), torch.cat([y_weak, y_random, y_test_sub])
            return wr.validate(m, (xe, ye), None, "all", eps=s["attack_eps"], severities=s["severities"],
                               attack_kwargs=attack_kw, seed=args.seed, device=dev)

        val = steps.run(f"validation_{name}", "pt", validate, lambda r, p: r.save(p), wr.ValidationResult.load)
        bounds = {"weak": (0, len(weak)), "random": (len(weak), len(weak) + k),
                  "test": (len(weak) + k, len(weak) + k + len(test_idx))}
        res: dict[str, Any] = {"analysis": an.summary(), "weak_indices": weak.indices}
        for set_name, (a, b) in bounds.items():
            res[set_name] = val.subset(torch.arange(a, b))
        return res

    results: dict[str, Any] = {"standard": analyse_and_validate("standard")}
    weaknesses = results["standard"]["weak"].weaknesses()
    weak_corr = [w for w in weaknesses if w in corr.names()]
    log(f"weaknesses on the standard model's weak set: {weaknesses}")

    # ---- the enhanced models
    def enhance(kind: str) -> torch.nn.Module:
        m = clone_model(models_["standard"]).to(dev)
        wr.enhance(m, train, weak_corr if kind == "reva" else (), epochs=s["enhance_epochs"], augmix=True,
                   adversarial=kind == "reva", jsd_weight=s["jsd_weight"], eps=s["adv_eps"],
                   adv_steps=s["adv_steps"], adv_alpha=s["adv_alpha"], recipe=recipes.Recipe(lr=s["enhance_lr"]),
                   batch_size=s["enhance_batch"], seed=args.seed, device=dev)
        return m

    for kind in ("augmix", "reva"):
        models_[kind] = steps.run(f"model_{kind}", "pt", lambda kind=kind: enhance(kind), save_model, load_model)
        results[kind] = analyse_and_validate(kind)

    # ---- the B3 table: test accuracy under attacks transferred from the standard model, and white-box
    transferred: dict[str, torch.Tensor] = {}  # the standard model's adversarial test images, made once

    def evaluate(name: str) -> dict[str, Any]:
        from robustest import attacks as atk

        x, y = x_test, y_test_sub
        e = s["eval_eps"]
        spec = {"pgd": {"steps": s["eval_pgd_steps"], "alpha": e / 4}, "fgsm": {},
                "bim": {"steps": s["eval_bim_steps"]}}
        row: dict[str, Any] = {"clean": accuracy(models_[name], (x, y))}
        for a, kw in spec.items():
            if a not in transferred:
                transferred[a] = atk.attack(a, models_["standard"], (x, y), eps=e, seed=args.seed, **kw).adv.cpu()
            row[f"{a}_transfer"] = accuracy(models_[name], (transferred[a], y))
            row[f"{a}_whitebox"] = (row[f"{a}_transfer"] if name == "standard" else
                                    atk.attack(a, models_[name], (x, y), eps=e, seed=args.seed, **kw).robust_accuracy)
        row["mean_adv_error_transfer"] = 1 - float(np.mean([row[f"{a}_transfer"] for a in spec]))
        return row

    evaluation = {name: steps.run(f"evaluation_{name}", "json", lambda name=name: evaluate(name), _save_json,
                                  lambda p: json.loads(p.read_text()))
                  for name in MODELS}
    summary = summarise(args, s, results, evaluation, weaknesses, steps.timings)
    if is_rank0():
        _save_json(summary, out / "results.json")
        (out / "summary.md").write_text(markdown(summary))
        print(markdown(summary))
    return summary


def summarise(args: argparse.Namespace, s: dict[str, Any], results: dict[str, Any], evaluation: dict[str, Any],
              weaknesses: list[str], timings: dict[str, float]) -> dict[str, Any]:
    from scipy.stats import spearmanr

    per_model = {}
    for name in MODELS:
        r = results[name]
        per_model[name] = {
            "analysis": r["analysis"],
            **{f"{set_name}_{fam}": (r[set_name].mean_adv_error if fam == "adversarial" else r[set_name].mce)
               for set_name in ("weak", "random", "test") for fam in ("adversarial", "corruption")},
            "clean_error_weak": r["weak"].clean_error, "clean_error_test": r["test"].clean_error,
            "evaluation": evaluation[name],
        }
    rho = {}
    for fam in ("adversarial", "corruption"):
        test = [per_model[m][f"test_{fam}"] for m in MODELS]
        for sig in ("weak", "random"):
            sig_v = [per_model[m][f"{sig}_{fam}"] for m in MODELS]
            ok = np.std(sig_v) > 0 and np.std(test) > 0
            rho[f"{sig}_{fam}"] = float(spearmanr(sig_v, test).statistic) if ok else None
    return {"setting": args.setting, "dry_run": bool(args.dry_run), "values": {k: (list(v) if isinstance(v, tuple)
                                                                                  else v) for k, v in s.items()},
            "weaknesses_of_standard": weaknesses, "models": per_model,
            "spearman_vs_test_over_models": rho, "timings_s": timings}


def markdown(summary: dict[str, Any]) -> str:
    v = summary["values"]
    lines = [f"{v['title']}{' (DRY RUN: synthetic data, not a result)' if summary['dry_run'] else ''}", "",
             "| model | clean test acc | weak adv err | random adv err | test adv err | weak mCE | random mCE | "
             "test mCE |", "|---|---|---|---|---|---|---|---|"]
    for m, r in summary["models"].items():
        f = [r[k] for k in ("weak_adversarial", "random_adversarial", "test_adversarial", "weak_corruption",
                            "random_corruption", "test_corruption")]
        lines.append(f"| {m} | {r['evaluation']['clean']:.4f} | " + " | ".join(
            "-" if x is None else f"{x:.4f}" for x in f) + " |")
    rho = summary["spearman_vs_test_over_models"]
    lines += ["", "Spearman rho against the test error over the three models (weak / random): "
              + ", ".join(f"{fam} {_f(rho[f'weak_{fam}'])} / {_f(rho[f'random_{fam}'])}"
                          for fam in ("adversarial", "corruption")), "",
              f"Accuracy (%) at eps {v['eval_eps']:.4f}: attacks transferred from the standard model (the "
              "paper's evaluation) / white-box", "",
              f"| model | clean | PGD-{v['eval_pgd_steps']} | FGSM | BIM-{v['eval_bim_steps']} | "
              "mean adv. error (transfer) |", "|---|---|---|---|---|---|"]
    for m, r in summary["models"].items():
        e = r["evaluation"]
        lines.append(f"| {m} | {100 * e['clean']:.2f} | " + " | ".join(
            f"{100 * e[f'{a}_transfer']:.2f} / {100 * e[f'{a}_whitebox']:.2f}" for a in ("pgd", "fgsm", "bim"))
            + f" | {100 * e['mean_adv_error_transfer']:.2f} |")
    lines += ["", "Paper (ImageNet-100, Swin-V2-B, 4/255, transferred), standard / AugMix / REVa: PGD-40 0.00 / "
              "48.82 / 75.30; FGSM 22.54 / 50.86 / 66.96; BIM-10 0.02 / 37.72 / 72.50; mean adversarial error "
              "83.18 / 55.60 / 32.97."]
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
