"""`qualify runs list|show`: read qualification runs (never migrates or writes)."""

from __future__ import annotations

import json
from typing import Any, Optional

import typer
from rich.table import Table

from qualify.cli.common import DbOption, JsonOption, examples, new_app, open_db, out
from qualify.errors import BadInput
from qualify.report.views import run_detail, run_summary
from qualify.report.verdict_text import reason_lines
from qualify.store import repo

runs_app = new_app(help="Read qualification runs.")


@runs_app.command("list", epilog=examples("qualify runs list --limit 5"))
def runs_list(db: Optional[str] = DbOption, limit: int = typer.Option(20, min=1),
              as_json: bool = JsonOption) -> None:
    """The newest runs."""
    sessions = open_db(db, migrate=False)
    with sessions() as session:
        rows = [run_summary(session, run) for run in repo.list_runs(session, limit)]
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    table = Table(title="runs")
    for col in ("run", "release", "status", "verdict", "cases", "digest", "started"):
        table.add_column(col)
    for row in rows:
        table.add_row(str(row["run"]), row["release"], row["status"], row["verdict"] or "n/a",
                      f"{row['cases_passed']}/{row['cases_total']}", (row["digest"] or "n/a")[:19],
                      str(row["started_at"])[:19])
    out.print(table)


@runs_app.command("show", epilog=examples("qualify runs show 12", "qualify runs show 12 --verbose"))
def runs_show(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
              as_json: bool = JsonOption,
              verbose: bool = typer.Option(False, "--verbose", "-v", help="list every check, the passed ones too")
              ) -> None:
    """One run: stages, component checks, case results, decisions, promotions."""
    sessions = open_db(db, migrate=False)
    with sessions() as session:
        detail = run_detail(session, run_id)
    if detail is None:
        raise BadInput(f"no run {run_id}")
    if as_json:
        print(json.dumps(detail, indent=2, default=str))
        return
    _print_run(detail, verbose)


def _print_run(d: dict[str, Any], verbose: bool = False) -> None:
    out.print(f"[bold]run {d['run']}[/bold] {d['release']} status={d['status']} stage={d['stage']} "
              f"digest={d['digest'] or 'n/a'}")
    if d.get("error"):
        out.print(f"error: {d['error']}", markup=False)
    if d["stage_seconds"]:
        out.print("stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in d["stage_seconds"].items()))
    if d.get("launch_time"):
        out.print(d["launch_time"]["line"], markup=False)
    if d.get("schedule"):
        out.print(d["schedule"]["line"], markup=False)
    if d.get("build_where"):
        out.print(d["build_where"], markup=False)
    if d.get("pulls"):
        out.print(d["pulls"], markup=False)
    several = len(d.get("images") or []) > 1  # a release of several images: say which image each row is about
    if several:
        t = Table(title="images")
        for col in ("image", "candidate", "digest", "builder", "cases"):
            t.add_column(col, overflow="fold")
        for i in d["images"]:
            t.add_row(i["name"], f"{i['repository']}:{i['tag']}", i["digest"], i["builder"] or "n/a",
                      str(len(i["cases"])))
        out.print(t)
    if d["components"]:
        t = Table(title="components")
        for col in ("image",) * several + ("name", "rule", "expected", "actual", "ok"):
            t.add_column(col)
        for c in d["components"]:
            t.add_row(*(c["image"],) * several, c["name"], c["rule"], c["expected"], c["actual"] or "missing",
                      "[green]yes[/green]" if c["ok"] else "[red]NO[/red]")
        out.print(t)
    t = Table(title="cases")
    for col in ("case",) + ("image",) * several + ("status", "key metrics", "attempts", "exec s"):
        t.add_column(col, overflow="fold")
    for r in d["cases"]:
        status = r["status"] + (f" ({r['error_class']})" if r["error_class"] else "")
        t.add_row(r["case_id"], *(r["image"],) * several, status, r["key_metrics"], str(r["attempts"]),
                  f"{r['exec_s']:.1f}" if r["exec_s"] is not None else "n/a")
    out.print(t)
    for dec in d["decisions"]:
        out.print(f"decision {dec['id']} at {str(dec['decided_at'])[:19]}: [bold]{dec['verdict']}[/bold]")
        for line in reason_lines(dec["reasons"], verbose):  # what decided first, the passes as a count
            out.print(f"  {line}", markup=False, highlight=False)
    for p in d["promotions"]:
        out.print(f"promotion {p['target_name']}: {p['outcome']} {p['target_ref']}"
                  + (f" ({p['detail']})" if p.get("detail") else ""), markup=False)


@runs_app.command("abort")
def runs_abort(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
               reason: str = typer.Option(..., "--reason", metavar="TEXT", help="why (recorded with the run)"),
               force: bool = typer.Option(False, "--force", help="abort even though its driver seems alive")) -> None:
    """Mark a running run aborted (a stuck or killed driver), so its digest can be qualified again."""
    from qualify.pipeline import driver_gone

    if not reason.strip():
        raise BadInput("--reason must say why the run is aborted")
    with open_db(db)() as session:
        run = repo.get_run(session, run_id)
        if run is None:
            raise BadInput(f"no run {run_id}")
        if run.status != "running":
            raise BadInput(f"run {run_id} is already {run.status}: only a running run can be aborted")
        gone = driver_gone(run)
        if gone is None and not force:
            raise BadInput(f"run {run_id} still has a live driver (pid {run.driver_pid} on {run.driver_host}); "
                           "stop it, or add --force")
        repo.finish_run(session, run, "aborted", f"aborted by hand: {reason.strip()}"
                        + (f" ({gone})" if gone else " (driver was alive: --force)"))
        session.commit()
    out.print(f"run {run_id} aborted: {reason.strip()}", markup=False, highlight=False)
