"""The driver's part of "sample until decided": the `sequential` block a case document carries to its Ray task.

Built once per case from the run's policy (gate.regression) and, in history mode, the previous release's
baseline result for the case (its launch figures) and the run-to-run variation that `qualify calibrate`
stored for that result's fingerprint. The runner (execution.launches) asks gate.sequential.next_step with it.
The first regression metric of the case's kind is the one sampling waits for (the gate judges them all).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from qualify import metrics as metric_info
from qualify.gate import sequential
from qualify.gate.calibration import lookup
from qualify.gate.checks import ResultData, series
from qualify.manifest import ReleaseManifest, is_reference_case
from qualify.manifest.cases import Case
from qualify.store import repo


def sequential_block(sessions: sessionmaker[Session], manifest: ReleaseManifest, case: Case, *,
                     paired: bool) -> dict[str, Any] | None:
    """None: the planned launches only (no regression metric, a multi-node case, or history mode without a
    baseline result or a calibration: more launches could not change the decision)."""
    reg = manifest.gate.regression_for(case)  # a reference case: the reference's mode and required change
    metrics = reg.metrics_for(case.kind)
    if not reg.enabled or not metrics or case.resources.nodes > 1 or not metric_info.is_known(metrics[0]):
        return None
    metric = metrics[0]
    common = dict(metric=metric, direction=metric_info.direction(metric), max_regression=reg.max_regression,
                  alpha=reg.alpha, min_samples=reg.min_samples, max_launches=reg.max_launches)
    if paired:
        return sequential.spec(mode="paired", **common)
    info = manifest.release
    if is_reference_case(case):
        return None  # a reference case has no stored history to compare with: paired or duet, or not at all
    if not info.previous_tag:
        return None
    with sessions() as session:
        base_run = repo.baseline_run(session, info.repository, info.previous_tag)
        row = next((r for r in repo.case_results(session, base_run.id) if r.case_id == case.case_id),
                   None) if base_run is not None else None
        if row is None or row.status != "passed":
            return None
        base = ResultData.from_row(row)
        variation = repo.calibrations_for(session, [base.fingerprint]).get(lookup(base.fingerprint, metric))
    figures = series(base, metric)
    if variation is None or len(figures) < 2:
        return None
    return sequential.spec(mode="history", baseline=figures, variation=variation, **common)
