"""benchmarks/pin_verbs.py's scrubbing: what varies from run to run goes, every figure stays."""

from __future__ import annotations

import re

from integration.test_reproduce import script

pin = script("pin_verbs")


def test_timings_and_memory_are_removed_and_the_figures_kept():
    doc = {"timings": {"total_s": 1.0}, "peak_rss_mib": 300.0, "training_cpu_s": 9.0, "after": {"seconds": 2.0,
           "clean_accuracy": 0.9, "load_s": 0.1}, "epochs": [{"seconds": 1.0, "loss": 0.5}]}
    assert pin._scrub(doc) == {"after": {"clean_accuracy": 0.9}, "epochs": [{"loss": 0.5}]}


def test_the_coverage_history_keeps_iteration_and_coverage_only():
    assert pin._scrub({"coverage_history": [[0, 0.004, 0.625], [1, 0.02, 0.73]]}) == {
        "coverage_history": [[0, 0.625], [1, 0.73]]}


def test_the_timing_cells_of_report_tables_are_blanked():
    html = ('<table><thead><tr><th>attack</th><th>seconds</th></tr></thead><tbody><tr><td>pgd</td><td>0.5</td></tr>'
            '</tbody></table><table class="kv"><tbody><tr><th scope="row">load (s)</th><td>0.54</td></tr>'
            '<tr><th scope="row">per input (ms)</th><td>0.14</td></tr><tr><th scope="row">eps</th><td>0.1</td></tr>'
            '</tbody></table>')
    out = re.sub(r"<table.*?</table>", pin._scrub_table, html, flags=re.S)
    assert "<td>pgd</td><td>T</td>" in out and "<td>0.5</td>" not in out
    assert "load (s)</th><td>T</td>" in out and "per input (ms)</th><td>T</td>" in out
    assert "eps</th><td>0.1</td>" in out
