"""Result objects print as one short line of sizes and key figures, never their tensors' contents (an
AttackResult of a few hundred images used to print 20,000 characters)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from robustest import attacks, fuzzing, metrics
from robustest import evaluate as ev
from robustest import weakrobust as wr
from robustest.fuzzing.mutations import mutate
from robustest.metrics.activations import Traces
from robustest.robot import Pool
from robustest.train import History, fit

N = 500


def check(obj: object, *figures: str) -> str:
    r = repr(obj)
    assert "\n" not in r and len(r) <= 260, r
    assert r.startswith(type(obj).__name__ + "(") and r.endswith(")"), r
    assert "tensor(" not in r, r  # no contents
    assert not re.search(r"\.0*[1-9]\d{4,}", r), r  # figures rounded to 4 significant digits
    for f in figures:
        assert f in r, (f, r)
    return r


def test_attack_result_repr(digits_model, digits_test) -> None:
    x, y = digits_test.tensors
    res = attacks.attack("fgsm", digits_model, (x, y), eps=0.1)
    r = check(res, "name='fgsm'", f"n={len(x)}", "eps=0.1", f"adv=<{len(x)}x1x8x8 float32>", "success_rate=")
    assert f"success_rate={res.success_rate:.4g}" in r


def test_training_history_repr(digits_model, digits_train) -> None:
    x, y = digits_train.tensors
    hist = fit(digits_model, (x[:128], y[:128]), epochs=2, batch_size=64, val=(x[128:256], y[128:256]),
                        progress=False)
    check(hist, "epochs=2", "val_accuracy=", "loss=")
    check(History(), "epochs=0", "loss=None")


def test_robustness_results_repr() -> None:
    g = torch.Generator().manual_seed(0)
    fixed = ev.FixedAdversarialSet(x=torch.rand(N, 3, 32, 32, generator=g), y=torch.zeros(N, dtype=torch.long),
                                           source_index=torch.arange(N), method=["fgsm"] * 200 + ["pgd"] * 300,
                                           eps=0.03, num_source=1000)
    check(fixed, f"n={N}", "by_attack={'fgsm': 200, 'pgd': 300}", "x=<500x3x32x32 float32>")
    acc = {c: {s: 0.5 + 0.01 * s for s in range(1, 6)} for c in ("fog", "snow", "contrast")}
    cres = ev.CorruptionResult(accuracy=acc, clean_accuracy=0.9, num_samples=N, severities=(1, 2, 3, 4, 5),
                                       seed=0)
    check(cres, "clean_accuracy=0.9", "corruptions=3", "severities=(1, 2, 3, 4, 5)", "mce=0.47")
    rep = ev.RobustnessReport(clean_accuracy=0.98, fixed_set_accuracy=0.5, fixed_set_size=N,
                                      whitebox_pgd_accuracy=0.2, whitebox_apgd_accuracy=0.1, whitebox_accuracy=0.1,
                                      eps=0.3, num_eval=1000, num_whitebox=500, corruption=cres.to_dict(),
                                      settings={"pgd_steps": 20})
    check(rep, "clean_accuracy=0.98", "whitebox_accuracy=0.1", "fixed_set_size=500")


def test_weakrobust_results_repr(digits_model, digits_train) -> None:
    x, y = digits_train.tensors
    a = wr.analyze(digits_model, (x, y), n_neighbors=4)
    check(a, f"n={len(x)}", "n_neighbors=4", "noise='uniform'", "mean_score=")
    ws = wr.select_weak(a, k=30)
    check(ws, "n=30", "rule='top_k'", "k=30", f"n_analysed={len(x)}")
    val = wr.validate(digits_model, (x, y), ws, perturbations=["fgsm", "gaussian_noise"], eps=(0.1,),
                      severities=(1, 3))
    check(val, "n=30", "attack_runs=1", "corruption_runs=2", "clean_error=")
    res = wr.enhance(digits_model, (x[:64], y[:64]), ["fog"], epochs=1, adversarial=False, batch_size=64)
    check(res, "epochs=1", "pool=10", "weaknesses=1")


def test_pool_and_fuzzing_results_repr(digits_model, digits_test) -> None:
    x, y = digits_test.tensors
    pool = Pool(x=torch.rand(N, 1, 28, 28), y=torch.zeros(N, dtype=torch.long), x0_index=torch.arange(N),
                method=["fgsm", "pgd"] * (N // 2), fol=torch.rand(N))
    check(pool, f"n={N}", "by_method={'fgsm': 250, 'pgd': 250}", "x=<500x1x28x28 float32>")
    res = fuzzing.fol_fuzz(digits_model, x[:20], y[:20], steps=3, seed=0)
    check(res, f"tests={len(res)}", "seeds=20", f"x=<{len(res)}x1x8x8 float32>")
    prof = metrics.CoverageProfile.build(digits_model, x[:100])
    cres = fuzzing.coverage_fuzz(digits_model, x[:10], y[:10], prof, iterations=2, seed=0)
    check(cres, "seeds=10", f"iterations={cres.stats['iterations']}", "coverage_final=")
    batch = mutate(x[:50], torch.Generator().manual_seed(0))
    check(batch, "n=50", "valid=", "x=<50x1x8x8 float32>")
    tr = Traces(acts=torch.rand(N, 300), logits=torch.rand(N, 10), index=torch.arange(N), sizes=[100, 200])
    check(tr, f"n={N}", "acts=<500x300 float32>", "layers=2")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_repr_names_the_device() -> None:
    pool = Pool(x=torch.rand(4, 1, 8, 8, device="cuda"), y=torch.zeros(4, dtype=torch.long),
                x0_index=torch.arange(4), method=["fgsm"] * 4, fol=torch.rand(4))
    assert "4x1x8x8 float32 cuda:0" in repr(pool)


def test_repr_helpers_round_and_truncate() -> None:
    from robustest.core import reprs

    assert reprs.number(0.123456789) == "0.1235" and reprs.number(3) == "3" and reprs.number(None) == "None"
    assert reprs.counts({str(i): i for i in range(6)}) == "{'0': 0, '1': 1, '2': 2, '3': 3, ... 2 more}"
    assert reprs.shape(torch.zeros(2, 3, dtype=torch.uint8)) == "<2x3 uint8>"
    assert np.isnan(float("nan"))  # nan prints as nan
    assert reprs.number(float("nan")) == "nan"
