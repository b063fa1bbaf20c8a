"""`qualify compare REF_A REF_B` and `qualify history CASE_ID`: releases side by side, a case over time.

Both read only (never migrate or write) and exit 0 when they could answer (a regression is information
here, not a refusal: the gate decides), 2 for an unknown reference or case, 3 when the database fails.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import typer

from qualify.cli.common import DbOption, JsonOption, open_db, say
from qualify.cli.outputs import output_file, write_bytes
from qualify.comparison import calibration_views, case_history, compare_runs, resolve_ref
from qualify.errors import BadInput
from qualify.report.views import fmt_number

RepositoryOption = typer.Option(None, "--repository", metavar="REPO",
                                help="the repository a bare tag belongs to (when several have it)")


def compare(ref_a: str = typer.Argument(..., metavar="REF_A", help="the reference: run:N, TAG or REPOSITORY:TAG"),
            ref_b: str = typer.Argument(..., metavar="REF_B", help="the one judged against it (e.g. 25.05 after 25.04)"),
            db: Optional[str] = DbOption, repository: Optional[str] = RepositoryOption,
            metric: Optional[list[str]] = typer.Option(None, "--metric", metavar="M",
                                                       help="compare these metrics (default: B's regression metrics)"),
            as_json: bool = JsonOption) -> None:
    """Per case and metric: both medians, the ratio B/A with its 90% interval, and whether the gate's rule calls
    it a regression, within tolerance, an improvement or undecided (the gate's rule). A tag stands for its newest PASS run (else its newest finished run)."""
    with open_db(db, migrate=False)() as session:
        a, b = _resolve_pair(session, ref_a, ref_b, repository)
        if a.run_id == b.run_id:  # a run compared with itself says nothing: every change would be 0
            raise BadInput(f"{ref_a!r} and {ref_b!r} are the same run ({a.run_id}): compare two different runs "
                           f"(run:N names one run)")
        result = compare_runs(session, a, b, metric or None)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
        return
    for side, run in (("A", a), ("B", b)):
        say(f"{side}: run {run.run_id} {run.label} ({run.how}), verdict {run.verdict or 'none'}, "
            f"digest {run.digest or 'n/a'}")
    p = result.policy
    say(f"rule (B's policy, the gate's history mode; baseline mode {result.baseline_mode}): change = B/A - 1 in the "
        f"metric's better direction, with one-sided bounds (alpha {p['alpha']:g}) over the two runs, the "
        f"fingerprint's calibrated run-to-run variation included; a regression when even the best end is below "
        f"-{p['max_regression']:.0%}, within tolerance when the worst end is above it, an improvement when the worst "
        f"end is above +{p['max_regression']:.0%}, otherwise undecided (always undecided without a calibration)")
    width = max([len(r.case_id) for r in result.rows] + [4])
    mwidth = max([len(r.metric) for r in result.rows] + [6])
    say(f"{'case':<{width}}  {'metric':<{mwidth}}  {'A median':>10}  {'B median':>10}  {'change':>7}  "
        f"{'worst .. best':<17}  {'n B/A':>6}  call")
    for r in result.rows:
        interval = f"{r.change_worst * 100:+.1f}% .. {r.change_best * 100:+.1f}%" if r.change_worst is not None else "n/a"
        say(f"{r.case_id:<{width}}  {r.metric:<{mwidth}}  {fmt_number(r.median_a):>10}  {fmt_number(r.median_b):>10}  "
            f"{(f'{r.change * 100:+.1f}%' if r.change is not None else 'n/a'):>7}  {interval:<17}  "
            f"{f'{r.n_b}/{r.n_a}':>6}  {r.call}"
            + (f" ({r.message})" if r.call in ("missing", "not comparable", "undecided") else ""))
    counts = result.counts()
    say("summary: " + (", ".join(f"{n} {call}" for call, n in sorted(counts.items())) or "nothing to compare"))


def _resolve_pair(session, ref_a: str, ref_b: str, repository: str | None):  # type: ignore[no-untyped-def]
    """A bare tag on one side takes the other side's repository when that side names one."""
    named = [ref for ref in (ref_a, ref_b) if ref.startswith("run:") or "/" in ref]
    if repository is None and named and len(named) < 2:
        anchor = resolve_ref(session, named[0])
        return (resolve_ref(session, ref_a, anchor.repository) if ref_a not in named else anchor,
                resolve_ref(session, ref_b, anchor.repository) if ref_b not in named else anchor)
    return resolve_ref(session, ref_a, repository), resolve_ref(session, ref_b, repository)


def history(case_id: str = typer.Argument(..., metavar="CASE_ID", help="e.g. train/llama3-8b/compile"),
            metric: Optional[str] = typer.Option(None, "--metric", metavar="M",
                                                 help="default: the case kind's regression metric"),
            png: Optional[Path] = typer.Option(None, "--png", metavar="FILE", help="also draw the chart as a PNG"),
            repository: Optional[str] = RepositoryOption,
            limit: int = typer.Option(50, "--limit", min=1, help="the newest N runs with a result for the case"),
            db: Optional[str] = DbOption, as_json: bool = JsonOption) -> None:
    """The metric over past runs (oldest first) as a table and, with --png, a chart; fingerprint changes marked
    (before such a change, results are not like for like and the gate does not compare them)."""
    from qualify import metrics as metric_info

    if metric is not None and not metric_info.is_known(metric):
        raise BadInput(f"unknown metric {metric!r} (known: {', '.join(sorted(metric_info.METRICS))})")
    if png is not None:
        output_file(png, "--png")  # bad input before anything is read
    with open_db(db, migrate=False)() as session:
        metric, points = case_history(session, case_id, metric, repository=repository, limit=limit)
        calibrations = calibration_views(session, [p.fingerprint_key for p in points], metric)
    if png is not None:
        from qualify.report.charts import history_chart

        write_bytes(png, history_chart(case_id, metric, [p.to_dict() for p in points]), "--png")
    if as_json:
        print(json.dumps({"case_id": case_id, "metric": metric, "direction": metric_info.direction(metric),
                          "png": str(png) if png else None, "points": [p.to_dict() for p in points],
                          "calibrations": [dataclasses.asdict(c) for c in calibrations]},
                         indent=2, default=str))
        return
    say(f"{case_id} {metric} ({metric_info.direction(metric)} is better), {len(points)} runs, oldest first")
    say(f"{'run':>5}  {'release':<12}  {'verdict':<10}  {'result':<7}  {'median':>10}  {'min..max':<21}  {'n':>3}  "
        "digest         fingerprint")
    for k, p in enumerate(points):
        span = f"{fmt_number(p.low)}..{fmt_number(p.high)}" if p.low is not None else "n/a"
        change = ("CHANGED: " + "; ".join(p.fingerprint_changes[:3])
                  + (f"; +{len(p.fingerprint_changes) - 3} more" if len(p.fingerprint_changes) > 3 else "")
                  if p.fingerprint_changes else "same" if k else "first shown")
        say(f"{p.run_id:>5}  {p.tag:<12}  {p.verdict or 'none':<10}  {p.result_status:<7}  {fmt_number(p.median):>10}  "
            f"{span:<21}  {p.n:>3}  {(p.digest or 'n/a')[:14]:<14} {change}")
    for view in calibrations:
        say(view.line())
    if not calibrations:
        say("no calibration for these fingerprints: history mode cannot decide (qualify calibrate MANIFEST)")
    if png is not None:
        say(f"chart: {png.resolve()}")
