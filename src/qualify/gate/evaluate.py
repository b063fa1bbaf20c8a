"""The gate as one pure function: policy + cases + results (+ baseline) + date -> Verdict."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from qualify.manifest.cases import Case
from qualify.gate.checks import (
    FAIL,
    INCOMPLETE,
    PASS,
    ComponentData,
    Reason,
    ResultData,
    apply_waivers,
    check_agreement,
    check_completeness,
    check_components,
    check_mfu_reported,
    check_probes,
    check_quantization_evidence,
    check_reference,
    check_regression,
    check_retries,
    check_thresholds,
    check_variant_evidence,
    check_variant_gains,
)
from qualify.gate.noninferiority import RunVariation
from qualify.manifest import Component, GatePolicy, Waiver
from qualify.outcomes import Verdict


@dataclass
class Judgement:
    """The gate's verdict about a run and every check's reason."""

    verdict: Verdict
    reasons: list[Reason] = field(default_factory=list)

    def reason_dicts(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.reasons]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for reason in self.reasons:
            out[reason.status] = out.get(reason.status, 0) + 1
        return out

    def by_status(self, status: str) -> list[Reason]:
        return [r for r in self.reasons if r.status == status]


def decide(reasons: Sequence[Reason]) -> Verdict:
    """FAIL if any FAIL is left after waivers; else INCOMPLETE if anything is; else PASS."""
    statuses = {r.status for r in reasons}
    if FAIL in statuses:
        return Verdict.FAIL
    if INCOMPLETE in statuses:
        return Verdict.INCOMPLETE
    return Verdict.PASS


def _index(results: Mapping[str, ResultData] | Sequence[ResultData] | None) -> dict[str, ResultData]:
    if results is None:
        return {}
    if isinstance(results, Mapping):
        return dict(results)
    return {r.case_id: r for r in results}


def evaluate(policy: GatePolicy, cases: Sequence[Case],
             results: Mapping[str, ResultData] | Sequence[ResultData],
             components: Sequence[ComponentData] = (),
             baseline: Mapping[str, ResultData] | Sequence[ResultData] | None = None, *,
             today: dt.date, expected_components: Sequence[Component] = (),
             waivers: Sequence[Waiver] | None = None, baseline_label: str = "",
             previous_named: bool | None = None,
             calibrations: Mapping[str, RunVariation] | None = None,
             image_components: Mapping[str, Sequence[Component]] | None = None) -> Judgement:
    """Judge one run.

    ``baseline`` is the previous release's results by case id, or None when there is no usable
    baseline run. ``previous_named`` says whether the release names a previous tag (then a missing
    baseline is INCOMPLETE unless the policy makes it optional; see check_regression).
    ``calibrations``: the run-to-run variation per fingerprint and metric (qualify.gate.calibration.lookup)
    that history mode needs to decide. ``image_components``: the components each further image of the
    release must contain (manifest `images:`), by image name; the verdict covers every image.
    ``waivers`` defaults to the policy's own. ``today`` decides which waivers have expired.
    """
    current = _index(results)
    base = None if baseline is None else _index(baseline)
    reasons: list[Reason] = []
    reasons += check_components(expected_components, components)
    for image, expected in (image_components or {}).items():
        reasons += check_components(expected, components, image)
    reasons += check_completeness(cases, current)
    reasons += check_thresholds(policy, cases, current)
    reasons += check_agreement(policy, cases, current, base)
    reasons += check_probes(policy, cases, current)
    reasons += check_regression(policy, cases, current, base, baseline_label, previous_named=previous_named,
                                calibrations=calibrations)
    reasons += check_reference(policy, cases, current)
    reasons += check_variant_gains(policy, cases, current)
    reasons += check_variant_evidence(cases, current)
    reasons += check_quantization_evidence(cases, current)
    reasons += check_mfu_reported(cases, current)
    reasons += check_retries(cases, current)
    reasons = apply_waivers(reasons, policy.waivers if waivers is None else waivers, today)
    return Judgement(decide(reasons), reasons)


__all__ = ["Judgement", "Verdict", "evaluate", "decide", "ResultData", "ComponentData", "Reason", "PASS", "FAIL", "INCOMPLETE"]
