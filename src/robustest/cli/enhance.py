"""``robustest enhance``: targeted enhancement of a checkpoint (AugMix + JSD, an adversarial copy, the weaknesses
a validation found).

It writes results.json (the results contract; schema docs/schemas/enhance.schema.json) and report.html to --out;
the description below is what ``--help`` shows.
"""

from __future__ import annotations

import argparse
import time

from robustest.cli.args import (
    add_data_args,
    add_model_args,
    add_run_args,
    learning_rate,
    linf_eps,
    list_arg,
    non_negative_float,
    non_negative_int,
    positive_int,
)
from robustest.cli.loading import load_checked, load_data
from robustest.cli.output import fmt, log, out_dir, write_run, written
from robustest.cli.settings import data_settings, model_settings
from robustest.core.devices import model_device
from robustest.core.errors import ConfigError

ORDER = 62
#: the flags that name an enhancement's state (a rerun with the same ones continues it)
_STATE_KEYS = ("epochs", "no_augmix", "no_adversarial", "jsd_weight", "adv_weight", "eps", "adv_steps", "adv_source",
               "lr", "batch_size", "seed")

ENHANCE_DESCRIPTION = """robustest enhance: targeted enhancement of a checkpoint.

Fine-tunes with AugMix + Jensen-Shannon consistency and an adversarial copy of each batch, the AugMix pool
extended by the weaknesses found by 'robustest validate' (--weaknesses: names, or its results.json). Writes
to --out:
  model.pt      the enhanced checkpoint
  results.json  settings in effect, per-epoch losses, before/after test figures (held-out corruptions,
                white-box attacks), timings
  report.html   the epochs, before/after table and per-perturbation errors, settings and timings
"""



def add_parser(sub: argparse._SubParsersAction) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("enhance", help="targeted enhancement: AugMix + JSD + adversarial copy + weaknesses",
                       description=ENHANCE_DESCRIPTION, formatter_class=raw)
    add_model_args(p)
    add_data_args(p, split=None)
    p.add_argument("--weaknesses", type=list_arg(str, what="weakness"), default=[], metavar="LIST",
                   help="corruption/attack names, or the results.json of 'robustest validate' (its weaknesses), "
                        "comma-separated")
    p.add_argument("--epochs", type=positive_int, required=True, help="training epochs")
    p.add_argument("--no-augmix", action="store_true", help="drop the AugMix + JSD term")
    p.add_argument("--no-adversarial", action="store_true", help="drop the adversarial copy")
    p.add_argument("--jsd-weight", type=non_negative_float, default=6.0, help="weight of the JSD term (default: 6)")
    p.add_argument("--adv-weight", type=non_negative_float, default=0.5, help="weight of CE(x_adv) (default: 0.5)")
    p.add_argument("--eps", type=linf_eps, default=None,
                   help="L-inf radius of the adversarial copy's PGD (default: 0.1 grey, 4/255 colour)")
    p.add_argument("--adv-steps", type=positive_int, default=10, help="PGD steps (default: 10)")
    p.add_argument("--adv-source", choices=("offline", "online"), default="offline",
                   help="PGD against the starting model once (offline) or the current model per batch")
    p.add_argument("--lr", type=learning_rate, default=5e-4, help="learning rate (default: 5e-4)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="batch size (default: 64)")
    p.add_argument("--eval-limit", type=non_negative_int, default=1000, metavar="N",
                   help="test samples for the before/after comparison (0: none; default: 1000)")
    add_run_args(p)
    p.set_defaults(func=run_enhance)


def run_enhance(args: argparse.Namespace) -> int:
    from robustest import weakrobust as wr
    from robustest.weakrobust.enhance_pipeline import enhance_pipeline, read_weaknesses, state_folder
    from robustest.weakrobust.reports import enhance_report

    t0 = time.perf_counter()
    weaknesses = read_weaknesses(args.weaknesses)
    wr.augmentation_pool(weaknesses)  # unknown names fail before any work
    model, train = load_checked(args, "train")
    test = load_data(args, "test") if args.eval_limit > 0 else None
    if args.no_augmix and args.no_adversarial and weaknesses:
        raise ConfigError("--weaknesses extend the AugMix pool: drop --no-augmix")
    out = out_dir(args)  # made once the arguments and data are checked: a refusal leaves nothing behind
    run = enhance_pipeline(model, train, test, weaknesses, out=out, eval_limit=args.eval_limit, seed=args.seed,
                           epochs=args.epochs, augmix=not args.no_augmix, adversarial=not args.no_adversarial,
                           jsd_weight=args.jsd_weight, adv_weight=args.adv_weight, eps=args.eps,
                           adv_steps=args.adv_steps, adv_source=args.adv_source, lr=args.lr,
                           batch_size=args.batch_size, progress=not args.no_progress,
                           state_dir=state_folder(out, {k: getattr(args, k) for k in _STATE_KEYS}, weaknesses, model,
                                                  train), resume=True)
    before, after, res = run.before, run.after, run.result
    settings = {**model_settings(args), **data_settings(args), "weaknesses": weaknesses, "epochs": args.epochs,
                "augmix": not args.no_augmix, "adversarial": not args.no_adversarial}
    if not args.no_augmix:
        settings["jsd_weight"] = args.jsd_weight
    if not args.no_adversarial:
        settings.update(adv_weight=args.adv_weight, eps=res.config.get("eps", args.eps),
                        adv_steps=args.adv_steps, adv_source=args.adv_source)
    settings.update(lr=args.lr, batch_size=args.batch_size, eval_limit=args.eval_limit, seed=args.seed,
                    device=str(model_device(model)))
    settings = {k: v for k, v in settings.items() if v is not None}
    doc = write_run(out, "enhance", t0, settings, run.to_results(), {"train_s": run.train_seconds},
                    lambda doc: enhance_report(doc, run, args.epochs))
    if before and after:
        log.info(f"test accuracy {fmt(before['clean_accuracy'], 'accuracy')} -> "
                 f"{fmt(after['clean_accuracy'], 'accuracy')}; mean adversarial error "
                 f"{fmt(before['mean_adv_error'], 'error')} -> "
                 f"{fmt(after['mean_adv_error'], 'error')}; held-out mCE {fmt(before['mce_held_out'], 'mce')} -> "
                 f"{fmt(after['mce_held_out'], 'mce')}")
    written(out, doc["files"], t0)
    return 0
