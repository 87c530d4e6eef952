"""Scale-out on the CPU: one process of one thread against ``torchrun --nproc-per-node 2`` of one thread each.

Trains a LeNet-5 on MNIST (untimed), then runs each job twice through the CLI, each time in fresh processes
(start-up, model and data loading included in the wall time):

* ``analyze``: the weak-robust analysis of the first N_A MNIST training images, Q = 20 neighbours;
* ``score``: FOL over the first N_S MNIST test images;
* ``generate``: PGD (10 steps, random start) over the first N_G MNIST test images, every test kept.

and checks that the two runs wrote equal tensors (``torch.equal``). Prints the wall times and the 2-rank /
1-rank ratio per job, and the same for the verb's own time (``timings.total_s`` of results.json: the verb's
work as it times it, without the start-up of Python, torch and torchrun); ``--repeat R`` keeps
the fastest of R runs of each. ``--json FILE`` saves them. On a 2-core machine run it with nothing else busy:

    python benchmarks/bench_scaling.py --data-dir ../shared/data/mnist --json /tmp/scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return seconds


def _same(a: Path, b: Path) -> bool:
    pa, pb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    keys = [k for k, v in pa.items() if isinstance(v, torch.Tensor)]
    return bool(keys) and all(torch.equal(pa[k], pb[k]) for k in keys)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True, help="MNIST folder (IDX files or mnist.npz)")
    p.add_argument("--analyze-n", type=int, default=20000)
    p.add_argument("--score-n", type=int, default=10000)
    p.add_argument("--generate-n", type=int, default=2000)
    p.add_argument("--jobs", default="analyze,score,generate")
    p.add_argument("--work", default="/tmp/robustest-bench-scaling")
    p.add_argument("--json", default=None)
    p.add_argument("--repeat", type=int, default=1, help="runs of each job and launcher; the fastest is kept")
    args = p.parse_args()
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        sys.exit("torchrun not found (it ships with PyTorch)")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rb = [sys.executable, "-m", "robustest"]
    model = work / "lenet5" / "model.pt"
    if not model.is_file():
        print("training LeNet-5 on 10,000 MNIST images (untimed) ...", flush=True)
        _run([*rb, "train", "--dataset", "mnist", "--data-dir", args.data_dir, "--model", "lenet5", "--epochs", "2",
              "--limit", "10000", "--quiet", "--out", str(work / "lenet5")])
    data = ["--checkpoint", str(model), "--dataset", "mnist", "--data-dir", args.data_dir]
    jobs = {
        "analyze": (["analyze", *data, "--split", "train", "--limit", str(args.analyze_n), "--neighbors", "20"],
                    "analysis.pt", f"analyze {args.analyze_n} MNIST training images, Q = 20"),
        "score": (["score", *data, "--limit", str(args.score_n), "--metric", "fol", "--eps", "0.3"],
                  "scores.pt", f"score --metric fol, {args.score_n} MNIST test images"),
        "generate": (["generate", *data, "--limit", str(args.generate_n), "--method", "pgd", "--eps", "0.3",
                      "--steps", "10", "--keep-all"],
                     "tests.pt", f"generate --method pgd (10 steps), {args.generate_n} MNIST test images"),
    }
    rows = []
    for name in args.jobs.split(","):
        argv, out_file, what = jobs[name]
        one, two = work / f"{name}-1", work / f"{name}-2"
        runs: dict[str, list[tuple[float, float]]] = {"one": [], "two": []}
        for _ in range(max(1, args.repeat)):
            for d in (one, two):
                shutil.rmtree(d, ignore_errors=True)
            t1 = _run([*rb, *argv, "--threads", "1", "--quiet", "--out", str(one)])
            t2 = _run([torchrun, "--nproc-per-node=2", f"--master-port={_port()}", "-m", "robustest", *argv,
                       "--threads", "1", "--quiet", "--out", str(two)])
            for key, d, t in (("one", one, t1), ("two", two, t2)):
                runs[key].append((t, json.loads((d / "results.json").read_text())["timings"]["total_s"]))
        (t1, v1), (t2, v2) = min(runs["one"]), min(runs["two"])
        same = _same(one / out_file, two / out_file)
        doc = json.loads((two / "results.json").read_text())
        row = {"job": name, "what": what, "one_rank_s": round(t1, 2), "two_ranks_s": round(t2, 2),
               "ratio": round(t2 / t1, 3), "verb_one_rank_s": round(v1, 2), "verb_two_ranks_s": round(v2, 2),
               "verb_ratio": round(v2 / v1, 3), "identical": same, "world_size": doc["world_size"],
               "rank_samples": doc.get("rank_samples"), "runs": runs}
        rows.append(row)
        print(f"{what}: 1 rank {t1:.1f} s, 2 ranks {t2:.1f} s, ratio {t2 / t1:.2f}x (the verb alone: {v1:.1f} s, "
              f"{v2:.1f} s, {v2 / v1:.2f}x), identical outputs: {same}", flush=True)
    info = {"cpus": os.cpu_count(), "torch": torch.__version__, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=2))
    print("\n| job | 1 rank (s) | 2 ranks (s) | ratio | verb alone: 1 rank / 2 ranks (s) | ratio | identical |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['what']} | {r['one_rank_s']:.1f} | {r['two_ranks_s']:.1f} | {r['ratio']:.2f}x | "
              f"{r['verb_one_rank_s']:.1f} / {r['verb_two_ranks_s']:.1f} | {r['verb_ratio']:.2f}x | "
              f"{'yes' if r['identical'] else 'NO'} |")


if __name__ == "__main__":
    main()
