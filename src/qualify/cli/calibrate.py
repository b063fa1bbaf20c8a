"""`qualify calibrate MANIFEST`: measure the regression gate on this machine, per case fingerprint.

Exit 0 when every chosen case was calibrated, 2 for a bad manifest or option, 3 when a run could not be
made (Ray, the database, a calibration run that did not pass).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from qualify.cli.common import DbOption, JsonOption, load, open_db, say
from qualify.errors import BadInput


def calibrate(manifest: Path = typer.Argument(..., help="release manifest (YAML)"),
              runs: int = typer.Option(6, "--runs", help="A/A runs of each case (identical code)"),
              slowed_runs: int = typer.Option(3, "--slowed-runs", help="runs with the injected slowdown"),
              slowdown: float = typer.Option(0.10, "--slowdown",
                                             help="params.slowdown of the slowed runs: fractional extra work"),
              case: Optional[list[str]] = typer.Option(None, "--case", metavar="GLOB",
                                                       help="calibrate only these case ids"),
              python: Optional[str] = typer.Option(None, "--python",
                                                   help="the interpreter whose environment is measured "
                                                        "(default: build.python, else this one)"),
              db: Optional[str] = DbOption, as_json: bool = JsonOption) -> None:
    """Run each throughput case as A/A runs and as runs with an injected slowdown; store per fingerprint the
    run-to-run variation, the realized false-alarm rate and the smallest regression detected with 90% power,
    which the gate's history mode needs to decide."""
    from qualify.execution import calibrate as calibration_runs
    from qualify.execution.ray import start_ray
    from qualify.executors import LocalExecutor

    if runs < 3:
        raise BadInput(f"--runs: at least 3 A/A runs are needed (a pair left out still leaves 1), got {runs}")
    if not 0 < slowdown < 1 or slowed_runs < 1:
        raise BadInput(f"--slowdown {slowdown} / --slowed-runs {slowed_runs}: a fraction of extra work in (0, 1) "
                       "and at least one slowed run")
    loaded = load(manifest)
    release = loaded.release
    if release.execution.executor != "local":
        raise BadInput(f"{manifest}: execution.executor {release.execution.executor!r}: calibrate measures the "
                       "local executor's environment (--python); a container image is calibrated by running "
                       "calibrate inside it")
    chosen = calibration_runs.calibrated_cases(release)
    if case:
        chosen = [c for c in chosen if any(fnmatch.fnmatchcase(c.case_id, g) for g in case)]
        if not chosen:
            raise BadInput(f"--case {' '.join(case)}: matches no single-node case with a regression metric")
    interpreter = python or release.build.python or sys.executable
    if release.build.python and not python and not Path(interpreter).is_absolute():
        interpreter = str((manifest.resolve().parent / interpreter).resolve())
    sessions = open_db(db)
    handle = start_ray(release.execution.ray_address)
    try:
        measured = calibration_runs.calibrate(sessions, release, LocalExecutor(python=interpreter),
                                              image=f"local interpreter {interpreter}", runs=runs,
                                              slowed_runs=slowed_runs, slowdown=slowdown, cases=chosen,
                                              log=lambda m: print(m, file=sys.stderr))
    finally:
        handle.shutdown()
    if as_json:
        print(json.dumps([dataclasses.asdict(m) for m in measured], indent=2))
        return
    say(f"{'case':<32} {'metric':<20} {'launches':>8} {'run-to-run':>10} {'launch sd':>9} "
        f"{'false alarms':>12} {'detected':>9} {'could see':>9}")
    for m in measured:
        detected = f"{m.detection_rate:.0%}" if m.detection_rate is not None else "n/a"
        say(f"{m.case_id:<32} {m.metric:<20} {m.launches:>8} {m.sd_run:>10.2%} {m.sd_launch:>9.2%} "
            f"{m.false_alarm_rate:>7.0%} of {m.aa_comparisons:<3} {detected:>9} {'>= ' + format(m.detectable, '.0%'):>9}")
    say(f"stored {len(measured)} calibration(s); detected: share of slowed-vs-A run pairs FAILed at "
        f"slowdown {slowdown:g}; could see: the drop the history rule FAILs with 90% power")
