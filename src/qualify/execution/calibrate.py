"""`qualify calibrate`: each throughput case of a manifest run several times as whole runs, to measure the gate.

For every case whose kind has regression metrics (single-node), ``runs`` A/A runs of the case as planned
(its launches, one Ray task each, exactly as `qualify run` runs it) and ``slowed_runs`` runs with the
injected slowdown (``params.slowdown``: fractional extra work per step, understood by the synthetic and
the training workloads). Per regression metric, qualify.gate.calibration turns the runs' launch figures into
the run-to-run variation, the realized false-alarm rate (A/A pairs the gate's history rule FAILs), the
detection rate at the slowdown, and the smallest drop detected with 90% power; one `calibrations` row each,
keyed by the result's fingerprint, which the gate's history mode then reads.

The runs are not qualification runs: nothing is gated or promoted, and no run row is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from sqlalchemy.orm import Session, sessionmaker

from qualify import metrics as metric_info
from qualify.errors import BadInput, InfraError
from qualify.execution.ray import run_case_on_ray
from qualify.executors import Executor
from qualify.gate import calibration
from qualify.manifest import ReleaseManifest, fingerprint, is_reference_case
from qualify.manifest.cases import Case, expand
from qualify.result_document import per_launch_series
from qualify.store import repo


@dataclass(frozen=True)
class Measured:
    case_id: str
    metric: str
    fingerprint_key: str
    launches: int
    runs: int
    sd_run: float
    sd_launch: float
    false_alarm_rate: float
    aa_comparisons: int
    slowdown: float
    detection_rate: float | None
    detectable: float


def calibrated_cases(manifest: ReleaseManifest) -> list[Case]:
    """The cases history mode compares run against run: a gate.reference case is measured beside its reference
    image (paired or duet), which needs no calibration, and would only repeat its own case here."""
    reg = manifest.gate.regression
    return [c for c in expand(manifest)
            if reg.metrics_for(c.kind) and c.resources.nodes == 1 and not is_reference_case(c)]


def _one_run(executor: Executor, case: Case, slowdown: float) -> dict[str, Any]:
    doc = case.document()
    if slowdown:
        doc["params"] = {**doc["params"], "slowdown": slowdown}
    out = run_case_on_ray(executor, doc, case.resources, case.timeout_s)
    if out.doc.get("status") != "passed":
        raise InfraError(f"{case.case_id}: a calibration run did not pass ({out.doc.get('error_class')}: "
                         f"{str(out.doc.get('error') or '')[:300]}): nothing is stored for it")
    return out.doc


def calibrate(sessions: sessionmaker[Session], manifest: ReleaseManifest, executor: Executor, *, image: str,
              runs: int, slowed_runs: int, slowdown: float, cases: Sequence[Case] | None = None,
              log: Callable[[str], None] = lambda _m: None) -> list[Measured]:
    """Run and store; returns what was stored (one entry per case and regression metric)."""
    if runs < 3:
        raise BadInput(f"--runs: at least 3 A/A runs are needed (a pair left out still leaves 1), got {runs}")
    if not 0 < slowdown < 1:
        raise BadInput(f"--slowdown: a fraction of extra work in (0, 1), got {slowdown}")
    reg = manifest.gate.regression
    chosen = list(cases) if cases is not None else calibrated_cases(manifest)
    if not chosen:
        raise BadInput("the manifest has no single-node case with a regression metric (gate.regression.metrics)")
    # Cases of one fingerprint (the same measurement under two names) are pooled: their A/A runs are runs of
    # identical code, and the gate reads one calibration per fingerprint, the newest. Stored separately, the
    # second case's estimate from its own 3 runs replaced the first's (seen: 7.9% then 0.0%, clipped at zero, so
    # history mode judged every run as if runs never moved); pooled, it is one estimate from all of them.
    pools: dict[tuple[str, str], _Pool] = {}
    out: dict[tuple[str, str], Measured] = {}
    for case in chosen:
        a_docs = []
        for i in range(runs):
            log(f"{case.case_id}: A/A run {i + 1}/{runs}")
            a_docs.append(_one_run(executor, case, 0.0))
        s_docs = []
        for i in range(slowed_runs):
            log(f"{case.case_id}: run {i + 1}/{slowed_runs} with params.slowdown {slowdown:g}")
            s_docs.append(_one_run(executor, case, slowdown))
        fp = fingerprint.of_case(case, a_docs[0].get("environment") or {})
        for metric in reg.metrics_for(case.kind):
            pool = pools.setdefault((calibration.key(fp), metric), _Pool())
            pool.add(case.case_id, [per_launch_series(d.get("samples") or {}, metric) or [] for d in a_docs],
                     [per_launch_series(d.get("samples") or {}, metric) or [] for d in s_docs])
            variation = calibration.run_variation(pool.a_runs)
            if variation is None or not metric_info.is_known(metric):
                log(f"{case.case_id}: {metric}: no launch figures to calibrate with (needs >= 2 launches a run)")
                continue
            direction = metric_info.direction(metric)
            rates = calibration.realized_rates(pool.a_runs, pool.s_runs, direction,
                                               max_regression=reg.max_regression, alpha=reg.alpha)
            spread = calibration.launch_spread(pool.a_runs)
            launches = min(len(r) for r in pool.a_runs)
            detectable = calibration.detectable(variation, spread, launches, max_regression=reg.max_regression,
                                                alpha=reg.alpha)
            # Stored after each case (an interrupted calibration keeps what it measured); a later case of the
            # same fingerprint stores the pooled estimate, which, being newer, is the one the gate reads.
            with sessions() as session:
                repo.record_calibration(
                    session, fingerprint_key=calibration.key(fp), fingerprint=fp, case_id=pool.label,
                    metric=metric, image=image, launches=launches, runs=len(pool.a_runs), sd_run=variation.sd_run,
                    df=variation.df, sd_launch=spread, false_alarm_rate=rates.false_alarm_rate,
                    aa_comparisons=rates.aa_comparisons, slowdown=slowdown, slowed_runs=len(pool.s_runs),
                    detection_rate=rates.detection_rate, detectable=detectable)
                session.commit()
            out[(calibration.key(fp), metric)] = Measured(
                pool.label, metric, calibration.key(fp), launches, len(pool.a_runs), variation.sd_run, spread,
                rates.false_alarm_rate, rates.aa_comparisons, slowdown, rates.detection_rate, detectable)
    return list(out.values())


@dataclass
class _Pool:
    """The runs of every case of one fingerprint and metric, so far."""

    case_ids: list[str] = field(default_factory=list)
    a_runs: list[list[float]] = field(default_factory=list)
    s_runs: list[list[float]] = field(default_factory=list)

    def add(self, case_id: str, a_runs: list[list[float]], s_runs: list[list[float]]) -> None:
        self.case_ids.append(case_id)
        self.a_runs += a_runs
        self.s_runs += s_runs

    @property
    def label(self) -> str:
        """The first case's id, and how many others of its fingerprint were pooled with it."""
        more = len(self.case_ids) - 1
        return self.case_ids[0] + (f" (+{more} of its fingerprint)" if more else "")
