"""The ``robustest harden`` verb: results.json, report, checkpoint, resume, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from robustest.cli import main
from robustest.models.checkpoints import load_checkpoint
from robustest.train import harden_pipeline, hardening
from robustest.train.state import STATE_FILES

TINY = ["--dataset", "digits", "--limit", "200", "--eps", "0.2", "--epochs", "2", "--steps", "3",
        "--batch-size", "64", "--test-limit", "60", "--whitebox-limit", "30", "--whitebox-pgd-steps", "3",
        "--whitebox-restarts", "1", "--apgd-steps", "3", "--val-size", "20", "--val-steps", "2", "--no-progress"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A digits_cnn checkpoint trained 5 epochs on the first 300 digits (one thread)."""
    from robustest import data, models
    from robustest.models.checkpoints import save_checkpoint
    from robustest.train import fit

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    x, y = data.load("digits", split="train").tensors
    torch.manual_seed(0)
    m = models.create("digits_cnn", input_size=8, mean=float(x.mean()), std=float(x.std()))
    fit(m, (x[:300], y[:300]), epochs=5, seed=0, progress=False)
    path = tmp_path_factory.mktemp("harden_ckpt") / "model.pt"
    save_checkpoint(path, m, metadata={"dataset": "digits"})
    yield str(path)
    torch.set_num_threads(threads)


def test_harden_verb_writes_model_results_and_report(checkpoint, tmp_path, capsys, results_contract):
    out = tmp_path / "out"
    rc = main(["harden", "--checkpoint", checkpoint, *TINY, "--method", "fol-budget", "--fol-threshold", "0.2",
               "--steps", "6", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "before" in text and "after" in text and "passes" in text
    res = results_contract(out, "harden")
    assert res["format"] == "robustest-harden-results" and res["version"] == 1 and res["world_size"] == 1
    s = res["settings"]
    assert s["method"] == "fol-budget" and s["eps"] == 0.2 and s["steps"] == 6 and s["fol_threshold"] == 0.2
    assert s["alpha"] == pytest.approx(2.5 * 0.2 / 6) and s["stop_misclassified"] is True
    assert set(res["timings"]) >= {"load_s", "before_s", "harden_s", "after_s", "total_s"}
    for key in ("before", "after"):
        r = res[key]
        assert r["num_eval"] == 60 and r["num_whitebox"] == 30
    assert len(res["epochs"]) == 2 and res["data"]["num_train"] == 200
    assert res["compute"]["passes"] == pytest.approx(sum(e["compute"]["passes"] for e in res["epochs"]))
    assert res["compute"]["passes"] < 2 * 200 * (6 + 1)  # fol-budget stops some samples early
    assert all("val_pgd_accuracy" in e for e in res["epochs"])
    assert res["data"]["num_val"] == 20 and res["data"]["num_fit"] == 180
    best = max(range(2), key=lambda i: (res["epochs"][i]["val_pgd_accuracy"], i))
    assert res["kept_epoch"] == res["best_epoch"] == best + 1 and res["settings"]["keep"] == "best"
    assert (res["last"] is None) == (best == 1) and (out / "last.pt").is_file() == (best == 0)
    html = (out / "report.html").read_text()
    assert "robustest harden" in html and "Robustness before and after" in html and "data:image/png" in html
    hardened, original = load_checkpoint(out / "model.pt"), load_checkpoint(checkpoint)
    assert hardened.robustest_metadata["hardened"]["settings"]["method"] == "fol-budget"
    assert hardened.robustest_metadata["dataset"] == "digits"  # the original metadata is kept
    assert any(not torch.equal(a, b) for a, b in zip(hardened.state_dict().values(), original.state_dict().values()))
    # the before/after figures are those of the two models on the first 60 test images (attacks on the first 30)
    from robustest import data
    from robustest.evaluate import measure

    xt, yt = data.load("digits", split="test").tensors
    for key, model in (("before", original), ("after", hardened)):
        want = measure(model, (xt[:60], yt[:60]), eps=0.2, whitebox=True, whitebox_limit=30, pgd_steps=3,
                       pgd_restarts=1, apgd_steps=3, seed=0, autoattack=False).to_dict()
        for fig in ("clean_accuracy", "whitebox_accuracy", "whitebox_pgd_accuracy", "whitebox_apgd_accuracy"):
            assert res[key][fig] == want[fig], (key, fig)
    # running again into the same folder needs --resume
    rc = main(["harden", "--checkpoint", checkpoint, *TINY, "--method", "fol-budget", "--fol-threshold", "0.2",
               "--steps", "6", "--out", str(out)])
    assert rc == 2 and "--resume" in capsys.readouterr().err


def test_pgd_at_compute_in_results_is_analytic(checkpoint, tmp_path):
    out = tmp_path / "pgd"
    assert main(["harden", "--checkpoint", checkpoint, *TINY, "--val-size", "0", "--keep", "last", "--out",
                 str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["compute"]["passes"] == pytest.approx(2 * 200 * (3 + 1))
    assert "val_pgd_accuracy" not in res["epochs"][0]


def test_interrupted_run_resumes_to_the_same_model(checkpoint, tmp_path, monkeypatch, capsys):
    full, part = tmp_path / "full", tmp_path / "part"
    args = ["harden", "--checkpoint", checkpoint, *TINY, "--epochs", "3", "--method", "trades"]
    assert main([*args, "--out", str(full)]) == 0
    real = hardening.harden

    def interrupted(*a, **kw):
        def stop(epoch, model, record):
            if epoch == 2:
                raise KeyboardInterrupt

        return real(*a, **kw, on_epoch_end=stop)

    monkeypatch.setattr(harden_pipeline, "harden", interrupted)  # the pipeline's own reference
    assert main([*args, "--out", str(part)]) == 130
    monkeypatch.setattr(harden_pipeline, "harden", real)
    capsys.readouterr()
    assert main([*args, "--beta", "3", "--out", str(part), "--resume"]) == 2  # other settings: refused
    assert "other settings" in capsys.readouterr().err
    assert main([*args, "--out", str(part), "--resume"]) == 0
    a, b = load_checkpoint(full / "model.pt").state_dict(), load_checkpoint(part / "model.pt").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = json.loads((full / "results.json").read_text()), json.loads((part / "results.json").read_text())
    assert rb["resumed_epochs"] == 2 and ra["after"] == rb["after"] and ra["compute"] == rb["compute"]


def test_from_scratch_trains_a_zoo_model_and_measures_autoattack(tmp_path, capsys, results_contract):
    out = tmp_path / "scratch"
    args = ["harden", "--model", "digits_cnn", *TINY, "--limit", "300", "--epochs", "3", "--autoattack", "fast",
            "--eps-warmup", "0.5"]
    assert main([*args, "--from-scratch", "--out", str(out)]) == 0
    res = results_contract(out, "harden")
    s = res["settings"]
    assert s["from_scratch"] is True and s["model"] == "digits_cnn" and s["autoattack"] == "fast"
    assert "schedule" not in s and s["eps_warmup"] == 0.5 and s["optimizer"] == "adam" and s["lr"] == 1e-3
    assert res["before"]["clean_accuracy"] < 0.3  # random weights
    assert 0.0 <= res["autoattack_accuracy"] == res["after"]["autoattack_accuracy"] <= res["after"]["whitebox_accuracy"]
    assert [e["eps"] for e in res["epochs"]][-1] == 0.2 and res["epochs"][0]["eps"] < 0.2  # the warm-up
    assert [e["lr"] for e in res["epochs"]] == [1e-3] * 3  # a constant rate by default
    assert [e["epoch"] for e in res["epochs"]] == [1, 2, 3] and res["kept_epoch"] in (1, 2, 3)
    model = load_checkpoint(out / "model.pt")
    assert model.robustest_metadata["hardened"]["from_scratch"] is True
    assert "validation robustness and clean accuracy against training compute" in (out / "report.html").read_text()
    # the same seed gives the same initial weights and so the same model
    assert main([*args, "--from-scratch", "--out", str(tmp_path / "again")]) == 0
    a, b = model.state_dict(), load_checkpoint(tmp_path / "again" / "model.pt").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "no")]) == 2  # a zoo name without --from-scratch
    err = capsys.readouterr().err
    assert "--from-scratch" in err and err.count("\n") == 1


@pytest.mark.parametrize("extra, match", [
    (["--keep", "best", "--val-size", "0"], "keep best picks the epoch"),
    (["--val-size", "50"], "more than a tenth"),
    (["--eps-warmup", "1"], "eps_warmup"),
    (["--schedule", "cyclic", "--warmup-epochs", "1"], "cyclic schedule has its own warm_up"),
    (["--co-guard"], "unrecognized"),
    (["--no-co-guard"], "co_guard applies to method fast_at / n_fgsm / grad_align only"),
    (["--eps", "1.5"], "eps"),
    (["--eps", "nan"], "eps"),
    (["--method", "fol-budget", "--fol-threshold", "inf"], "fol_threshold"),
    (["--method", "fosc", "--fosc-c-max", "nan"], "fosc_c_max"),
    (["--beta", "2"], "trades only"),
    (["--method", "fast-at", "--steps", "4"], "one step"),
])
def test_bad_input_is_one_line_exit_2_before_any_work(extra, match, checkpoint, tmp_path, capsys):
    out = tmp_path / "bad"
    try:
        rc = main(["harden", "--checkpoint", checkpoint, *TINY, *extra, "--out", str(out)])
    except SystemExit as exc:  # refused by the parser (non-finite numbers)
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and match in err.replace("-", "_") and err.count("\n") == 1
    assert not out.exists()  # nothing was started


def test_bad_arguments_rejected_by_the_parser(checkpoint, tmp_path, capsys):
    for extra in (["--epochs", "0"], ["--method", "madry"], ["--eps", "abc"]):
        with pytest.raises(SystemExit) as info:
            main(["harden", "--checkpoint", checkpoint, *TINY, *extra, "--out", str(tmp_path / "x")])
        assert info.value.code == 2
        assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.freeze is deprecated in 2.13
def test_a_frozen_model_is_refused(tmp_path, capsys):
    from robustest import models

    m = models.create("mlp", input_size=8)
    path = tmp_path / "frozen.pt"
    torch.jit.save(torch.jit.freeze(torch.jit.script(m.eval())), str(path))
    rc = main(["harden", "--checkpoint", str(path), "--torchscript", *TINY, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "no trainable parameters" in err and err.count("\n") == 1


@pytest.mark.slow
def test_killed_process_resumes_to_the_same_model(checkpoint, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "robustest", "harden", "--checkpoint", checkpoint, *TINY, "--limit", "600",
           "--epochs", "4", "--steps", "5", "--method", "pgd-at"]
    subprocess.run([*cmd, "--out", str(tmp_path / "full")], check=True, env=env, capture_output=True, timeout=600)
    killed = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, "--out", str(killed)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    state = killed / "state" / STATE_FILES["harden"]
    deadline = time.time() + 300
    while not state.is_file() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed: make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "model.pt").exists()
    done = subprocess.run([*cmd, "--out", str(killed), "--resume"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    res = json.loads((killed / "results.json").read_text())
    assert res["resumed_epochs"] >= 1
    a = load_checkpoint(tmp_path / "full" / "model.pt").state_dict()
    b = load_checkpoint(killed / "model.pt").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_default_validation_split_fits_small_data(checkpoint, tmp_path, capsys):
    """The default --val-size is 1000 images, at most a tenth of the training data: 200 digits hold out 20, with
    no flag (a new user's first run on a small set must not fail)."""
    i = TINY.index("--val-size")
    tiny = TINY[:i] + TINY[i + 2:]
    out = tmp_path / "v"
    assert main(["harden", "--checkpoint", checkpoint, *tiny, "--epochs", "1", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["data"]["num_val"] == 20 and res["settings"]["val_size"] == 20 and res["data"]["num_fit"] == 180
    capsys.readouterr()
    rc = main(["harden", "--checkpoint", checkpoint, *tiny, "--limit", "9", "--out", str(tmp_path / "few")])
    err = capsys.readouterr().err
    assert rc == 2 and "too few to hold out a validation split" in err and err.count("\n") == 1


@pytest.mark.parametrize("method, flags, key, value", [
    ("fast-at", ["--no-clamp-start", "--eps-train", "0.24"], "clamp_start", False),
    ("n-fgsm", ["--noise", "1.5"], "noise", 1.5),
    ("grad-align", ["--grad-align-lambda", "0.5"], "grad_align_lambda", 0.5),
])
def test_single_step_remedies_run_from_the_cli(method, flags, key, value, checkpoint, tmp_path, capsys,
                                               results_contract):
    i = TINY.index("--steps")
    tiny = TINY[:i] + TINY[i + 2:]
    out = tmp_path / method
    assert main(["harden", "--checkpoint", checkpoint, *tiny, "--method", method, *flags, "--out", str(out)]) == 0
    res = results_contract(out, "harden")  # the schema knows the method and its options
    s = res["settings"]
    alpha = 0.3 if method == "fast-at" else 0.2  # 1.25 * the training radius 0.24, else eps
    assert (s["method"], s["steps"], s["alpha"], s[key], s["co_guard"]) == (method, 1, pytest.approx(alpha), value,
                                                                             True)
    assert s["eps_train"] == (0.24 if method == "fast-at" else s["eps"])
    if method == "n-fgsm":
        assert s.get("clip") is None  # not clamped (None settings are left out)
    # N images per epoch: fast-at and n-fgsm 2 N passes; grad-align (N + 2 N forwards + 2 (N + 4 N) backwards) / 3
    n = res["data"]["num_fit"]
    per = {"fast-at": 2.0, "n-fgsm": 2.0, "grad-align": (1 + 2 + 2 * (1 + 4)) / 3}[method]
    assert res["epochs"][0]["compute"]["passes"] == pytest.approx(per * n)


@pytest.mark.parametrize("rule, said, in_report", [
    ("masked", "the training attack's accuracy at least 0.5 above the validation robust accuracy",
     "the model resists only its own single-step attack"),
    ("overstated", "APGD-CE with 10 times the validation's iterations breaking at least 10 % more of up to 200 "
     "validation images", "the short validation attack no longer sees what the training hides"),
])
def test_the_report_names_the_guard_rule_that_fired(rule, said, in_report, checkpoint, tmp_path, capsys, monkeypatch):
    """A validation robust accuracy of 0 under a training-attack accuracy of 0.5 or more: the 'masked' rule; a long
    APGD-CE 0.2 under the short one: the 'overstated' rule."""
    from robustest.train import early_stopping

    monkeypatch.setattr(early_stopping, "validate", lambda *a, **k: {"val_clean_accuracy": 0.9,
                                                                      "val_apgd_accuracy": 0.0})  # n-fgsm: APGD-CE
    monkeypatch.setattr(early_stopping, "masked", lambda adv, pgd: rule == "masked")
    monkeypatch.setattr(early_stopping, "short_long", lambda *a: {"val_short_accuracy": 0.3, "val_long_accuracy": 0.1})
    i = TINY.index("--steps")
    tiny = TINY[:i] + TINY[i + 2:]
    out = tmp_path / "g"
    assert main(["harden", "--checkpoint", checkpoint, *tiny, "--method", "n-fgsm", "--eps-warmup", "0",
                 "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["guard_epoch"] == 1 and res["epochs"][0]["guard"] == rule and len(res["epochs"]) == 1
    assert ("val_long_accuracy" in res["epochs"][0]) is (rule == "overstated")
    cap = capsys.readouterr()
    assert f"guard at epoch 1 ({said})" in cap.out + cap.err
    assert in_report in (out / "report.html").read_text()
