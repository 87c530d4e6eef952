"""``robustest score``: score every input of a data set (or of a tests file) with one test metric.

Metrics: zol, fol, fol_gradnorm (loss; need labels), gini, entropy, margin, max_prob (uncertainty),
nc, kmnc, nbc, snac, tknc (neuron coverage) and lsa, dsa (surprise adequacy). Coverage and surprise
metrics build their reference from training data: the train split of --dataset, or --train-dataset.

Writes to --out:
  results.json    settings in effect, count, mean, std, min, max, quantiles, timings (and set coverage for
                  coverage metrics); schema: docs/schemas/score.schema.json
  report.html     summary, quantiles, histogram, settings and timings
  scores.pt       dict of plain tensors (loads with torch.load(weights_only=True)): "scores" [N] float32,
                  "index" [N] (position in the scored set), "labels" [N] (when known), "x0_index" [N]
                  (tests files), "bits" BoolTensor[N, cells] (coverage metrics; input of
                  'robustest select --strategy coverage'), plus "metric" and "options"
  scores.csv      index,score[,label][,x0_index]
  summary.json    the figures of results.json without its header (kept for older scripts)
  scores_hist.png histogram of the scores

Tests files (--dataset tests --data-dir tests.pt from 'robustest generate'): FOL measures each test x'
against its seed x0 = SEEDS[x0_index], where SEEDS is --seeds-dataset/--seeds-data-dir/--seeds-split (the
data set the tests were generated from). Without --seeds-dataset each test is its own seed (x0 = x'),
i.e. FOL = eps * ||g||_q. --seeds-split defaults to the split the tests file records ('robustest generate'
records it); a tests file that records its source data set refuses a different --seeds-dataset.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from robustest import data as datasets
from robustest import metrics
from robustest.cli.args import (
    add_data_args,
    add_model_args,
    add_option_args,
    add_run_args,
    batch_size_arg,
    name_list,
    options_from_args,
    positive_int,
)
from robustest.cli.loading import check_fits, load_data, load_model, resolve_batch_size
from robustest.cli.output import log, out_dir, write_run, written
from robustest.cli.settings import data_settings, model_settings, pick
from robustest.core.devices import model_device
from robustest.core.errors import ConfigError
from robustest.metrics.scoring import AMP_METRICS
from robustest.selection.score_pipeline import ScoreInputs, ScoreOptions, inputs_of_tests
from robustest.selection.score_reports import score_report

ORDER = 30


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="score inputs with a test metric (FOL, ZOL, DeepGini, coverage, SA, ...)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_data_args(p, split="test")
    p.add_argument("--metric", required=True, choices=metrics.names(), help="metric to compute")
    p.add_argument("--batch-size", type=batch_size_arg, default=256, metavar="B",
                   help="batch size, or 'auto': the largest that fits the GPU (the default 256 on the CPU)")
    add_option_args(p, ScoreOptions, ("amp",))
    g = p.add_argument_group("loss metrics (fol, zol, fol_gradnorm)")
    add_option_args(g, ScoreOptions, ("eps", "norm", "label"))
    g.add_argument("--seeds-dataset", metavar="NAME", default=None,
                   help="tests files: data set the tests were generated from (x0 = its images at x0_index)")
    g.add_argument("--seeds-data-dir", metavar="DIR", default=None, help="folder or file of --seeds-dataset")
    g.add_argument("--seeds-split", choices=datasets.SPLITS, default=None,
                   help="split of --seeds-dataset (default: the split recorded in the tests file)")
    c = p.add_argument_group("coverage and surprise metrics")
    c.add_argument("--train-dataset", metavar="NAME", default=None,
                   help="training data for the profile (default: --dataset, or --seeds-dataset for tests files)")
    c.add_argument("--train-data-dir", metavar="DIR", default=None, help="folder or file of --train-dataset")
    c.add_argument("--train-limit", type=positive_int, default=None, metavar="N",
                   help="use only the first N training images for the profile")
    c.add_argument("--layers", type=name_list("layer"), default=None, metavar="A,B",
                   help="comma-separated module names to trace (default: every activation module; SA: the last)")
    add_option_args(c, ScoreOptions, ("k", "threshold", "top_k", "scale"))
    add_run_args(p)
    p.set_defaults(func=run)


# --------------------------------------------------------------------------------------------- inputs
def _is_tests(name: str) -> bool:
    return name.strip().lower() == "tests"


def _load_inputs(args: argparse.Namespace) -> ScoreInputs:
    """The data set to score (streamed), or the tests file with its seeds."""
    if not _is_tests(args.dataset):
        return ScoreInputs(load_data(args), f"{args.dataset}:{args.split}")
    if args.data_dir is None:
        raise ConfigError("--dataset tests needs --data-dir pointing to the tests.pt file")
    return inputs_of_tests(args.data_dir, limit=args.limit, seeds_dataset=args.seeds_dataset,
                        seeds_root=args.seeds_data_dir, seeds_split=args.seeds_split)


def _load_train(args: argparse.Namespace) -> Any:
    """The training data coverage/SA build their reference from (streamed; --train-limit read first)."""
    if args.train_dataset is not None:
        name, root = args.train_dataset, args.train_data_dir
    elif not _is_tests(args.dataset):
        name, root = args.dataset, args.data_dir
    elif args.seeds_dataset is not None:
        name, root = args.seeds_dataset, args.seeds_data_dir
    else:
        raise ConfigError(f"--metric {args.metric} on a tests file needs training data: pass --train-dataset "
                          "(and --train-data-dir)")
    return datasets.load(name, root=root, split="train", limit=args.train_limit,
                         workers=getattr(args, "workers", 0) or 0)


def _check_options(args: argparse.Namespace, options: ScoreOptions) -> None:
    """Refuse options that the chosen metric would silently ignore."""
    options.check(args.metric)
    wide = metrics.info(args.metric).kind in ("coverage", "surprise")
    bad = [f for f, v in (("--layers", args.layers), ("--train-dataset", args.train_dataset)) if v is not None]
    if bad and not wide:
        raise ConfigError(f"{', '.join(bad)} does not apply to --metric {args.metric}: drop it")
    for opt, needs, given_ in (("--seeds-data-dir", "--seeds-dataset", args.seeds_data_dir and not args.seeds_dataset),
                               ("--seeds-split", "--seeds-dataset", args.seeds_split and not args.seeds_dataset),
                               ("--train-data-dir", "--train-dataset", args.train_data_dir and not args.train_dataset),
                               ("--train-limit", "a coverage or surprise metric",
                                args.train_limit is not None and not wide)):
        if given_:
            raise ConfigError(f"{opt} applies with {needs}: drop it or name that too")


# ---------------------------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    from robustest.core.amp import check_amp
    from robustest.selection.score_pipeline import score_pipeline

    options = ScoreOptions(**options_from_args(ScoreOptions, args))
    _check_options(args, options)
    t0 = time.perf_counter()
    model = load_model(args)
    inputs = _load_inputs(args)
    check_fits(model, inputs.data)
    train = _load_train(args) if metrics.info(args.metric).needs_train else None
    check_amp(args.amp, model_device(model))
    # input gradients (fol, fol_gradnorm) and kept activations (coverage, surprise) hold about what a backward pass
    # holds: they are probed with one
    resolve_batch_size(args, model, inputs.data, default=256, amp=args.amp, grad=args.metric not in AMP_METRICS)
    out = out_dir(args)  # made once the inputs are known to fit: a refusal leaves nothing behind
    srun = score_pipeline(model, inputs, args.metric, out=out, train=train, layers=args.layers or None,
                          batch_size=args.batch_size, amp=args.amp, progress=not args.no_progress,
                          options=options.of_metric(args.metric), load_s=time.perf_counter() - t0,
                          model_source=str(args.checkpoint or args.model_factory or args.weights))
    doc = write_run(out, "score", t0, _settings(args, options, model_device(model), srun.result.options),
                    srun.to_results(), srun.timings, lambda doc: score_report(doc, srun.result.scores))
    for line in srun.summary_lines():
        log.info(line)
    if srun.own_seed:
        log.warning("each test was scored as its own seed (x0 = x'); pass --seeds-dataset to use the seeds")
    written(out, doc["files"], t0)
    return 0


def _settings(args: argparse.Namespace, options: ScoreOptions, device: Any, opts: dict[str, Any]) -> dict[str, Any]:
    """The options in effect for this metric (options of other metrics left out; ``opts``: the metric's options
    as the library resolved them)."""
    d: dict[str, Any] = {**model_settings(args), **data_settings(args), "metric": args.metric,
                         "batch_size": args.batch_size, **({"batch_size_auto": True} if args.batch_size_auto else {}),
                         **options.settings(args.metric)}
    if _is_tests(args.dataset):
        d.pop("split", None)  # a tests file has no splits
        d.update(pick(args, ("seeds_dataset", "seeds_data_dir", "seeds_split")))
    if metrics.info(args.metric).kind in ("coverage", "surprise"):
        d.update({**pick(args, ("train_dataset", "train_data_dir", "train_limit", "layers")), **opts})
    d["device"] = str(device)
    return d
