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
    add_checkpoint_arg,
    add_data_args,
    add_run_args,
    batch_size_arg,
    finite_float,
    name_list,
    non_negative_float,
    positive_int,
    radius,
)
from robustest.cli.loading import check_fits, load_data, load_model, resolve_batch_size
from robustest.cli.output import fmt, log, out_dir, write_run, written
from robustest.cli.settings import data_settings, model_settings
from robustest.core.devices import model_device
from robustest.core.errors import ConfigError
from robustest.core.validation import check_eps
from robustest.metrics.scoring import AMP_METRICS
from robustest.selection.score_pipeline import ScoreInputs, inputs_of_tests
from robustest.selection.score_reports import score_report

ORDER = 30


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="score inputs with a test metric (FOL, ZOL, DeepGini, coverage, SA, ...)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_arg(p)
    add_data_args(p, split="test")
    p.add_argument("--metric", required=True, choices=metrics.names(), help="metric to compute")
    p.add_argument("--batch-size", type=batch_size_arg, default=256, metavar="B",
                   help="batch size, or 'auto': the largest that fits the GPU (the default 256 on the CPU)")
    p.add_argument("--amp", choices=("bf16", "fp16"), default=None,
                   help="run the forward passes of zol, gini, entropy, margin and max_prob in bf16 (CPU or CUDA) "
                        "or fp16 (CUDA) autocast: faster on GPUs, scores rounded accordingly (default: float32; "
                        "the other metrics refuse it)")
    g = p.add_argument_group("loss metrics (fol, zol, fol_gradnorm)")
    g.add_argument("--eps", type=radius, default=0.3,
                   help="FOL ball radius in pixel scale, a number or a fraction like 8/255 (L-inf: in (0, 1]; "
                        "default: 0.3)")
    g.add_argument("--norm", choices=("linf", "l2", "l1"), default="linf",
                   help="FOL perturbation norm; the gradient is measured in its dual (default: linf)")
    g.add_argument("--label", choices=("true", "pred"), default="true",
                   help="labels for the loss: the data's ('true') or the model's prediction on the seed ('pred')")
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
    c.add_argument("--k", type=positive_int, default=None, help="kmnc sections per neuron (default: 10)")
    c.add_argument("--threshold", type=finite_float, default=None, help="nc activation threshold (default: 0.5)")
    c.add_argument("--top-k", type=positive_int, default=None, help="tknc neurons per layer (default: 1)")
    c.add_argument("--scale", type=non_negative_float, default=None,
                   help="nbc/snac margin in training std (default: 0)")
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


def _metric_options(args: argparse.Namespace) -> dict[str, Any]:
    """The flags of the options the metric takes (its registry entry's), those given."""
    return {o: getattr(args, o) for o in metrics.info(args.metric).options if getattr(args, o) is not None}


def _check_options(args: argparse.Namespace) -> None:
    """Refuse options that the chosen metric would silently ignore."""
    m = args.metric
    kind = metrics.info(m).kind
    given = {
        **{f"--{o.replace('_', '-')}": getattr(args, o) is not None and o not in metrics.info(m).options
           for o in ("k", "threshold", "top_k", "scale")},
        "--layers": args.layers is not None and kind not in ("coverage", "surprise"),
        "--train-dataset": args.train_dataset is not None and kind not in ("coverage", "surprise"),
    }
    bad = [k for k, v in given.items() if v]
    if bad:
        raise ConfigError(f"{', '.join(bad)} does not apply to --metric {m}: drop it")
    check_eps("eps", args.eps, args.norm)
    if args.amp is not None and m not in AMP_METRICS:
        why = "input gradients" if kind == "loss" else "layer activations compared with a float32 reference"
        raise ConfigError(f"--amp applies to {', '.join(AMP_METRICS)} (computed from the logits alone); --metric {m} "
                          f"needs {why} in float32: drop --amp")
    for opt, needs, given_ in (("--seeds-data-dir", "--seeds-dataset", args.seeds_data_dir and not args.seeds_dataset),
                               ("--seeds-split", "--seeds-dataset", args.seeds_split and not args.seeds_dataset),
                               ("--train-data-dir", "--train-dataset", args.train_data_dir and not args.train_dataset),
                               ("--train-limit", "a coverage or surprise metric",
                                args.train_limit is not None and kind not in ("coverage", "surprise"))):
        if given_:
            raise ConfigError(f"{opt} applies with {needs}: drop it or name that too")


# ---------------------------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    from robustest.core.amp import check_amp
    from robustest.selection.score_pipeline import score_pipeline

    _check_options(args)
    t0 = time.perf_counter()
    model = load_model(args)
    inputs = _load_inputs(args)
    check_fits(model, inputs.data)
    train = _load_train(args) if metrics.info(args.metric).needs_train else None
    check_amp(args.amp, model_device(model))
    # input gradients (fol, fol_gradnorm) and kept activations (coverage, surprise) hold about what a backward
    # pass holds: they are probed with one
    resolve_batch_size(args, model, inputs.data, default=256, amp=args.amp, grad=args.metric not in AMP_METRICS)
    out = out_dir(args)  # made once the inputs are known to fit: a refusal leaves nothing behind
    srun = score_pipeline(model, inputs, args.metric, out=out, train=train, layers=args.layers or None,
                          batch_size=args.batch_size, amp=args.amp, progress=not args.no_progress,
                          options=_metric_options(args), model_source=str(args.checkpoint or args.model_factory
                                                                          or args.weights),
                          load_s=time.perf_counter() - t0)
    s, n = srun.figures, len(srun.result.scores)
    doc = write_run(out, "score", t0, _settings(args, model_device(model), srun.result.options),
                    srun.to_results(), srun.timings, lambda doc: score_report(doc, srun.result.scores))
    log.info(f"{args.metric} on {n} inputs from {inputs.source}: mean {fmt(s.get('mean'))}, "
             f"median {fmt(s.get('quantiles', {}).get('q50'))}, min {fmt(s.get('min'))}, max {fmt(s.get('max'))} "
             f"({fmt(srun.timings['score_s'], 'score_s')} s)")
    if "set_coverage" in s:
        log.info(f"set coverage: {fmt(s['set_coverage'], 'coverage')} of {s['num_cells']} cells")
    if srun.own_seed:
        log.warning("each test was scored as its own seed (x0 = x'); pass --seeds-dataset to use the seeds")
    written(out, doc["files"], t0)
    return 0


def _settings(args: argparse.Namespace, device: Any, opts: dict[str, Any]) -> dict[str, Any]:
    """The options in effect for this metric (options of other metrics left out; ``opts``: the metric's options
    as the library resolved them)."""
    kind = metrics.info(args.metric).kind
    d: dict[str, Any] = {**model_settings(args), **data_settings(args), "metric": args.metric,
                         "batch_size": args.batch_size}
    if getattr(args, "batch_size_auto", False):
        d["batch_size_auto"] = True
    if args.amp is not None:
        d["amp"] = args.amp
    if args.metric in ("fol", "zol", "fol_gradnorm"):
        if args.metric == "fol":
            d.update(eps=args.eps, norm=args.norm)
        d["label"] = args.label
    if _is_tests(args.dataset):
        d.pop("split", None)  # a tests file has no splits
        d.update({k: v for k, v in (("seeds_dataset", args.seeds_dataset), ("seeds_data_dir", args.seeds_data_dir),
                                    ("seeds_split", args.seeds_split)) if v is not None})
    if kind in ("coverage", "surprise"):
        d.update({k: v for k, v in (("train_dataset", args.train_dataset), ("train_data_dir", args.train_data_dir),
                                    ("train_limit", args.train_limit), ("layers", args.layers)) if v is not None})
        d.update(opts)
    d["device"] = str(device)
    return d


