"""Pin what verbs write before a refactoring and show it identical after.

Runs a few verbs on the built-in 8x8 digits (a small CNN trained first), then writes, per verb, a normalised copy of
its results.json (timings, peak memory and CPU seconds removed: they change from run to run), the text of its
report.html (numbers of those keys removed the same way) and its stdout/stderr lines, into OUT/pins (the verbs'
own folders: OUT/runs). Two runs of this script on two commits are compared with ``diff -r``:

    python benchmarks/pin_verbs.py /tmp/pin/before    # on the commit before the change
    python benchmarks/pin_verbs.py /tmp/pin/after     # after it
    diff -r /tmp/pin/before/pins /tmp/pin/after/pins  # nothing: the verbs compute and print what they did
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

VOLATILE = ("timings", "peak_rss_mib", "training_cpu_s", "seconds", "cpu_s", "elapsed_s")
DIGITS = ["--dataset", "digits"]


def _scrub(obj):
    if isinstance(obj, dict) and "coverage_history" in obj:  # (iteration, seconds, coverage): the seconds vary
        obj = {**obj, "coverage_history": [[h[0], h[2]] for h in obj["coverage_history"]]}
    if isinstance(obj, dict):
        return {k: _scrub(v) for k, v in obj.items() if k not in VOLATILE and not k.endswith("_s")}
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    return obj


_TIMED = re.compile(r"\(m?s\)|second|time")


def _scrub_table(m: re.Match) -> str:
    """A report table with its timing cells (in a column, or a key-value row, whose header names seconds) as T."""
    table = m.group(0)
    if 'class="kv"' in table:
        return re.sub(r"(<th[^>]*>([^<]*)</th><td[^>]*>)(.*?)(</td>)",
                      lambda r: r.group(1) + ("T" if _TIMED.search(r.group(2)) else r.group(3)) + r.group(4), table)
    heads = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<th[^>]*>(.*?)</th>", table, flags=re.S)]
    timed = {i for i, h in enumerate(heads) if _TIMED.search(h)}

    def row(r: re.Match) -> str:
        cells = re.findall(r"<td[^>]*>.*?</td>", r.group(0), flags=re.S)
        return "<tr>" + "".join("<td>T</td>" if i in timed else c for i, c in enumerate(cells)) + "</tr>"

    return re.sub(r"<tr>(?:(?!</tr>).)*?<td.*?</tr>", row, table, flags=re.S) if timed else table


def _run(out: Path, name: str, argv: list[str]) -> None:
    p = subprocess.run([sys.executable, "-m", "robustest", *argv, "--no-progress"], capture_output=True, text=True)
    lines = [re.sub(r"\d+(\.\d+)? ?(CPU-)?s(econds)?\b", "T s", s) for s in (p.stdout + p.stderr).splitlines()]
    lines = [s.replace(str(out), "OUT") for s in lines if "peak" not in s]
    pins = out.parent / "pins"
    pins.mkdir(exist_ok=True)
    (pins / f"{name}.log").write_text(f"exit {p.returncode}\n" + "\n".join(lines) + "\n")
    run_dir = out / name
    res = run_dir / "results.json"
    if res.is_file():
        doc = _scrub(json.loads(res.read_text()))
        (pins / f"{name}.results.json").write_text(json.dumps(doc, indent=1, sort_keys=True).replace(str(out), "OUT"))
    rep = run_dir / "report.html"
    if rep.is_file():
        text = re.sub(r"<table.*?</table>", _scrub_table, re.sub(r"<img[^>]*>", "<img>", rep.read_text()), flags=re.S)
        text = re.sub(r"<[^>]+>", "\n", text)
        text = re.sub(r"\d+(\.\d+)? ?(CPU-)?s(econds)?\b", "T s", text)
        kept = [s.strip() for s in text.splitlines() if s.strip()]
        (pins / f"{name}.report.txt").write_text("\n".join(kept).replace(str(out), "OUT") + "\n")


def main(out: str) -> None:
    o = Path(out) / "runs"  # the verbs' folders; the normalised copies go to OUT/pins
    o.mkdir(parents=True, exist_ok=True)
    _run(o, "train", ["train", *DIGITS, "--model", "digits_cnn", "--epochs", "2", "--seed", "0",
                      "--out", str(o / "train")])
    ckpt = str(o / "train" / "model.pt")
    _run(o, "harden", ["harden", "--checkpoint", ckpt, *DIGITS, "--eps", "0.1", "--epochs", "2", "--val-size", "100",
                       "--test-limit", "200", "--whitebox-limit", "60", "--autoattack", "fast", "--certify", "ibp",
                       "--out", str(o / "harden")])
    _run(o, "harden-scratch", ["harden", "--model", "digits_cnn", "--from-scratch", *DIGITS, "--method", "trades",
                               "--eps", "0.1", "--epochs", "1", "--val-size", "0", "--keep", "last",
                               "--test-limit", "100", "--whitebox-limit", "0", "--out", str(o / "harden-scratch")])
    _run(o, "eval", ["eval", "--checkpoint", ckpt, *DIGITS, "--eps", "0.1", "--limit", "80", "--version", "fast",
                     "--out", str(o / "eval")])
    _run(o, "eval-gate", ["eval", "--checkpoint", ckpt, *DIGITS, "--eps", "0.1", "--limit", "60", "--version", "fast",
                          "--certify", "ibp", "--fail-under", "0.99", "--out", str(o / "eval-gate")])
    _run(o, "eval-bad", ["eval", "--checkpoint", ckpt, *DIGITS, "--eps", "2", "--out", str(o / "eval-bad")])
    _run(o, "suite-build", ["suite", "build", "--checkpoint", ckpt, *DIGITS, "--eps", "0.1", "--limit", "200", "--k",
                            "40", "--version", "fast", "--out", str(o / "suite-build")])
    _run(o, "suite-check", ["suite", "check", "--suite", str(o / "suite-build"),
                            "--checkpoint", str(o / "harden" / "model.pt"), "--out", str(o / "suite-check")])
    _run(o, "generate-pgd", ["generate", "--checkpoint", ckpt, *DIGITS, "--limit", "60", "--method", "pgd", "--eps",
                             "0.1", "--out", str(o / "generate-pgd")])
    _run(o, "generate-fol", ["generate", "--checkpoint", ckpt, *DIGITS, "--limit", "20", "--method", "fol-fuzz",
                             "--steps", "5", "--out", str(o / "generate-fol")])
    _run(o, "generate-cov", ["generate", "--checkpoint", ckpt, *DIGITS, "--limit", "20", "--method", "cov-fuzz",
                             "--iterations", "5", "--profile-limit", "100", "--out", str(o / "generate-cov")])
    _run(o, "generate-bad", ["generate", "--checkpoint", ckpt, *DIGITS, "--method", "fol-fuzz", "--keep-all",
                             "--out", str(o / "generate-bad")])
    _run(o, "score-fol", ["score", "--checkpoint", ckpt, *DIGITS, "--limit", "60", "--metric", "fol", "--eps", "0.1",
                          "--out", str(o / "score-fol")])
    _run(o, "score-kmnc", ["score", "--checkpoint", ckpt, *DIGITS, "--limit", "40", "--metric", "kmnc",
                           "--train-limit", "100", "--out", str(o / "score-kmnc")])
    _run(o, "select-best", ["select", "--scores", str(o / "score-fol" / "scores.pt"), "--n", "10", "--strategy",
                            "best", "--out", str(o / "select-best")])
    _run(o, "select-cov", ["select", "--scores", str(o / "score-kmnc" / "scores.pt"), "--n", "5", "--strategy",
                           "coverage", "--out", str(o / "select-cov")])
    _run(o, "select-bad", ["select", "--scores", str(o / "missing.pt"), "--n", "5", "--strategy", "best",
                           "--out", str(o / "select-bad")])
    _run(o, "certify-ibp", ["certify", "--checkpoint", ckpt, *DIGITS, "--limit", "40", "--eps", "0.005", "--method",
                            "ibp", "--out", str(o / "certify-ibp")])
    _run(o, "certify-smoothing", ["certify", "--checkpoint", ckpt, *DIGITS, "--limit", "10", "--eps", "0.1",
                                  "--method", "smoothing", "--norm", "l2", "--sigma", "0.25", "--n-samples", "100",
                                  "--out", str(o / "certify-smoothing")])
    _run(o, "analyze", ["analyze", "--checkpoint", ckpt, *DIGITS, "--limit", "60", "--neighbors", "10",
                        "--radius-eps-max", "0.2", "--out", str(o / "analyze")])
    _run(o, "validate", ["validate", "--checkpoint", ckpt, *DIGITS, "--limit", "60", "--neighbors", "10", "--k", "10",
                         "--perturbations", "fgsm,gaussian_noise", "--test-limit", "30", "--out", str(o / "validate")])
    _run(o, "enhance", ["enhance", "--checkpoint", ckpt, *DIGITS, "--limit", "150", "--weaknesses",
                        str(o / "validate" / "results.json"), "--epochs", "1", "--adv-steps", "2", "--eval-limit", "30",
                        "--out", str(o / "enhance")])
    _run(o, "harden-bad", ["harden", "--checkpoint", ckpt, *DIGITS, "--eps", "0.1", "--val-size", "5000",
                           "--out", str(o / "harden-bad")])


if __name__ == "__main__":
    main(sys.argv[1])
