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


def test_csv_scores_are_float64_and_a_csv_without_an_index_counts_its_rows(tmp_path):
    (tmp_path / "s.csv").write_text("score\n0.5\n0.25\n")
    back = read_scores(tmp_path / "s.csv")
    assert back["scores"].dtype == torch.float64 and back["index"].tolist() == [0, 1]


@pytest.mark.parametrize(("scores", "message"), [
    (torch.ones(2, 3), r"scores must be a 1-D tensor of numbers, got torch.float32 of shape \(2, 3\)"),
    (torch.ones(3, dtype=torch.bool), r"scores must be a 1-D tensor of numbers, got torch.bool of shape \(3,\)"),
])
def test_a_scores_pt_whose_scores_are_not_numbers_in_one_dimension_is_refused(tmp_path, scores, message):
    torch.save({"scores": scores}, tmp_path / "s.pt")
    with pytest.raises(DataError, match=message):
        read_scores(tmp_path / "s.pt")
    torch.save({"scores": torch.ones(2), "index": torch.tensor([0, 0])}, tmp_path / "dup.pt")
    with pytest.raises(DataError, match=f"^{tmp_path / 'dup.pt'}: 'index' names an input twice"):
        read_scores(tmp_path / "dup.pt")  # the message starts with the file


@pytest.mark.parametrize(("extra", "message"), [
    ({"x0_index": torch.arange(3)}, r"'x0_index' must be 2 integers \(one per score\), got torch.int64 of shape"),
    ({"index": None}, "'index' must be 2 integers"),  # the index is required, labels and x0_index are not
    ({"index": [0, 1]}, "'index' must be 2 integers \\(one per score\\), got list"),
    ({"index": torch.tensor([True, False])}, "'index' must be 2 integers"),
    ({"bits": [[1, 0], [0, 1]]}, r"one row of covered cells per score \(2 rows\), got list"),
    ({"bits": torch.ones(2)}, r"one row of covered cells per score \(2 rows\), got \(2,\)"),
])
def test_each_field_of_a_payload_is_checked_by_name(extra, message):
    payload = {"scores": torch.ones(2), "index": torch.arange(2), **extra}
    with pytest.raises(DataError, match=f"^s.pt: .*{message}"):
        check_scores_payload(payload, "s.pt")


def test_a_consistent_payload_with_every_field_passes_unchanged():
    payload = {"scores": torch.ones(2), "index": torch.tensor([5, 3]), "labels": torch.tensor([0, 1]),
               "x0_index": torch.tensor([7, 8]), "bits": torch.ones(2, 4, dtype=torch.bool)}
    assert check_scores_payload(payload, "s.pt") is payload


class NotAllowed:
    """A class torch.load(weights_only=True) refuses to rebuild."""


def test_a_scores_pt_is_never_unpickled_and_a_non_dict_payload_is_named(tmp_path):
    torch.save({"scores": torch.ones(2), "extra": NotAllowed()}, tmp_path / "pickled.pt")
    with pytest.raises(DataError, match="is not a readable scores file"):
        read_scores(tmp_path / "pickled.pt")
    torch.save([torch.ones(2)], tmp_path / "list.pt")
    with pytest.raises(DataError, match="holds no 'scores' tensor"):
        read_scores(tmp_path / "list.pt")


def test_a_csv_names_itself_in_its_errors(tmp_path):
    (tmp_path / "s.csv").write_text("index,score\n1,0.5\n1,0.25\n")
    with pytest.raises(DataError, match=f"^{tmp_path / 's.csv'}: 'index' names an input twice"):
        read_scores(tmp_path / "s.csv")


def test_a_zip_member_larger_than_the_file_is_refused_as_a_damaged_scores_file(tmp_path):
    import struct
    import zipfile

    path = tmp_path / "lying.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", b"x" * 77777)
    raw = path.read_bytes().replace(struct.pack("<I", 77777), struct.pack("<I", 10**9))
    path.write_bytes(raw)
    with pytest.raises(DataError, match="the scores file is damaged: member 'archive/data.pkl' declares"):
        read_scores(path)
