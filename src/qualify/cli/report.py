"""`qualify report RUN [--out DIR]`: write a run's HTML report (the flow writes the same at the end of a run)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from qualify.cli.common import DbOption, open_db, say, settings
from qualify.cli.outputs import output_dir
from qualify.errors import BadInput
from qualify.report.html import write_report
from qualify.report.links import flow_run_url
from qualify.report.views import report_view
from qualify.store.identity import database_data_dir


def report(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
           out_dir: Optional[Path] = typer.Option(None, "--out", metavar="DIR",
                                                  help="folder for run-N.html (default: <data dir>/db-<database uuid>/reports)")) -> None:
    """Write the run's self-contained HTML report (verdict and failures first, tables, charts) and print its path."""
    directory = output_dir(out_dir, "--out") if out_dir is not None else None  # bad input before anything
    sessions = open_db(db, migrate=False)
    with sessions() as session:
        view = report_view(session, run_id)
    if view is None:
        raise BadInput(f"no run {run_id}")
    view["flow_run_url"] = flow_run_url(settings(db).prefect_ui_url, view.get("flow_run_id"))
    try:
        path = write_report(view, directory or database_data_dir(settings(db).data_dir, sessions) / "reports")
    except OSError as exc:
        raise BadInput(f"cannot write the report: {exc.strerror or exc} ({getattr(exc, 'filename', '')})") from None
    verdict = view["decisions"][-1]["verdict"] if view["decisions"] else "no decision"
    say(f"run {run_id} ({view['release']}, {verdict}): {path.resolve()}")
