"""qualify's own predicate: the evidence behind a gate decision, as a versioned in-toto predicate.

No standard predicate carries a noise-aware comparison (in-toto's test-result has test names only, the
proposed eval-result absolute thresholds only), so this one is ours; docs/ATTESTATIONS.md says what every
field means. The model is pydantic (camelCase on the wire, as in-toto predicates are) so that what we write
and what `qualify verify` reads are checked against one definition. Building is pure: plain data in
(`DecisionFacts`), a predicate out.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

PREDICATE_TYPE = "https://qualify.dev/attestation/qualification/v1"

Design = Literal["history", "paired", "duet", "threshold"]


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class Digest(_Model):
    sha256: str


class Check(_Model):
    check: str
    case_id: str | None
    status: str  # PASS | FAIL | INCOMPLETE | WAIVED | NO-BASELINE | NOTE
    reason: str


class Comparison(_Model):
    case_id: str | None
    check: str
    metric: str | None
    status: str
    design: Design
    baseline_digest: str | None
    n_candidate: int | None
    n_baseline: int | None
    change: float | None  # relative change, positive = the candidate is better (thresholds: None)
    interval: list[float] | None  # [worst, best] of that change, when the gate computed one
    margin: float | None  # the worsening the rule tolerates (max_regression); negative: a gain required (reference)
    value: float | None = None  # thresholds: the measured figure
    bound: float | None = None  # thresholds: the limit it was held to


class WaiverEntry(_Model):
    id: str
    cases: str
    check: str
    reason: str
    expires: dt.date


class QualificationPredicate(_Model):
    verdict: Literal["PASS", "FAIL", "INCOMPLETE"]
    decision_id: int
    decided_at: dt.datetime
    run_id: int
    release: str  # name:tag
    candidate: str  # repository:tag the run qualified
    qualified_repositories: list[str]  # where this digest may carry a tag (candidate, release, promotion targets)
    manifest_digest: Digest
    policy_digest: Digest
    hardware_fingerprint: Digest
    hardware: list[dict[str, Any]] = Field(default_factory=list)
    checks: list[Check]
    comparisons: list[Comparison]
    waivers: list[WaiverEntry]

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


@dataclass(frozen=True)
class DecisionFacts:
    """What a predicate is built from (read from the database by qualify.attest.service)."""

    verdict: str
    decision_id: int
    decided_at: dt.datetime
    run_id: int
    release: str
    candidate: str
    digest: str
    qualified_repositories: Sequence[str]
    manifest_sha256: str
    policy_sha256: str
    reasons: Sequence[Mapping[str, Any]]
    waivers: Sequence[Mapping[str, Any]]
    fingerprints: Sequence[Mapping[str, Any]]  # the case results' fingerprints
    baseline_digest: str | None = None  # history: the baseline run's candidate digest
    extra: dict[str, Any] = field(default_factory=dict)


HARDWARE_KEYS = ("device", "world_size")


def hardware(fingerprints: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The distinct hardware the cases ran on (device, world size, resources) and its sha256."""
    seen: dict[str, dict[str, Any]] = {}
    for fp in fingerprints:
        if not isinstance(fp, Mapping):
            continue
        part = {k: fp.get(k) for k in HARDWARE_KEYS}
        part.update({k: v for k, v in fp.items() if str(k).startswith("resources.")})
        seen[json.dumps(part, sort_keys=True, default=str)] = part
    canonical = json.dumps(sorted(seen), separators=(",", ":"))
    return [seen[k] for k in sorted(seen)], hashlib.sha256(canonical.encode()).hexdigest()


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _better_change(figures: Mapping[str, Any]) -> tuple[float | None, list[float] | None]:
    """(change, [worst, best]) in the better direction (positive = the candidate is better), from whichever form
    the gate stored: the non-inferiority rule's `change`/`change_worst`/`change_best` (positive = better), the
    duet interval's `estimate`/`lower`/`upper` (positive = worse), or the median `ratio` with the metric's
    `direction` (no interval: never invented)."""
    change, worst, best = (_number(figures.get(k)) for k in ("change", "change_worst", "change_best"))
    if change is not None:
        return change, [worst, best] if worst is not None and best is not None else None
    estimate, lower, upper = (_number(figures.get(k)) for k in ("estimate", "lower", "upper"))
    if estimate is not None:  # duet_stats: the throughput's relative change, positive = the candidate better
        return estimate, [lower, upper] if lower is not None and upper is not None else None
    ratio = _number(figures.get("ratio"))
    if ratio is None or ratio <= 0:
        return None, None
    return (ratio - 1.0 if figures.get("direction", "higher") == "higher" else 1.0 / ratio - 1.0), None


def _design(figures: Mapping[str, Any]) -> Design:
    stated = str(figures.get("design") or figures.get("method") or "")
    if "duet" in stated:
        return "duet"
    if "paired" in stated or "baseline_samples" in figures:
        return "paired"
    return "history"


def _baseline_digest(figures: Mapping[str, Any], fallback: str | None) -> str | None:
    """The image compared with: paired and duet store it (a digest, or a record with one); history's is the
    baseline run's candidate."""
    for key in ("reference_image", "baseline"):  # gate.reference's image first: a reference check names it
        base = figures.get(key)
        if isinstance(base, Mapping) and isinstance(base.get("digest"), str):
            return str(base["digest"])
        found = re.search(r"sha256:[0-9a-f]{64}", base) if isinstance(base, str) else None
        if found:  # a digest, or a reference / an executor's description that holds one
            return found.group(0)
    return fallback


def comparison(reason: Mapping[str, Any], history_baseline: str | None) -> Comparison | None:
    check = str(reason.get("check") or "")
    figures = reason.get("figures") if isinstance(reason.get("figures"), Mapping) else {}
    assert isinstance(figures, Mapping)
    if check in ("regression", "reference") and reason.get("case_id"):
        change, interval = _better_change(figures)
        margin = next((m for m in (_number(figures.get(k)) for k in ("max_regression", "margin", "tolerance"))
                       if m is not None), None)
        n_candidate = figures.get("n_candidate", figures.get("n"))
        return Comparison(case_id=reason.get("case_id"), check=check, metric=figures.get("metric"),
                          status=str(reason.get("status")), design=_design(figures),
                          baseline_digest=_baseline_digest(figures, history_baseline if check == "regression"
                                                           else None),
                          n_candidate=n_candidate if isinstance(n_candidate, int) else None,
                          n_baseline=figures.get("n_baseline") if isinstance(figures.get("n_baseline"), int) else None,
                          change=change, interval=interval, margin=margin)
    if check.startswith("threshold:") and reason.get("case_id"):
        bound = _number(figures.get("min")) if _number(figures.get("min")) is not None else _number(figures.get("max"))
        return Comparison(case_id=reason.get("case_id"), check=check, metric=check.split(":", 1)[1],
                          status=str(reason.get("status")), design="threshold", baseline_digest=None,
                          n_candidate=figures.get("n"), n_baseline=None, change=None, interval=None, margin=None,
                          value=_number(figures.get("value")), bound=bound)
    return None


def build(facts: DecisionFacts) -> QualificationPredicate:
    devices, hw_sha = hardware(facts.fingerprints)
    checks = [Check(check=str(r.get("check")), case_id=r.get("case_id"), status=str(r.get("status")),
                    reason=str(r.get("message") or "")) for r in facts.reasons]
    comparisons = [c for c in (comparison(r, facts.baseline_digest) for r in facts.reasons) if c is not None]
    waivers = [WaiverEntry(id=str(w["id"]), cases=str(w.get("cases", "*")), check=str(w["check"]),
                           reason=str(w.get("reason", "")), expires=w["expires"]) for w in facts.waivers]
    return QualificationPredicate(
        verdict=facts.verdict, decision_id=facts.decision_id, decided_at=facts.decided_at, run_id=facts.run_id,
        release=facts.release, candidate=facts.candidate,
        qualified_repositories=sorted(set(facts.qualified_repositories)),
        manifest_digest=Digest(sha256=facts.manifest_sha256), policy_digest=Digest(sha256=facts.policy_sha256),
        hardware_fingerprint=Digest(sha256=hw_sha), hardware=devices, checks=checks, comparisons=comparisons,
        waivers=waivers)
