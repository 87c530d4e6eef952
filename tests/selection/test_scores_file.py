"""The scores file (robustest.selection.scores_file): written by score, read by select, checked like user input."""

from __future__ import annotations

import pytest
import torch

from robustest.core.errors import DataError
from robustest.selection.scores_file import (
    check_scores_payload,
    read_scores,
    score_stats,
    summarize,
    write_scores_csv,
)


def test_summarize_gives_exact_moments_and_quantiles():
    s = summarize(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert s["count"] == 5 and s["mean"] == 3.0 and s["min"] == 1.0 and s["max"] == 5.0
    assert s["std"] == pytest.approx(2.5 ** 0.5)  # the sample standard deviation (n - 1)
    assert s["quantiles"] == pytest.approx({"q01": 1.04, "q05": 1.2, "q25": 2.0, "q50": 3.0, "q75": 4.0, "q95": 4.8,
                                            "q99": 4.96})
    assert summarize(torch.tensor([7.0]))["std"] == 0.0 and summarize(torch.empty(0)) == {"count": 0}


def test_score_stats_ignore_non_finite_scores():
    assert score_stats(torch.tensor([1.0, float("nan"), 3.0, float("inf")])) == {
        "count": 2, "mean": 2.0, "min": 1.0, "max": 3.0, "median": 1.0}  # torch's median: the lower of the two
    assert score_stats(torch.tensor([float("nan")])) == {"count": 0}


def test_a_written_csv_reads_back_as_the_same_scores(tmp_path):
    path = tmp_path / "scores.csv"
    write_scores_csv(path, torch.tensor([4, 2]), torch.tensor([0.5, 0.25]), torch.tensor([1, 0]), None)
    assert path.read_text() == "index,score,label\n4,0.5,1\n2,0.25,0\n"
    back = read_scores(path)
    assert back["index"].tolist() == [4, 2] and back["scores"].tolist() == [0.5, 0.25] and back["metric"] is None
    write_scores_csv(path, torch.tensor([0]), torch.tensor([1.0]), None, torch.tensor([9]))
    assert path.read_text() == "index,score,x0_index\n0,1.0,9\n"


def test_a_scores_pt_reads_back_and_a_bare_tensor_gets_an_index(tmp_path):
    torch.save({"scores": torch.tensor([0.1, 0.2]), "index": torch.tensor([3, 1]), "metric": "fol"}, tmp_path / "a.pt")
    assert read_scores(tmp_path / "a.pt")["index"].tolist() == [3, 1]
    torch.save(torch.tensor([0.3, 0.1, 0.2]), tmp_path / "b.pt")
    assert read_scores(tmp_path / "b.pt")["index"].tolist() == [0, 1, 2]


@pytest.mark.parametrize(("payload", "message"), [
    ({"scores": torch.empty(0), "index": torch.empty(0, dtype=torch.long)}, "empty"),
    ({"scores": torch.ones(2), "index": torch.tensor([0, 0])}, "names an input twice"),
    ({"scores": torch.ones(2), "index": torch.tensor([0, -1])}, "negative index -1"),
    ({"scores": torch.ones(2), "index": torch.tensor([0.0, 1.0])}, "'index' must be 2 integers"),
    ({"scores": torch.ones(2), "index": torch.arange(2), "labels": torch.arange(3)}, "'labels' must be 2 integers"),
    ({"scores": torch.ones(2), "index": torch.arange(2), "bits": torch.ones(3, 4)}, "one row of covered cells"),
])
def test_inconsistent_payloads_are_refused_by_name(payload, message):
    with pytest.raises(DataError, match=message):
        check_scores_payload(payload, "s.pt")


def test_a_csv_without_a_score_column_or_with_a_bad_value_is_refused(tmp_path):
    (tmp_path / "a.csv").write_text("index,value\n0,1\n")
    with pytest.raises(DataError, match="no 'score' column"):
        read_scores(tmp_path / "a.csv")
    (tmp_path / "b.csv").write_text("index,score\n0,high\n")
    with pytest.raises(DataError, match="unreadable score or index value"):
        read_scores(tmp_path / "b.csv")
    with pytest.raises(DataError, match="does not exist"):
        read_scores(tmp_path / "none.pt")
