"""``robustest --help`` groups the verbs and says where to start; sub-command help says its name once."""

from __future__ import annotations

import re

import pytest

from robustest import cli


def help_text(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_groups_every_verb_and_says_where_to_start(capsys):
    text = help_text(capsys)
    verbs = set(cli.build_parser()._subparsers._group_actions[0].choices)
    titles = [title for title, _ in cli.VERB_GROUPS]
    assert [t for t in re.findall(r"^([a-z][a-z ]+):$", text, re.M) if t in titles] == titles
    assert "other:" not in text  # every verb has its group
    grouped = {v for _, vs in cli.VERB_GROUPS for v in vs}
    assert verbs == grouped
    for title, members in cli.VERB_GROUPS:
        block = text.split(f"\n{title}:\n", 1)[1].split("\n\n", 1)[0]
        assert [line.split()[0] for line in block.splitlines() if line.startswith("  ") and line[2] != " "] == \
            list(members), title
    assert text.index("test a model:") < text.index("make it robust:") < text.index("research methods:") \
        < text.index("data:")
    assert "For your own model, start with:\n  robustest eval --model pkg.module:factory --weights FILE" in text
    assert "\n  eval      evaluate robustness" in text


def test_suite_build_help_names_its_command_once(capsys):
    text = help_text(capsys, "suite", "build")
    assert text.count("robustest suite build") == 2  # the usage line and the description's first words
    assert "suite build: robustest suite build" not in text
    assert "\n\nrobustest suite build scores a data split's samples" in text
    check = help_text(capsys, "suite", "check")
    assert "\n\nrobustest suite check runs the suite's stored attacks" in check
