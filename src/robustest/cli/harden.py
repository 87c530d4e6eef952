"""``robustest harden``: adversarial fine-tuning of a checkpoint (PGD-AT, TRADES, dynamic AT by FOSC, FOL-budgeted
PGD-AT, Fast-AT), with robustness measured before and after on the test split.

Writes OUT/model.pt (the hardened model, a safe checkpoint), OUT/results.json (settings in effect, per-epoch
history and compute, clean and white-box accuracy before and after, timings), OUT/report.html and OUT/state/
(the state after every epoch, written atomically); ``--resume`` continues an interrupted run and ends with the
same model as an uninterrupted one.

White-box accuracy: the per-sample worst case of PGD (--whitebox-pgd-steps steps of eps/4 from a random start,
best of --whitebox-restarts) and APGD-CE (--apgd-steps) on the first --whitebox-limit test images.

Example:
    robustest harden --checkpoint model.pt --dataset digits --method fol-budget --eps 0.2 --epochs 5 --out hard
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from robustest.cli._common import (
    add_checkpoint_arg,
    add_data_args,
    add_run_args,
    check_fits,
    data_settings,
    finite_float,
    learning_rate,
    load_data,
    load_model,
    log,
    model_settings,
    non_negative_int,
    out_dir,
    peak_rss_mib,
    positive_int,
    print_table,
)
from robustest.errors import ConfigError
from robustest.runtime import atomic_write_json

ORDER = 35
# arguments that do not change what a run computes (left out of the resume check)
_RUNTIME_ARGS = ("func", "resume", "no_progress", "device", "out", "debug", "verb")


_float = finite_float  # ranges are checked by hardening.resolve_settings, with the method in view


def add_parser(sub: argparse._SubParsersAction) -> None:
    from robustest import data as datasets
    from robustest.hardening import DEFAULTS, METHODS

    p = sub.add_parser("harden", help="adversarial fine-tuning (PGD-AT, TRADES, FOSC, FOL budget, Fast-AT)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_arg(p)
    add_data_args(p, split="train")
    g = p.add_argument_group("method")
    g.add_argument("--method", choices=METHODS, default="pgd-at", help="hardening method (default: pgd-at)")
    g.add_argument("--eps", type=_float, required=True, help="L-inf radius in pixel scale, in (0, 1]")
    g.add_argument("--steps", type=positive_int, default=None,
                   help=f"attack steps of the inner maximisation (default: {DEFAULTS['steps']}; fast-at: 1)")
    g.add_argument("--alpha", type=_float, default=None,
                   help="attack step size (default: 2.5 * eps / steps; fast-at: 1.25 * eps)")
    g.add_argument("--mix", type=_float, default=None,
                   help=f"pgd-at: fraction of the loss on clean images, in [0, 1] (default: {DEFAULTS['mix']})")
    g.add_argument("--beta", type=_float, default=None, help=f"trades: weight of the KL term "
                   f"(default: {DEFAULTS['beta']})")
    g.add_argument("--fosc-c-max", type=_float, default=None,
                   help=f"fosc: FOSC criterion of the first epoch (default: {DEFAULTS['fosc_c_max']})")
    g.add_argument("--fosc-warmup", type=_float, default=None,
                   help="fosc: fraction of the epochs over which the criterion falls linearly to 0 "
                        f"(default: {DEFAULTS['fosc_warmup']})")
    g.add_argument("--fol-threshold", type=_float, default=None,
                   help=f"fol-budget: stop a sample's attack once its FOL is at most this "
                        f"(default: {DEFAULTS['fol_threshold']})")
    g.add_argument("--fol-min-steps", type=non_negative_int, default=None,
                   help=f"fol-budget: steps every sample takes before the rule applies "
                        f"(default: {DEFAULTS['fol_min_steps']})")
    g.add_argument("--no-stop-misclassified", dest="stop_misclassified", action="store_const", const=False,
                   default=None, help="fol-budget: do not stop a sample's attack when it is misclassified")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=positive_int, default=5, help="fine-tuning epochs (default: 5)")
    t.add_argument("--batch-size", type=positive_int, default=128, help="batch size (default: 128)")
    t.add_argument("--lr", type=learning_rate, default=1e-3, help="learning rate (default: 1e-3)")
    t.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="optimizer (default: adam)")
    t.add_argument("--weight-decay", type=_float, default=0.0, help="weight decay (default: 0)")
    m = p.add_argument_group("measurement")
    m.add_argument("--test-split", choices=datasets.SPLITS, default="test",
                   help="split measured before and after (default: test)")
    m.add_argument("--test-limit", type=positive_int, default=1000, metavar="N",
                   help="clean accuracy on the first N test images (default: 1000)")
    m.add_argument("--whitebox-limit", type=non_negative_int, default=500, metavar="N",
                   help="white-box attacks on the first N test images; 0 skips them (default: 500)")
    m.add_argument("--whitebox-pgd-steps", type=positive_int, default=20, help="PGD steps (default: 20)")
    m.add_argument("--whitebox-restarts", type=positive_int, default=2, help="PGD restarts (default: 2)")
    m.add_argument("--apgd-steps", type=non_negative_int, default=50, help="APGD-CE steps, 0 skips (default: 50)")
    m.add_argument("--monitor", "--monitor-images", dest="monitor", type=non_negative_int, default=200, metavar="N",
                   help="after every epoch, clean and PGD-10 accuracy on the first N test images (default: 200; "
                        "under torchrun spell it --monitor-images: torchrun takes --monitor for its own "
                        "--monitor-interval)")
    p.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    add_run_args(p)
    p.set_defaults(func=run)


def _fingerprint_args(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in sorted(vars(args).items()) if k not in _RUNTIME_ARGS}


def _prepare_out(args: argparse.Namespace) -> Path:
    """Create --out; refuse to overwrite a run without --resume, or to resume one with other settings."""
    out = out_dir(args)
    marker = out / "state" / "run.json"
    settings = json.loads(json.dumps(_fingerprint_args(args), default=str))
    if marker.is_file() or (out / "results.json").is_file():
        if not args.resume:
            raise ConfigError(f"{out} already holds a harden run: pass --resume to continue it or choose another --out")
        try:
            prev = json.loads(marker.read_text()).get("args")
        except (OSError, ValueError, AttributeError):
            prev = None
        if prev != settings:
            raise ConfigError(f"{out} holds a run with other settings: resume with the same options or choose "
                              "another --out")
    from robustest import distributed

    distributed.barrier()  # every rank has looked at --out before rank 0 writes the marker
    atomic_write_json(marker, {"args": settings})
    return out


def _measure(model, test, args) -> dict[str, Any]:
    from robustest.robustness import measure

    rep = measure(model, test, eps=args.eps, whitebox=args.whitebox_limit > 0,
                  whitebox_limit=args.whitebox_limit or None, pgd_steps=args.whitebox_pgd_steps,
                  pgd_restarts=args.whitebox_restarts, apgd_steps=args.apgd_steps, seed=args.seed)
    d = rep.to_dict()
    for key in ("fixed_set_accuracy", "fixed_set_size", "seconds"):  # seconds go to timings: results stay reproducible
        d.pop(key, None)
    return d


def run(args: argparse.Namespace) -> int:
    from robustest import hardening
    from robustest.checkpoints import source_of
    from robustest.results import write_results
    from robustest.runtime import take
    from robustest.training import save_checkpoint

    t0 = time.perf_counter()
    method_kw = {"mix": args.mix, "beta": args.beta, "fosc_c_max": args.fosc_c_max, "fosc_warmup": args.fosc_warmup,
                 "fol_threshold": args.fol_threshold, "stop_misclassified": args.stop_misclassified,
                 "fol_min_steps": args.fol_min_steps}
    common = {"eps": args.eps, "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
              "optimizer": args.optimizer, "weight_decay": args.weight_decay, "steps": args.steps,
              "alpha": args.alpha, "seed": args.seed}
    settings = hardening.harden_settings(args.method, **common, **method_kw)  # bad values: one line, no work
    if Path(args.out).exists() and not Path(args.out).is_dir():
        out_dir(args)
    model = load_model(args)
    hardening.check_trainable(model)
    spec = source_of(model)
    train = load_data(args)
    check_fits(model, train)
    test = load_data(argparse.Namespace(**{**vars(args), "limit": args.test_limit}), args.test_split)
    check_fits(model, test)
    out = _prepare_out(args)
    t_load = time.perf_counter() - t0

    t1 = time.perf_counter()
    before_path = out / "state" / "before.json"
    if args.resume and before_path.is_file():
        before = json.loads(before_path.read_text())
    else:
        before = _measure(model, test, args)
        atomic_write_json(before_path, before)
    t_before = time.perf_counter() - t1

    t2 = time.perf_counter()
    val = None
    if args.monitor > 0:
        n = min(args.monitor, len(test))
        val = take(test, torch.arange(n))
    res = hardening.harden(model, train, args.method, **common, **method_kw, device=args.device,
                           progress=not args.no_progress, val=val, state_dir=out / "state", resume=args.resume)
    t_harden = time.perf_counter() - t2

    t3 = time.perf_counter()
    after = _measure(model, test, args)
    t_after = time.perf_counter() - t3
    meta = dict(getattr(model, "robustest_metadata", {}) or {})
    meta["hardened"] = {"settings": res.settings, "compute": res.compute,
                        "source": str(args.checkpoint or args.model_factory), "dataset": args.dataset}
    save_checkpoint(out / "model.pt", model, metadata=meta)
    cli_settings = {**model_settings(args), **data_settings(args), **settings, "test_split": args.test_split,
                    "test_limit": args.test_limit, "whitebox_limit": args.whitebox_limit,
                    "whitebox_pgd_steps": args.whitebox_pgd_steps, "whitebox_restarts": args.whitebox_restarts,
                    "apgd_steps": args.apgd_steps, "monitor": args.monitor,
                    "device": str(next(iter(model.parameters())).device)}
    results = {
        "data": {"num_train": len(train), "num_test": len(test), "model": spec},
        "before": before, "after": after,
        "epochs": res.epochs, "compute": res.compute, "resumed_epochs": res.resumed_epochs,
        "peak_rss_mib": peak_rss_mib(),
        "files": {"model": "model.pt", "report": "report.html", "state": "state/"},
    }
    timings = {"load_s": t_load, "before_s": t_before, "harden_s": t_harden, "after_s": t_after,
               "total_s": time.perf_counter() - t0}
    doc = write_results(out, "harden", {k: v for k, v in cli_settings.items() if v is not None}, results, timings)
    _report(doc, out / "report.html")
    rows = [{"model": name, "clean": r["clean_accuracy"], "white-box": r["whitebox_accuracy"],
             "pgd": r["whitebox_pgd_accuracy"], "apgd": r["whitebox_apgd_accuracy"]}
            for name, r in (("before", before), ("after", after))]
    print_table(rows, ["model", "clean", "white-box", "pgd", "apgd"])
    c = res.compute
    n_ep = len(res.epochs)
    log.info(f"{res.method}: {n_ep} epoch{'s' if n_ep != 1 else ''} on {len(train)} images, "
             f"{c['passes']:.4g} forward+backward passes ({c['passes'] / len(train):.2f} per image)")
    log.info(f"wrote {out / 'model.pt'}, {out / 'results.json'} and {out / 'report.html'}")
    return 0


def _report(results: dict[str, Any], path: Path) -> None:
    from robustest.report import HtmlReport, save_lines

    s = results["settings"]
    rep = HtmlReport.from_results(results, f"robustest harden: {s['method']} on {s['dataset']}")
    rep.paragraph(f"{s['method']} at eps {s['eps']:g} (L-inf), {s['epochs']} epochs, {s['steps']} attack step(s) of "
                  f"{s['alpha']:.4g}, on {results['data']['num_train']} images of {s['dataset']}; "
                  f"{results['compute']['passes']:.4g} forward+backward passes in all.")
    rep.heading("Robustness before and after")
    rows = [{"model": name, "clean accuracy": r["clean_accuracy"], "white-box accuracy": r["whitebox_accuracy"],
             "PGD accuracy": r["whitebox_pgd_accuracy"], "APGD-CE accuracy": r["whitebox_apgd_accuracy"],
             "test images": r["num_eval"], "white-box images": r["num_whitebox"]}
            for name, r in (("before", results["before"]), ("after", results["after"]))]
    rep.table(rows)
    rep.heading("Epochs")
    cum = 0.0
    erows = []
    for e in results["epochs"]:
        cum += e["compute"]["passes"]
        erows.append({"epoch": e["epoch"], "loss": e["loss"], "adv. accuracy (train)": e["adv_accuracy"],
                      "attack evals / image": e["attack_evals_mean"], "stopped early": e["stopped_early"],
                      "passes": e["compute"]["passes"], "cumulative passes": cum,
                      "fosc c_t": e.get("fosc_c"), "monitor clean": e.get("val_clean_accuracy"),
                      "monitor PGD-10": e.get("val_pgd_accuracy"), "seconds": e["seconds"]})
    rep.table(erows)
    if erows and erows[0]["monitor PGD-10"] is not None:
        xs = [r["cumulative passes"] for r in erows]
        rep.image(save_lines({"PGD-10 accuracy": (xs, [r["monitor PGD-10"] for r in erows]),
                              "clean accuracy": (xs, [r["monitor clean"] for r in erows])}, None,
                             title="monitor images after every epoch", xlabel="forward+backward passes",
                             ylabel="accuracy"), "accuracy on the monitor images against training compute")
    rep.write(path)
