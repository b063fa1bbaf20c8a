"""`--help` in the conventions people read elsewhere (issue 26.9): arguments in capitals, flags with no value
type, value types as words, and examples. Fails when a Typer upgrade moves the hooks qualify.cli.help_style uses."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from qualify.cli import app

COMMANDS = [["run"], ["compare"], ["history"], ["promote"], ["gate", "check"], ["gate", "evaluate"], ["runs", "show"],
            ["runs", "list"], ["verify"], ["attest"], ["serve"], ["validate"], ["plan"], ["calibrate"]]


def _help(args: list[str]) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_help_names_arguments_in_capitals_and_gives_flags_no_value(args: list[str]) -> None:
    text = _help(args)
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert not re.search(r"\{[a-z_]+\}", usage), usage  # typer's {manifest}
    assert "<bool>" not in text and "<str>" not in text and "<int>" not in text and "<path>" not in text, text
    assert not re.search(r"\b[a-z_]+$", usage.split("[OPTIONS]")[-1].strip() or "X"), usage


def test_the_main_commands_show_examples() -> None:
    run = _help(["run"])
    assert "Examples:" in run and "qualify run releases/cpu-smoke.yaml" in run
    assert "MANIFEST" in run and re.search(r"--json\s+print the outcome", run), run
    assert re.search(r"--db\s+TEXT\s+database URL", run), run
    for args in (["gate", "check"], ["compare"], ["runs", "show"]):
        assert "Examples:" in _help(args), args
