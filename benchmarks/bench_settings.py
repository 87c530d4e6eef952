"""Reduced full-setting runs: the seeds' settings' real architectures and per-step settings on synthetic data
of the right shape, timed per kind of work, and the full settings' run times estimated from the rates.

    python benchmarks/bench_settings.py --setting robot-cifar10-resnet20 --device cuda --steps 300
    python benchmarks/bench_settings.py --setting all --device cpu --steps 3 --train-batch 16   # CPU figures
    python benchmarks/bench_settings.py --setting all --estimate-only --assume-tflops 64         # no timing

Every setting's work is counted in three units (``work()``; counts from the settings dicts of
reproduce_robot.py and _weakrobust_full.py and the data sets' sizes):

* T, training image-steps: forward + backward + optimiser step of one image with the setting's recipe
  (optimiser, crop-flip, ``--amp``), through ``fit`` on an in-memory uint8 data set (the real path);
* A, attack image-steps: one PGD step on one image (forward + backward to the input), fp32 as the library runs;
* F, forward passes of one image in eval mode (evaluation, neighbours, corrupted copies), fp32;

plus the enhancement epochs (AugMix + JSD, and REVa's AugMix + JSD + adversarial copy) measured as whole
``weakrobust.enhance`` epochs per training image. The rates measured here (``--steps`` training steps, the
first epoch of ``fit`` and the first attack/forward call discarded as warm-up) give the estimate
``T / rate_T + A / rate_A + F / rate_F + enhance``. ``--assume-tflops X`` instead divides the FLOPs (2 x the
multiply-adds of ``models.profile``; 3 x forward for T and A) by X TFLOP/s sustained. Not counted: decoding
image files (ImageNet-100: give the folder loader enough ``--workers``), the corruption operations
themselves and the selection/bookkeeping between steps.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _weakrobust_full as wrfull  # noqa: E402
import reproduce_robot  # noqa: E402
from robustest import attacks, models  # noqa: E402
from robustest import weakrobust as wr  # noqa: E402
from robustest.data import arrays_to_dataset  # noqa: E402
from robustest.evaluate import predict  # noqa: E402
from robustest.train import fit, recipes

SIZES = {"cifar10": (50_000, 10_000), "imagenet100": (126_689, 5_000)}  # training / test images
NAMES = ("robot-cifar10-resnet20", "weakrobust-cifar10-wrn40-2", "weakrobust-imagenet100-resnet50")


def setting(name: str) -> dict[str, Any]:
    """The setting's values with what the benchmark needs: model, shape, classes, batch, recipe."""
    if name == "robot-cifar10-resnet20":
        s = dict(reproduce_robot.SETTINGS["cifar10-resnet20"])
        kw = recipes.recipe(s["recipe"])
        return {**s, "kind": "robot", "sizes": SIZES["cifar10"], "batch": kw["batch_size"], "recipe_kw": kw}
    key = name.removeprefix("weakrobust-")
    s = dict(wrfull.FULL_SETTINGS[key])
    kw = recipes.recipe(s["recipe"])
    return {**s, "kind": "weakrobust", "sizes": SIZES["cifar10" if "cifar" in key else "imagenet100"],
            "batch": kw["batch_size"], "epochs": kw["epochs"], "recipe_kw": kw}


# --------------------------------------------------------------------------------------------- the work
def work(s: dict[str, Any]) -> dict[str, float]:
    """T, A and F counts of the full setting, and E_aug / E_reva (enhancement image-epochs)."""
    n_train, n_test = s["sizes"]
    if s["kind"] == "robot":
        n_val = round(0.1 * n_train)
        n_fit = n_train - n_val
        budgets = [int(b) for b in s["budgets"].split(",")]
        cells = len(budgets) * len(s["strategies"].split(",")) * len(s["seeds"].split(","))
        whitebox = s["whitebox_limit"] * (2 * s["pgd_steps"] + s["apgd_steps"])
        pool = 2 * n_fit  # at most every FGSM and PGD example succeeds
        t = s["train_epochs"] * n_train + sum(s["epochs"] * (n_fit + b) for b in budgets) * cells / len(budgets)
        a = (11 * (n_test + n_val + n_fit)  # FGSM + PGD-10 for the fixed set, the validation split and the pool
             + pool  # FOL of every pool test
             + (cells + 1) * whitebox)  # white-box measure of the original model and of every cell
        f = (n_test + cells * s["epochs"] * (n_val + 2 * n_val)  # validation (clean + adversarial) per epoch
             + (cells + 1) * (n_test + 2 * n_test) + 2 * (n_test + n_val + n_fit) + pool)  # measures, checks
        return {"T": t, "A": a, "F": f, "E_aug": 0.0, "E_reva": 0.0}
    k, m = s["k"], s["k"] * 2 + min(s["test_size"], n_test)  # weak + random + test samples validated
    iterative = 3 * s["attack_steps"] + 2  # PGD, BIM, MI-FGSM steps + FGSM + R-FGSM, per budget
    per_model_a = m * len(s["attack_eps"]) * iterative
    per_model_f = n_train * (s["neighbors"] + 1) + m * (19 * len(s["severities"]) + 1 + len(s["attack_eps"]) * 5)
    evaluation_a = min(s["test_size"], n_test) * (s["eval_pgd_steps"] + 1 + s["eval_bim_steps"]) * 3
    t = s["epochs"] * n_train
    a = 3 * per_model_a + evaluation_a + n_train * s["adv_steps"]  # + REVa's offline PGD copy
    f = 3 * per_model_f + 2 * n_train + 4 * min(s["test_size"], n_test) * 3
    return {"T": t, "A": a, "F": f, "E_aug": s["enhance_epochs"] * n_train, "E_reva": s["enhance_epochs"] * n_train,
            "k": k}


def flops(s: dict[str, Any]) -> dict[str, float]:
    """FLOPs of one unit: T and A = 3 x forward, F = forward (2 FLOPs per multiply-add); enhancement: 3 copies
    (AugMix + JSD) or 4 (+ adversarial copy) of a training step per image."""
    c, h, _ = s["shape"]
    fwd = 2 * models.profile(s["model"], in_channels=c, input_size=h, num_classes=s["classes"])["macs"]
    return {"T": 3 * fwd, "A": 3 * fwd, "F": fwd, "E_aug": 9 * fwd, "E_reva": 12 * fwd}


def estimate(counts: dict[str, float], rates: dict[str, float]) -> float:
    """Seconds for the counted work at the given units/s."""
    return sum(counts[u] / rates[u] for u in ("T", "A", "F", "E_aug", "E_reva") if counts.get(u))


# images per call of each unit in the library: the recipe's training batch, validate()'s attack and forward
# batches (256); enhancement batches carry 3 (AugMix + JSD) or 4 (+ adversarial) copies of each image
UNIT_BATCH = {"A": 256, "F": 256}


def op_counts(s: dict[str, Any]) -> dict[str, int]:
    """Top-level aten operators dispatched per call of each unit (training step with the recipe's optimiser,
    foreach as on CUDA; one PGD step; one eval forward), counted with torch.profiler on the CPU at batch 2
    (the count does not depend on the batch). On a GPU each costs launch/dispatch time however small its
    kernels, which bounds small networks' throughput from below."""
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    c, h, _ = s["shape"]
    model = models.create(s["model"], num_classes=s["classes"], in_channels=c, input_size=h, mean=0.5, std=0.25)
    kw = s["recipe_kw"]
    params = [p for p in model.parameters()]
    opt = (torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=kw.get("nesterov", False), foreach=True)
           if kw["optimizer"] == "sgd" else torch.optim.Adam(params, lr=1e-3, foreach=True))
    x, y = torch.rand(2, c, h, h), torch.tensor([0, 1])

    def train_step() -> None:
        model.train()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(recipes.crop_flip(x)), y).backward()
        opt.step()

    def attack_step() -> None:
        model.eval()
        xa = x.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(F.cross_entropy(model(xa), y), xa)
        torch.minimum(torch.maximum(xa.detach() + 0.01 * g.sign(), x - 0.03), x + 0.03).clamp_(0, 1)

    def forward_step() -> None:
        model.eval()
        with torch.no_grad():
            model(x).argmax(1)

    out = {}
    for unit, fn in (("T", train_step), ("A", attack_step), ("F", forward_step)):
        fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        out[unit] = sum(1 for e in prof.events() if e.name.startswith("aten::") and
                        (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
    return out


def floor_estimate(s: dict[str, Any], counts: dict[str, float], fl: dict[str, float], ops: dict[str, int],
                   tflops: float, overhead_us: float) -> float:
    """Seconds when every unit costs the larger of its FLOPs at ``tflops`` and its share of the per-call
    dispatch overhead (``ops`` x ``overhead_us`` per call of ``batch`` images)."""
    total = 0.0
    batch = {"T": s["batch"], **UNIT_BATCH, "E_aug": s.get("enhance_batch", 64), "E_reva": s.get("enhance_batch", 64)}
    per_call = {"T": ops["T"], "A": ops["A"], "F": ops["F"], "E_aug": 3 * ops["T"], "E_reva": 4 * ops["T"]}
    for u in ("T", "A", "F", "E_aug", "E_reva"):
        if counts.get(u):
            unit_s = max(fl[u] / (tflops * 1e12), per_call[u] * overhead_us * 1e-6 / batch[u])
            total += counts[u] * unit_s
    return total


# ------------------------------------------------------------------------------------------ measurement
def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def synthetic(n: int, shape: tuple[int, int, int], classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    c, h, w = shape
    x = rng.integers(0, 256, (n, h, w, c), dtype=np.uint8)
    return arrays_to_dataset(x, np.arange(n) % classes, "synthetic")


def measure(s: dict[str, Any], dev: torch.device, steps: int, batch: int | None, attack_batch: int,
            amp: str | None) -> dict[str, Any]:
    c, h, _ = s["shape"]
    torch.manual_seed(0)
    model = models.create(s["model"], num_classes=s["classes"], in_channels=c, input_size=h, mean=0.5,
                          std=0.25).to(dev)
    b = batch or s["batch"]
    per_epoch = max(1, min(steps, 20))
    epochs = 1 + max(1, steps // per_epoch)
    data = synthetic(b * per_epoch, s["shape"], s["classes"])
    # the setting's recipe, milestones scaled to this run
    _, _, recipe = recipes.layered_recipe(s["recipe"], epochs, {"amp": amp} if amp else {})
    hist = fit(model, data, epochs, b, recipe, device=dev, progress=False)
    t_epoch = statistics.median(e.seconds for e in hist.epochs[1:])  # the first epoch warms up
    rate_t = b * per_epoch / t_epoch
    model.eval()
    xa = torch.rand(attack_batch, c, h, h, device=dev)
    ya = torch.arange(attack_batch, device=dev) % s["classes"]
    pgd_steps = 10
    times = []
    for _ in range(3):
        sync(dev)
        t0 = time.perf_counter()
        attacks.pgd(model, xa, ya, eps=4 / 255, steps=pgd_steps, seed=0)
        sync(dev)
        times.append(time.perf_counter() - t0)
    rate_a = attack_batch * pgd_steps / statistics.median(times[1:])
    fb = attack_batch * 4
    xf = torch.rand(fb, c, h, h, device=dev)
    times = []
    with torch.no_grad():
        for _ in range(4):
            sync(dev)
            t0 = time.perf_counter()
            predict(model, xf, batch_size=fb)
            sync(dev)
            times.append(time.perf_counter() - t0)
    rate_f = fb / statistics.median(times[1:])
    out = {"T": rate_t, "A": rate_a, "F": rate_f, "train_batch": b, "attack_batch": attack_batch,
           "train_steps_timed": per_epoch * (epochs - 1)}
    if s["kind"] == "weakrobust":
        n = max(b // 2, 8)
        small = synthetic(n, s["shape"], s["classes"], seed=1)
        for key, adversarial in (("E_aug", False), ("E_reva", True)):
            m = models.create(s["model"], num_classes=s["classes"], in_channels=c, input_size=h, mean=0.5,
                              std=0.25).to(dev)
            wr.enhance(m, small, (), epochs=1, augmix=True, adversarial=adversarial, adv_steps=1,
                       batch_size=min(n, s["enhance_batch"]), device=dev)  # warm-up
            sync(dev)
            t0 = time.perf_counter()
            wr.enhance(m, small, (), epochs=2, augmix=True, adversarial=adversarial, adv_steps=1,
                       batch_size=min(n, s["enhance_batch"]), device=dev)
            sync(dev)
            t2 = time.perf_counter() - t0
            # two epochs plus one offline PGD step per image (adversarial): keep the epochs only
            attack_s = n / rate_a if adversarial else 0.0
            out[key] = 2 * n / max(t2 - attack_s, 1e-9)
    return out


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds / 60:.1f} min"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", choices=(*NAMES, "all"), default="all")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=300, help="timed training steps (a few hundred on a GPU)")
    ap.add_argument("--train-batch", type=int, default=None, help="training batch (default: the recipe's)")
    ap.add_argument("--attack-batch", type=int, default=None, help="images per attack call (default 256; "
                                                                   "ImageNet 64)")
    ap.add_argument("--amp", choices=("bf16", "fp16"), default=None, help="train under autocast (CUDA)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--estimate-only", action="store_true", help="no timing: FLOPs at --assume-tflops only")
    ap.add_argument("--assume-tflops", type=float, default=64.0,
                    help="sustained TFLOP/s for the FLOP-based estimate (default 64: ResNet-50 AMP training on an "
                         "A100, 2,600 images/s, pytorch-image-models issue 1491)")
    ap.add_argument("--overhead-us", type=float, default=10.0,
                    help="dispatch/launch time per operator for the overhead-aware estimate (default 10 us)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    names = NAMES if args.setting == "all" else (args.setting,)
    rows = []
    print(f"device {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else platform.processor() or 'cpu'})"
          f", torch {torch.__version__}, threads {torch.get_num_threads()}, amp {args.amp}")
    for name in names:
        s = setting(name)
        counts = work(s)
        fl = flops(s)
        total_flops = sum(counts[u] * fl[u] for u in fl if counts.get(u))
        ops = op_counts(s)
        row: dict[str, Any] = {"setting": name, "model": s["model"], "shape": list(s["shape"]), "counts": counts,
                               "flops_per_unit": fl, "total_pflop": total_flops / 1e15,
                               "assume_tflops": args.assume_tflops,
                               "estimate_s_at_assumed": total_flops / (args.assume_tflops * 1e12),
                               "ops_per_call": ops, "overhead_us": args.overhead_us,
                               "estimate_s_with_overhead": floor_estimate(s, counts, fl, ops, args.assume_tflops,
                                                                          args.overhead_us)}
        if not args.estimate_only:
            t0 = time.perf_counter()
            ab = args.attack_batch or (64 if s["shape"][1] > 64 else 256)
            rates = measure(s, dev, args.steps, args.train_batch, ab, args.amp)
            row["rates_per_s"] = rates
            row["estimate_s_measured"] = estimate(counts, rates)
            row["benchmark_s"] = time.perf_counter() - t0
        rows.append(row)
        line = (f"{name}: {s['model']} {'x'.join(map(str, s['shape']))}; work T {counts['T']:.3g}, "
                f"A {counts['A']:.3g}, F {counts['F']:.3g}"
                + (f", enhance {counts['E_aug']:.3g} + {counts['E_reva']:.3g} image-epochs" if counts.get("E_aug")
                   else "")
                + f"; {row['total_pflop']:.1f} PFLOP -> {hours(row['estimate_s_at_assumed'])} at "
                  f"{args.assume_tflops:g} TFLOP/s; ops per call T {ops['T']}, A {ops['A']}, F {ops['F']} -> "
                  f"{hours(row['estimate_s_with_overhead'])} with {args.overhead_us:g} us per op")
        if "rates_per_s" in row:
            r = row["rates_per_s"]
            line += (f"; measured T {r['T']:.1f}/s, A {r['A']:.1f}/s, F {r['F']:.1f}/s"
                     + (f", enhance {r['E_aug']:.1f} / {r['E_reva']:.1f} img/s" if "E_aug" in r else "")
                     + f" -> {hours(row['estimate_s_measured'])} on this device (benchmark {row['benchmark_s']:.0f} s)")
        print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(dev), "amp": args.amp, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
