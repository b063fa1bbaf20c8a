"""Compare two runs case by case, and follow one case over past runs, with the gate's own rule.

`qualify compare`, `qualify history` and the HTML report's baseline section use this module. A
comparison decides exactly as the gate's history mode would (qualify.gate.stats.compare_history with the
newer run's policy and the fingerprint's calibrated run-to-run variation, the rule in
qualify.gate.noninferiority): *regression* when a drop beyond max_regression is shown, *within tolerance*
when non-inferiority is shown, *improvement* when a gain beyond max_regression is shown, *undecided*
otherwise (including every comparison of a fingerprint that was never calibrated: two runs cannot be told
apart without their run-to-run variation). The change is B / A - 1 in the metric's better direction, with
the interval's worst and best ends. Results whose fingerprints differ are not compared (like
with like).

A reference names a run: ``run:N``, a release tag (``25.05``, of the one repository that has it, or of
the repository the other reference names), or ``REPOSITORY:TAG``. A tag selects the run the gate would
use as a baseline -- the newest run whose latest decision is PASS -- and, when the tag has none, the
newest finished run; `ResolvedRun.how` says which.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping, Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from qualify import metrics as metric_info
from qualify.errors import BadInput
from qualify.manifest.fingerprint import differences as fingerprint_differences
from qualify.gate import stats
from qualify.gate.checks import ResultData
from qualify.gate import calibration, noninferiority as ni
from qualify.gate.checks import series as gate_series  # the gate's own choice of samples for a metric
from qualify.imageref import InvalidReference, parse_reference
from qualify.manifest import RegressionPolicy
from qualify.manifest.load import ManifestError
from qualify.store import repo
from qualify.store.models import CaseResult, GateDecision, Release, Run
from qualify.timestamps import iso

Call = Literal["regression", "within tolerance", "improvement", "undecided", "not comparable", "missing"]
FINISHED = ("passed", "failed", "incomplete")


# --------------------------------------------------------------------------- references


@dataclass(frozen=True)
class ResolvedRun:
    run_id: int
    label: str  # repository:tag
    repository: str
    tag: str
    how: str  # why this run: "run:N as given", "newest PASS run of the tag", ...
    verdict: str | None
    digest: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_run(session: Session, run: Run, how: str) -> ResolvedRun:
    decision = repo.latest_decision(session, run.id)
    return ResolvedRun(run.id, f"{run.release.repository}:{run.release.tag}", run.release.repository,
                       run.release.tag, how, decision.verdict if decision else None, run.candidate_digest)


def resolve_ref(session: Session, text: str, repository: str | None = None) -> ResolvedRun:
    """A run for `run:N`, `TAG` or `REPOSITORY:TAG` (see the module docstring); BadInput when there is none."""
    text = text.strip()
    if text.startswith("run:"):
        try:
            run_id = int(text[4:])
        except ValueError:
            raise BadInput(f"{text!r}: a run reference is run:<number>") from None
        run = repo.get_run(session, run_id)
        if run is None:
            raise BadInput(f"no run {run_id}")
        return describe_run(session, run, f"run {run_id} as given")
    if "/" in text:
        try:
            ref = parse_reference(text)
        except InvalidReference as exc:
            raise BadInput(f"{text!r} is neither run:N, a tag nor REPOSITORY:TAG ({exc})") from None
        if not ref.tag or ref.digest:
            raise BadInput(f"{text!r}: name a tag (REPOSITORY:TAG) or a run (run:N)")
        return _run_of_tag(session, _stored_repository(session, text.rsplit(":", 1)[0], ref.name), ref.tag)
    repositories = session.scalars(select(Release.repository).where(Release.tag == text)
                                   .order_by(Release.repository)).all()
    if repository is not None:
        if repository not in repositories:
            raise BadInput(f"{repository} has no release tagged {text!r}"
                           + (f" (it exists in {', '.join(repositories)})" if repositories else ""))
        return _run_of_tag(session, repository, text)
    if not repositories:
        raise BadInput(f"no release is tagged {text!r} (use run:N, TAG or REPOSITORY:TAG)")
    if len(repositories) > 1:
        raise BadInput(f"tag {text!r} exists in {len(repositories)} repositories ({', '.join(repositories)}): "
                       "write REPOSITORY:TAG")
    return _run_of_tag(session, repositories[0], text)


def _stored_repository(session: Session, written: str, normalised: str) -> str:
    """The repository as the database spells it (as written in the manifest, or its normalised name)."""
    for name in dict.fromkeys((written, normalised)):
        if session.scalar(select(Release.id).where(Release.repository == name).limit(1)) is not None:
            return name
    raise BadInput(f"no release of repository {written} in the database")


def _run_of_tag(session: Session, repository: str, tag: str) -> ResolvedRun:
    run = repo.baseline_run(session, repository, tag)
    if run is not None:
        return describe_run(session, run, f"newest run of {tag} whose latest decision is PASS")
    release = session.scalar(select(Release).where(Release.repository == repository, Release.tag == tag))
    if release is None:
        raise BadInput(f"no release {repository}:{tag}")
    run = session.scalar(select(Run).where(Run.release_id == release.id, Run.status.in_(FINISHED))
                         .order_by(Run.id.desc()).limit(1))
    if run is None:
        raise BadInput(f"{repository}:{tag} has no finished run")
    return describe_run(session, run, f"newest finished run of {tag}; it has no PASS run")


# --------------------------------------------------------------------------- one metric


@dataclass
class MetricComparison:
    """B (the newer run) against A (the reference) for one case and one metric."""

    case_id: str
    metric: str
    direction: str
    median_a: float | None
    median_b: float | None
    n_a: int
    n_b: int
    change: float | None  # B / A - 1 in the better direction (positive: B better), on the launches' logs
    change_worst: float | None  # the interval's worst end (one-sided bound at the gate's look level)
    change_best: float | None
    could_see: float | None  # the drop the rule detects with 90% power here
    calibrated: bool  # the fingerprint's run-to-run variation was known
    tolerance: float | None  # the policy's max_regression
    call: Call
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_series(case_id: str, metric: str, a: Sequence[float], b: Sequence[float], policy: RegressionPolicy,
                   *, variation: ni.RunVariation | None = None) -> MetricComparison:
    """B against A with the gate's history rule (the policy's tolerance and alpha; runs as the unit)."""
    direction = metric_info.direction(metric) if metric_info.is_known(metric) else "higher"
    cmp = stats.compare_history(b, a, direction, variation=variation, metric=metric,
                                max_regression=policy.max_regression, alpha=policy.alpha,
                                min_samples=min(policy.min_samples, max(2, len(b))),
                                max_launches=policy.max_launches)
    outcome = cmp.outcome
    common = dict(case_id=case_id, metric=metric, direction=direction, median_a=cmp.median_baseline,
                  median_b=cmp.median_candidate, n_a=cmp.n_baseline, n_b=cmp.n_candidate,
                  change=outcome.interval.change if outcome else None,
                  change_worst=outcome.interval.worst if outcome else None,
                  change_best=outcome.interval.best if outcome else None,
                  could_see=outcome.could_see if outcome else None, calibrated=variation is not None,
                  tolerance=policy.max_regression)
    if not cmp.n_candidate or not cmp.n_baseline:
        return MetricComparison(**common, call="missing", message=cmp.message)
    if outcome is None:
        return MetricComparison(**common, call="undecided", message=cmp.message)
    if outcome.decision is ni.Decision.FAIL:
        return MetricComparison(**common, call="regression", message=cmp.message)
    if outcome.decision is ni.Decision.PASS:
        # A gain beyond the tolerance shown is an improvement (the same bound, the other side).
        improved = outcome.interval.lower > -ni.margin(policy.max_regression)
        return MetricComparison(**common, call="improvement" if improved else "within tolerance",
                                message=cmp.message)
    return MetricComparison(**common, call="undecided", message=cmp.message)


def _not_compared(case_id: str, metric: str, call: Call, why: str, a: ResultData | None,
                  b: ResultData | None) -> MetricComparison:
    direction = metric_info.direction(metric) if metric_info.is_known(metric) else "higher"
    med_a = stats.median(gate_series(a, metric)) if a is not None else None
    med_b = stats.median(gate_series(b, metric)) if b is not None else None
    return MetricComparison(case_id, metric, direction, med_a, med_b, len(gate_series(a, metric)) if a else 0,
                            len(gate_series(b, metric)) if b else 0, None, None, None, None, False, None, call, why)


def compare_results(case_id: str, metric: str, a: ResultData | None, b: ResultData | None,
                    policy: RegressionPolicy,
                    calibrations: Mapping[str, ni.RunVariation] | None = None) -> MetricComparison:
    """One case's metric, with the reasons the gate has for not comparing (missing, failed, not like for like)."""
    for side, result in (("A", a), ("B", b)):
        if result is None:
            return _not_compared(case_id, metric, "missing", f"run {side} has no result for this case", a, b)
        if result.status != "passed":
            return _not_compared(case_id, metric, "missing",
                                 f"the result of run {side} is {result.status} ({result.error_class or 'no class'})",
                                 a, b)
    assert a is not None and b is not None
    diffs = fingerprint_differences(b.fingerprint, a.fingerprint)
    if diffs:
        return _not_compared(case_id, metric, "not comparable",
                             "not like for like, the fingerprints differ: " + "; ".join(diffs[:6])
                             + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else ""), a, b)
    variation = (calibrations or {}).get(calibration.lookup(b.fingerprint, metric))
    return compare_series(case_id, metric, gate_series(a, metric), gate_series(b, metric), policy,
                          variation=variation)


# --------------------------------------------------------------------------- two runs


@dataclass
class RunComparison:
    a: ResolvedRun
    b: ResolvedRun
    baseline_mode: str  # the newer run's gate.regression.baseline: history | optional | paired
    policy: dict[str, Any]
    rows: list[MetricComparison] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.rows:
            out[row.call] = out.get(row.call, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a.to_dict(), "b": self.b.to_dict(), "baseline_mode": self.baseline_mode,
                "policy": self.policy, "counts": self.counts(),
                "rows": [r.to_dict() for r in self.rows]}


def run_policy(run: Run) -> tuple[RegressionPolicy, list[str]]:
    """The run's own regression policy and its manifest order of case ids (defaults when unreadable)."""
    from qualify.manifest.cases import expand

    try:
        release = repo.run_manifest(run).release
    except ManifestError:
        return RegressionPolicy(), []
    return release.gate.regression, [c.case_id for c in expand(release)]


def results_by_case(session: Session, run_id: int) -> dict[str, ResultData]:
    return {r.case_id: ResultData.from_row(r) for r in repo.case_results(session, run_id)}


def compare_runs(session: Session, a: ResolvedRun, b: ResolvedRun,
                 metrics: Sequence[str] | None = None) -> RunComparison:
    """Every case of either run and every metric the newer run's policy compares (or `metrics`)."""
    run_b = repo.get_run(session, b.run_id)
    assert run_b is not None
    policy, order = run_policy(run_b)
    res_a, res_b = results_by_case(session, a.run_id), results_by_case(session, b.run_id)
    calibrations = repo.calibrations_for(session, [r.fingerprint for r in res_b.values()])
    case_ids = list(dict.fromkeys([c for c in order if c in res_a or c in res_b] + list(res_b) + list(res_a)))
    rows = []
    for case_id in case_ids:
        sample = res_b.get(case_id) or res_a[case_id]
        names = list(metrics) if metrics else policy.metrics_for(sample.kind)
        for metric in names:
            rows.append(compare_results(case_id, metric, res_a.get(case_id), res_b.get(case_id), policy,
                                        calibrations))
    policy_figures = {k: getattr(policy, k) for k in ("max_regression", "alpha", "min_samples", "max_launches")}
    return RunComparison(a, b, policy.baseline, policy_figures, rows)


# --------------------------------------------------------------------------- one case over time


@dataclass
class HistoryPoint:
    run_id: int
    repository: str
    tag: str
    digest: str | None
    started_at: dt.datetime | None
    result_status: str
    verdict: str | None  # the run's latest decision
    median: float | None
    low: float | None  # smallest and largest launch figure (the spread over the run's launches)
    high: float | None
    n: int
    fingerprint_changes: list[str]  # against the previous point that had a fingerprint; empty: unchanged
    fingerprint_key: str = ""  # qualify.gate.calibration.key: what its calibrations are filed under

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["started_at"] = iso(self.started_at)
        return out


def default_metric(kind: str) -> str:
    return RegressionPolicy().metrics_for(kind)[0] if RegressionPolicy().metrics_for(kind) else "tokens_per_s"


def case_history(session: Session, case_id: str, metric: str | None = None, *, repository: str | None = None,
                 limit: int = 50) -> tuple[str, list[HistoryPoint]]:
    """The metric of `case_id` over the newest `limit` runs that have a result for it, oldest first."""
    stmt = (select(CaseResult, Run, Release).join(Run, Run.id == CaseResult.run_id)
            .join(Release, Release.id == Run.release_id).where(CaseResult.case_id == case_id))
    if repository:
        stmt = stmt.where(Release.repository == repository)
    rows = session.execute(stmt.order_by(CaseResult.run_id.desc()).limit(limit)).all()
    if not rows:
        raise BadInput(f"no result for case {case_id!r}" + (f" in {repository}" if repository else "")
                       + " (`qualify runs show RUN` lists case ids)")
    rows.reverse()
    metric = metric or default_metric(rows[-1][0].kind)
    verdicts = _latest_verdicts(session, [run.id for _, run, _ in rows])
    points: list[HistoryPoint] = []
    previous_fp: Mapping[str, Any] | None = None
    for result, run, release in rows:
        data = ResultData.from_row(result)
        series = gate_series(data, metric)
        changes: list[str] = []
        if previous_fp is not None and data.fingerprint:
            changes = fingerprint_differences(data.fingerprint, previous_fp)
        if data.fingerprint:
            previous_fp = data.fingerprint
        points.append(HistoryPoint(run.id, release.repository, release.tag, run.candidate_digest, run.started_at,
                                   result.status, verdicts.get(run.id), stats.median(series),
                                   min(series) if series else None, max(series) if series else None, len(series),
                                   changes, calibration.key(data.fingerprint)))
    return metric, points


def _latest_verdicts(session: Session, run_ids: list[int]) -> dict[int, str]:
    if not run_ids:
        return {}
    latest = (select(GateDecision.run_id, func.max(GateDecision.id).label("id"))
              .where(GateDecision.run_id.in_(run_ids)).group_by(GateDecision.run_id).subquery())
    rows = session.execute(select(GateDecision.run_id, GateDecision.verdict)
                           .join(latest, latest.c.id == GateDecision.id)).all()
    return {run_id: verdict for run_id, verdict in rows}


# --------------------------------------------------------------------------- calibrations


@dataclass(frozen=True)
class CalibrationView:
    """What `qualify calibrate` measured for one fingerprint and metric (the newest), as `history` shows it."""

    fingerprint_key: str
    metric: str
    created_at: str
    image: str
    runs: int
    launches: int
    sd_run: float
    sd_launch: float
    false_alarm_rate: float
    aa_comparisons: int
    slowdown: float
    detection_rate: float | None
    detectable: float

    def line(self) -> str:
        detected = f"{self.detection_rate:.0%}" if self.detection_rate is not None else "n/a"
        return (f"calibrated {self.created_at[:19]} ({self.fingerprint_key[:12]}): {self.runs} A/A runs of "
                f"{self.launches} launches, run-to-run {self.sd_run:.2%}, launch sd {self.sd_launch:.2%}; "
                f"realized false alarms {self.false_alarm_rate:.0%} of {self.aa_comparisons} A/A pairs; "
                f"slowdown {self.slowdown:.0%} detected in {detected}; could see >= {self.detectable:.0%} "
                "(90% power)")


def calibration_views(session: Session, keys: Sequence[str], metric: str) -> list[CalibrationView]:
    """The newest calibration of each fingerprint key for `metric` ("*": every metric)."""
    rows = repo.latest_calibrations(session, [k for k in dict.fromkeys(keys) if k])
    return [CalibrationView(r.fingerprint_key, r.metric, r.created_at.isoformat() if r.created_at else "", r.image,
                            r.runs, r.launches, r.sd_run, r.sd_launch, r.false_alarm_rate, r.aa_comparisons,
                            r.slowdown, r.detection_rate, r.detectable) for r in rows if metric in ("*", r.metric)]
