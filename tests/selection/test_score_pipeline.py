"""The score pipeline (robustest.selection.score_pipeline): tests files with their seeds, the scores file."""

from __future__ import annotations

import json

import pytest
import torch

from robustest import data as datasets
from robustest.core.batching import take
from robustest.core.errors import ConfigError, DataError
from robustest.metrics.loss import fol
from robustest.metrics.scoring import score
from robustest.report import format_value
from robustest.selection.score_pipeline import SCORE_FILES, ScoreInputs, inputs_of_tests, score_pipeline
from robustest.selection.scores_file import read_scores


@pytest.fixture
def seeds():
    return datasets.load("digits", split="test")


def _tests(tmp_path, seeds, index=(3, 0, 7, 7), extra=None):
    idx = torch.tensor(index)
    x, y = take(seeds, idx % len(seeds))
    path = tmp_path / "tests.pt"
    datasets.save_tests(path, (x + 0.05).clamp(0, 1), y, idx, "pgd",
                        extra={"dataset": "digits", "split": "test"} if extra is None else extra)
    return str(path), x, y


def test_inputs_of_tests_read_the_tests_and_their_seeds(tmp_path, seeds):
    path, x_seed, _ = _tests(tmp_path, seeds)
    own = inputs_of_tests(path, limit=3)
    assert own.x0 is None and own.source == f"tests:{path}" and own.x0_index.tolist() == [3, 0, 7]
    assert own.data[0].shape == (3, 1, 8, 8)
    with_seeds = inputs_of_tests(path, seeds_dataset="digits")
    assert torch.equal(with_seeds.x0(torch.tensor([1, 3])), x_seed[[1, 3]])  # SEEDS[x0_index[i]]
    train_seeds = inputs_of_tests(path, seeds_dataset="digits", seeds_split="train")  # the recorded split: a default
    assert torch.equal(train_seeds.x0(torch.tensor([0])), take(datasets.load("digits", split="train"), [3])[0])


@pytest.mark.parametrize("extra, kwargs, error, match", [
    ({"dataset": "mnist", "split": "test"}, {}, ConfigError, "generated from 'mnist', not 'digits'"),
    ({"dataset": "digits"}, {}, ConfigError, "does not record its seeds' split"),
    ({"dataset": "digits", "split": "test"}, {"seeds_split": "bogus"}, ConfigError, "seeds' split"),
])
def test_inputs_of_tests_refuse_seeds_that_are_not_the_tests_source(tmp_path, seeds, extra, kwargs, error, match):
    path, _, _ = _tests(tmp_path, seeds, extra=extra)
    with pytest.raises(error, match=match):
        inputs_of_tests(path, seeds_dataset="digits", **kwargs)


def test_inputs_of_tests_refuse_an_index_past_the_seeds(tmp_path, seeds):
    path, _, _ = _tests(tmp_path, seeds, index=(0, len(seeds)))
    with pytest.raises(DataError, match=f"reaches {len(seeds)} but digits:test has {len(seeds)} images"):
        inputs_of_tests(path, seeds_dataset="digits")


def test_score_pipeline_writes_the_scores_file_select_reads(tmp_path, trained_digits_model, seeds):
    data = take(seeds, torch.arange(40))
    run = score_pipeline(trained_digits_model, ScoreInputs(data, "digits:test"), "gini", out=tmp_path,
                         batch_size=16, progress=False, model_source="m.pt", load_s=1.5)
    expected = score(trained_digits_model, data, "gini").scores
    assert torch.allclose(run.result.scores, expected)
    payload = read_scores(tmp_path / "scores.pt")
    assert payload["metric"] == "gini" and torch.equal(payload["index"], torch.arange(40))
    raw = torch.load(tmp_path / "scores.pt", weights_only=True)  # the file as written, not as read back
    assert sorted(raw) == ["index", "labels", "metric", "options", "scores"] and raw["options"] == {}
    assert torch.equal(payload["labels"], data[1]) and "x0_index" not in payload and "bits" not in payload
    lines = (tmp_path / "scores.csv").read_text().splitlines()
    assert lines[0] == "index,score,label" and len(lines) == 41
    assert all((tmp_path / f).is_file() for f in ("scores.pt", "scores.csv", "scores_hist.png", "summary.json"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["checkpoint"] == "m.pt" and summary["count"] == 40 and summary["fol_seed"] is None
    assert list(run.timings) == ["load_s", "score_s", "per_input_ms", "total_s"] and run.timings["load_s"] == 1.5
    assert run.timings["total_s"] >= 1.5 + run.timings["score_s"]
    assert run.timings["per_input_ms"] == 1000 * run.timings["score_s"] / 40
    assert not {"set_coverage", "num_cells", "layers"} & set(run.figures)  # coverage figures only for coverage
    assert run.figures["mean"] == pytest.approx(float(expected.mean())) and run.figures["non_finite"] == 0
    assert run.to_results()["files"] == SCORE_FILES and run.own_seed is False


def test_fol_on_tests_measures_against_the_seeds_or_says_it_did_not(tmp_path, trained_digits_model, seeds):
    path, x_seed, y = _tests(tmp_path, seeds)
    x = datasets.load_tests(path)["x"]
    with_seeds = score_pipeline(trained_digits_model, inputs_of_tests(path, seeds_dataset="digits"), "fol",
                                out=tmp_path, options={"eps": 0.1}, progress=False)
    assert with_seeds.figures["fol_seed"] == "x0 = seeds at x0_index" and with_seeds.own_seed is False
    assert torch.allclose(with_seeds.result.scores, fol(trained_digits_model, x, y, x0=x_seed, eps=0.1), atol=1e-6)
    assert read_scores(tmp_path / "scores.pt")["x0_index"].tolist() == [3, 0, 7, 7]
    lines = (tmp_path / "scores.csv").read_text().splitlines()
    assert lines[0] == "index,score,label,x0_index" and lines[1].endswith(",3")
    own = score_pipeline(trained_digits_model, inputs_of_tests(path), "fol", out=tmp_path, options={"eps": 0.1},
                         progress=False)
    assert own.figures["fol_seed"] == "x0 = x' (own seed)" and own.own_seed is True
    assert torch.allclose(own.result.scores, fol(trained_digits_model, x, y, x0=x, eps=0.1), atol=1e-6)


def test_coverage_scores_use_the_training_profile_and_the_layers_given(tmp_path, trained_digits_model, seeds,
                                                                      digits_train):
    data, train = take(seeds, torch.arange(30)), take(digits_train, torch.arange(80))
    run = score_pipeline(trained_digits_model, ScoreInputs(data, "digits:test"), "kmnc", out=tmp_path, train=train,
                         layers=["relu3"], options={"k": 4}, progress=False)
    want = score(trained_digits_model, data, "kmnc", train=train, layers=["relu3"], k=4)
    assert torch.equal(run.result.bits, want.bits) and run.result.layers == want.layers == ["relu3"]
    assert run.figures["set_coverage"] == want.set_coverage and run.figures["num_cells"] == want.num_cells
    assert run.figures["layers"] == ["relu3"]
    assert torch.equal(read_scores(tmp_path / "scores.pt")["bits"], want.bits)
    lines = run.summary_lines()
    assert len(lines) == 2 and lines[0].startswith("kmnc on 30 inputs from digits:test: mean ")
    assert lines[1] == f"set coverage: {format_value(want.set_coverage, 'coverage')} of {want.num_cells} cells"
    other = score(trained_digits_model, data, "kmnc", train=take(digits_train, torch.arange(80, 160)),
                  layers=["relu3"], k=4)
    assert not torch.equal(other.bits, want.bits)  # the profile comes from the training data given


def test_defaults_record_no_model_and_no_loading_time(tmp_path, trained_digits_model, seeds):
    run = score_pipeline(trained_digits_model, ScoreInputs(take(seeds, torch.arange(5)), "digits:test"), "gini",
                         out=tmp_path, progress=False)
    assert run.timings["load_s"] == 0.0
    assert json.loads((tmp_path / "summary.json").read_text())["checkpoint"] == ""


def test_the_seeds_come_from_the_folder_given(tmp_path, seeds):
    import numpy as np

    path, _, _ = _tests(tmp_path, seeds, extra={"dataset": "npz", "split": "test"})
    x = (np.arange(20 * 64) % 256).astype(np.uint8).reshape(20, 8, 8)
    np.savez(tmp_path / "own.npz", x_test=x, y_test=np.arange(20) % 10)
    inputs = inputs_of_tests(path, seeds_dataset="npz", seeds_root=str(tmp_path / "own.npz"), seeds_split="test")
    assert torch.equal(inputs.x0(torch.tensor([0, 2])), torch.from_numpy(x[[3, 7]]).float().unsqueeze(1) / 255)


def test_amp_reaches_the_metric(tmp_path, trained_digits_model, seeds):
    data = take(seeds, torch.arange(20))
    run = score_pipeline(trained_digits_model, ScoreInputs(data, "digits:test"), "gini", out=tmp_path, amp="bf16",
                         progress=False)
    assert torch.equal(run.result.scores, score(trained_digits_model, data, "gini", amp="bf16").scores)
    assert not torch.equal(run.result.scores, score(trained_digits_model, data, "gini").scores)  # rounded in bf16


def test_the_histogram_draws_the_scores_named_by_metric_and_source(tmp_path, trained_digits_model, seeds,
                                                                 monkeypatch):
    import robustest.report

    drawn = {}

    def record(values, path, **kw):
        drawn.update(values=values, path=path, **kw)

    monkeypatch.setattr(robustest.report, "save_histogram", record)
    one = take(seeds, torch.arange(1))
    run = score_pipeline(trained_digits_model, ScoreInputs(one, "digits:test"), "gini", out=tmp_path, progress=False)
    assert run.metric == "gini" and torch.equal(drawn["values"], run.result.scores)
    assert drawn["path"] == tmp_path / "scores_hist.png"
    assert (drawn["title"], drawn["xlabel"]) == ("gini on digits:test (n=1)", "gini")
    assert run.timings["per_input_ms"] == 1000 * run.timings["score_s"]  # one input


# ------------------------------------------------------------------------------------------- ScoreOptions
def test_score_options_hand_each_metric_only_what_it_takes():
    from robustest.selection.score_pipeline import ScoreOptions

    o = ScoreOptions(eps=0.1, norm="l2", label="pred", k=4, threshold=0.25, top_k=2, scale=0.0)
    assert o.of_metric("fol") == {"eps": 0.1, "norm": "l2", "label": "pred"}
    assert o.of_metric("fol_gradnorm") == {"label": "pred"}
    assert o.of_metric("kmnc") == {"k": 4}
    assert o.of_metric("nc") == {"threshold": 0.25}
    assert o.of_metric("tknc") == {"top_k": 2}
    assert o.of_metric("nbc") == {"scale": 0.0}  # 0 is set, not left to the default
    assert ScoreOptions().of_metric("kmnc") == {} and ScoreOptions().of_metric("zol") == {}


def test_score_options_record_what_the_metric_ran_with():
    from robustest.selection.score_pipeline import ScoreOptions

    assert ScoreOptions().settings("fol") == {"eps": 0.3, "norm": "linf", "label": "true"}
    assert ScoreOptions(amp="bf16", label="pred").settings("zol") == {"amp": "bf16", "label": "pred"}
    assert ScoreOptions(eps=0.1).settings("fol_gradnorm") == {"label": "true"}
    assert ScoreOptions(eps=0.1, k=3).settings("gini") == {}
    assert list(ScoreOptions(amp="fp16").settings("fol")) == ["amp", "eps", "norm", "label"]


@pytest.mark.parametrize("metric, kwargs, match", [
    ("fol", {"k": 3}, "^--k does not apply to --metric fol: drop it$"),
    ("nc", {"k": 3, "top_k": 1, "scale": 0.0}, "^--k, --top-k, --scale does not apply to --metric nc: drop it$"),
    ("kmnc", {"threshold": 0.5}, "^--threshold does not apply to --metric kmnc"),
    ("fol", {"eps": 1.5}, "^eps "),
    ("fol", {"amp": "bf16"}, "^--amp applies to zol, gini, entropy, margin, max_prob .* --metric fol needs input "
                             "gradients in float32: drop --amp$"),
    ("nc", {"amp": "bf16"}, "--metric nc needs layer activations compared with a float32 reference in float32"),
])
def test_score_options_refuse_what_the_metric_would_ignore(metric, kwargs, match):
    from robustest.selection.score_pipeline import ScoreOptions

    with pytest.raises(ConfigError, match=match):
        ScoreOptions(**kwargs).check(metric)


def test_score_options_accept_what_the_metric_takes():
    from robustest.selection.score_pipeline import ScoreOptions

    for metric, kwargs in (("kmnc", {"k": 3}), ("nc", {"threshold": 0.0}), ("zol", {"amp": "bf16"}),
                           ("fol", {"eps": 1.5, "norm": "l2"}), ("fol", {"eps": 1.0}), ("tknc", {"top_k": 1}),
                           ("snac", {"scale": 0.5})):
        ScoreOptions(**kwargs).check(metric)  # no error


def test_the_summary_line_rounds_the_figures_like_the_report(tmp_path, trained_digits_model, seeds):
    from robustest.selection.score_pipeline import ScoreRun

    run = score_pipeline(trained_digits_model, ScoreInputs(take(seeds, torch.arange(12)), "digits:test"), "gini",
                         out=tmp_path, progress=False)
    f = run.figures
    assert run.summary_lines() == [
        f"gini on 12 inputs from digits:test: mean {format_value(f['mean'])}, median "
        f"{format_value(f['quantiles']['q50'])}, min {format_value(f['min'])}, max {format_value(f['max'])} "
        f"({format_value(run.timings['score_s'], 'score_s')} s)"]
    fixed = ScoreRun("zol", run.result, {"source": "s", "mean": 0.5, "min": 0.25, "max": 1.0,
                                         "quantiles": {"q50": 0.5}}, {"score_s": 2.0})
    assert fixed.summary_lines() == ["zol on 12 inputs from s: mean 0.5, median 0.5, min 0.25, max 1 (2.0 s)"]
