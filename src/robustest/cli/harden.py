"""``robustest harden``: adversarial or certified training (docs/HARDEN.md) of a checkpoint (fine-tuning) or of a
model built with random weights (--model NAME --from-scratch), robustness measured before and after on the test split.

The default recipe trains stably (docs/HARDEN.md has the sweeps): the radius grows linearly from 0 over the first
30 % of the steps (--eps-warmup), Adam at a constant 1e-3, and robust early stopping: --val-size training
images (class-stratified, seeded) are held out, PGD-10 accuracy on them is measured after every epoch, and the
model of the best epoch is kept (--keep best). Single-step methods: APGD-CE, stopping at catastrophic overfitting.

Writes OUT/model.pt (the kept model, a safe checkpoint), OUT/last.pt (the last epoch's, when another epoch was
kept), OUT/results.json (settings in effect, per-epoch history with the validation curve and compute, clean,
white-box and, with --autoattack, AutoAttack accuracy before and after, timings), OUT/report.html and OUT/state/
(the state after every epoch, written atomically); ``--resume`` continues an interrupted run and ends with the
same model as an uninterrupted one.

White-box accuracy: the per-sample worst case of PGD (--whitebox-pgd-steps steps of eps/4 from a random start,
best of --whitebox-restarts) and APGD-CE (--apgd-steps) on the first --whitebox-limit test images. Certified
accuracy (--certify; default with ibp and crown-ibp): the share of the test images IBP or CROWN proves robust.

Examples:
    robustest harden --checkpoint model.pt --dataset digits --method fol-budget --eps 0.2 --epochs 5 --out hard
    robustest harden --model mnist_small --from-scratch --dataset mnist --data-dir mnist.npz --eps 0.3 \\
        --epochs 10 --autoattack fast --out mnist-at
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from robustest.cli.args import (
    _option_types,
    add_data_args,
    add_model_args,
    add_option_args,
    add_run_args,
    below_one,
    finite_float,
    list_arg,
    non_negative_int,
    options_from_args,
    positive_int,
)
from robustest.cli.loading import build_zoo_model, check_fits, load_data, load_model
from robustest.cli.output import log, out_dir, print_table, write_run, written
from robustest.cli.settings import data_settings, model_settings, option_settings
from robustest.core.errors import ConfigError
from robustest.train.recipes import Recipe

ORDER = 35
# arguments that do not change what a run computes (left out of the resume check)
_RUNTIME_ARGS = ("func", "resume", "no_progress", "device", "out", "debug", "verb")

#: the Recipe fields harden offers as flags, in the help's order
RECIPE_FLAGS = ("optimizer", "lr", "weight_decay", "momentum", "nesterov", "schedule", "warmup_epochs", "milestones")
_float = finite_float  # ranges are checked by robustest.train.harden_settings, with the method in view


def add_parser(sub: argparse._SubParsersAction) -> None:
    from robustest import data as datasets
    from robustest.train import objectives
    from robustest.train.early_stopping import KEEP, VAL_ATTACKS
    from robustest.train.harden_pipeline import Measurement
    from robustest.train.hardening import DEFAULT_STEPS, EPS_WARMUP

    p = sub.add_parser("harden", help="adversarial or certified training, fine-tuning or from scratch (PGD-AT, "
                                      "TRADES, N-FGSM, IBP, ...)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, zoo=True)
    add_data_args(p, split="train")
    g = p.add_argument_group("method")
    methods = [objectives.get(name) for name in objectives.names()]
    g.add_argument("--method", choices=objectives.names(), default="pgd-at",
                   help="hardening method (default: pgd-at)")
    g.add_argument("--eps", type=_float, required=True, help="L-inf radius in pixel scale, in (0, 1]")
    g.add_argument("--eps-train", type=_float, default=None, help="L-inf radius the training attack (ibp / crown-ibp: "
                   "the bounds) works at; above --eps it trains for a margin (MNIST at 0.3: 0.4) (default: --eps)")
    fixed = "".join(f"; {o.name}: {o.fixed_steps}" for o in methods if o.fixed_steps is not None)
    g.add_argument("--steps", type=positive_int, default=None,
                   help=f"attack steps of the inner maximisation (default: {DEFAULT_STEPS}{fixed})")
    alphas = "".join(f"; {o.name}: {o.alpha_doc}" for o in methods if o.alpha_doc != "2.5 * eps / steps")
    g.add_argument("--alpha", type=_float, default=None,
                   help=f"attack step size (default: 2.5 * eps / steps{alphas})")
    _add_method_options(g)
    guarded = " / ".join(o.name for o in methods if o.co_guard is not None)
    g.add_argument("--no-co-guard", dest="co_guard", action="store_const", const=False, default=None,
                   help=f"{guarded}: train on when the catastrophic-overfitting guard fires in an epoch at the full "
                        "radius (collapsed, masked, overstated; default: stop there and keep the best epoch)")
    g.add_argument("--eps-warmup", type=below_one, default=EPS_WARMUP, metavar="FRACTION",
                   help="the training radius grows linearly from 0 to --eps-train over this fraction of the training "
                        f"steps; 0 trains at --eps-train from the first step (default: {EPS_WARMUP})")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=positive_int, default=5, help="training epochs (default: 5)")
    t.add_argument("--batch-size", type=positive_int, default=128, help="batch size (default: 128)")
    given = {"optimizer", "lr", "weight_decay", "warmup_epochs"}  # the flags a run records even when left out
    add_option_args(t, Recipe, RECIPE_FLAGS,
                    {**{k: v for k, v in asdict(Recipe()).items() if k in given}, "schedule": "none"}, unset=True,
                    shown={"nesterov": "off"})
    v = p.add_argument_group("validation and robust early stopping")
    v.add_argument("--val-size", type=non_negative_int, default=None, metavar="N",
                   help="hold out N training images (class-stratified, drawn with --seed) on which clean and "
                        "robust accuracy are measured after every epoch; at most a tenth of the training data; 0: none "
                        "(default: 1000, or a tenth of the training images when they are fewer than 10,000)")
    v.add_argument("--val-attack", choices=VAL_ATTACKS, help="the validation's attack: PGD (step eps/4, random "
                   "start) or APGD-CE, which sees masked gradients too (default: apgd-ce for single-step methods, "
                   "else pgd)")
    v.add_argument("--val-steps", type=positive_int, default=10, help="steps of the validation attack (default: 10)")
    v.add_argument("--keep", choices=KEEP, default="best",
                   help="the model written to model.pt: the epoch of the best validation robust accuracy (robust "
                        "early stopping) or the last epoch; best needs --val-size > 0 (default: best)")
    m = p.add_argument_group("measurement")
    m.add_argument("--test-split", choices=datasets.SPLITS, default="test",
                   help="split measured before and after (default: test)")
    m.add_argument("--test-limit", type=positive_int, default=1000, metavar="N",
                   help="clean accuracy on the first N test images (default: 1000)")
    add_option_args(m, Measurement)
    certified = " / ".join(o.name for o in methods if o.certificates)
    m.add_argument("--certify", type=list_arg(_certificate, what="certificate"), default=None, metavar="LIST",
                   help="certified accuracy at --eps on the test images, before and after, by bound propagation: "
                        f"ibp, crown or ibp,crown; none: off (default: ibp,crown with --method {certified}, else off)")
    p.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    add_run_args(p)
    p.set_defaults(func=run)


def _add_method_options(g: argparse._ArgumentGroup) -> None:
    """One flag per method option of the registered objectives: ``--name-with-dashes VALUE`` read as its kind says,
    or ``--no-name`` for a switch, None when left out; the help names the methods that take it and the default."""
    from robustest.train import objectives

    types = _option_types()
    for name, (owners, opt) in objectives.option_owners().items():
        who, text = " / ".join(owners), opt.help.replace("%", "%%")
        flag = opt.flag_name
        if opt.kind == "switch":
            g.add_argument(f"--no-{flag}", dest=name, action="store_const", const=False, default=None,
                           help=f"{who}: {text}")
        else:
            default = "" if opt.default is None else f" (default: {opt.default})"
            g.add_argument(f"--{flag}", type=types[opt.kind], default=None, help=f"{who}: {text}{default}")


def _fingerprint_args(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in sorted(vars(args).items()) if k not in _RUNTIME_ARGS}


def _certificate(text: str) -> str:
    name = str(text).strip().lower()
    if name not in ("ibp", "crown", "none"):
        raise argparse.ArgumentTypeError(f"unknown certificate {text!r}: choose ibp, crown or none")
    return name


def _method_kwargs(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(method parameters, common settings) of :func:`robustest.train.harden` from the flags."""
    from robustest.train import objectives

    method_kw = {name: getattr(args, name) for name in objectives.option_owners()}
    method_kw["co_guard"] = args.co_guard
    common = {"eps": args.eps, "epochs": args.epochs, "batch_size": args.batch_size,
              "recipe": Recipe(**{k: v for k, v in options_from_args(Recipe, args, RECIPE_FLAGS).items()
                                  if v is not None}),
              "eps_warmup": args.eps_warmup, "eps_train": args.eps_train, "steps": args.steps, "alpha": args.alpha,
              "keep": args.keep, "val_attack": args.val_attack, "seed": args.seed}
    return method_kw, common


def run(args: argparse.Namespace) -> int:
    from robustest.train import hardening
    from robustest.train.early_stopping import validation_split
    from robustest.train.harden_pipeline import Measurement, certificates_for, claim_run_dir, harden_pipeline
    from robustest.train.harden_report import harden_report

    t0 = time.perf_counter()
    method_kw, common = _method_kwargs(args)
    settings = hardening.harden_settings(args.method, **common, **method_kw)  # bad values: one line, no work
    if args.keep == "best" and args.val_size == 0:
        raise ConfigError("--keep best picks the epoch by validation PGD accuracy: give --val-size N > 0 or "
                          "--keep last")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        out_dir(args)
    train = load_data(args)
    model = build_zoo_model(args, train) if args.model_factory and ":" not in args.model_factory else load_model(args)
    hardening.check_trainable(model)
    check_fits(model, train)
    test = load_data(argparse.Namespace(**{**vars(args), "limit": args.test_limit}), args.test_split)
    check_fits(model, test)
    args.certify = certificates_for(args.method, args.certify, model, test)
    fit_data, val, args.val_size = validation_split(train, args.val_size, args.keep, args.seed)
    out = claim_run_dir(out_dir(args), json.loads(json.dumps(_fingerprint_args(args), default=str)), args.resume)
    t_load = time.perf_counter() - t0

    measurement = Measurement(eps=args.eps, seed=args.seed, certify=tuple(args.certify) if args.certify else None,
                              **options_from_args(Measurement, args))
    hrun = harden_pipeline(model, fit_data, test, args.method, out=out, measurement=measurement,
                           options={**common, **method_kw, "val_steps": args.val_steps}, val=val, resume=args.resume,
                           device=args.device, progress=not args.no_progress,
                           metadata={"source": str(args.checkpoint or args.model_factory or args.weights),
                                     "dataset": args.dataset, "from_scratch": bool(args.random_init)})
    cli_settings = {**model_settings(args), **data_settings(args), **settings, "from_scratch": bool(args.random_init),
                    "val_size": args.val_size, "val_steps": args.val_steps, "test_split": args.test_split,
                    "test_limit": args.test_limit, **option_settings(Measurement, args), "certify": args.certify,
                    "device": str(next(iter(model.parameters())).device)}
    doc = write_run(out, "harden", t0, {k: v for k, v in cli_settings.items() if v is not None},
                    hrun.to_results(), {"load_s": t_load, **hrun.timings}, harden_report)
    rows = hrun.summary_rows()
    print_table(rows, [c for c in rows[0] if c == "model" or rows[0][c] is not None])
    for f in hrun.after.get("autoattack_flags") or []:
        print(f"robustest harden: flag {f['severity']} {f['name']}: {f['message']} (remedy: {f['remedy']})",
              file=sys.stderr)
    log.info(hrun.summary_line())
    written(out, doc["files"], t0)
    return 0
