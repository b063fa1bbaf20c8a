"""The `qualify` command line, assembled at import time from one module per command group.

Exit codes (qualify.errors.ExitCode): 0 success/PASS, 1 FAIL or refused, 2 bad input,
3 infrastructure. Errors become exit codes in one place: common.QualifyGroup.
"""

from __future__ import annotations

import typer

from qualify.cli import manifests
from qualify.cli.common import QualifyGroup
from qualify.cli.compare import compare, history
from qualify.cli.db import db_app
from qualify.cli.gate import gate_app
from qualify.cli.plan import plan
from qualify.cli.promote import promote
from qualify.cli.report import report
from qualify.cli.run import run
from qualify.cli.runs import runs_app
from qualify.cli.serve import serve

app = typer.Typer(cls=QualifyGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Qualify ML container images before their tags are published.")
app.command()(manifests.validate)
app.command()(manifests.cases)
app.command("run")(run)
app.command("promote")(promote)
app.command("report")(report)
app.command("compare")(compare)
app.command("history")(history)
app.command("plan")(plan)
app.command("serve")(serve)
app.add_typer(db_app, name="db")
app.add_typer(runs_app, name="runs")
app.add_typer(gate_app, name="gate")


def main() -> None:
    app()


__all__ = ["app", "main"]
