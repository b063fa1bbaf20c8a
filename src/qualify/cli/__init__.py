"""The `qualify` command line, assembled at import time from one module per command group.

Exit codes (qualify.errors.ExitCode): 0 success/PASS, 1 FAIL or refused, 2 bad input,
3 infrastructure. Errors become exit codes in one place: common.QualifyGroup.
"""

from __future__ import annotations

import typer

from qualify.cli import help_style, manifests
from qualify.cli.attest import attest, verify
from qualify.cli.calibrate import calibrate
from qualify.cli.common import QualifyGroup, examples
from qualify.cli.compare import compare, history
from qualify.cli.db import db_app
from qualify.cli.gate import gate_app
from qualify.cli.plan import plan
from qualify.cli.promote import promote
from qualify.cli.report import report
from qualify.cli.run import run
from qualify.cli.runs import runs_app
from qualify.cli.serve import serve

help_style.apply()
app = typer.Typer(cls=QualifyGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Qualify ML container images before their tags are published.")
app.command()(manifests.validate)
app.command()(manifests.cases)
app.command("run", epilog=examples(
    ".venv/bin/qualify run releases/cpu-smoke.yaml",
    "qualify run releases/25.05.yaml --ray-address 10.0.0.5:6379 --json > outcome.json",
    "qualify run releases/25.05.yaml --resume 12   # the cases of run 12 without a final result"))(run)
app.command("promote", epilog=examples("qualify promote 12", "qualify promote 12 --dry-run"))(promote)
app.command("report")(report)
app.command("compare", epilog=examples("qualify compare 25.04 25.05", "qualify compare run:11 run:12 --metric mfu"))(
    compare)
app.command("history", epilog=examples("qualify history train/tiny-llama/base --metric tokens_per_s --png chart.png"))(history)
app.command("plan")(plan)
app.command("calibrate")(calibrate)
app.command("serve")(serve)
app.command("attest")(attest)
app.command("verify")(verify)
app.add_typer(db_app, name="db")
app.add_typer(runs_app, name="runs")
app.add_typer(gate_app, name="gate")


def main() -> None:
    import sys

    from qualify.cli.pipes import ClosedPipeSafe

    sys.stdout = ClosedPipeSafe(sys.stdout)  # type: ignore[assignment]  # `| head` ends quietly
    app()


__all__ = ["app", "main"]
