"""Every verb's report.html in a real browser (headless Chromium): it renders (a non-empty screenshot), logs
nothing to the console, every image decodes, and the page does not scroll sideways in a 900 px window (wide
tables scroll inside their own box).

Slow (it runs every verb once on tiny digits settings, then Chromium twice per report); skipped where
/usr/bin/chromium is absent (``apt-get install chromium``). Set ROBUSTEST_SCREENSHOTS=DIR to keep the
screenshots.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from robustest.cli import main

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="headless Chromium is not installed")]
WIDTH = 900
MEASURE = """<script>window.addEventListener("load", () => {
  const root = document.documentElement, imgs = Array.from(document.images);
  const wraps = Array.from(document.querySelectorAll(".table-wrap"));
  const m = {scrollWidth: root.scrollWidth, clientWidth: root.clientWidth, innerWidth: window.innerWidth,
             images: imgs.length, broken: imgs.filter(i => !i.complete || i.naturalWidth === 0).length,
             tables: document.querySelectorAll("table").length,
             scrollingTables: wraps.filter(w => w.scrollWidth > w.clientWidth).length};
  const pre = document.createElement("pre"); pre.id = "robustest-measure"; pre.textContent = JSON.stringify(m);
  document.body.appendChild(pre);
});</script>"""


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                           f"--user-data-dir={profile}", f"--window-size={WIDTH},1200", "--enable-logging=stderr",
                           "--v=0", *args], capture_output=True, text=True, timeout=180)


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def measure(page: Path, tmp: Path) -> dict:
    """Load ``page`` with a measuring script added and read what it wrote into the DOM."""
    probe = tmp / f"probe-{page.parent.name}-{page.name}"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    proc = chromium("--virtual-time-budget=10000", "--dump-dom", probe.as_uri(), profile=tmp / "profile-m")
    m = re.search(r'<pre id="robustest-measure">(.*?)</pre>', proc.stdout, re.S)
    assert m, proc.stderr[-2000:]
    assert not console_lines(proc.stderr), console_lines(proc.stderr)
    return json.loads(m.group(1).replace("&quot;", '"'))


def screenshot(page: Path, tmp: Path) -> np.ndarray:
    from PIL import Image

    shot = tmp / f"{page.parent.name}.png"
    proc = chromium(f"--screenshot={shot}", page.as_uri(), profile=tmp / "profile-s")
    assert shot.is_file() and shot.stat().st_size > 5000, proc.stderr[-2000:]
    assert not console_lines(proc.stderr), console_lines(proc.stderr)  # the report has no script: no message
    keep = os.environ.get("ROBUSTEST_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
    with Image.open(io.BytesIO(shot.read_bytes())) as im:
        return np.asarray(im.convert("L"), dtype=float)


@pytest.fixture(scope="module")
def reports(tmp_path_factory, _trained_digits_session) -> dict[str, Path]:
    """report.html of every verb that writes one, from tiny digits runs."""
    from robustest.models.checkpoints import save_checkpoint
    from robustest.report import HtmlReport, save_hbars

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("reports")
    ckpt = root / "model.pt"
    save_checkpoint(ckpt, _trained_digits_session)
    m = ["--checkpoint", str(ckpt)]
    yaml = root / "tiny.yaml"
    yaml.write_text("whitebox_pgd_steps: 3\nwhitebox_restarts: 1\napgd_steps: 3\nconvergence_probe: 30\n"
                    "pool_pgd_steps: 5\n")
    robot = ["--config", str(yaml), *m, "--dataset", "digits", "--train-limit", "300", "--test-limit", "60",
             "--eps", "0.15", "--epochs", "1", "--whitebox-limit", "20", "--threads", "1"]
    runs = {
        "train": ["train", "--dataset", "digits", "--model", "digits_cnn", "--epochs", "2", "--limit", "300"],
        "score": ["score", *m, "--dataset", "digits", "--metric", "fol", "--limit", "100"],
        "generate": ["generate", *m, "--dataset", "digits", "--method", "pgd", "--limit", "40", "--steps", "3"],
        "corrupt": ["corrupt", "--dataset", "digits", "--limit", "4", "--severities", "1,3,5"],
        "analyze": ["analyze", *m, "--dataset", "digits", "--limit", "80", "--neighbors", "4", "--eps", "0.8"],
        "validate": ["validate", *m, "--dataset", "digits", "--limit", "80", "--neighbors", "4", "--eps", "0.8",
                     "--k", "10", "--perturbations", "all", "--attack-eps", "0.1", "--attack-steps", "2",
                     "--severities", "2", "--test-limit", "30"],
        "enhance": ["enhance", *m, "--dataset", "digits", "--limit", "64", "--epochs", "1", "--adv-steps", "1",
                    "--eval-limit", "40", "--weaknesses", "fog"],
        "run": ["run", *robot, "--strategy", "random", "--budget", "10%", "--rounds", "1"],
        "compare": ["compare", *robot, "--strategies", "best,kmst,random", "--budgets", "10,5%", "--seeds", "0-1"],
        "eval": ["eval", *m, "--dataset", "digits", "--limit", "40", "--eps", "0.1", "--version", "fast",
                 "--corruptions", "fog,gaussian_noise", "--severities", "2"],
        "harden": ["harden", *m, "--dataset", "digits", "--limit", "300", "--val-size", "30", "--epochs", "2",
                   "--eps", "0.1", "--autoattack", "fast", "--threads", "1"],
        "suite": ["suite", "build", *m, "--dataset", "digits", "--limit", "120", "--eps", "0.1", "--k", "30",
                  "--version", "fast", "--neighbors", "4"],
    }
    out: dict[str, Path] = {}
    for verb, argv in runs.items():
        assert main([*argv, "--out", str(root / verb), "--quiet"]) == 0, verb
        out[verb] = root / verb / "report.html"
    assert main(["select", "--scores", str(root / "score" / "scores.pt"), "--fraction", "0.2", "--strategy", "kmst",
                 "--out", str(root / "select"), "--quiet"]) == 0
    out["select"] = root / "select" / "report.html"
    # the gate's check of the same model against its own suite (the verdict in words)
    assert main(["suite", "check", "--suite", str(root / "suite"), *m, "--out", str(root / "suite-check"),
                 "--quiet"]) == 0
    out["suite-check"] = root / "suite-check" / "report.html"
    # the hardest case for the layout: a 30-column table, 60 perturbation types and the significance table
    doc = json.loads((root / "compare" / "results.json").read_text())
    rep = HtmlReport.from_results(doc, "a report with very wide content")
    rep.table([{f"a_rather_long_column_name_{i}": 0.123456 * i for i in range(30)}])
    rep.image(save_hbars({"weak set": {f"perturbation_type_{i}": (i % 9) / 10 for i in range(60)},
                          "test split": {f"perturbation_type_{i}": (i % 5) / 10 for i in range(60)}}, None,
                         title="error per perturbation type", xlabel="top-1 error"), "60 types")
    rep.significance([{"strategy": s, "budget": "10%", "metric": "fixed_set_accuracy", "mean_diff": d,
                       "ci_low": d - 0.03, "ci_high": d + 0.03, "n_seeds": 5}
                      for s, d in (("best", 0.08), ("kmst", 0.01), ("gini", -0.06))])
    (root / "stress").mkdir()
    out["stress"] = rep.write(root / "stress" / "report.html")
    torch.set_num_threads(threads)
    return out


VERBS = ["train", "score", "select", "generate", "corrupt", "analyze", "validate", "enhance", "run", "compare",
         "eval", "harden", "suite", "suite-check", "stress"]


@pytest.mark.parametrize("verb", VERBS)
def test_report_renders_in_chromium(reports, verb, tmp_path):
    page = reports[verb]
    pixels = screenshot(page, tmp_path)
    assert pixels.shape == (1200, WIDTH) and pixels.std() > 10  # something is drawn, not a blank page
    m = measure(page, tmp_path)
    assert m["innerWidth"] == WIDTH
    assert m["scrollWidth"] <= WIDTH, m  # no sideways scrolling of the page
    assert m["broken"] == 0 and m["images"] >= 1, m
    assert m["tables"] >= 2, m  # the verb's figures and the settings
    text = page.read_text(encoding="utf-8")
    assert "<h2>Settings</h2>" in text and "results.json: format robustest-" in text
    numbers = re.findall(r"\d+\.\d+", re.sub(r"<(img|style)[^>]*>[^<]*", "", text))
    assert numbers and max(len(n.replace(".", "").lstrip("0")) for n in numbers) <= 5, "unrounded figures"
    if verb == "stress":
        assert m["scrollingTables"] >= 1  # the 30-column table scrolls inside its box
        assert text.count('<tr class="sig">') == 2


def test_the_measure_sees_a_page_that_scrolls_sideways(tmp_path):
    """Control: a table without the scroll box makes the page wider than the window, and the measure says so."""
    cells = "".join(f"<td>column_number_{i}</td>" for i in range(40))
    page = tmp_path / "wide" / "report.html"
    page.parent.mkdir()
    page.write_text(f"<!DOCTYPE html><html><body><table><tr>{cells}</tr></table></body></html>")
    assert measure(page, tmp_path)["scrollWidth"] > WIDTH
