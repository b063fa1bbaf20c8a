"""`qualify run`: qualify a release from the command line (through the Prefect flow).

Exit codes: 0 PASS, 1 FAIL (or INCOMPLETE), 2 bad input, 3 infrastructure error.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import typer

from qualify import exitcodes


def register(app: typer.Typer) -> None:
    app.command("run")(run)


def _quiet_orchestrators(verbose: bool) -> None:
    # Ephemeral Prefect logs every task to the console; the CLI shows its own progress.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
    # The ephemeral API server takes ~10 s to start, far longer on a loaded 2-core machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def run(manifest: Path = typer.Argument(..., help="release manifest (YAML)"),
        db: Optional[str] = typer.Option(None, "--db", help="database URL (default: QUALIFY_DATABASE_URL or SQLite)"),
        ray_address: Optional[str] = typer.Option(None, "--ray-address", envvar="QUALIFY_RAY_ADDRESS",
                                                  help="join this Ray cluster instead of starting a local one"),
        resume: Optional[int] = typer.Option(None, "--resume", metavar="RUN",
                                             help="re-run only the cases of RUN without a final result, then gate"),
        wait: bool = typer.Option(False, "--wait", help="queue behind a running run of the same digest"),
        promote: Optional[bool] = typer.Option(None, "--promote/--no-promote",
                                               help="promote on PASS (default: the manifest's promotion.on_pass)"),
        as_json: bool = typer.Option(False, "--json", help="print the outcome as JSON on stdout"),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="show Prefect's task logs")) -> None:
    """Qualify a release end to end: build, verify, run every case on Ray, gate, report, promote."""
    from rich.console import Console

    err = Console(stderr=True)
    # Validate first, before Prefect and Ray start: bad input costs nothing and writes nothing.
    from qualify.manifest_load import ManifestError, load_manifest

    try:
        load_manifest(manifest)
    except ManifestError as exc:
        for problem in exc.problems:
            typer.echo(str(problem), err=True)
        raise typer.Exit(exitcodes.BAD_INPUT) from None

    _quiet_orchestrators(verbose)
    from flows import qualify_release as flow_module

    from qualify import pipeline
    from qualify.cases import expand
    from qualify.store.engine import DatabaseError

    n_cases = len(expand(load_manifest(manifest).release))
    status_line = {"text": "starting"}

    def on_progress(p: pipeline.Progress) -> None:
        status_line["text"] = (f"cases {p.done}/{p.total} done, {p.running} running, {p.failed} failed, "
                               f"elapsed {p.elapsed_s:.0f} s")

    flow_module.PROGRESS_LISTENER = on_progress
    stop = threading.Event()

    def ticker() -> None:
        start = time.monotonic()
        last = ""
        while not stop.wait(1.0):
            line = status_line["text"]
            if sys.stderr.isatty():
                sys.stderr.write(f"\r\033[K{line} [{time.monotonic() - start:.0f} s]")
                sys.stderr.flush()
            elif line != last:  # logs and CI: one line per change
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
            last = line

    thread = threading.Thread(target=ticker, daemon=True)
    thread.start()
    try:
        state = flow_module.run_sized(str(manifest), n_cases, db_url=db, ray_address=ray_address,
                                      resume_run=resume, wait=wait, promote=promote)
    except Exception as exc:  # noqa: BLE001 - Prefect itself could not start (API server, settings)
        typer.echo(f"infrastructure error: Prefect could not run the flow: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(exitcodes.INFRA) from None
    finally:
        stop.set()
        thread.join(timeout=2)
        if sys.stderr.isatty():
            sys.stderr.write("\n")
    try:
        outcome: dict[str, Any] = state.result()
    except pipeline.UserInputError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exitcodes.BAD_INPUT) from None
    except pipeline.CandidateFailed as exc:
        typer.echo(f"FAIL: {exc}", err=True)
        raise typer.Exit(exitcodes.FAIL) from None
    except DatabaseError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exitcodes.INFRA) from None
    except Exception as exc:  # noqa: BLE001 - infrastructure: Ray, Prefect, registry
        typer.echo(f"infrastructure error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(exitcodes.INFRA) from None

    if as_json:
        print(json.dumps(outcome, indent=2, default=str))
    else:
        _print_outcome(Console(width=None if sys.stdout.isatty() else 200), outcome)
    raise typer.Exit(exitcodes.OK if outcome["verdict"] == "PASS" else exitcodes.FAIL)


def _print_outcome(console: Any, outcome: dict[str, Any]) -> None:
    verdict = outcome["verdict"]
    colour = {"PASS": "green", "FAIL": "red"}.get(verdict, "yellow")
    console.print(f"run {outcome['run_id']}: [bold {colour}]{verdict}[/]  candidate {outcome['digest']}")
    for reason in outcome["reasons"]:
        console.print(f"  {reason['status']:<11} {reason['check']}: {reason['message']}", markup=False,
                      highlight=False)
    stages = outcome.get("stage_seconds") or {}
    if stages:
        console.print("stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in stages.items()))
    for p in outcome.get("promotions") or []:
        console.print(f"promotion {p.get('target_name', p.get('target', '?'))}: {p.get('outcome')}", markup=False)
    console.print(f"report: {outcome['report']}", markup=False, highlight=False)
