"""`qualify run`: qualify a release end to end (through the launcher that drives the flow).

Exit codes: 0 PASS, 1 FAIL (or INCOMPLETE, or a failed candidate), 2 bad input, 3 infrastructure.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
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
from qualify.report.verdict_text import reason_lines


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
        verbose: bool = typer.Option(False, "--verbose", "-v",
                                     help="show Prefect's task logs, and every gate check (the passed ones too)")
        ) -> None:
    """Qualify a release end to end: build, verify, run every case on Ray, gate, report, promote."""
    # Validate first, before Prefect and Ray start: bad input costs nothing and writes nothing.
    release = load(manifest).release
    request = RunRequest(manifest=manifest, n_cases=len(expand(release)), ray_address=ray_address,
                         resume_run=resume, wait=wait, promote=promote, verbose=verbose,
                         local_ray=not (ray_address or release.execution.ray_address or resume is not None))
    launcher = find_launcher()
    # stdout carries only the outcome (JSON for --json): what Prefect, Ray or a library prints while the
    # run goes on (e.g. Ray's "(raylet) A worker died" notice) goes to stderr.
    with _progress_line() as on_progress, contextlib.redirect_stdout(sys.stderr):
        outcome = launcher(request, settings(db), on_progress)
    if as_json:
        print(json.dumps(outcome.to_dict(), indent=2, default=str))
    else:
        _print_outcome(Console(width=None if sys.stdout.isatty() else 200, highlight=False), outcome, verbose)
    exit_with(ExitCode.OK if outcome.verdict == Verdict.PASS else ExitCode.FAIL)


@contextlib.contextmanager
def _progress_line() -> Iterator["ProgressSink"]:
    """A status line on stderr: redrawn on a terminal, one line per change in logs and CI."""
    sink = ProgressSink()
    stop = threading.Event()

    def ticker() -> None:
        last = ""
        while not stop.wait(1.0):
            line = sink.text
            if sys.stderr.isatty():
                sys.stderr.write(f"\r\033[K{line}")
                sys.stderr.flush()
                continue
            changed = line.rsplit("; elapsed", 1)[0]  # in logs, a line when the cases move, not every second
            if changed != last:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
            last = changed

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
    """The progress callback the flow calls from its worker threads; the ticker reads `text` every second."""

    def __init__(self) -> None:
        self.progress: Progress | None = None

    def __call__(self, p: Progress) -> None:
        self.progress = p

    @property
    def text(self) -> str:
        return progress_text(self.progress)


def progress_text(p: Progress | None, width: int = 60) -> str:
    """'cases 1/8 done, 1 failed; running: a, b; queued: 5; elapsed 71 s, about 140 s left': the running cases
    by name (their Ray task started), the queued ones counted, the elapsed time read now (never frozen at the
    last change), and the estimate of the end when every unfinished case has an expected duration."""
    if p is None:
        return "starting"
    names = p.running_cases
    shown = ""
    for k, name in enumerate(names):
        more = f", +{len(names) - k} more" if shown else f"{len(names)} cases"
        if len(shown) + len(name) + 2 > width:
            shown += more
            break
        shown += (", " if shown else "") + name
    running = f"; running: {shown}" if names else ""
    queued = f"; queued: {len(p.queued_cases)}" if p.queued_cases else ""
    left = p.remaining_s()
    eta = f", about {left:.0f} s left" if left is not None else ""
    return f"cases {p.done}/{p.total} done, {p.failed} failed{running}{queued}; elapsed {p.elapsed_s:.0f} s{eta}"


def _print_outcome(console: Console, outcome: RunOutcome, verbose: bool = False) -> None:
    """The verdict, then what failed or could not be judged; the passed checks as a count (all with --verbose)."""
    colour = {Verdict.PASS: "green", Verdict.FAIL: "red"}.get(outcome.verdict, "yellow")
    console.print(f"run {outcome.run_id}: [bold {colour}]{outcome.verdict}[/]  candidate {outcome.digest}",
                  highlight=False)
    for line in reason_lines(outcome.reasons, verbose):
        console.print(f"  {line}", markup=False, highlight=False)
    if outcome.stage_seconds:
        console.print("stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in outcome.stage_seconds.items()))
    if outcome.launch_time:
        console.print(outcome.launch_time, markup=False, highlight=False)
    for p in outcome.promotions:
        console.print(f"promotion {p.target}: {p.outcome}", markup=False)
    console.print(f"report: {outcome.report}", markup=False, highlight=False)
