"""Coverage and surprise adequacy: robustest vs dnn-tip 0.1.1 on the same activation arrays.

MNIST LeNet-5 trained for one epoch in this script; the coverage profile and the surprise-adequacy reference
come from the first ``--train`` training images, the scores are computed for the ``--test`` test images.
Both libraries get the same per-channel-reduced activation traces (and, for coverage, the same profile
statistics); the script checks that the results agree, times each metric and prints the ratios and a
markdown table. Not run by pytest.

    python benchmarks/bench_coverage.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--train", type=int, default=10000, help="training images for the profile / SA reference")
    ap.add_argument("--test", type=int, default=10000, help="test images scored")
    ap.add_argument("--sa-train", type=int, default=5000, help="training images for the SA reference")
    ap.add_argument("--dsa-test", type=int, default=1000,
                    help="test images for the DSA comparison (dnn-tip's DSA needs minutes per thousand)")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs for the fast metrics")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: the same single core NumPy uses; more oversubscribe shared cores)")
    ap.add_argument("--checkpoint", default=None,
                    help="reuse this LeNet-5 checkpoint if it exists, else train one epoch and save it here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from robustest import data, models
    from robustest.evaluate import accuracy
    from robustest.models.checkpoints import load_checkpoint, save_checkpoint
    from robustest.train import fit

    torch.manual_seed(args.seed)
    train = data.load("mnist", root=args.data_dir, split="train")
    test = data.load("mnist", root=args.data_dir, split="test")
    if args.checkpoint and os.path.exists(args.checkpoint):
        model = load_checkpoint(args.checkpoint)
        print(f"loaded {args.checkpoint}")
    else:
        model = models.create("lenet5")
        t0 = time.perf_counter()
        fit(model, train, epochs=1, batch_size=128, seed=args.seed, progress=False)
        print(f"trained LeNet-5 1 epoch in {time.perf_counter() - t0:.1f}s")
        if args.checkpoint:
            save_checkpoint(args.checkpoint, model)
    print(f"LeNet-5 test accuracy {accuracy(model, test):.4f}; torch threads {torch.get_num_threads()}")
    xtr = train.tensors[0][: args.train]
    xte = test.tensors[0][: args.test]

    compare(model, xtr, xte, sa_train=args.sa_train, dsa_test=args.dsa_test, repeat=args.repeat)


def compare(model: torch.nn.Module, xtr: torch.Tensor, xte: torch.Tensor, *, sa_train: int = 5000,
            dsa_test: int = 1000, repeat: int = 3) -> list[tuple[str, float, float, str]]:
    """Time every coverage metric, LSA and DSA, robustest against dnn-tip on the same activations of ``xte``
    (profile from ``xtr``, SA reference from its first ``sa_train`` images); check that they agree; print
    the lines and a markdown table and return the rows (label, ours s, dnn-tip s, agreement)."""
    import dnn_tip.neuron_coverage as tip_nc
    import dnn_tip.surprise as tip_sa

    from robustest.metrics.coverage import CoverageProfile
    from robustest.metrics.surprise import SurpriseAdequacy

    rows: list[tuple[str, float, float, str]] = []

    # ------------------------------------------------------------------------------------------ coverage
    t_build, prof = timed(lambda: CoverageProfile.build(model, xtr, batch_size=500), 1)
    t_acts, acts = timed(lambda: prof.activations(xte, batch_size=500), 1)
    print(f"profile of {prof.num_neurons} neurons ({prof.sizes}) from {len(xtr)} images in {t_build:.2f}s "
          f"(one streaming pass, forward included); traces of {len(xte)} test images in {t_acts:.2f}s")
    a = acts.numpy()
    layers, s = [], 0
    for n in prof.sizes:
        layers.append(a[:, s:s + n])
        s += n
    mins, maxs, stds = [prof.min.numpy()], [prof.max.numpy()], [prof.std.numpy()]
    cases = [
        ("NC t=0.5", "nc", {"threshold": 0.5}, tip_nc.NAC(0.5)),
        ("KMNC k=10", "kmnc", {"k": 10}, tip_nc.KMNC(mins, maxs, 10)),
        ("KMNC k=100", "kmnc", {"k": 100}, tip_nc.KMNC(mins, maxs, 100)),
        ("NBC s=0.5", "nbc", {"scale": 0.5}, tip_nc.NBC(mins, maxs, stds, 0.5)),
        ("SNAC s=0", "snac", {"scale": 0.0}, tip_nc.SNAC(maxs, stds, 0.0)),
        ("TKNC k=1", "tknc", {"top_k": 1}, tip_nc.TKNC(1)),
    ]
    for label, metric, opts, ref in cases:
        def ours(metric: str = metric, opts: dict[str, Any] = opts) -> tuple[torch.Tensor, torch.Tensor]:
            return (prof.bits_from_activations(acts, metric, **opts),
                    prof.per_input_from_activations(acts, metric, **opts))

        t_ours, (bits, per) = timed(ours, repeat)
        t_ref, (scores, profiles) = timed(lambda ref=ref: ref(layers), repeat)
        same = np.array_equal(bits.numpy(), profiles.reshape(len(a), -1))
        same_scores = np.array_equal(np.rint(per.double().numpy() * bits.shape[1]).astype(np.int64),
                                     scores.astype(np.int64))
        t_per, _ = timed(lambda metric=metric, opts=opts: prof.per_input_from_activations(acts, metric, **opts),
                         repeat)
        t_set, cov = timed(lambda metric=metric, opts=opts: prof.set_coverage_from_activations(acts, metric, **opts),
                           repeat)
        agree = "identical bits and scores" if same and same_scores else "DIFFERENT"
        print(f"{label:12s} ours {t_ours * 1e3:8.1f} ms  dnn-tip {t_ref * 1e3:8.1f} ms  "
              f"ratio {t_ref / t_ours:6.1f}x  per-input only {t_per * 1e3:.1f} ms  "
              f"set coverage {cov:.4f} ({t_set * 1e3:.1f} ms)  {agree}")
        rows.append((label, t_ours, t_ref, agree + f"; ours per-input scores alone {t_per * 1e3:.1f} ms, "
                     f"set coverage alone {t_set * 1e3:.1f} ms"))

    # ------------------------------------------------------------------------------------ surprise adequacy
    xsa = xtr[: sa_train]
    t_sa, sa = timed(lambda: SurpriseAdequacy.build(model, xsa, batch_size=500), 1)
    sacts, spred = sa.activations(xte, batch_size=500)
    print(f"SA reference: layer {sa.layers} ({sum(sa.sizes)} neurons), {len(xsa)} traces in {t_sa:.2f}s")
    tr_a, tr_p = sa.train_acts.numpy(), sa.train_pred.numpy()
    te_a, te_p = sacts.numpy(), spred.numpy()

    t_ours, lsa = timed(lambda: (setattr(sa, "_kde", None), sa.lsa_from_activations(sacts, spred))[1], 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(divide="ignore"):
            t_ref, ref_lsa = timed(lambda: tip_sa.MultiModalSA.build_by_class(
                tr_a, tr_p, lambda x, y: tip_sa.LSA(x, var_threshold=1e-5, max_features=None))(te_a, te_p), 1)
    fin = np.isfinite(ref_lsa)
    same = np.array_equal(lsa.numpy()[fin], ref_lsa[fin])
    agree = (f"identical on {fin.sum()} finite values" if same else "DIFFERENT") + (
        f"; dnn-tip inf on {(~fin).sum()}, ours finite" if (~fin).any() else "")
    print(f"{'LSA':12s} ours {t_ours:8.2f} s   dnn-tip {t_ref:8.2f} s   ratio {t_ref / t_ours:6.1f}x  {agree}")
    rows.append(("LSA (fit + score)", t_ours, t_ref, agree))

    t_all, _ = timed(lambda: sa.dsa_from_activations(sacts, spred), 1)
    print(f"DSA (ours) of all {len(xte)} test traces in {t_all:.2f}s")
    nd = min(dsa_test, len(xte))
    dacts, dpred = sacts[:nd], spred[:nd]
    t_ours, dsa = timed(lambda: sa.dsa_from_activations(dacts, dpred), 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_ref, ref_dsa = timed(lambda: tip_sa.DSA(tr_a, tr_p)(te_a[:nd], te_p[:nd]), 1)
    rel32 = float(np.max(np.abs(dsa.numpy() / ref_dsa - 1)))
    agree = f"max rel. diff {rel32:.1e} (dnn-tip computes in float32, ours in float64)"
    print(f"{'DSA':12s} ({nd} test) ours {t_ours:8.2f} s   dnn-tip {t_ref:8.2f} s   "
          f"ratio {t_ref / t_ours:6.1f}x  {agree}")
    rows.append((f"DSA (first {nd} test traces; ours on all {len(xte)}: {t_all:.2f} s)", t_ours, t_ref, agree))

    print(f"\n| metric ({len(xte)} test traces; profile from {len(xtr)}, SA reference from {len(xsa)} train images) "
          "| robustest | dnn-tip 0.1.1 | speed-up | agreement and notes |")
    print("|---|---:|---:|---:|---|")
    for label, to, tr_, agree in rows:
        unit = (lambda t: f"{t * 1e3:.1f} ms") if tr_ < 1 else (lambda t: f"{t:.2f} s")
        print(f"| {label} | {unit(to)} | {unit(tr_)} | {tr_ / to:.1f}x | {agree} |")

    return rows


if __name__ == "__main__":
    main()
