"""The `qualify` command line: validate, cases, db, runs, run, gate, promote.

Exit codes: 0 success/PASS, 1 FAIL, 2 bad input, 3 infrastructure error.
User errors print one line per problem and never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from qualify import exitcodes
from qualify.config import database_url, redact_url

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Qualify ML container images before their tags are published.")
db_app = typer.Typer(no_args_is_help=True, help="The results database.")
runs_app = typer.Typer(no_args_is_help=True, help="Read qualification runs.")
app.add_typer(db_app, name="db")
app.add_typer(runs_app, name="runs")

# Pipes and CI logs get wide lines instead of wrapping references mid-word.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

DbOption = typer.Option(None, "--db", help="database URL (default: QUALIFY_DATABASE_URL or SQLite in the data dir)")


def fail(code: int, *lines: str) -> typer.Exit:
    for line in lines:  # plain lines: never wrapped, easy to grep in CI logs
        typer.echo(line, err=True)
    return typer.Exit(code)


def open_db(url: str | None, migrate: bool = True):  # type: ignore[no-untyped-def]
    from qualify.store.engine import DatabaseError, open_database

    try:
        return open_database(database_url(url), migrate=migrate)
    except DatabaseError as exc:
        raise fail(exitcodes.INFRA, f"error: {exc}") from None


def load_or_exit(path: Path):  # type: ignore[no-untyped-def]
    from qualify.manifest_load import ManifestError, load_manifest

    try:
        return load_manifest(path)
    except ManifestError as exc:
        raise fail(exitcodes.BAD_INPUT, *[str(p) for p in exc.problems]) from None


# --------------------------------------------------------------------------- validate / cases


@app.command()
def validate(files: list[Path] = typer.Argument(..., help="manifest files")) -> None:
    """Check manifests; print a summary, or one line per problem (exit 2)."""
    from qualify.cases import expand
    from qualify.manifest_load import ManifestError, load_manifest

    problems: list[str] = []
    for path in files:
        try:
            loaded = load_manifest(path)
        except ManifestError as exc:
            problems.extend(str(p) for p in exc.problems)
            continue
        rel = loaded.release
        cases = expand(rel)
        n_train = sum(c.kind == "train" for c in cases)
        n_infer = sum(c.kind == "infer" for c in cases)
        out.print(f"[green]ok[/green] {path}: {rel.release.name} {rel.release.tag} "
                  f"(candidate {rel.release.candidate_tag}, previous {rel.release.previous_tag or 'none'})")
        out.print(f"   {len(rel.components)} components, {n_train} training cases, {n_infer} inference cases"
                  + (f", {len(cases) - n_train - n_infer} other cases" if len(cases) > n_train + n_infer else ""))
        targets = rel.expanded_targets()
        out.print(f"   {len(targets)} promotion targets" + (":" if targets else ""))
        for target in targets:
            out.print(f"     {target.name}: {target.reference}", markup=False, highlight=False)
    if problems:
        raise fail(exitcodes.BAD_INPUT, *problems)


@app.command()
def cases(file: Path, as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """List the test cases a manifest expands to (stable ids, same order every time)."""
    from qualify.cases import expand

    loaded = load_or_exit(file)
    expanded = expand(loaded.release)
    if as_json:
        print(json.dumps([c.to_dict() for c in expanded], indent=2, sort_keys=True))
        return
    table = Table(title=f"{len(expanded)} cases of {file}")
    for col in ("case id", "kind", "resources", "parameters"):
        table.add_column(col, overflow="fold")
    for case in expanded:
        res = case.resources
        resources = f"cpu {res.cpus:g} gpu {res.gpus:g}" + (f" x{res.nodes} nodes" if res.nodes > 1 else "")
        if res.accelerator_type:
            resources += f" {res.accelerator_type}"
        params = ", ".join(f"{k}={v}" for k, v in case.to_dict()["params"].items()
                           if k not in ("deepspeed_config", "engine_args"))
        table.add_row(case.case_id, case.kind, resources, params)
    out.print(table)


# --------------------------------------------------------------------------- db


@db_app.command("upgrade")
def db_upgrade(db: Optional[str] = DbOption) -> None:
    """Create or migrate the results database to the latest schema."""
    from qualify.store.engine import DatabaseError, upgrade

    url = database_url(db)
    try:
        upgrade(url)
    except DatabaseError as exc:
        raise fail(exitcodes.INFRA, f"error: {exc}") from None
    out.print(f"database at head: {redact_url(url)}", markup=False, highlight=False)


# --------------------------------------------------------------------------- runs


@runs_app.command("list")
def runs_list(db: Optional[str] = DbOption, limit: int = typer.Option(20, min=1),
              as_json: bool = typer.Option(False, "--json")) -> None:
    """The newest runs."""
    from qualify.reporting import run_summary
    from qualify.store import repo

    _, sessions = open_db(db)
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


@runs_app.command("show")
def runs_show(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
              as_json: bool = typer.Option(False, "--json")) -> None:
    """One run: stages, component checks, case results, decisions, promotions."""
    from qualify.reporting import run_detail

    _, sessions = open_db(db)
    with sessions() as session:
        detail = run_detail(session, run_id)
    if detail is None:
        raise fail(exitcodes.BAD_INPUT, f"error: no run {run_id}")
    if as_json:
        print(json.dumps(detail, indent=2, default=str))
        return
    _print_run(detail)


def _print_run(d: dict[str, Any]) -> None:
    out.print(f"[bold]run {d['run']}[/bold] {d['release']} status={d['status']} stage={d['stage']} "
              f"digest={d['digest'] or 'n/a'}")
    if d.get("error"):
        out.print(f"error: {d['error']}", markup=False)
    if d["stage_seconds"]:
        out.print("stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in d["stage_seconds"].items()))
    if d["components"]:
        t = Table(title="components")
        for col in ("name", "rule", "expected", "actual", "ok"):
            t.add_column(col)
        for c in d["components"]:
            t.add_row(c["name"], c["rule"], c["expected"], c["actual"] or "missing",
                      "[green]yes[/green]" if c["ok"] else "[red]NO[/red]")
        out.print(t)
    t = Table(title="cases")
    for col in ("case", "status", "key metrics", "attempts", "exec s"):
        t.add_column(col, overflow="fold")
    for r in d["cases"]:
        status = r["status"] + (f" ({r['error_class']})" if r["error_class"] else "")
        t.add_row(r["case_id"], status, r["key_metrics"], str(r["attempts"]),
                  f"{r['exec_s']:.1f}" if r["exec_s"] is not None else "n/a")
    out.print(t)
    for dec in d["decisions"]:
        out.print(f"decision {dec['id']} at {str(dec['decided_at'])[:19]}: [bold]{dec['verdict']}[/bold]")
        for reason in dec["reasons"]:
            out.print(f"  {reason['status']:<11} {reason['check']}: {reason['message']}", markup=False)
    for p in d["promotions"]:
        out.print(f"promotion {p['target_name']}: {p['outcome']} {p['target_ref']}"
                  + (f" ({p['detail']})" if p.get("detail") else ""), markup=False)


def _register_optional_commands() -> None:
    # Each group lives in its own module so that the core CLI stays small.
    from qualify import cli_gate, cli_run

    cli_gate.register(app)
    cli_run.register(app)


def main() -> None:
    _register_optional_commands()
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(exitcodes.INFRA)
