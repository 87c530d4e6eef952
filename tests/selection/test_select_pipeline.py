"""The select pipeline (robustest.selection.select_pipeline): what a strategy selects from, the files written."""

from __future__ import annotations

import pytest
import torch

from robustest import data as datasets
from robustest.core.errors import ConfigError, DataError
from robustest.selection.select_pipeline import read_scored_tests, select_pipeline, strategy_input


def _payload(**extra) -> dict:
    return {"metric": "fol", "scores": torch.tensor([0.5, 3.0, 1.0, 2.0, 0.1]), "index": torch.tensor([10, 11, 12, 13,
                                                                                                       14]), **extra}


def test_strategy_input_is_what_the_strategy_declares():
    p = _payload(bits=torch.tensor([[1, 0], [0, 0], [0, 1], [1, 1], [0, 0]], dtype=torch.bool))
    assert strategy_input(p, "top") is p["scores"]
    assert strategy_input(p, "coverage") is p["bits"]
    feats = torch.rand(5, 3)
    assert strategy_input(p, "kcenter", feats) is feats
    with pytest.raises(ConfigError, match="needs covered cells"):
        strategy_input(_payload(), "coverage")
    with pytest.raises(ConfigError, match="pass --tests"):
        strategy_input(_payload(), "kcenter")
    nan = _payload(scores=torch.tensor([0.5, float("nan"), 1.0, float("inf"), 0.1]))
    with pytest.raises(ConfigError, match="2 of 5 scores are NaN or infinite"):
        strategy_input(nan, "top")


def test_select_pipeline_writes_positions_scores_and_csv(tmp_path):
    run = select_pipeline(_payload(x0_index=torch.tensor([0, 1, 2, 3, 4])), "top", 2, out=tmp_path)
    assert run.idx.tolist() == [1, 3] and run.chosen.tolist() == [3.0, 2.0] and run.warnings == []
    saved = torch.load(tmp_path / "selected.pt", weights_only=True)
    assert saved["indices"].tolist() == [11, 13] and saved["x0_index"].tolist() == [1, 3]
    assert saved["scores"].tolist() == [3.0, 2.0]
    assert (saved["strategy"], saved["metric"], saved["pool_size"]) == ("top", "fol", 5)
    assert (tmp_path / "selected.csv").read_text() == "rank,index,score\n0,11,3.0\n1,13,2.0\n"
    mean = run.results["pool_scores"]["mean"]
    assert run.summary_line("top") == f"selected 2 of 5 inputs with top: selected scores mean 2.5 (pool {mean:g})"
    res = run.to_results()
    assert (res["requested"], res["selected"], res["pool_size"]) == (2, 2, 5)
    assert res["selected_scores"]["mean"] == 2.5 and res["pool_scores"]["max"] == 3.0
    assert res["files"] == {"selected": "selected.pt", "csv": "selected.csv", "report": "report.html"}
    assert "cells" not in res


def test_select_pipeline_counts_cells_for_coverage(tmp_path):
    bits = torch.tensor([[1, 0, 0], [0, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    res = select_pipeline(_payload(bits=bits), "coverage", 1, out=tmp_path / "made").to_results()
    assert (tmp_path / "made" / "selected.pt").is_file()
    assert (res["cells"], res["cells_covered_by_pool"], res["cells_covered_by_selection"]) == (3, 2, 2)


def test_selected_tests_are_the_chosen_rows_of_the_tests_file(tmp_path):
    x = torch.rand(6, 1, 4, 4)
    datasets.save_tests(tmp_path / "t.pt", x, torch.arange(6) % 3, torch.arange(6) + 100, "pgd",
                        fol=torch.arange(6).float(), extra={"dataset": "digits"})
    payload = _payload()
    tests = read_scored_tests(tmp_path / "t.pt", torch.tensor([1, 2, 3, 4, 5]))
    assert torch.equal(tests["scored_x"], x[1:]) and tests["scored_y"].tolist() == [1, 2, 0, 1, 2]
    payload["index"] = torch.tensor([1, 2, 3, 4, 5])
    run = select_pipeline(payload, "top", 2, out=tmp_path, tests=tests)
    sel = datasets.load_tests(tmp_path / "selected_tests.pt")  # positions 2 and 4 of the tests file
    assert torch.equal(sel["x"], x[[2, 4]]) and sel["x0_index"].tolist() == [102, 104]
    assert sel["fol"].tolist() == [2.0, 4.0] and sel["extra"] == {"dataset": "digits", "selected_by": "top"}
    assert sel["method"] == "pgd"
    assert run.files["tests"] == "selected_tests.pt"
    datasets.save_tests(tmp_path / "plain.pt", x, torch.arange(6) % 3, torch.arange(6), "fgsm")  # no FOL stored
    select_pipeline(payload, "top", 1, out=tmp_path, tests=read_scored_tests(tmp_path / "plain.pt", payload["index"]))
    assert datasets.load_tests(tmp_path / "selected_tests.pt")["fol"] is None
    with pytest.raises(DataError, match="the scores index test 6 but .* holds 6 tests"):
        read_scored_tests(tmp_path / "t.pt", torch.tensor([0, 6]))


def test_select_pipeline_passes_the_strategy_its_options_and_defaults(tmp_path):
    from robustest.selection import select

    p = _payload(scores=torch.linspace(0, 1, 40), index=torch.arange(40))
    s = p["scores"]
    assert select_pipeline(p, "kmst", 8, out=tmp_path).idx.tolist() == select(s, 8, "kmst", k=4, seed=0).tolist()
    assert select_pipeline(p, "kmst", 8, out=tmp_path, k=2, seed=3).idx.tolist() == \
        select(s, 8, "kmst", k=2, seed=3).tolist()
    assert select_pipeline(p, "random", 8, out=tmp_path).idx.tolist() == select(s, 8, "random", seed=0).tolist()
    assert select_pipeline(p, "random", 8, out=tmp_path, seed=7).idx.tolist() == \
        select(s, 8, "random", seed=7).tolist()
    bits = torch.zeros(40, 3, dtype=torch.bool)
    bits[0, 0] = True  # one input covers everything there is: the rest is filled
    p["bits"] = bits
    for fill in ("total", "random"):
        assert select_pipeline(p, "coverage", 5, out=tmp_path, fill=fill, seed=1).idx.tolist() == \
            select(bits, 5, "coverage", fill=fill, seed=1).tolist()
    flipped = -s  # a source given is what the strategy ranks, not the scores
    assert select_pipeline(p, "top", 3, out=tmp_path, source=flipped).idx.tolist() == [0, 1, 2]


def test_select_pipeline_records_the_strategys_warnings_and_an_empty_selection(tmp_path):
    run = select_pipeline(_payload(), "top", 9, out=tmp_path)
    assert run.warnings == ["asked for 9 inputs but the pool holds only 5: returning the whole pool"]
    assert run.to_results()["warnings"] == run.warnings and len(run.idx) == 5
    bits = torch.ones(5, 2, dtype=torch.bool)
    none = select_pipeline(_payload(bits=bits), "coverage", 0, out=tmp_path).to_results()
    assert (none["selected"], none["cells_covered_by_selection"], none["cells_covered_by_pool"]) == (0, 0, 2)
    assert torch.load(tmp_path / "selected.pt", weights_only=True)["scores"].numel() == 0


@pytest.mark.parametrize("strategy, kw, settings", [
    ("top", {}, {"strategy": "top"}),  # no option, no randomness
    ("random", {"seed": 3}, {"strategy": "random", "seed": 3}),
    ("kmst", {"k": 2, "seed": 1}, {"strategy": "kmst", "k": 2, "seed": 1}),
    ("coverage", {"fill": "total", "seed": 5}, {"strategy": "coverage", "fill": "total"}),  # no draw: no seed
    ("coverage", {"fill": "random", "seed": 5}, {"strategy": "coverage", "fill": "random", "seed": 5}),
])
def test_select_pipeline_records_the_options_the_strategy_reads(tmp_path, strategy, kw, settings):
    bits = torch.tensor([[1, 0], [0, 0], [0, 1], [1, 1], [0, 0]], dtype=torch.bool)
    run = select_pipeline(_payload(bits=bits), strategy, 2, out=tmp_path, **kw)
    assert run.settings == settings
