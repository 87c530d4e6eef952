"""``robustest certify``: certified robustness of a model, a guaranteed lower bound beside the attacks' upper
bound (docs/CERTIFY.md).

Methods: ``ibp`` (interval bound propagation) and ``crown`` (linear bounds, tighter) prove, per sample, that no
point of the L-inf (clipped to [0, 1]) or L2 ball of radius --eps changes the model's prediction away from the
label; the model must be built of the layers they support (Linear, Conv2d, ReLU, BatchNorm, pooling, Normalize,
residual adds), anything else is refused with one line before any work. ``smoothing`` (randomised smoothing,
--norm l2 only) certifies the *smoothed* classifier of any model (the majority vote under Gaussian noise of
--sigma): a sample is certified when it predicts the label with a certified L2 radius of at least --eps.

Writes to --out: ``results.json`` (certified and clean accuracy, counts, settings, timings; schema
docs/schemas/certify.schema.json), ``samples.csv`` (one row per sample: label, clean prediction, certified, and
the lower margin bound or the smoothed prediction and radius) and ``report.html``.

Exit status: 0 done, 2 bad input (one line on stderr, before any work), 3 internal error.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from robustest.cli.args import (
    add_data_args,
    add_model_args,
    add_option_args,
    add_run_args,
    options_from_args,
    radius,
)
from robustest.cli.loading import load_checked
from robustest.cli.output import log, out_dir, write_run, written
from robustest.cli.settings import data_settings, model_settings
from robustest.core.errors import ConfigError
from robustest.evaluate.certification import CERTIFY_OPTIONS, run_certify

ORDER = 37
CERTIFY = (run_certify, CERTIFY_OPTIONS)  # the options of the certification, flags included
_SMOOTHING_FLAGS = (("sigma", "--sigma"), ("n0", "--n0"), ("n_samples", "--n-samples"), ("alpha", "--alpha"))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("certify", help="certified robustness (IBP, CROWN, randomised smoothing): a proved lower "
                                       "bound of robust accuracy", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_data_args(p, split="test")
    p.add_argument("--eps", type=radius, required=True, metavar="E",
                   help="radius to certify in pixel scale, e.g. 0.1 or 8/255 (L-inf: in (0, 1]; smoothing: an L2 "
                        "radius)")
    add_option_args(p, CERTIFY, ("norm", "method"))
    g = p.add_argument_group("randomised smoothing (--method smoothing)")
    add_option_args(g, CERTIFY, ("sigma", "n0", "n", "alpha"))
    add_option_args(p, CERTIFY, ("batch_size", "block_size"))
    add_run_args(p)
    p.set_defaults(func=run)


def _check_args(args: argparse.Namespace) -> None:
    """Every check that needs no model or data: one-line ConfigError before any work."""
    from robustest.core.validation import check_eps

    args.eps = float(check_eps("eps", args.eps, args.norm))
    if args.method == "smoothing":
        if args.norm != "l2":
            raise ConfigError("--method smoothing certifies an L2 radius: add --norm l2")
        if args.sigma is None:
            raise ConfigError("--method smoothing needs --sigma, the noise's standard deviation (e.g. 0.25)")
    else:
        given = [flag for key, flag in _SMOOTHING_FLAGS if getattr(args, key) is not None]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise ConfigError(f"{', '.join(given)} {verb} to --method smoothing only")


def run(args: argparse.Namespace) -> int:
    from robustest.core.devices import model_device
    from robustest.evaluate.certify_pipeline import certify_pipeline
    from robustest.evaluate.certify_report import certify_report
    from robustest.models.checkpoints import source_of

    t0 = time.perf_counter()
    _check_args(args)
    if Path(args.out).exists():
        out_dir(args)
    model, ds = load_checked(args)
    t_load = time.perf_counter() - t0
    describe = {"model": {**model_settings(args), "spec": source_of(model)}, "data": data_settings(args)}
    crun = certify_pipeline(model, ds, args.eps, out=args.out, **options_from_args(CERTIFY, args), seed=args.seed,
                            progress=not args.no_progress, describe=describe)
    result, out = crun.result, Path(args.out)
    settings = {**model_settings(args), **data_settings(args), **result.settings, "device": str(model_device(model))}
    write_run(out, "certify", t0, settings, crun.to_results(), {**result.timings, "load_s": t_load},
              lambda doc: certify_report(result, doc, ds))
    log.info(crun.summary_line(args.dataset))
    written(out, crun.files, t0)
    return 0
