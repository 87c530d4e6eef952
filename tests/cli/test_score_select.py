"""``robustest score`` and ``robustest select`` on digits with a small trained model."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from robustest import data, metrics, selection
from robustest.cli import main


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, _trained_digits_session) -> Path:
    from robustest.models.checkpoints import save_checkpoint

    path = tmp_path_factory.mktemp("model") / "model.pt"
    save_checkpoint(path, _trained_digits_session)
    return path


@pytest.fixture(scope="module")
def model(ckpt):
    from robustest.models.checkpoints import load_checkpoint

    return load_checkpoint(ckpt)


@pytest.fixture(scope="module")
def test_split():
    return data.load("digits", split="test").tensors


def _score(ckpt, out, *extra) -> int:
    return main(["score", "--checkpoint", str(ckpt), "--dataset", "digits", "--out", str(out), "--no-progress",
                 *extra])


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_score_fol_writes_all_files_matching_the_library(ckpt, model, test_split, tmp_path, results_contract):
    out = tmp_path / "fol"
    assert _score(ckpt, out, "--metric", "fol", "--limit", "100", "--eps", "0.1", "--norm", "l2") == 0
    x, y = test_split
    expected = metrics.fol(model, x[:100], y[:100], eps=0.1, norm="l2")
    payload = torch.load(out / "scores.pt", weights_only=True)
    assert payload["metric"] == "fol" and payload["options"] == {"eps": 0.1, "norm": "l2", "label": "true"}
    torch.testing.assert_close(payload["scores"], expected)
    assert torch.equal(payload["labels"], y[:100]) and torch.equal(payload["index"], torch.arange(100))
    rows = list(csv.DictReader((out / "scores.csv").open()))
    assert len(rows) == 100 and list(rows[0]) == ["index", "score", "label"]
    assert float(rows[7]["score"]) == pytest.approx(float(expected[7]), rel=1e-6)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["count"] == 100 and summary["mean"] == pytest.approx(float(expected.double().mean()), rel=1e-6)
    assert summary["quantiles"]["q50"] == pytest.approx(float(torch.quantile(expected.double(), 0.5)), rel=1e-9)
    assert summary["min"] <= summary["quantiles"]["q05"] <= summary["quantiles"]["q95"] <= summary["max"]
    assert (out / "scores_hist.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = results_contract(out, "score")
    assert res["settings"] == {"checkpoint": str(ckpt), "dataset": "digits", "split": "test", "limit": 100,
                               "metric": "fol", "batch_size": 256, "eps": 0.1, "norm": "l2", "label": "true",
                               "device": "cpu"}
    assert res["count"] == summary["count"] and res["quantiles"] == summary["quantiles"]  # summary.json: a copy
    assert set(res["timings"]) == {"load_s", "score_s", "per_input_ms", "total_s"}
    assert "<img" in (out / "report.html").read_text()


@pytest.mark.parametrize("name", ["zol", "gini", "entropy", "margin", "max_prob", "fol_gradnorm"])
def test_score_other_metrics_match_the_library(ckpt, model, test_split, tmp_path, name, results_contract):
    assert _score(ckpt, tmp_path, "--metric", name, "--limit", "60") == 0
    settings = results_contract(tmp_path, "score")["settings"]
    assert ("label" in settings) == (name in ("zol", "fol_gradnorm"))  # options of other metrics are left out
    assert not {"eps", "norm", "k", "layers", "train_limit"} & set(settings)
    x, y = test_split
    got = torch.load(tmp_path / "scores.pt", weights_only=True)["scores"]
    torch.testing.assert_close(got, metrics.compute(name, model, x[:60], y[:60]))


def test_score_kmnc_and_select_coverage(ckpt, model, test_split, tmp_path, results_contract):
    out = tmp_path / "kmnc"
    assert _score(ckpt, out, "--metric", "kmnc", "--k", "5", "--limit", "80", "--train-limit", "300") == 0
    payload = torch.load(out / "scores.pt", weights_only=True)
    bits = payload["bits"]
    assert payload["options"] == {"k": 5}
    assert bits.dtype == torch.bool and bits.shape[0] == 80
    torch.testing.assert_close(payload["scores"], bits.float().sum(1) / bits.shape[1])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["set_coverage"] == pytest.approx(float(bits.any(0).float().mean()))
    res = results_contract(out, "score")
    assert res["settings"]["k"] == 5 and res["settings"]["train_limit"] == 300 and "eps" not in res["settings"]
    sel = tmp_path / "sel"
    assert main(["select", "--scores", str(out / "scores.pt"), "--n", "10", "--strategy", "coverage",
                 "--out", str(sel)]) == 0
    chosen = torch.load(sel / "selected.pt", weights_only=True)["indices"]
    assert torch.equal(chosen, selection.select(bits, 10, "coverage"))
    info = results_contract(sel, "select")
    assert info["cells_covered_by_selection"] == int(bits[chosen].any(0).sum())
    assert info["settings"] == {"scores": str(out / "scores.pt"), "strategy": "coverage", "n": 10, "fill": "total"}


def test_score_surprise(ckpt, tmp_path):
    pytest.importorskip("robustest.metrics.surprise")
    assert _score(ckpt, tmp_path, "--metric", "dsa", "--limit", "40", "--train-limit", "300") == 0
    s = torch.load(tmp_path / "scores.pt", weights_only=True)["scores"]
    assert s.shape == (40,) and bool(torch.isfinite(s).all()) and bool((s > 0).all())


def _tests_file(path: Path, test_split) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x, y = test_split
    x0_index = torch.arange(30) * 3
    g = torch.Generator().manual_seed(1)
    xt = (x[x0_index] + 0.1 * (torch.rand(x[x0_index].shape, generator=g) * 2 - 1)).clamp(0, 1)
    data.save_tests(path, xt, y[x0_index], x0_index, "test")
    return xt, y[x0_index], x0_index


def test_score_tests_file_against_seeds(ckpt, model, test_split, tmp_path, capsys):
    tf = tmp_path / "tests.pt"
    xt, yt, x0_index = _tests_file(tf, test_split)
    base = ["--checkpoint", str(ckpt), "--dataset", "tests", "--data-dir", str(tf), "--metric", "fol"]
    assert main(["score", *base, "--seeds-dataset", "digits", "--seeds-split", "test",
                 "--out", str(tmp_path / "a")]) == 0
    payload = torch.load(tmp_path / "a" / "scores.pt", weights_only=True)
    x0 = test_split[0][x0_index]
    torch.testing.assert_close(payload["scores"], metrics.fol(model, xt, yt, x0=x0))
    assert torch.equal(payload["x0_index"], x0_index)
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["fol_seed"].startswith("x0 = seeds")
    # without the seeds data set each test is its own seed
    capsys.readouterr()
    assert main(["score", *base, "--out", str(tmp_path / "b")]) == 0
    assert "warning: each test was scored as its own seed" in capsys.readouterr().err
    own = torch.load(tmp_path / "b" / "scores.pt", weights_only=True)["scores"]
    torch.testing.assert_close(own, metrics.fol(model, xt, yt))
    assert not torch.allclose(own, payload["scores"])
    # the tests file does not record the seeds' split: it must be given
    assert main(["score", *base, "--seeds-dataset", "digits", "--out", str(tmp_path / "c")]) == 2
    assert "--seeds-split" in _err(capsys)
    # a tests file that records its source refuses another seeds data set
    data.save_tests(tmp_path / "rec.pt", xt, yt, x0_index, "test", extra={"dataset": "mnist", "split": "test"})
    assert main(["score", "--checkpoint", str(ckpt), "--dataset", "tests", "--data-dir", str(tmp_path / "rec.pt"),
                 "--metric", "fol", "--seeds-dataset", "digits", "--out", str(tmp_path / "d")]) == 2
    assert "generated from 'mnist'" in _err(capsys)
    # selecting with --tests writes the chosen tests
    sel = tmp_path / "sel"
    assert main(["select", "--scores", str(tmp_path / "a" / "scores.pt"), "--n", "6", "--strategy", "best",
                 "--tests", str(tf), "--out", str(sel)]) == 0
    chosen = torch.load(sel / "selected.pt", weights_only=True)
    assert torch.equal(chosen["indices"], selection.select(payload["scores"], 6, "best"))
    picked = data.load_tests(sel / "selected_tests.pt")
    assert torch.equal(picked["x"], xt[chosen["indices"]]) and torch.equal(picked["x0_index"], chosen["x0_index"])


def test_select_kcenter_on_the_models_features(ckpt, model, test_split, tmp_path, capsys, results_contract):
    from robustest.metrics.activations import penultimate_features

    tf = tmp_path / "tests.pt"
    xt, _, _ = _tests_file(tf, test_split)
    # the scores name the tests in another order: the features must follow the scores' index
    index = torch.arange(30).flip(0)
    torch.save({"scores": torch.rand(30, generator=torch.Generator().manual_seed(0)), "index": index},
               tmp_path / "scores.pt")
    base = ["select", "--scores", str(tmp_path / "scores.pt"), "--n", "7", "--strategy", "kcenter"]
    assert main([*base, "--tests", str(tf), "--checkpoint", str(ckpt), "--seed", "3", "--out",
                 str(tmp_path / "sel")]) == 0
    results_contract(tmp_path / "sel", "select")
    chosen = torch.load(tmp_path / "sel" / "selected.pt", weights_only=True)
    expect = selection.select(penultimate_features(model, xt[index]), 7, "kcenter", seed=3)
    assert torch.equal(chosen["indices"], index[expect])
    picked = data.load_tests(tmp_path / "sel" / "selected_tests.pt")
    assert torch.equal(picked["x"], xt[chosen["indices"]])
    assert json.loads((tmp_path / "sel" / "results.json").read_text())["settings"]["seed"] == 3
    # kcenter needs the tests and a model, said before anything is written
    capsys.readouterr()
    assert main([*base, "--checkpoint", str(ckpt), "--out", str(tmp_path / "no")]) == 2
    assert "--tests" in _err(capsys) and not (tmp_path / "no").exists()
    assert main([*base, "--tests", str(tf), "--out", str(tmp_path / "no")]) == 2
    assert "--checkpoint" in _err(capsys) and not (tmp_path / "no").exists()
    assert main([*base[:-1], "random", "--checkpoint", str(ckpt), "--out", str(tmp_path / "no")]) == 2
    assert "applies to --strategy kcenter only" in _err(capsys) and not (tmp_path / "no").exists()


def test_select_strategies_fraction_csv_and_warning(tmp_path, capsys, results_contract):
    scores = torch.linspace(0, 1, 40) ** 3
    torch.save({"scores": scores, "metric": "fol"}, tmp_path / "s.pt")
    for strategy in [s for s in selection.names() if s not in ("coverage", "kcenter")]:  # kcenter: own test
        out = tmp_path / strategy
        assert main(["select", "--scores", str(tmp_path / "s.pt"), "--fraction", "0.25", "--strategy", strategy,
                     "--k", "3", "--seed", "4", "--out", str(out)]) == 0
        got = torch.load(out / "selected.pt", weights_only=True)
        assert torch.equal(got["indices"], selection.select(scores, 10, strategy, k=3, seed=4))
        torch.testing.assert_close(got["scores"], scores[got["indices"]])
        rows = list(csv.DictReader((out / "selected.csv").open()))
        assert [int(r["index"]) for r in rows] == got["indices"].tolist()
        settings = results_contract(out, "select")["settings"]
        assert ("k" in settings) == (strategy in ("kmst", "stratified"))
        assert ("seed" in settings) == (strategy in ("kmst", "random", "stratified", "fol-prop"))
        assert settings["fraction"] == 0.25 and "n" not in settings and "fill" not in settings
    # a scores.csv works as input
    (tmp_path / "s.csv").write_text("index,score\n" + "".join(f"{i},{float(v)}\n" for i, v in enumerate(scores)))
    assert main(["select", "--scores", str(tmp_path / "s.csv"), "--n", "5", "--strategy", "top",
                 "--out", str(tmp_path / "csv")]) == 0
    assert torch.load(tmp_path / "csv" / "selected.pt", weights_only=True)["indices"].tolist() == [39, 38, 37, 36, 35]
    capsys.readouterr()
    assert main(["select", "--scores", str(tmp_path / "s.pt"), "--n", "99", "--strategy", "random",
                 "--out", str(tmp_path / "all")]) == 0
    captured = capsys.readouterr()
    assert "robustest select: warning:" in captured.err and "whole pool" in captured.err  # warnings: stderr
    info = json.loads((tmp_path / "all" / "results.json").read_text())
    assert info["selected"] == 40 and info["warnings"]


def test_select_errors(tmp_path, capsys):
    torch.save({"scores": torch.tensor([0.1, float("nan"), 0.3])}, tmp_path / "nan.pt")
    torch.save({"scores": torch.rand(5)}, tmp_path / "ok.pt")
    assert main(["select", "--scores", str(tmp_path / "nan.pt"), "--n", "1", "--strategy", "best",
                 "--out", str(tmp_path / "o")]) == 2
    assert "NaN" in _err(capsys)
    assert main(["select", "--scores", str(tmp_path / "ok.pt"), "--n", "1", "--strategy", "coverage",
                 "--out", str(tmp_path / "o")]) == 2
    assert "covered cells" in _err(capsys)
    assert main(["select", "--scores", str(tmp_path / "missing.pt"), "--n", "1", "--strategy", "top",
                 "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in _err(capsys)
    (tmp_path / "bad.pt").write_bytes(b"not a torch file")
    assert main(["select", "--scores", str(tmp_path / "bad.pt"), "--n", "1", "--strategy", "top",
                 "--out", str(tmp_path / "o")]) == 2
    assert "scores file" in _err(capsys)
    with pytest.raises(SystemExit) as exc:
        main(["select", "--scores", str(tmp_path / "ok.pt"), "--n", "-3", "--strategy", "top", "--out", "x"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main(["select", "--scores", str(tmp_path / "ok.pt"), "--n", "2", "--fraction", "0.5", "--strategy", "top",
              "--out", "x"])


def test_score_errors(ckpt, tmp_path, capsys):
    assert _score(ckpt, tmp_path, "--metric", "fol", "--k", "3") == 2
    assert "--k does not apply" in _err(capsys)
    assert main(["score", "--checkpoint", str(ckpt), "--dataset", "tests", "--metric", "kmnc",
                 "--out", str(tmp_path)]) == 2
    assert "--data-dir" in _err(capsys)
    assert main(["score", "--checkpoint", str(tmp_path / "nope.pt"), "--dataset", "digits", "--metric", "zol",
                 "--out", str(tmp_path)]) == 2
    assert "does not exist" in _err(capsys)
    with pytest.raises(SystemExit) as exc:
        _score(ckpt, tmp_path, "--metric", "foo")
    assert exc.value.code == 2


@pytest.mark.slow
def test_generate_score_select_end_to_end(ckpt, tmp_path):
    gen = tmp_path / "gen"
    assert main(["generate", "--checkpoint", str(ckpt), "--dataset", "digits", "--split", "test", "--limit", "60",
                 "--method", "pgd", "--eps", "0.2", "--out", str(gen), "--no-progress"]) == 0
    tests = data.load_tests(gen / "tests.pt")
    assert main(["score", "--checkpoint", str(ckpt), "--dataset", "tests", "--data-dir", str(gen / "tests.pt"),
                 "--metric", "fol", "--eps", str(tests["extra"]["fol_eps"]), "--norm", tests["extra"]["fol_norm"],
                 "--seeds-dataset", "digits", "--out", str(tmp_path / "s"), "--no-progress"]) == 0
    scores = torch.load(tmp_path / "s" / "scores.pt", weights_only=True)["scores"]
    torch.testing.assert_close(scores, tests["fol"], rtol=1e-5, atol=1e-7)  # same FOL as the generator's
    assert main(["select", "--scores", str(tmp_path / "s" / "scores.pt"), "--fraction", "0.5", "--strategy", "kmst",
                 "--tests", str(gen / "tests.pt"), "--out", str(tmp_path / "sel")]) == 0
    picked = data.load_tests(tmp_path / "sel" / "selected_tests.pt")
    assert len(picked["x"]) == -(-len(tests["x"]) // 2)
