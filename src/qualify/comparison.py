"""Compare two runs case by case, and follow one case over past runs, with the gate's own rule.

`qualify compare`, `qualify history` and the HTML report's baseline section use this module. A
comparison calls a change a *regression* exactly when the gate would (qualify.gate.stats.compare_samples
with the policy of the newer run: the ratio beyond the tolerance AND, with enough samples, a significant
one-sided Welch t-test on the logs of the launch-level samples), an *improvement* when the same rule read the other way round says the
older run is the worse one, and *noise* otherwise. Results whose fingerprints differ are not compared
(DESIGN.md: like with like). The ratio's interval is the gate's percentile bootstrap of the medians
(qualify.gate.stats.gain_interval), so it is deterministic.

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
from qualify.gate.checks import _series as gate_series  # the gate's own choice of samples for a metric
from qualify.imageref import InvalidReference, parse_reference
from qualify.manifest import RegressionPolicy
from qualify.manifest.load import ManifestError
from qualify.store import repo
from qualify.store.models import CaseResult, GateDecision, Release, Run

Call = Literal["regression", "improvement", "noise", "not comparable", "missing"]
FINISHED = ("passed", "failed", "incomplete")
CONFIDENCE = 0.90


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
    ratio: float | None  # median B / median A
    ratio_low: float | None  # the bootstrap interval of that ratio
    ratio_high: float | None
    p_value: float | None  # one-sided Mann-Whitney, "B is worse" (or "better" for an improvement)
    method: str  # welch-log | ratio-only | none
    tolerance: float | None
    call: Call
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_series(case_id: str, metric: str, a: Sequence[float], b: Sequence[float], policy: RegressionPolicy,
                   *, confidence: float = CONFIDENCE) -> MetricComparison:
    """B against A with the gate's rule (the regression policy's tolerance, alpha, minimum samples, noise floor)."""
    direction = metric_info.direction(metric) if metric_info.is_known(metric) else "higher"
    params = dict(metric=metric, max_regression=policy.max_regression, alpha=policy.alpha,
                  min_samples=policy.min_samples, noise_floor=policy.noise_floor)
    worse = stats.compare_samples(b, a, direction, **params)  # is B worse than A? (the gate's question)
    interval = stats.gain_interval(b, a, "higher", confidence=confidence)  # of median B / median A - 1
    common = dict(case_id=case_id, metric=metric, direction=direction, median_a=worse.median_baseline,
                  median_b=worse.median_candidate, n_a=worse.n_baseline, n_b=worse.n_candidate, ratio=worse.ratio,
                  ratio_low=1 + interval.low if interval else None, ratio_high=1 + interval.high if interval else None,
                  method=worse.method, tolerance=worse.tolerance)
    if worse.method == "none":
        return MetricComparison(**common, p_value=None, call="missing", message=worse.message)
    if worse.regressed:
        return MetricComparison(**common, p_value=worse.p_value, call="regression", message=worse.message)
    better = stats.compare_samples(a, b, direction, **params)  # the same rule read the other way round
    if better.regressed:
        return MetricComparison(**common, p_value=better.p_value, call="improvement",
                                message=f"improvement: A is worse than B by the gate's rule ({better.message})")
    return MetricComparison(**common, p_value=worse.p_value, call="noise", message=worse.message)


def _not_compared(case_id: str, metric: str, call: Call, why: str, a: ResultData | None,
                  b: ResultData | None) -> MetricComparison:
    direction = metric_info.direction(metric) if metric_info.is_known(metric) else "higher"
    med_a = stats.median(gate_series(a, metric)) if a is not None else None
    med_b = stats.median(gate_series(b, metric)) if b is not None else None
    return MetricComparison(case_id, metric, direction, med_a, med_b, len(gate_series(a, metric)) if a else 0,
                            len(gate_series(b, metric)) if b else 0,
                            med_b / med_a if med_a and med_b is not None else None, None, None, None, "none", None,
                            call, why)


def compare_results(case_id: str, metric: str, a: ResultData | None, b: ResultData | None,
                    policy: RegressionPolicy) -> MetricComparison:
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
    return compare_series(case_id, metric, gate_series(a, metric), gate_series(b, metric), policy)


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
                "policy": self.policy, "confidence": CONFIDENCE, "counts": self.counts(),
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
    case_ids = list(dict.fromkeys([c for c in order if c in res_a or c in res_b] + list(res_b) + list(res_a)))
    rows = []
    for case_id in case_ids:
        sample = res_b.get(case_id) or res_a[case_id]
        names = list(metrics) if metrics else policy.metrics_for(sample.kind)
        for metric in names:
            rows.append(compare_results(case_id, metric, res_a.get(case_id), res_b.get(case_id), policy))
    policy_figures = {k: getattr(policy, k) for k in ("max_regression", "alpha", "min_samples", "noise_floor")}
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
    low: float | None  # smallest and largest sample (the spread over repeats)
    high: float | None
    n: int
    fingerprint_changes: list[str]  # against the previous point that had a fingerprint; empty: unchanged

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["started_at"] = self.started_at.isoformat() if self.started_at else None
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
                                   changes))
    return metric, points


def _latest_verdicts(session: Session, run_ids: list[int]) -> dict[int, str]:
    if not run_ids:
        return {}
    latest = (select(GateDecision.run_id, func.max(GateDecision.id).label("id"))
              .where(GateDecision.run_id.in_(run_ids)).group_by(GateDecision.run_id).subquery())
    rows = session.execute(select(GateDecision.run_id, GateDecision.verdict)
                           .join(latest, latest.c.id == GateDecision.id)).all()
    return {run_id: verdict for run_id, verdict in rows}
