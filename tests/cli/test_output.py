"""The end every verb's run shares (cli.output.write_run)."""

from __future__ import annotations

import json
import time

import pytest

from robustest.cli.output import write_run, written


class _Page:
    """A stand-in report: records the document it was drawn from and writes one line."""

    def __init__(self, doc: dict) -> None:
        self.doc = doc

    def write(self, path) -> None:
        path.write_text(f"<p>{self.doc['format']} {sorted(self.doc['timings'])}</p>")


def test_write_run_writes_results_then_the_report_drawn_from_them(tmp_path):
    started = time.perf_counter() - 2.0  # the verb began two seconds ago
    drawn = []
    doc = write_run(tmp_path, "score", started, {"metric": "fol"}, {"n": 3}, {"load_s": 0.5, "total_s": 0.1},
                    lambda d: drawn.append(d) or _Page(d))
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(doc)) and drawn == [doc]
    assert doc["format"] == "robustest-score-results" and doc["settings"] == {"metric": "fol"} and doc["n"] == 3
    assert list(doc["timings"]) == ["load_s", "total_s"] and doc["timings"]["load_s"] == 0.5
    assert 2.0 <= doc["timings"]["total_s"] < 60.0  # the whole run's, from the verb's start, replacing the part's
    assert (tmp_path / "report.html").read_text() == "<p>robustest-score-results ['load_s', 'total_s']</p>"


def test_write_run_closes_the_timings_with_total_s(tmp_path):
    doc = write_run(tmp_path, "select", time.perf_counter(), {}, {}, {}, _Page)
    assert list(doc["timings"]) == ["total_s"] and doc["timings"]["total_s"] >= 0.0


def test_write_run_refuses_results_that_break_the_contract_before_any_report(tmp_path):
    drawn = []
    with pytest.raises(ValueError, match="header key"):
        write_run(tmp_path, "score", time.perf_counter(), {}, {"format": "mine"}, {}, drawn.append)
    assert drawn == [] and not (tmp_path / "report.html").exists()


def test_written_names_results_first_and_counts_past_eight(tmp_path, caplog):
    caplog.set_level("INFO", logger="robustest.cli")
    written(tmp_path, {"model": "model.pt", "report": "report.html"}, time.perf_counter())
    written(tmp_path, ["results.json", "samples.csv"], time.perf_counter() - 3.04)
    written(tmp_path, [f"{i}.npz" for i in range(9)], time.perf_counter())
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == f"wrote results.json, model.pt, report.html to {tmp_path} in 0.0s"
    assert lines[1].startswith(f"wrote results.json, samples.csv to {tmp_path} in 3.")
    assert lines[2] == f"wrote results.json, 0.npz, 1.npz, 2.npz, 3.npz, 4.npz, 4 more to {tmp_path} in 0.0s"
