"""The `qualify` command line: the table of commands, and the app built from it.

A command imports only its own module: `qualify gate check` in a CI job must not pay for the run
launcher, the service, the report renderer and scipy (issue 27: the check was 1.15 s a call). `main`
builds the app with the one command named on the command line; `--help` and anything unknown get
the whole table, so what people see is the same.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from typing import Any

import typer

from qualify.cli import help_style
from qualify.cli.common import QualifyGroup, examples

HELP = "Qualify ML container images before their tags are published."


@dataclass(frozen=True)
class Entry:
    module: str  # qualify.cli.<module>
    attr: str  # the function, or the Typer sub-app for a group
    group: bool = False
    options: dict[str, Any] = field(default_factory=dict)  # typer's command() keywords


COMMANDS: dict[str, Entry] = {
    "validate": Entry("manifests", "validate"),
    "cases": Entry("manifests", "cases"),
    "run": Entry("run", "run", options={"epilog": examples(
        ".venv/bin/qualify run releases/cpu-smoke.yaml",
        "qualify run releases/25.05.yaml --ray-address 10.0.0.5:6379 --json > outcome.json",
        "qualify run releases/25.05.yaml --resume 12   # the cases of run 12 without a final result")}),
    "promote": Entry("promote", "promote", options={"epilog": examples("qualify promote 12",
                                                                       "qualify promote 12 --dry-run")}),
    "report": Entry("report", "report"),
    "compare": Entry("compare", "compare", options={"epilog": examples(
        "qualify compare 25.04 25.05", "qualify compare run:11 run:12 --metric mfu")}),
    "history": Entry("compare", "history", options={"epilog": examples(
        "qualify history train/tiny-llama/base --metric tokens_per_s --png chart.png")}),
    "plan": Entry("plan", "plan"),
    "calibrate": Entry("calibrate", "calibrate"),
    "serve": Entry("serve", "serve"),
    "attest": Entry("attest", "attest"),
    "verify": Entry("attest", "verify"),
    "db": Entry("db", "db_app", group=True),
    "runs": Entry("runs", "runs_app", group=True),
    "gate": Entry("gate", "gate_app", group=True),
}


def build(only: str | None = None) -> typer.Typer:
    """The app with every command, or with the one named (`only`), imported then."""
    help_style.apply()
    app = typer.Typer(cls=QualifyGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                      help=HELP)
    # A group even with one command: Typer makes a lone command the whole program (`qualify run M` would read
    # "run" as the manifest), so the command line keeps its shape whichever commands are built.
    app.callback()(_group)
    for name, entry in COMMANDS.items():
        if only is not None and name != only:
            continue
        target = getattr(importlib.import_module(f"qualify.cli.{entry.module}"), entry.attr)
        if entry.group:
            app.add_typer(target, name=name)
        else:
            app.command(name, **entry.options)(target)
    return app


def _group() -> None:
    """Qualify ML container images before their tags are published."""


def named_command(argv: list[str]) -> str | None:
    """The command the arguments name, when they name one of COMMANDS first (the group takes no options)."""
    return argv[0] if argv and argv[0] in COMMANDS else None


def main() -> None:
    from qualify.cli.pipes import ClosedPipeSafe

    sys.stdout = ClosedPipeSafe(sys.stdout)  # type: ignore[assignment]  # `| head` ends quietly
    build(named_command(sys.argv[1:]))()
