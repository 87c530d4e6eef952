"""What the loop and the comparison share: the output folder and its resume marker, data and model
loading, the validation split, the fixed adversarial set and baseline, fine-tuning with checkpoint
selection on the validation split, and robustness measurement."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from robustest import data as datasets
from robustest.core.atomic import atomic_save, atomic_write_json
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError, DataError
from robustest.core.modelcall import set_mode
from robustest.core.modelchecks import check_model_fits
from robustest.core.seeding import derive_seed
from robustest.core.stats import describe
from robustest.evaluate import FixedAdversarialSet, RobustnessReport, adversarial_examples, build_fixed_set, measure
from robustest.models.checkpoints import clone_model, source_of
from robustest.robot.config import EXTENDABLE_KEYS, PATH_KEYS, RobotConfig
from robustest.robot.pool import Pool


def quantiles(t: torch.Tensor) -> dict[str, float | None]:
    if t.numel() == 0:
        return {"n": 0, "mean": None, "std": None, "min": None, "q25": None, "median": None, "q75": None, "max": None}
    return describe(t, {"n": "count", "mean": "mean", "std": "std", "min": "min", "q25": "q25", "median": "q50",
                        "q75": "q75", "max": "max"})


# ------------------------------------------------------------------------------------------- the setup
@dataclass
class RunSetup:
    model0: nn.Module
    x_fit: torch.Tensor
    y_fit: torch.Tensor
    val: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    fixed: FixedAdversarialSet
    baseline: RobustnessReport
    info: dict[str, Any]
    device: torch.device
    timings: dict[str, float] = field(default_factory=dict)


def log_progress(cfg: RobotConfig, msg: str) -> None:
    """A progress message (round or cell finished) to the ``robustest.robot`` logger when ``cfg.verbose``: the
    command prints it on stderr; from Python, ``logging.basicConfig(level=logging.INFO)`` shows it."""
    if cfg.verbose:
        import logging

        logging.getLogger("robustest.robot").info(msg)


def _limit(ds: Any, n: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = ds.tensors[0], ds.tensors[1]
    if n is not None and n < len(x):
        x, y = x[:n], y[:n]
    return x.contiguous(), y.contiguous()


def config_fingerprint(cfg: RobotConfig, kind: str) -> str:
    d = {k: v for k, v in cfg.result_dict().items() if k not in EXTENDABLE_KEYS and k not in PATH_KEYS
         and not (k in ("train_options", "finetune_options") and not v)  # runs from before these keys resume
         and not (k == "stratified_bins" and v == 4)
         and not (k == "autoattack" and v is None)}  # runs from before the key resume
    if kind == "compare":  # compare does not use the loop's strategy: fixed at its former default, so comparisons
        d["strategy"] = "best"  # started before the default became adv-train still resume
    return hashlib.sha256(json.dumps([kind, d], sort_keys=True, default=str).encode()).hexdigest()


def prepare_out(cfg: RobotConfig, kind: str) -> Path:
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out {str(out)!r} exists and is not a folder: choose another path")
    marker = out / "state" / "run.json"
    fp = config_fingerprint(cfg, kind)
    if marker.is_file():
        try:
            prev = json.loads(marker.read_text())
        except (OSError, json.JSONDecodeError):
            prev = {}
        if not cfg.resume:
            raise ConfigError(f"{out} already holds a run: pass --resume to continue it or choose another --out")
        if prev.get("fingerprint") != fp:
            raise ConfigError(f"{out} holds a run with different settings: resume with the same config or use "
                              "another --out")
    from robustest.core import distributed

    distributed.barrier()  # under torchrun every rank has looked at --out before rank 0 writes the marker
    return out


def _mark_run(cfg: RobotConfig, out: Path, kind: str) -> None:
    """Write the resume marker: only once the model and the data have loaded, so a run refused for bad input
    leaves nothing behind."""
    atomic_write_json(out / "state" / "run.json",
                      {"kind": kind, "fingerprint": config_fingerprint(cfg, kind), "config": cfg.result_dict()})


def _train_original(cfg: RobotConfig, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                    device: torch.device) -> nn.Module:
    from robustest import models as zoo
    from robustest.train import fit

    mean = x.mean(dim=(0, 2, 3)).tolist()
    std = x.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist()
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    model = zoo.create(cfg.train_model, num_classes=max(num_classes, 2), in_channels=x.shape[1],
                       input_size=x.shape[2], mean=mean, std=std).to(device)
    fit(model, (x, y), cfg.train_epochs, cfg.train_options.get("batch_size", cfg.batch_size), cfg.train_recipe(),
        seed=derive_seed(cfg.seed, "train-original"), device=device, progress=cfg.progress, ddp=False)
    return model


def measure_model(model: nn.Module, setup_test: tuple[torch.Tensor, torch.Tensor], fixed: FixedAdversarialSet,
             cfg: RobotConfig, seed: int, whitebox: bool | None = None) -> RobustnessReport:
    return measure(model, setup_test, eps=cfg.eps, fixed=fixed,
                   whitebox=cfg.whitebox if whitebox is None else whitebox, whitebox_limit=cfg.whitebox_limit,
                   pgd_steps=cfg.whitebox_pgd_steps, pgd_restarts=cfg.whitebox_restarts, apgd_steps=cfg.apgd_steps,
                   corruptions=cfg.corruptions, seed=seed, autoattack=cfg.autoattack is not None,
                   autoattack_version=cfg.autoattack or "standard")


def robustness_figures(rep: RobustnessReport) -> dict[str, Any]:
    d = rep.to_dict()
    d.pop("seconds", None)
    return d


def prepare_setup(cfg: RobotConfig, out: Path, model: nn.Module | None, kind: str) -> RunSetup:
    """Load data and model, carve the validation split, build (or load) the fixed adversarial set and the
    baseline measurement; everything cached under OUT/state so a resumed run reuses it."""
    from robustest.models.checkpoints import load_model, save_weights, state_fingerprint

    t0 = time.perf_counter()
    device = resolve_device(model, cfg.device) if (cfg.device or model is not None) else torch.device("cpu")
    # the limits apply while loading: the first N of an array format, a class-stratified subset of a folder
    train = datasets.load(cfg.dataset, root=cfg.data_dir, split="train", workers=cfg.workers, limit=cfg.train_limit)
    test = datasets.load(cfg.dataset, root=cfg.data_dir, split="test", workers=cfg.workers, limit=cfg.test_limit)
    x_tr, y_tr = _limit(train, cfg.train_limit)
    x_te, y_te = _limit(test, cfg.test_limit)
    n = x_tr.shape[0]
    n_val = max(1, int(round(n * cfg.val_fraction)))
    if n - n_val < 2:
        raise DataError(f"only {n} training images: too few to carve a validation split (use more data)")
    g = torch.Generator().manual_seed(derive_seed(cfg.seed, "val-split"))
    perm = torch.randperm(n, generator=g)
    val_idx, fit_idx = torch.sort(perm[:n_val]).values, torch.sort(perm[n_val:]).values
    x_fit, y_fit = x_tr[fit_idx], y_tr[fit_idx]
    x_val, y_val = x_tr[val_idx], y_tr[val_idx]
    state = out / "state"
    timings: dict[str, float] = {"load_data_s": time.perf_counter() - t0}

    t1 = time.perf_counter()
    orig_path = state / "original_model.pt"
    if model is None and (cfg.model is not None or cfg.model_factory is not None):
        model = load_model(cfg.model, factory=cfg.model_factory, factory_args=cfg.model_args, weights=cfg.weights,
                           torchscript=cfg.torchscript, map_location=device)
    elif model is None:
        if orig_path.is_file():  # a zoo model: its checkpoint rebuilds it
            model = load_model(orig_path, map_location=device)
        else:
            epochs = f"{cfg.train_epochs} epoch{'s' if cfg.train_epochs != 1 else ''}"
            log_progress(cfg, f"training {cfg.train_model} on {cfg.dataset} ({len(x_tr)} images, {epochs})")
            model = _train_original(cfg, x_tr, y_tr, int(max(y_tr.max(), y_te.max())) + 1, device)
            save_weights(orig_path, model, metadata={"dataset": cfg.dataset, "epochs": cfg.train_epochs})
    set_mode(model.to(device), False)
    check_model_fits(model, (x_tr, y_tr))
    _mark_run(cfg, out, kind)
    _check_same_inputs(state, state_fingerprint(model), _data_fingerprint(x_tr, y_tr, x_te, y_te))
    timings["original_model_s"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    setup_path = state / "setup.pt"
    if setup_path.is_file():
        p = torch.load(setup_path, map_location="cpu", weights_only=True)
        fixed = FixedAdversarialSet(x=p["fixed_x"], y=p["fixed_y"], source_index=p["fixed_index"],
                                    method=list(p["fixed_method"]), eps=float(p["eps"]),
                                    num_source=int(p["fixed_num_source"]), settings=dict(p["fixed_settings"]))
        val_x, val_y = p["val_x"], p["val_y"]
        base_json = json.loads((state / "baseline.json").read_text())
        baseline = RobustnessReport(**base_json)
    else:
        log_progress(cfg, f"building the fixed adversarial set from {len(x_te)} test images (eps {cfg.eps})")
        fixed = build_fixed_set(model, (x_te, y_te), cfg.eps, seed=derive_seed(cfg.seed, "fixed-set"))
        val_x, val_y = x_val, y_val
        if cfg.val_adversarial:
            xa, ya, _, _ = adversarial_examples(model, (x_val, y_val), cfg.eps, pgd_steps=cfg.pool_pgd_steps,
                                                seed=derive_seed(cfg.seed, "val-adv"))
            val_x, val_y = torch.cat([x_val, xa]), torch.cat([y_val, ya])
        baseline = measure_model(model, (x_te, y_te), fixed, cfg, derive_seed(cfg.seed, "measure", "baseline"))
        atomic_write_json(state / "baseline.json", baseline.to_dict())
        atomic_save({"fixed_x": fixed.x, "fixed_y": fixed.y, "fixed_index": fixed.source_index,
                     "fixed_method": fixed.method, "eps": fixed.eps, "fixed_num_source": fixed.num_source,
                     "fixed_settings": fixed.settings, "val_x": val_x, "val_y": val_y}, setup_path)
    timings["fixed_set_and_baseline_s"] = time.perf_counter() - t2
    spec = source_of(model)
    info = {
        "dataset": cfg.dataset, "num_train": int(n), "num_fit": int(len(x_fit)), "num_val_clean": int(n_val),
        "num_val": int(len(val_x)), "num_test": int(len(x_te)), "model": spec,
        "fixed_set": {"size": len(fixed), "num_source": fixed.num_source, "by_attack": fixed.counts(),
                      "eps": fixed.eps, **fixed.settings},
    }
    return RunSetup(model0=model, x_fit=x_fit, y_fit=y_fit, val=(val_x, val_y), test=(x_te, y_te), fixed=fixed,
                  baseline=baseline, info=info, device=device, timings=timings)


def _data_fingerprint(*tensors: torch.Tensor) -> str:
    """SHA-256 over the data a run uses (shapes and values): a resumed run must see the same data."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _check_same_inputs(state: Path, model_sha: str, data_sha: str) -> None:
    """A resumed run must start from the same model weights and data as the run it continues (compared by
    content, not by path): otherwise one results.json would mix two models' numbers."""
    path = state / "inputs.json"
    now = {"model_sha256": model_sha, "data_sha256": data_sha}
    if path.is_file():
        try:
            before = json.loads(path.read_text())
        except (OSError, ValueError):
            before = {}
        for key, what in (("model_sha256", "model weights"), ("data_sha256", "data")):
            if before.get(key) not in (None, now[key]):
                raise ConfigError(f"the {what} differ from those the run in {state.parent} started with (compared "
                                  "by content): resume with the same model and data, or choose another --out")
    atomic_write_json(path, now)


# ---------------------------------------------------------------------------------------- fine-tuning
def finetune_on_tests(model0: nn.Module, setup: RunSetup, tests: Pool, cfg: RobotConfig, seed: int
              ) -> tuple[nn.Module, nn.Module | None, dict[str, Any]]:
    """Fine-tune a copy of ``model0`` on the training data + ``tests``; pick the checkpoint on the validation
    split. Returns (selected model, last-epoch model or None when it is the selected one, history dict)."""
    from robustest.train import fit

    model = clone_model(model0)
    last: dict[str, Any] = {}

    def keep_last(epoch: int, m: nn.Module, stats: Any) -> None:
        if epoch == cfg.epochs:
            last["state"] = {k: v.detach().clone() for k, v in m.state_dict().items()}

    from robustest.core.compute import PassCounter

    x = torch.cat([setup.x_fit, tests.x]) if len(tests) else setup.x_fit
    y = torch.cat([setup.y_fit, tests.y]) if len(tests) else setup.y_fit
    # under torchrun every rank fine-tunes the whole cell by itself (ddp=False), identically, so the results
    # equal one process's; the per-sample work around it (pool generation, robustness measurements) is what
    # the ranks share out
    with PassCounter(model) as pc:
        hist = fit(model, (x, y), cfg.epochs, cfg.batch_size, cfg.finetune_recipe(), val=setup.val, seed=seed,
                   device=setup.device, progress=cfg.progress, keep="best", on_epoch_end=keep_last, ddp=False)
    last_model = None
    if hist.best_epoch != cfg.epochs and "state" in last:
        last_model = clone_model(model)
        last_model.load_state_dict(last["state"])
        set_mode(last_model, False)
    h = hist.to_dict()
    for e in h["epochs"]:
        e.pop("seconds", None)
    secs = h.pop("seconds", 0.0)
    h["num_train"] = int(len(x))
    return model, last_model, {"history": h, "seconds": secs, "passes": pc.passes, "adversarial_passes": 0.0}


def adversarial_finetune(model0: nn.Module, setup: RunSetup, cfg: RobotConfig, seed: int, method: str = "pgd-at"
                  ) -> tuple[nn.Module, nn.Module | None, dict[str, Any]]:
    """The ``adv-train`` baseline and the other hardening strategies (``method``: pgd-at for adv-train, or
    trades, fosc, fol-budget, fast-at): fine-tune a copy of ``model0`` on the training images with
    adversarial training (Madry et al.; :func:`robustest.train.harden`, e.g. pgd-at: ``cfg.pool_pgd_steps`` steps of
    2.5 eps / steps from a random start, generated against the model as it learns, every batch), with the
    epochs, batch size, learning rate and optimiser of the other cells; the checkpoint is picked on the same
    validation split by accuracy, as :func:`finetune_on_tests` does. Returns what :func:`finetune_on_tests`
    returns; the history dict's ``passes`` are the update steps and validation, ``adversarial_passes`` the attacks."""
    from robustest.core.compute import PassCounter
    from robustest.evaluate import loss_and_accuracy
    from robustest.train import objectives
    from robustest.train.hardening import harden

    model = clone_model(model0)
    best: dict[str, Any] = {"acc": -1.0, "epoch": None, "state": None}
    last: dict[str, Any] = {}
    epochs: list[dict[str, Any]] = []

    def on_end(epoch: int, m: nn.Module, rec: dict[str, Any]) -> None:
        val_loss, val_acc = loss_and_accuracy(m, setup.val, batch_size=max(256, cfg.batch_size))
        epochs.append({"epoch": epoch, "loss": rec["loss"], "accuracy": rec["adv_accuracy"], "lr": rec["lr"],
                       "val_loss": val_loss, "val_accuracy": val_acc})
        state = {k: v.detach().clone() for k, v in m.state_dict().items()}
        if val_acc > best["acc"]:
            best.update(acc=val_acc, epoch=epoch, state=state)
        if epoch == cfg.epochs:
            last["state"] = state

    with PassCounter(model) as pc:
        res = harden(model, (setup.x_fit, setup.y_fit), method, eps=cfg.eps, epochs=cfg.epochs,
                     batch_size=cfg.batch_size, recipe=cfg.finetune_recipe(),
                     eps_warmup=cfg.finetune_options.get("eps_warmup", 0.0),
                     steps=None if objectives.get(method).fixed_steps is not None else cfg.pool_pgd_steps, seed=seed,
                     device=setup.device, progress=cfg.progress, on_epoch_end=on_end)
    last_model = None
    if best["epoch"] != cfg.epochs and "state" in last:
        last_model = clone_model(model)
        last_model.load_state_dict(last["state"])
        set_mode(last_model, False)
    if best["state"] is not None:
        model.load_state_dict(best["state"])
    set_mode(model, False)
    attack = float(res.compute["attack_passes"])
    passes = None if pc.passes is None else pc.passes - attack
    h = {"epochs": epochs, "best_epoch": best["epoch"], "num_train": int(len(setup.x_fit)), "method": method,
         "settings": {k: res.settings[k] for k in ("eps", "steps", "alpha", "optimizer", "lr", "batch_size",
                                                   "schedule", "eps_warmup") if k in res.settings}}
    return model, last_model, {"history": h, "seconds": res.seconds, "passes": passes, "adversarial_passes": attack}


def last_figures(best: RobustnessReport, last_model: nn.Module | None, setup: RunSetup, cfg: RobotConfig,
                  seed: int) -> dict[str, Any]:
    if last_model is None:
        return {**robustness_figures(best), "same_as_selected": True}
    rep = measure_model(last_model, setup.test, setup.fixed, cfg, seed, whitebox=cfg.whitebox and cfg.whitebox_last)
    return {**robustness_figures(rep), "same_as_selected": False}


def fmt_acc(v: Any) -> str:
    """An accuracy for a progress message: 3 decimals, as in the tables."""
    return "-" if v is None else f"{v:.3f}"

