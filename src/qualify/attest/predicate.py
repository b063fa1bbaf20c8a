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
    status: str  # PASS | FAIL | INCOMPLETE | WAIVED | NO_BASELINE
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
    change: float | None  # candidate median / baseline median - 1 (thresholds: None)
    interval: list[float] | None  # [low, high] of the change, when the gate computed one
    margin: float | None  # the change the rule tolerates (max_regression / the non-inferiority margin)
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


def _interval(figures: Mapping[str, Any]) -> list[float] | None:
    """The change's interval as the gate stored it (the non-inferiority rule's), else None: never invented."""
    for low_key, high_key in (("interval_low", "interval_high"), ("ci_low", "ci_high"),
                              ("change_low", "change_high")):
        low, high = _number(figures.get(low_key)), _number(figures.get(high_key))
        if low is not None and high is not None:
            return [low, high]
    pair = figures.get("interval")
    if isinstance(pair, (list, tuple)) and len(pair) == 2 and all(_number(v) is not None for v in pair):
        return [float(pair[0]), float(pair[1])]
    return None


def _design(figures: Mapping[str, Any]) -> Design:
    stated = figures.get("design")
    if stated in ("history", "paired", "duet"):
        return stated  # type: ignore[return-value]
    if figures.get("duet") or figures.get("method") == "duet":
        return "duet"
    if figures.get("method") == "paired-t-log" or "baseline_samples" in figures:
        return "paired"
    return "history"


def _baseline_digest(figures: Mapping[str, Any], fallback: str | None) -> str | None:
    base = figures.get("baseline")
    if isinstance(base, str) and base.startswith("sha256:"):
        return base
    if isinstance(base, Mapping) and isinstance(base.get("digest"), str):
        return str(base["digest"])
    return fallback


def comparison(reason: Mapping[str, Any], history_baseline: str | None) -> Comparison | None:
    check = str(reason.get("check") or "")
    figures = reason.get("figures") if isinstance(reason.get("figures"), Mapping) else {}
    assert isinstance(figures, Mapping)
    if check == "regression" and reason.get("case_id"):
        ratio = _number(figures.get("ratio"))
        margin = _number(figures.get("margin"))
        return Comparison(case_id=reason.get("case_id"), check=check, metric=figures.get("metric"),
                          status=str(reason.get("status")), design=_design(figures),
                          baseline_digest=_baseline_digest(figures, history_baseline),
                          n_candidate=figures.get("n_candidate"), n_baseline=figures.get("n_baseline"),
                          change=None if ratio is None else ratio - 1.0, interval=_interval(figures),
                          margin=margin if margin is not None else _number(figures.get("tolerance")))
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
