"""docs/EXTENDING.md runs as written: each Python block, in order, in one namespace; afterwards every entry it
registered is usable by name (the harden verb takes the new method, select the new strategy, train the new model
on the new data set) and is removed again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from robustest import attacks, corruptions, data, models, selection
from robustest.cli import main
from robustest.data.registry import unregister as unregister_data
from robustest.train import objectives

DOC = Path(__file__).resolve().parents[2] / "docs" / "EXTENDING.md"


@pytest.fixture
def ran_recipes():
    namespace: dict = {"__name__": "extending_doc"}
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 8, ("one recipe per kind: attack, corruption, objective, strategy, model, data set, a "
                              "verb's option flags, verb")
    try:
        for code in blocks:
            exec(compile(code, str(DOC), "exec"), namespace)
        yield namespace
    finally:
        for undo in (lambda: attacks.unregister("sign_noise"), lambda: corruptions.unregister("darken"),
                     lambda: objectives.unregister("noise-at"), lambda: selection.unregister("middle"),
                     lambda: models.unregister("tiny_mlp"), lambda: unregister_data("stripes")):
            try:
                undo()
            except Exception:  # a block that failed before registering its entry
                pass


def test_every_recipe_registers_an_entry_the_verbs_take_by_name(ran_recipes, tmp_path, capsys):
    assert "sign_noise" in attacks.names() and "darken" in corruptions.resolve_names("digital")
    assert "noise-at" in objectives.names() and "middle" in selection.names()
    assert "tiny_mlp" in models.names() and "stripes" in data.names()
    assert main(["train", "--model", "tiny_mlp", "--dataset", "bars", "--epochs", "1", "--out",
                 str(tmp_path / "model"), "--no-progress"]) == 0
    ckpt = str(tmp_path / "model" / "model.pt")
    assert main(["harden", "--checkpoint", ckpt, "--dataset", "stripes", "--method", "noise-at", "--noise-scale",
                 "0.5", "--eps", "0.1", "--epochs", "1", "--out", str(tmp_path / "hard"), "--no-progress"]) == 0
    assert main(["generate", "--checkpoint", ckpt, "--dataset", "stripes", "--method", "sign_noise", "--eps",
                 "0.1", "--keep-all", "--out", str(tmp_path / "gen"), "--no-progress"]) == 0


def test_the_recipes_leave_nothing_behind():
    assert "sign_noise" not in attacks.names() and "darken" not in corruptions.names()
    assert "noise-at" not in objectives.names() and "middle" not in selection.names()
    assert "tiny_mlp" not in models.names() and "stripes" not in data.names()


def test_the_verb_recipe_parses_loads_and_writes(ran_recipes, mlp_digits_checkpoint, tmp_path, caplog):
    import argparse
    import json

    caplog.set_level("INFO", logger="robustest.cli")
    parser = argparse.ArgumentParser()
    ran_recipes["add_parser"](parser.add_subparsers())
    args = parser.parse_args(["clean", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--limit", "50",
                              "--out", str(tmp_path / "clean")])
    assert args.func(args) == 0
    from robustest.evaluate import loss_and_accuracy
    from robustest.models.checkpoints import load_model

    doc = json.loads((tmp_path / "clean" / "results.json").read_text())
    loss, acc = loss_and_accuracy(load_model(mlp_digits_checkpoint), data.load("digits", split="test", limit=50))
    assert doc["format"] == "robustest-clean-results" and doc["settings"]["dataset"] == "digits"
    assert doc["settings"]["limit"] == 50 and list(doc["timings"]) == ["total_s"]
    assert (doc["loss"], doc["accuracy"]) == (pytest.approx(loss), acc)
    assert f"accuracy {acc:.3f}" in (tmp_path / "clean" / "report.html").read_text()
    assert caplog.records[-1].getMessage().startswith(f"wrote results.json, report.html to {tmp_path}")
