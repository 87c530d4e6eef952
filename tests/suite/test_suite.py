"""Regression suites (``robustest.suite``, ``robustest suite build / check``, ``assert_no_regression``).

The statistics are checked by hand and against scipy; the gate end to end on digits: a suite of 60 test samples
built from an adversarially trained ``digits_cnn`` (3 epochs of PGD-5 training at eps 0.1 on top of the
conftest's 2-epoch model); checking the same model passes, checking the model before adversarial training
fails. The attacks are the ``fast`` ensemble (APGD-CE + APGD-T) to keep the default suite quick.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from robustest.cli import main
from robustest.core.errors import ConfigError, DataError
from robustest.selection.strata import allocate
from robustest.suite import Suite, build_suite, check_suite, model_fingerprint
from robustest.suite.build import MIN_PER_STRATUM, make_strata
from robustest.suite.format import SUITE_VERSION, content_sha256
from robustest.suite.stats import mcnemar_exact, paired_difference, stratified_estimate

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("one_thread")

EPS = 0.1


# ------------------------------------------------------------------------------------------------ statistics
@pytest.mark.parametrize("b, c", [(5, 1), (0, 4), (3, 3), (10, 2), (30, 17), (1, 0), (0, 1), (12, 0)])
def test_mcnemar_is_scipys_exact_binomial_test(b, c):
    from scipy.stats import binomtest

    one, two = mcnemar_exact(b, c)
    assert one == pytest.approx(binomtest(b, b + c, 0.5, alternative="greater").pvalue, rel=1e-12)
    assert two == pytest.approx(binomtest(b, b + c, 0.5).pvalue, rel=1e-12)
    assert mcnemar_exact(0, 0) == (1.0, 1.0)
    with pytest.raises(ConfigError):
        mcnemar_exact(-1, 2)


def test_stratified_estimate_by_hand():
    """Two strata of 40 and 60 samples (W = 0.4, 0.6); 4 suite samples each: 3/4 and 1/4 robust."""
    from scipy.stats import beta, t

    v = torch.tensor([1, 1, 1, 0, 0, 0, 1, 0], dtype=torch.float64)
    s = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    sizes = torch.tensor([40, 60])
    est = stratified_estimate(v, s, sizes)
    p = 0.4 * 0.75 + 0.6 * 0.25
    assert est.value == pytest.approx(p)

    def var_h(x: list[int]) -> float:  # one pseudo-observation, half at 0 and half at 1
        n = len(x)
        pt = (sum(x) + 0.5) / (n + 1)
        return (sum((xi - pt) ** 2 for xi in x) + 0.5 * pt ** 2 + 0.5 * (1 - pt) ** 2) / n

    v_st = 0.4 ** 2 * (1 - 4 / 40) * var_h([1, 1, 1, 0]) / 4 + 0.6 ** 2 * (1 - 4 / 60) * var_h([0, 0, 1, 0]) / 4
    assert est.std_error == pytest.approx(math.sqrt(v_st))
    n_eff = p * (1 - p) / v_st * (t.ppf(0.975, 7) / t.ppf(0.975, 6)) ** 2
    assert est.n_eff == pytest.approx(n_eff) and est.df == 6
    assert est.ci_low == pytest.approx(beta.ppf(0.025, p * n_eff, n_eff - p * n_eff + 1))
    assert est.ci_high == pytest.approx(beta.ppf(0.975, p * n_eff + 1, n_eff - p * n_eff))
    assert est.ci_low < est.value < est.ci_high


def test_estimate_behaves_at_zero_and_one():
    s = torch.tensor([0] * 5 + [1] * 5)
    sizes = torch.tensor([100, 100])
    zero, one = stratified_estimate(torch.zeros(10), s, sizes), stratified_estimate(torch.ones(10), s, sizes)
    assert zero.value == 0 and zero.ci_low == 0 and 0.2 < zero.ci_high < 0.5
    assert one.value == 1 and one.ci_high == 1 and 0.5 < one.ci_low < 0.8
    assert zero.ci_high == pytest.approx(1 - one.ci_low)
    # strata whose samples all agree but differ from each other: still a positive width
    mixed = stratified_estimate(torch.tensor([1.0] * 5 + [0.0] * 5), s, sizes)
    assert mixed.value == pytest.approx(0.5) and mixed.ci_low < 0.4 and mixed.ci_high > 0.6
    # every stratum taken whole: the value is exact
    census = stratified_estimate(torch.tensor([1.0, 0, 1, 1]), torch.tensor([0, 0, 1, 1]), torch.tensor([2, 2]))
    assert census.value == census.ci_low == census.ci_high == 0.75
    with pytest.raises(ConfigError):
        stratified_estimate(torch.ones(3), torch.tensor([0, 0, 2]), torch.tensor([5, 5, 5]))  # stratum 1 empty
    for ids in ([0, 1, 2], [-1, 0, 1]):  # 3 strata: ids 0..1 with 2 sizes, and a negative id
        with pytest.raises(ConfigError, match=r"^stratum ids must lie in 0\.\.1$"):
            stratified_estimate(torch.ones(3), torch.tensor(ids), torch.tensor([5, 5]))


def test_paired_difference():
    s = torch.tensor([0] * 10 + [1] * 10)
    sizes = torch.tensor([50, 150])
    base = torch.tensor([1.0] * 8 + [0.0] * 2 + [1.0] * 5 + [0.0] * 5)
    same = paired_difference(base, base, s, sizes)
    assert same.drop == 0 and same.b == same.c == 0 and same.p_value == 1 and same.ci_low < 0 < same.ci_high
    cand = base.clone()
    cand[[0, 1, 10, 11, 12]] = 0  # the candidate loses 2 samples in stratum 0, 3 in stratum 1
    d = paired_difference(base, cand, s, sizes)
    assert d.b == 5 and d.c == 0 and d.p_value == pytest.approx(1 / 32)
    assert d.drop == pytest.approx(0.25 * 0.2 + 0.75 * 0.3)
    assert d.ci_low < d.drop < d.ci_high and d.ci_low > 0  # every discordant pair in one direction
    rev = paired_difference(cand, base, s, sizes)
    assert rev.drop == pytest.approx(-d.drop) and rev.p_value == 1 and rev.c == 5


def test_allocation_and_strata():
    f = MIN_PER_STRATUM
    n = allocate(torch.tensor([10.0, 30.0, 60.0]), 20, torch.tensor([10, 30, 60]), f)
    assert n.tolist() == [2, 6, 12]
    n = allocate(torch.tensor([0.0, 1.0, 100.0]), 10, torch.tensor([5, 5, 100]), f)
    assert int(n.sum()) == 10 and int(n.min()) >= 2
    with pytest.raises(ConfigError):
        allocate(torch.ones(3), 5, torch.tensor([5, 5, 5]), f)  # 3 strata of at least 2 need K >= 6
    order = torch.arange(100).flip(0)  # position 99 is the weakest
    labels = torch.arange(100) % 2
    stratum, desc, crossed = make_strata(order, labels, 60, strata=4)
    counts = torch.bincount(stratum)
    assert crossed and len(desc) == 8 and int(counts.sum()) == 100 and set(counts.tolist()) <= {12, 13}
    assert [d["class"] for d in desc] == [0, 1] * 4 and [d["bin"] for d in desc] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(int(counts[2 * b] + counts[2 * b + 1]) == 25 for b in range(4))  # rank quartiles
    assert int(stratum[99]) // 2 == 0 and desc[0]["bin"] == 0  # the weakest samples are in bin 0
    stratum, desc, crossed = make_strata(order, labels, 10, strata=4)
    assert not crossed and len(desc) == 4 and all(d["class"] == -1 for d in desc)
    stratum, desc, _ = make_strata(order, labels, 6, strata=10)
    assert len(desc) == 3  # at most K / 2 strata
    with pytest.raises(ConfigError, match="cannot cross"):
        make_strata(order, labels, 10, strata=4, by_class="yes")


# --------------------------------------------------------------------------------------------- on digits
@pytest.fixture(scope="module")
def models(_trained_digits_session) -> dict[str, torch.nn.Module]:
    """``plain``: the conftest's 2-epoch digits_cnn; ``hardened``: the same after 3 epochs of PGD-5 training
    (clean + adversarial batch, Adam 1e-3) at eps 0.1."""
    from robustest import attacks, data

    torch.set_num_threads(1)
    plain = copy.deepcopy(_trained_digits_session).eval()
    hard = copy.deepcopy(plain)
    x, y = data.load("digits", split="train").tensors
    opt = torch.optim.Adam(hard.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        perm = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), 64):
            xb, yb = x[perm[i:i + 64]], y[perm[i:i + 64]]
            hard.eval()
            xa = attacks.pgd(hard, xb, yb, eps=EPS, steps=5, seed=i)
            hard.train()
            loss = torch.nn.functional.cross_entropy(hard(torch.cat([xb, xa])), torch.cat([yb, yb]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {"plain": plain, "hardened": hard.eval()}


@pytest.fixture(scope="module")
def suite(models) -> Suite:
    from robustest import data

    torch.set_num_threads(1)
    return build_suite(models["hardened"], data.load("digits", split="test"), EPS, k=60, version="fast",
                       dataset="digits", split="test")


@pytest.fixture(scope="module")
def files(tmp_path_factory, models, suite) -> dict[str, str]:
    from robustest.models.checkpoints import save_checkpoint

    root = tmp_path_factory.mktemp("suite")
    paths = {name: str(root / f"{name}.pt") for name in models}
    for name, m in models.items():
        save_checkpoint(paths[name], m)
    suite.save(root / "suite.pt")
    paths["suite"] = str(root / "suite.pt")
    return paths


def test_built_suite(suite, models):
    m = suite.meta
    assert len(suite) == 60 and m["n_population"] == 360 and sum(m["stratum_samples"]) == 60
    assert sum(m["stratum_sizes"]) == 360 and math.isclose(sum(m["stratum_weights"]), 1.0)
    assert len(m["stratum_sizes"]) == 4 and not m["strata"]["by_class"]  # 40 cells would need K >= 80
    assert torch.bincount(suite.stratum).tolist() == m["stratum_samples"] and min(m["stratum_samples"]) >= 2
    assert suite.x.dtype == torch.float32  # digits are multiples of 1/16, not of 1/255: stored as they are
    from robustest import data

    x, y = data.load("digits", split="test").tensors
    assert torch.equal(suite.images(), x[suite.index]) and torch.equal(suite.y, y[suite.index])
    assert m["baseline_sha256"] == model_fingerprint(models["hardened"]) != model_fingerprint(models["plain"])
    assert m["attack"] == {"eps": EPS, "norm": "linf", "version": "fast", "n_targets": None, "seed": 0,
                           "batch_size": 256}
    # weaker strata (bin 0 = lowest local robustness) are broken more often
    rob = [float(suite.robust[suite.stratum == h].double().mean()) for h in range(4)]
    assert rob[0] < rob[-1]


def test_check_same_model_passes_and_the_unhardened_one_regresses(suite, models):
    same = check_suite(models["hardened"], suite)
    assert same.regression is False and same.comparison.b == same.comparison.c == 0
    assert same.baseline_source == "stored" and torch.equal(same.outcomes["robust"], suite.robust)
    worse = check_suite(models["plain"], suite)
    assert worse.regression is True and worse.verdict == "regression"
    c = worse.comparison
    assert c.b > c.c and c.p_value < 0.05 and c.drop > 0.02 and c.ci_low > 0
    assert "REGRESSION" in worse.message() and "McNemar" in worse.message()



def test_verdict_rule(suite, models, monkeypatch):
    """Regression = exact McNemar p < alpha AND drop > max_drop (the candidate's outcomes fixed: half the
    baseline's robust samples broken)."""
    from robustest.suite import check as check_mod

    robust = suite.robust.clone()
    robust[robust.nonzero().flatten()[::2]] = False
    fixed = {"clean": suite.clean, "robust": robust, "corruption": suite.corruption, "seconds": {}}
    monkeypatch.setattr(check_mod, "evaluate_outcomes", lambda *a, **k: fixed)
    res = check_suite(models["plain"], suite)
    c = res.comparison
    assert res.regression and c.c == 0 and c.b == int(suite.robust.sum()) - int(robust.sum())
    assert check_suite(models["plain"], suite, max_drop=min(1.0, c.drop + 0.01)).regression is False
    assert check_suite(models["plain"], suite, max_drop=max(0.0, c.drop - 0.01)).regression is True
    assert check_suite(models["plain"], suite, alpha=c.p_value / 2).regression is False
    assert check_suite(models["plain"], suite, baseline=False).regression is None
    assert check_suite(models["plain"], suite, baseline=False).verdict == "no baseline"


def test_assert_no_regression(suite, models, files):
    from robustest.testing import assert_no_regression

    with pytest.raises(AssertionError, match="REGRESSION: robust accuracy"):
        assert_no_regression(models["plain"], files["suite"])
    with pytest.raises(ConfigError, match="alpha"):
        assert_no_regression(models["plain"], suite, alpha=1.5)
    with pytest.raises(ConfigError, match="needs|pass the baseline"):
        assert_no_regression(models["plain"], suite, version="standard")


def test_a_masked_candidate_fails_the_gate_as_unreliable(suite, models, tmp_path: Path, capsys):
    """A candidate that hides its gradients (a quantiser in front of the baseline) looks as robust as the
    baseline to the gradient attacks; its evaluation is flagged, so the gate fails unless the flag is accepted."""
    from masked_zoo import Quantized
    from robustest.testing import assert_no_regression

    masked = Quantized(models["hardened"], 16).eval()
    res = check_suite(masked, suite)
    assert "zero-gradient" in res.blocking_flags and res.failed and res.verdict in ("unreliable", "regression")
    assert res.to_dict()["blocking_flags"] == res.blocking_flags and res.to_dict()["failed"] is True
    if not res.regression:
        assert "UNRELIABLE: the evaluation is flagged zero-gradient" in res.message()
        with pytest.raises(AssertionError, match="UNRELIABLE"):
            assert_no_regression(masked, suite)
        ok = assert_no_regression(masked, suite, accept_flags=res.blocking_flags)
        assert ok.verdict == "pass" and ok.accepted_flags == tuple(res.blocking_flags)
    with pytest.raises(ConfigError, match="unknown flag"):
        check_suite(masked, suite, accept_flags=["masked"])
    ts = tmp_path / "masked.ts"
    torch.jit.script(masked).save(str(ts))
    code = main(["suite", "check", "--suite", str(suite.save(tmp_path / "s.pt")),
                 "--torchscript", "--checkpoint", str(ts), "--out", str(tmp_path / "o"), "--no-progress"])
    assert code == 1
    assert "flag unreliable zero-gradient" in capsys.readouterr().err
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    assert "zero-gradient" in doc["blocking_flags"] and doc["failed"] is True


def test_format_round_trip_and_refusals(suite, tmp_path: Path):
    path = suite.save(tmp_path / "s.pt")
    raw = torch.load(path, weights_only=True)  # plain data: no unpickling of objects
    assert raw["format"] == "robustest-suite" and raw["version"] == 1 and SUITE_VERSION == 2  # 2: certified outcomes
    back = Suite.load(path)
    for k, t in suite.tensors().items():
        assert torch.equal(getattr(back, k), t), k
    assert back.meta == json.loads(json.dumps(suite.meta))
    # tampered: one outcome flipped, the hash left as it was
    bad = copy.deepcopy(raw)
    bad["tensors"]["robust"][0] = ~bad["tensors"]["robust"][0]
    torch.save(bad, tmp_path / "tampered.pt")
    with pytest.raises(DataError, match="does not match its SHA-256"):
        Suite.load(tmp_path / "tampered.pt")
    bad = copy.deepcopy(raw)
    bad["meta"]["attack"]["eps"] = 0.3
    torch.save(bad, tmp_path / "tampered_meta.pt")
    with pytest.raises(DataError, match="altered"):
        Suite.load(tmp_path / "tampered_meta.pt")
    newer = {**raw, "version": SUITE_VERSION + 1}
    torch.save(newer, tmp_path / "newer.pt")
    with pytest.raises(DataError, match="newer than this robustest reads"):
        Suite.load(tmp_path / "newer.pt")
    # consistent hash but inconsistent fields
    bad = copy.deepcopy(raw)
    bad["tensors"]["stratum"][:] = 0
    bad["sha256"] = content_sha256(bad["meta"], bad["tensors"])
    torch.save(bad, tmp_path / "inconsistent.pt")
    with pytest.raises(DataError, match="damaged suite"):
        Suite.load(tmp_path / "inconsistent.pt")
    torch.save({"format": "robustest-analysis"}, tmp_path / "other.pt")
    with pytest.raises(DataError, match="not a robustest suite"):
        Suite.load(tmp_path / "other.pt")
    with pytest.raises(DataError, match="does not exist"):
        Suite.load(tmp_path / "missing.pt")


def test_cli_check_exit_codes(files, tmp_path: Path, capsys):
    from conftest import check_results

    rc = main(["suite", "check", "--suite", files["suite"], "--checkpoint", files["hardened"], "--out",
               str(tmp_path / "same"), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "no regression" in out
    doc = check_results(tmp_path / "same", "suite")
    assert doc["verdict"] == "pass" and doc["baseline_source"] == "stored" and doc["command"] == "check"
    e = doc["estimate"]
    assert e["ci_low"] <= e["robust_accuracy"] <= e["ci_high"] and e["robust_accuracy"] == e["value"]
    assert (tmp_path / "same" / "report.html").is_file()
    # the baseline given as a checkpoint with the suite's weights: its stored outcomes are reused
    rc = main(["suite", "check", "--suite", str(Path(files["suite"]).parent), "--checkpoint", files["plain"],
               "--baseline", files["hardened"], "--out", str(tmp_path / "worse"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and "regression" in err and len(err.strip().splitlines()) == 1
    doc = check_results(tmp_path / "worse", "suite")
    assert doc["verdict"] == "regression" and doc["baseline_source"] == "stored"
    assert doc["comparison"]["p_value"] < 0.05 and doc["comparison"]["drop"] > 0.02
    html = (tmp_path / "worse" / "report.html").read_text()
    assert "REGRESSION" in html and "McNemar" in html
    # the samples the candidate breaks are shown (b of them broken only by the candidate, c saved only by it)
    b, c = doc["comparison"]["b"], doc["comparison"]["c"]
    assert f"({b} broken by the candidate only, {c} kept robust by the candidate only" in html
    assert "data:image/png;base64," in html.split("Samples")[-1]
    same = (tmp_path / "same" / "report.html").read_text()
    assert "no outcome differs from the baseline" in same and "data:image/png;base64," in same.split("Samples")[-1]


@pytest.mark.parametrize("argv, message", [
    (["--suite", "/nonexistent/suite.pt"], "does not exist"),
    (["--version", "standard"], "pass --baseline"),
    (["--no-baseline", "--baseline", "x.pt"], "exclude each other"),
    (["--alpha", "1.5"], "significance level"),
    (["--max-drop", "150%"], "in [0, 1]"),
])
def test_cli_check_bad_input(files, tmp_path: Path, capsys, argv, message):
    base = {"--suite": files["suite"], "--checkpoint": files["plain"], "--out": str(tmp_path / "o")}
    for i in range(0, len(argv), 2):
        base.pop(argv[i], None)
    args = [a for kv in base.items() for a in kv] + argv
    try:
        rc = main(["suite", "check", *args])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1 and "suite" in err
    assert not (tmp_path / "o").exists()


def test_cli_build(files, tmp_path: Path, capsys):
    from conftest import check_results

    out = tmp_path / "b"
    rc = main(["suite", "build", "--checkpoint", files["hardened"], "--dataset", "digits", "--limit", "100",
               "--eps", str(EPS), "--version", "fast", "--k", "12", "--strata", "3", "--neighbors", "4",
               "--corruptions", "fog,contrast", "--severities", "3", "--out", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "results.json", "suite.pt"]
    doc = check_results(out, "suite")
    s = Suite.load(out / "suite.pt")
    assert doc["suite"]["k"] == len(s) == 12 and doc["suite"]["n_population"] == 100 and doc["suite"]["strata"] == 3
    assert s.corruption.shape == (12, 2) and s.meta["corruption"]["settings"] == [["fog", 3], ["contrast", 3]]
    assert doc["settings"]["command"] == "build" and doc["settings"]["k"] == 12
    assert "corruption_accuracy" in doc["baseline"]
    rc = main(["suite", "check", "--suite", str(out), "--checkpoint", files["hardened"], "--out",
               str(tmp_path / "c"), "--no-progress"])
    assert rc == 0
    doc = check_results(tmp_path / "c", "suite")
    assert doc["corruption_comparison"]["drop"] == 0 and "corruption" in doc


def test_pytest_fixture(pytester: pytest.Pytester, files):
    pytester.makepyfile(test_gate=f'''
import torch
from robustest.models.checkpoints import load_checkpoint, save_checkpoint

def test_gate(assert_no_regression):
    torch.set_num_threads(1)
    model = load_checkpoint({files["plain"]!r})
    assert_no_regression(model, {files["suite"]!r})
''')
    r = pytester.runpytest_inprocess("-p", "robustest.pytest_plugin", "-p", "no:cacheprovider")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*robustness checks (robustest)*", "FAILED*test_gate*REGRESSION: robust accuracy*"])


@pytest.mark.slow
def test_interval_contains_the_full_split_robust_accuracy(suite, models):
    """The suite's interval for each model contains that model's robust accuracy on the whole test split
    (the same fast ensemble and seed)."""
    from robustest import data
    from robustest.evaluate import evaluate

    test = data.load("digits", split="test")
    for name, model in models.items():
        full = evaluate(model, test, EPS, version="fast").robust_accuracy
        res = check_suite(model, suite, baseline=False)
        assert res.robust.ci_low <= full <= res.robust.ci_high, (name, full, res.robust)


@pytest.mark.slow
def test_under_torchrun_the_same_suite_and_verdict(files, tmp_path: Path):
    """`suite build` on 2 ranks writes the same file, byte for byte, as one process; `suite check` on 2 ranks
    gives the same verdict (exit 1 on both ranks, one line on stderr)."""
    import os
    import shutil
    import socket
    import subprocess
    import sys

    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun not found")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def port() -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return str(s.getsockname()[1])

    build = ["suite", "build", "--checkpoint", files["hardened"], "--dataset", "digits", "--limit", "120", "--eps",
             str(EPS), "--version", "fast", "--k", "20", "--neighbors", "5", "--quiet"]
    one = subprocess.run([sys.executable, "-m", "robustest", *build, "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, env=env, timeout=600)
    two = subprocess.run([torchrun, "--nproc-per-node=2", f"--master-port={port()}", "-m", "robustest", *build,
                          "--out", str(tmp_path / "two")], capture_output=True, text=True, env=env, timeout=600)
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    assert (tmp_path / "one" / "suite.pt").read_bytes() == (tmp_path / "two" / "suite.pt").read_bytes()
    assert json.loads((tmp_path / "two" / "results.json").read_text())["world_size"] == 2
    check = subprocess.run([torchrun, "--nproc-per-node=2", f"--master-port={port()}", "-m", "robustest", "suite",
                            "check", "--suite", str(tmp_path / "two"), "--checkpoint", files["plain"], "--out",
                            str(tmp_path / "check"), "--quiet"], capture_output=True, text=True, env=env, timeout=600)
    assert check.returncode != 0 and check.stderr.count("robustest suite: robust accuracy dropped") == 1
    doc = json.loads((tmp_path / "check" / "results.json").read_text())
    assert doc["verdict"] == "regression" and doc["world_size"] == 2
