"""Tests of robustest.testing (assert_robust) and the pytest plugin (robustest.pytest_plugin)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from robustest.core.errors import ConfigError
from robustest.testing import assert_robust, robust_accuracy

SRC = str(Path(__file__).resolve().parents[2] / "src")
pytest_plugins = ["pytester"]


pytestmark = pytest.mark.usefixtures("one_thread")  # two shared cores: one intra-op thread


def test_assert_robust_passes_and_fails(trained_digits_model, digits_test):
    m = trained_digits_model
    res = robust_accuracy(m, digits_test, eps=0.1, attack=("apgd-ce", {"steps": 5}), limit=50)
    assert res.num_samples == 50 and 0 < res.robust_accuracy < 1
    ok = assert_robust(m, digits_test, eps=0.1, min_accuracy=res.robust_accuracy, attack=("apgd-ce", {"steps": 5}),
                       limit=50)
    assert ok.robust_accuracy == res.robust_accuracy  # seeded: the same verdict
    with pytest.raises(AssertionError, match=r"robust accuracy \d+\.\d+% < required") as e:
        assert_robust(m, digits_test, eps=0.1, min_accuracy=res.robust_accuracy + 0.01,
                      attack=("apgd-ce", {"steps": 5}), limit=50)
    assert "linf eps=0.1" in str(e.value) and "50 samples" in str(e.value) and "\n" not in str(e.value)
    # attack names and lists pick a custom ensemble; "fast" is evaluate's fast version
    weak = assert_robust(m, digits_test, eps=0.05, min_accuracy=0.0, attack=["fgsm", "bim"], limit=20,
                         accept_flags=["gradient-free-breaks"])  # the Square probe may find what they missed
    assert list(weak.attacks)[:2] == ["fgsm", "bim"] and set(weak.attacks) <= {"fgsm", "bim", "square-probe"}
    assert robust_accuracy(m, digits_test, eps=0.05, attack="fast", limit=10, n_targets=2).version == "fast"


def test_assert_robust_bad_input(trained_digits_model, digits_test):
    for bad in (1.5, -0.1, "high", True):
        with pytest.raises(ConfigError, match="min_accuracy"):
            assert_robust(trained_digits_model, digits_test, eps=0.1, min_accuracy=bad)
    with pytest.raises(ConfigError, match="limit"):
        assert_robust(trained_digits_model, digits_test, eps=0.1, min_accuracy=0.5, limit=0)
    with pytest.raises(ConfigError, match="attack"):
        assert_robust(trained_digits_model, digits_test, eps=0.1, min_accuracy=0.5, attack=3)


PLUGIN_TESTS = textwrap.dedent('''
    import pytest
    import torch
    from robustest import data, models
    from robustest.train import fit

    @pytest.fixture(scope="module")
    def model_and_data():
        torch.set_num_threads(1)
        train, test = data.load("digits", split="train"), data.load("digits", split="test")
        torch.manual_seed(0)
        model = models.create("mlp", input_size=8)
        x, y = train.tensors
        fit(model, (x[:600], y[:600]), epochs=2, seed=0, progress=False)
        return model, test

    @pytest.mark.robustness(eps=0.02, min_accuracy=0.0, attack=["fgsm"])
    def test_passes(assert_robust, model_and_data):
        res = assert_robust(*model_and_data)
        assert res.num_samples == LIMIT

    @pytest.mark.robustness(eps=0.3, min_accuracy=0.99, attack=["bim"])
    def test_fails(assert_robust, model_and_data):
        assert_robust(*model_and_data)

    def test_call_overrides_marker(assert_robust, model_and_data):
        assert_robust(*model_and_data, eps=0.01, min_accuracy=0.0, attack="fgsm")

    def test_plain():
        assert True
''')


def _run_pytest(tmp_path: Path, *args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, *(env_extra or {}).pop("PYTHONPATH", "").split(
        os.pathsep)]).rstrip(os.pathsep), "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_pytest_plugin(pytester: pytest.Pytester):
    # in process (no second torch import): the plugin enabled with -p, as from a source checkout
    pytester.makepyfile(test_model=PLUGIN_TESTS.replace("LIMIT", "30"))
    r = pytester.runpytest_inprocess("-p", "robustest.pytest_plugin", "--robustness-limit", "30", "-p",
                                     "no:cacheprovider")
    r.assert_outcomes(passed=3, failed=1)
    out = r.stdout.str()
    assert "robustness checks (robustest)" in out
    assert "ok     test_model.py::test_passes: robust" in out
    assert "FAILED test_model.py::test_fails: robust" in out and "required 99.00%" in out
    assert "< required 99.00%" in out  # the assertion message names both accuracies
    r2 = pytester.runpytest_inprocess("-p", "robustest.pytest_plugin", "--robustness-limit", "30", "-m",
                                      "robustness", "-k", "passes", "-p", "no:cacheprovider")
    r2.assert_outcomes(passed=1, deselected=3)


@pytest.mark.slow
def test_pytest_plugin_from_the_entry_point(tmp_path: Path):
    # what an installed robustest provides: a dist-info with the pytest11 entry point of pyproject.toml
    import tomllib

    ep = tomllib.loads((Path(SRC).parent / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    site = tmp_path / "site"
    info = site / "robustest_plugin_probe-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: robustest-plugin-probe\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in ep.items()))
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "test_model.py").write_text(PLUGIN_TESTS.replace("LIMIT", "20"))
    env = {"PYTHONPATH": str(site)}
    r = _run_pytest(proj, "--robustness-limit", "20", "-m", "robustness", "-k", "passes or plain",
                    env_extra=dict(env))
    assert r.returncode == 0 and "1 passed" in r.stdout and "3 deselected" in r.stdout, r.stdout + r.stderr
    # also enabled explicitly (conftest or -p): registered once, no error
    (proj / "conftest.py").write_text('pytest_plugins = ["robustest.pytest_plugin"]\n')
    r = _run_pytest(proj, "--robustness-limit", "20", "-k", "passes", env_extra=dict(env))
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
