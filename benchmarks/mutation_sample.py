"""Mutation score of the modules that decide results, estimated on a stratified random sample of mutmut's mutants.

``mutmut run`` over every module in ``[tool.mutmut]`` makes about 8,500 mutants; on 2 CPU cores the tests that
reach them take some 15 hours. This script draws ``--per-group`` mutants at random (seeded) from each group of
modules, has mutmut run exactly those, and reports per group the killed share with its Wilson 95 % interval. A
mutant that no selected test reaches ("no tests") counts as surviving; a timeout counts as killed (the mutant
made a test hang: the suite notices). Run it from the repository root:

    python benchmarks/mutation_sample.py --per-group 60 --seed 0 --json /tmp/mutation.json

``--names-only`` prints the drawn names (to rerun a subset with ``mutmut run NAME ...``); ``--report-only``
reads mutmut's stored results for the drawn names without running anything (after adding tests, rerun the
survivors with ``mutmut run`` and report again).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import subprocess
import sys
from collections import defaultdict

#: the groups of the sample, matched in order against a mutant's name (module path, then the function)
GROUPS = (
    ("suite", r"^robustest\.suite\."),
    ("train.objectives", r"^robustest\.train\.objectives\."),
    ("train.early_stopping", r"^robustest\.train\.early_stopping\."),
    ("train.engine", r"^robustest\.train\.engine\."),
    ("train.schedules", r"^robustest\.train\.schedules\."),
    ("attacks core (_core, gradient)", r"^robustest\.attacks\.(_core|gradient)\."),
    ("attacks.apgd", r"^robustest\.attacks\.apgd\."),
    ("evaluate.ensemble", r"^robustest\.evaluate\.ensemble\."),
    ("selection", r"^robustest\.selection\."),
)
KILLED = {"killed", "timeout"}


def mutmut(*args: str) -> str:
    out = subprocess.run(["mutmut", *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"mutmut {' '.join(args[:2])} failed: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout


def statuses() -> dict[str, str]:
    """Every mutant's name -> mutmut's status (killed, survived, no tests, timeout, not checked, ...)."""
    found = {}
    for line in mutmut("results", "--all", "true").splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep:
            found[name] = status.strip()
    return found


def group_of(name: str) -> str | None:
    for label, pattern in GROUPS:
        if re.search(pattern, name):
            return label
    return None


def draw(names: list[str], per_group: int, seed: int) -> dict[str, list[str]]:
    by_group: dict[str, list[str]] = defaultdict(list)
    for n in sorted(names):
        g = group_of(n)
        if g is not None:
            by_group[g].append(n)
    rng = random.Random(seed)
    return {g: sorted(rng.sample(members, min(per_group, len(members)))) for g, members in by_group.items()}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-group", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-children", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the figures and the surviving names here")
    ap.add_argument("--names-only", action="store_true")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()

    status = statuses()
    if not status:  # no mutants generated yet: let mutmut make them (a filter that matches nothing runs none)
        subprocess.run(["mutmut", "run", "no.such.mutant"], capture_output=True)
        status = statuses()
    sample = draw(list(status), args.per_group, args.seed)
    names = [n for g in sample.values() for n in g]
    if args.names_only:
        print("\n".join(names))
        return 0
    if not args.report_only:
        subprocess.run(["mutmut", "run", "--max-children", str(args.max_children), *names], check=False)
        status = statuses()
    rows, survivors = [], {}
    total_k = total_n = 0
    for label, _ in GROUPS:
        drawn = sample.get(label, [])
        done = [n for n in drawn if status.get(n) not in (None, "not checked")]
        k = sum(status[n] in KILLED for n in done)
        lo, hi = wilson(k, len(done))
        survivors[label] = [f"{n}: {status[n]}" for n in done if status[n] not in KILLED]
        rows.append({"group": label, "population": sum(group_of(n) == label for n in status), "sampled": len(done),
                     "killed": k, "score": k / len(done) if done else None, "ci95": [lo, hi]})
        total_k, total_n = total_k + k, total_n + len(done)
    print(f"{'group':32s} {'mutants':>8s} {'sampled':>8s} {'killed':>7s} {'score':>7s}  95 % interval")
    for r in rows:
        score = "-" if r["score"] is None else f"{100 * r['score']:.1f}%"
        print(f"{r['group']:32s} {r['population']:8d} {r['sampled']:8d} {r['killed']:7d} {score:>7s}  "
              f"[{100 * r['ci95'][0]:.1f}, {100 * r['ci95'][1]:.1f}]")
    scored = [r for r in rows if r["score"] is not None]
    weighted = sum(r["population"] * r["score"] for r in scored) / max(1, sum(r["population"] for r in scored))
    print(f"{'all sampled':32s} {len(status):8d} {total_n:8d} {total_k:7d} "
          f"{100 * total_k / max(total_n, 1):6.1f}%  (weighted by group size: {100 * weighted:.1f}%)")
    for label, names_left in survivors.items():
        for line in names_left:
            print(f"  {label}: {line}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"per_group": args.per_group, "seed": args.seed, "rows": rows, "weighted_score": weighted,
                       "survivors": survivors}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
