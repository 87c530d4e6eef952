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
    add_option_args,
    add_run_args,
    list_arg,
    non_negative_int,
    options_from_args,
    positive_int,
)
from robustest.cli.loading import load_checked, load_data
from robustest.cli.output import log, out_dir, write_run, written
from robustest.cli.settings import data_settings, model_settings
from robustest.core.errors import ConfigError
from robustest.train.recipes import Recipe
from robustest.weakrobust.enhance import ENHANCE_OPTIONS, enhance

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
    add_option_args(p, (enhance, ENHANCE_OPTIONS), ("jsd_weight", "adv_weight", "eps", "adv_steps", "adv_source"))
    add_option_args(p, Recipe, ("lr",), {"lr": 5e-4})
    add_option_args(p, (enhance, ENHANCE_OPTIONS), ("batch_size",))
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
                           **options_from_args((enhance, ENHANCE_OPTIONS), args),
                           recipe=Recipe(**options_from_args(Recipe, args, ("lr",))), progress=not args.no_progress,
                           state_dir=state_folder(out, {k: getattr(args, k) for k in _STATE_KEYS}, weaknesses, model,
                                                  train), resume=True)
    settings = {**model_settings(args), **data_settings(args), **run.settings}
    doc = write_run(out, "enhance", t0, settings, run.to_results(), {"train_s": run.train_seconds},
                    lambda doc: enhance_report(doc, run, args.epochs))
    if (line := run.summary_line()) is not None:
        log.info(line)
    written(out, doc["files"], t0)
    return 0
