"""`qualify report RUN [--out DIR]`: write a run's HTML report (the flow writes the same at the end of a run)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from qualify.cli.common import DbOption, open_db, say, settings
from qualify.errors import BadInput
from qualify.report.html import write_report
from qualify.report.views import report_view


def report(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
           out_dir: Optional[Path] = typer.Option(None, "--out", metavar="DIR",
                                                  help="folder for run-N.html (default: <data dir>/reports)")) -> None:
    """Write the run's self-contained HTML report (verdict and failures first, tables, charts) and print its path."""
    with open_db(db, migrate=False)() as session:
        view = report_view(session, run_id)
    if view is None:
        raise BadInput(f"no run {run_id}")
    path = write_report(view, out_dir or settings(db).reports_dir)
    verdict = view["decisions"][-1]["verdict"] if view["decisions"] else "no decision"
    say(f"run {run_id} ({view['release']}, {verdict}): {path.resolve()}")
