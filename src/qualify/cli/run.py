"""`qualify run`: qualify a release end to end (through the launcher that drives the flow).

Exit codes: 0 PASS, 1 FAIL (or INCOMPLETE, or a failed candidate), 2 bad input, 3 infrastructure.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import typer
from rich.console import Console

from qualify.manifest.cases import expand
from qualify.cli.common import DbOption, exit_with, load, settings
from qualify.errors import ExitCode
from qualify.launcher import RunRequest, find_launcher
from qualify.outcomes import RunOutcome, Verdict
from qualify.progress import Progress


def run(manifest: Path = typer.Argument(..., help="release manifest (YAML)"),
        db: Optional[str] = DbOption,
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
    # Validate first, before Prefect and Ray start: bad input costs nothing and writes nothing.
    release = load(manifest).release
    request = RunRequest(manifest=manifest, n_cases=len(expand(release)), ray_address=ray_address,
                         resume_run=resume, wait=wait, promote=promote, verbose=verbose)
    launcher = find_launcher()
    # stdout carries only the outcome (JSON for --json): what Prefect, Ray or a library prints while the
    # run goes on (e.g. Ray's "(raylet) A worker died" notice) goes to stderr.
    with _progress_line() as on_progress, contextlib.redirect_stdout(sys.stderr):
        outcome = launcher(request, settings(db), on_progress)
    if as_json:
        print(json.dumps(outcome.to_dict(), indent=2, default=str))
    else:
        _print_outcome(Console(width=None if sys.stdout.isatty() else 200), outcome)
    exit_with(ExitCode.OK if outcome.verdict == Verdict.PASS else ExitCode.FAIL)


@contextlib.contextmanager
def _progress_line() -> Iterator["ProgressSink"]:
    """A status line on stderr: redrawn on a terminal, one line per change in logs and CI."""
    sink = ProgressSink()
    stop = threading.Event()

    def ticker() -> None:
        start = time.monotonic()
        last = ""
        while not stop.wait(1.0):
            line = sink.text
            if sys.stderr.isatty():
                sys.stderr.write(f"\r\033[K{line} [{time.monotonic() - start:.0f} s]")
                sys.stderr.flush()
            elif line != last:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
            last = line

    thread = threading.Thread(target=ticker, daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        stop.set()
        thread.join(timeout=2)
        if sys.stderr.isatty():
            sys.stderr.write("\n")


class ProgressSink:
    """The progress callback the flow calls from its worker threads; the ticker reads `text`."""

    def __init__(self) -> None:
        self.text = "starting"

    def __call__(self, p: Progress) -> None:
        self.text = (f"cases {p.done}/{p.total} done, {p.running} running, {p.failed} failed, "
                     f"elapsed {p.elapsed_s:.0f} s")


def _print_outcome(console: Console, outcome: RunOutcome) -> None:
    colour = {Verdict.PASS: "green", Verdict.FAIL: "red"}.get(outcome.verdict, "yellow")
    console.print(f"run {outcome.run_id}: [bold {colour}]{outcome.verdict}[/]  candidate {outcome.digest}")
    for reason in outcome.reasons:
        console.print(f"  {reason['status']:<11} {reason['check']}: {reason['message']}", markup=False,
                      highlight=False)
    if outcome.stage_seconds:
        console.print("stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in outcome.stage_seconds.items()))
    for p in outcome.promotions:
        console.print(f"promotion {p.target}: {p.outcome}", markup=False)
    console.print(f"report: {outcome.report}", markup=False, highlight=False)
