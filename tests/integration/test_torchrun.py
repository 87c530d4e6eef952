"""Every per-sample verb under `torchrun --nproc-per-node 2` (gloo, CPU) writes the same files as one process.

Both runs use one thread per process (the float results of a convolution may depend on the thread count).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

TORCHRUN = shutil.which("torchrun")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def single(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "robustest", *args, "--quiet"], capture_output=True, text=True,
                          env=_env(), timeout=600)


def ranks(*args: str, n: int = 2) -> subprocess.CompletedProcess:
    if TORCHRUN is None:
        pytest.skip("torchrun not found")
    cmd = [TORCHRUN, f"--nproc-per-node={n}", f"--master-port={_port()}", "-m", "robustest", *args, "--quiet"]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("model")
    res = single("train", "--dataset", "digits", "--model", "digits_cnn", "--epochs", "2", "--out", str(out))
    assert res.returncode == 0, res.stderr
    return str(out / "model.pt")


def _same_tensors(a: Path, b: Path) -> None:
    pa = torch.load(a, weights_only=True)
    pb = torch.load(b, weights_only=True)
    keys = [k for k, v in pa.items() if isinstance(v, torch.Tensor)]
    assert keys
    for k in keys:
        assert torch.equal(pa[k], pb[k]), f"{a.name}[{k}] differs"


def _world(path: Path) -> int:
    return json.loads((path / "results.json").read_text())["world_size"]


def test_score_fol_and_kmnc(model, tmp_path) -> None:
    for metric in ("fol", "kmnc"):
        args = ["score", "--checkpoint", model, "--dataset", "digits", "--metric", metric, "--eps", "0.1"] \
            if metric == "fol" else ["score", "--checkpoint", model, "--dataset", "digits", "--metric", metric,
                                     "--train-limit", "300"]
        one, two = tmp_path / f"{metric}1", tmp_path / f"{metric}2"
        assert single(*args, "--out", str(one)).returncode == 0
        res = ranks(*args, "--out", str(two))
        assert res.returncode == 0, res.stderr
        _same_tensors(one / "scores.pt", two / "scores.pt")
        assert _world(two) == 2 and _world(one) == 1
        if metric == "fol":  # each rank's share of the scored images
            n = len(torch.load(one / "scores.pt", weights_only=True)["scores"])
            shares = json.loads((two / "results.json").read_text())["rank_samples"]
            assert len(shares) == 2 and min(shares) > 0 and sum(shares) == n
            assert "rank_samples" not in json.loads((one / "results.json").read_text())


def test_analyze(model, tmp_path) -> None:
    args = ["analyze", "--checkpoint", model, "--dataset", "digits", "--neighbors", "8", "--save-every", "500"]
    assert single(*args, "--out", str(tmp_path / "a1")).returncode == 0
    res = ranks(*args, "--out", str(tmp_path / "a2"))
    assert res.returncode == 0, res.stderr
    _same_tensors(tmp_path / "a1" / "analysis.pt", tmp_path / "a2" / "analysis.pt")
    doc = json.loads((tmp_path / "a2" / "results.json").read_text())
    assert sum(doc["rank_samples"]) == doc["n"] and min(doc["rank_samples"]) > 0


def test_corrupt(tmp_path) -> None:
    args = ["corrupt", "--dataset", "digits", "--limit", "300", "--corruptions", "gaussian_noise,glass_blur,fog",
            "--severities", "2,5", "--batch-size", "64"]
    assert single(*args, "--out", str(tmp_path / "c1")).returncode == 0
    res = ranks(*args, "--out", str(tmp_path / "c2"))
    assert res.returncode == 0, res.stderr
    one = json.loads((tmp_path / "c1" / "results.json").read_text())["corruptions"]
    two = json.loads((tmp_path / "c2" / "results.json").read_text())["corruptions"]
    assert {k: v["sha256"] for k, v in one.items()} == {k: v["sha256"] for k, v in two.items()}


def test_generate_attack(model, tmp_path) -> None:
    # PGD with a random start: batch k draws from seed + k * stride wherever it runs, so the ranks' shares
    # give the single process's tests
    args = ["generate", "--checkpoint", model, "--dataset", "digits", "--method", "pgd", "--eps", "0.1",
            "--steps", "3", "--batch-size", "64", "--keep-all", "--limit", "300"]
    assert single(*args, "--out", str(tmp_path / "g1")).returncode == 0
    res = ranks(*args, "--out", str(tmp_path / "g2"))
    assert res.returncode == 0, res.stderr
    _same_tensors(tmp_path / "g1" / "tests.pt", tmp_path / "g2" / "tests.pt")
    assert _world(tmp_path / "g2") == 2


def test_train_with_ddp(tmp_path) -> None:
    # DDP: each rank trains on its half of every global batch; gradients are averaged, so the model follows
    # the single process's closely (not bit for bit: float sums in another order, per-rank batch norm)
    args = ["train", "--dataset", "digits", "--model", "digits_cnn", "--epochs", "3"]
    assert single(*args, "--out", str(tmp_path / "t1")).returncode == 0
    res = ranks(*args, "--out", str(tmp_path / "t2"))
    assert res.returncode == 0, res.stderr
    one = json.loads((tmp_path / "t1" / "results.json").read_text())
    two = json.loads((tmp_path / "t2" / "results.json").read_text())
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert abs(one["test_accuracy"] - two["test_accuracy"]) <= 0.01
    assert (tmp_path / "t2" / "model.pt").is_file() and not list((tmp_path / "t2").rglob("*.tmp"))


def test_validate(model, tmp_path) -> None:
    args = ["validate", "--checkpoint", model, "--dataset", "digits", "--split", "train", "--limit", "400",
            "--neighbors", "4", "--k", "40", "--perturbations", "fgsm,pgd,gaussian_noise,fog", "--attack-eps", "0.1",
            "--severities", "1,3", "--test-limit", "120"]
    assert single(*args, "--out", str(tmp_path / "v1")).returncode == 0
    res = ranks(*args, "--out", str(tmp_path / "v2"))
    assert res.returncode == 0, res.stderr
    _same_tensors(tmp_path / "v1" / "validation.pt", tmp_path / "v2" / "validation.pt")
    _same_tensors(tmp_path / "v1" / "weakset.pt", tmp_path / "v2" / "weakset.pt")
    assert _world(tmp_path / "v2") == 2


def test_eval(model, tmp_path) -> None:
    # blocks of 128 images: 2 of the 3 blocks on rank 0, 1 on rank 1; per-block generators make them agree
    args = ["eval", "--checkpoint", model, "--dataset", "digits", "--limit", "300", "--eps", "0.1",
            "--version", "fast", "--block-size", "128", "--save-adv"]
    assert single(*args, "--out", str(tmp_path / "e1")).returncode == 0
    res = ranks(*args, "--out", str(tmp_path / "e2"))
    assert res.returncode == 0, res.stderr
    one = json.loads((tmp_path / "e1" / "results.json").read_text())
    two = json.loads((tmp_path / "e2" / "results.json").read_text())
    assert one["robust_accuracy"] == two["robust_accuracy"] and one["attacks"] == two["attacks"]
    assert (tmp_path / "e1" / "samples.csv").read_text() == (tmp_path / "e2" / "samples.csv").read_text()
    _same_tensors(tmp_path / "e1" / "adv.pt", tmp_path / "e2" / "adv.pt")
    assert two["world_size"] == 2


def test_a_rank_that_dies_ends_the_job_with_one_line_and_the_rerun_continues(model, tmp_path) -> None:
    import signal
    import time

    if TORCHRUN is None:
        pytest.skip("torchrun not found")
    args = ["analyze", "--checkpoint", model, "--dataset", "digits", "--split", "train", "--neighbors", "200",
            "--save-every", "128", "--no-progress"]
    out = tmp_path / "killed"
    cmd = [TORCHRUN, "--nproc-per-node=2", f"--master-port={_port()}", "-m", "robustest", *args, "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    deadline = time.monotonic() + 300
    while not (out / "state" / "steps" / "analysis_00001.pt").exists():  # two steps saved
        assert proc.poll() is None and time.monotonic() < deadline, "the job ended before it could be killed"
        time.sleep(0.2)
    # the two workers (torchrun starts them as "python -u -m robustest ..."; its own command line has no -u)
    ranks_ = subprocess.run(["pgrep", "-f", "--", f"-u -m robustest analyze .*--out {out}"], capture_output=True,
                            text=True)
    pids = sorted(int(p) for p in ranks_.stdout.split())
    assert len(pids) == 2, ranks_.stdout
    os.kill(pids[-1], signal.SIGKILL)  # the rank started last: rank 1
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    ours = [ln for ln in err.splitlines() if ln.startswith("robustest analyze:")]
    assert len(ours) == 1 and ("stopped by torchrun" in ours[0] or "another rank stopped" in ours[0]), err[-2000:]
    again = ranks(*args, "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert "reused" in again.stderr
    whole = tmp_path / "whole"
    assert single(*args, "--out", str(whole)).returncode == 0
    _same_tensors(out / "analysis.pt", whole / "analysis.pt")


ROBOT_YAML = "whitebox_pgd_steps: 3\nwhitebox_restarts: 1\napgd_steps: 3\nconvergence_probe: 30\npool_pgd_steps: 5\n"
ROBOT_FLAGS = ["--dataset", "digits", "--train-limit", "300", "--test-limit", "60", "--eps", "0.15", "--epochs", "1",
               "--whitebox-limit", "20", "--no-progress"]


def test_run_and_compare(model, tmp_path) -> None:
    # the ranks share out the pool generation and the robustness measurements (attack()) and each fine-tunes
    # every cell by itself, so the tables equal one process's
    cfg = tmp_path / "robot.yaml"
    cfg.write_text(ROBOT_YAML)
    run = ["run", "--config", str(cfg), "--checkpoint", model, *ROBOT_FLAGS, "--strategy", "random", "--budget", "10%",
           "--rounds", "2"]
    assert single(*run, "--out", str(tmp_path / "r1")).returncode == 0
    res = ranks(*run, "--out", str(tmp_path / "r2"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "r1" / "summary.csv").read_text() == (tmp_path / "r2" / "summary.csv").read_text()
    assert _world(tmp_path / "r2") == 2
    # compare: the ranks take whole cells (3 cells on 2 ranks: a round of two, then one), rank 0 writes them
    cmp_ = ["compare", "--config", str(cfg), "--checkpoint", model, *ROBOT_FLAGS, "--strategies",
            "random,kmst,adv-train", "--budgets", "5%", "--seeds", "0"]
    assert single(*cmp_, "--out", str(tmp_path / "c1")).returncode == 0
    res = ranks(*cmp_, "--out", str(tmp_path / "c2"))
    assert res.returncode == 0, res.stderr
    one = json.loads((tmp_path / "c1" / "results.json").read_text())
    two = json.loads((tmp_path / "c2" / "results.json").read_text())
    assert one["cells"] == two["cells"] and two["world_size"] == 2
    cells = sorted(p.name for p in (tmp_path / "c1" / "state" / "cells").iterdir())
    assert len(cells) == 3
    for name in cells:
        _same_weights(tmp_path / "c1" / "state" / "cells" / name / "model.pt",
                      tmp_path / "c2" / "state" / "cells" / name / "model.pt")


def test_compare_with_autoattack(model, tmp_path) -> None:
    # the ensemble inside every measurement is robustest.evaluate.evaluate, which shares its blocks of 4096 images out
    # over the ranks and gathers the outcomes (test_eval checks that with several blocks); here the white-box
    # images make one block, so rank 0 attacks them all and every rank gets its figure: equal to one process's
    cfg = tmp_path / "robot.yaml"
    cfg.write_text(ROBOT_YAML)
    cmp_ = ["compare", "--config", str(cfg), "--checkpoint", model, *ROBOT_FLAGS, "--strategies", "random,kmst",
            "--budgets", "5%", "--seeds", "0", "--autoattack", "fast"]
    assert single(*cmp_, "--out", str(tmp_path / "c1")).returncode == 0
    res = ranks(*cmp_, "--out", str(tmp_path / "c2"))
    assert res.returncode == 0, res.stderr
    one = json.loads((tmp_path / "c1" / "results.json").read_text())
    two = json.loads((tmp_path / "c2" / "results.json").read_text())
    assert all(c["robustness"]["autoattack_accuracy"] is not None for c in one["cells"])
    assert one["cells"] == two["cells"] and one["baseline"] == two["baseline"] and two["world_size"] == 2


def _same_weights(a: Path, b: Path) -> None:
    from robustest.models.checkpoints import load_model

    sa, sb = load_model(a).state_dict(), load_model(b).state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_enhance_and_harden(model, tmp_path) -> None:
    # enhance trains with DDP (each rank its part of every batch, its own AugMix draws): close to one process,
    # not equal; harden: every rank trains the same model by itself, equal. Measurements go through attack(),
    # shared out; rank 0 writes
    weak = tmp_path / "weak.json"
    weak.write_text(json.dumps({"weaknesses": ["gaussian_noise", "pgd"]}))
    enh = ["enhance", "--checkpoint", model, "--dataset", "digits", "--limit", "192", "--weaknesses", str(weak),
           "--epochs", "2", "--adv-steps", "2", "--eval-limit", "120"]
    assert single(*enh, "--out", str(tmp_path / "e1")).returncode == 0
    res = ranks(*enh, "--out", str(tmp_path / "e2"))
    assert res.returncode == 0, res.stderr
    one = json.loads((tmp_path / "e1" / "results.json").read_text())
    two = json.loads((tmp_path / "e2" / "results.json").read_text())
    assert two["world_size"] == 2
    for key in ("clean_accuracy", "mean_adv_error", "mce_held_out"):  # the tolerance docs/SCALING.md states
        assert abs(one["after"][key] - two["after"][key]) <= 0.05, (key, one["after"], two["after"])
    hard = ["harden", "--checkpoint", model, "--dataset", "digits", "--limit", "200", "--eps", "0.2", "--epochs", "1",
            "--steps", "3", "--batch-size", "64", "--test-limit", "60", "--whitebox-limit", "30",
            "--whitebox-pgd-steps", "3", "--whitebox-restarts", "1", "--apgd-steps", "3", "--val-size", "20"]
    assert single(*hard, "--out", str(tmp_path / "h1")).returncode == 0
    res = ranks(*hard, "--out", str(tmp_path / "h2"))
    assert res.returncode == 0, res.stderr
    _same_weights(tmp_path / "h1" / "model.pt", tmp_path / "h2" / "model.pt")
    one = json.loads((tmp_path / "h1" / "results.json").read_text())
    two = json.loads((tmp_path / "h2" / "results.json").read_text())
    assert one["after"] == two["after"] and one["compute"] == two["compute"]


def test_no_option_is_taken_by_torchrun() -> None:
    # torchrun's parser reads every --option after the module too, expanding abbreviations: an option of ours
    # that is a prefix of one of torchrun's would be taken by torchrun or refused as ambiguous
    from torch.distributed.run import get_args_parser

    from robustest.cli import build_parser

    theirs = [o for a in get_args_parser()._actions for o in a.option_strings if o.startswith("--")]
    verbs = build_parser()._subparsers._group_actions[0].choices
    clashes = {(verb, o) for verb, sp in verbs.items() if verb != "select"  # select runs no model: one process
               for a in sp._actions for o in a.option_strings[-1:]  # the spelling the battery and docs use
               if o.startswith("--") and o != "--help" and any(t.startswith(o) for t in theirs)}
    assert not clashes


LOCAL_WORK_SCRIPT = """
import json, sys
import torch.distributed as dist
from robustest.core import distributed
from robustest.core.distributed import Shard
distributed.init()
out = {"outside": [distributed.world_size(), distributed.rank(), Shard.current().bounds(10)]}
with distributed.local_work():
    # a rank alone: a world of one, collectives do nothing, the rank (and so who writes) unchanged
    out["inside"] = [distributed.world_size(), distributed.rank(), Shard.current().bounds(10),
                     distributed.all_gather_objects(distributed.rank()), distributed.is_main(),
                     distributed.in_local_work()]
out["gathered"] = distributed.all_gather_objects(distributed.rank())
distributed.shutdown()
with open(f"{sys.argv[1]}/rank{out['outside'][1]}.json", "w") as fh:  # one file per rank: stdout lines interleave
    json.dump(out, fh)
"""


def test_local_work_is_a_world_of_one(tmp_path) -> None:
    if TORCHRUN is None:
        pytest.skip("torchrun not found")
    script = tmp_path / "local.py"
    script.write_text(LOCAL_WORK_SCRIPT)
    res = subprocess.run([TORCHRUN, "--nproc-per-node=2", f"--master-port={_port()}", str(script), str(tmp_path)],
                         capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    rows = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["outside"] for r in rows] == [[2, 0, [0, 5]], [2, 1, [5, 10]]]
    assert [r["inside"] for r in rows] == [[1, 0, [0, 10], [0], True, True], [1, 1, [0, 10], [1], False, True]]
    assert all(r["gathered"] == [0, 1] for r in rows)
