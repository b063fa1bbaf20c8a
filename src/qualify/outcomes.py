"""Typed outcomes that travel on the driver: verdicts, statuses, and what a case or a run ended with.

Statuses are StrEnums so that they compare and serialise as the strings stored in the database
and shown to people ("PASS", "passed"), while the code names them once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from qualify.workloads.protocol import CaseStatus, ErrorClass


class Verdict(StrEnum):
    """The gate's decision about a run."""

    PASS = "PASS"
    FAIL = "FAIL"
    INCOMPLETE = "INCOMPLETE"


class CheckStatus(StrEnum):
    """What one gate check concluded."""

    PASS = "PASS"
    FAIL = "FAIL"
    WAIVED = "WAIVED"
    NO_BASELINE = "NO-BASELINE"
    INCOMPLETE = "INCOMPLETE"
    # A fact the verdict discloses (where an MFU's peak came from, or why there is none): not a check, so it
    # counts neither as passed nor as failed. A figure that could not be computed is never a passed check.
    NOTE = "NOTE"


class RunStatus(StrEnum):
    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    INCOMPLETE = "incomplete"
    ERROR = "error"
    ABORTED = "aborted"

    @classmethod
    def for_verdict(cls, verdict: Verdict) -> "RunStatus":
        return {Verdict.PASS: cls.PASSED, Verdict.FAIL: cls.FAILED, Verdict.INCOMPLETE: cls.INCOMPLETE}[verdict]


@dataclass(frozen=True)
class CaseOutcome:
    """How one case of a run ended, as recorded."""

    case_id: str
    status: CaseStatus
    error_class: ErrorClass | None
    error: str | None
    attempts: int
    exec_s: float | None
    queue_wait_s: float | None
    node: str | None
    gpu_ids: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.status == CaseStatus.PASSED

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __repr__(self) -> str:
        # Prefect logs a failed task run's state with its result's repr, in every UI log line about it: one short
        # line (the case, how it ended, where), not every field with enum reprs and float noise.
        how = self.status.value + (f" ({self.error_class.value})" if self.error_class else "")
        return (f"CaseOutcome({self.case_id}: {how}, {self.attempts} attempt(s)"
                + (f", {self.exec_s:.1f} s" if self.exec_s is not None else "")
                + (f" on {self.node}" if self.node else "") + ")")


@dataclass(frozen=True)
class PromotionSummary:
    target: str
    target_ref: str
    outcome: str
    detail: str = ""


@dataclass(frozen=True)
class RunOutcome:
    """What `qualify run` (and a deployment) ends with."""

    run_id: int
    verdict: Verdict
    status: RunStatus
    digest: str
    reasons: list[dict[str, Any]]
    report: str
    cases: list[CaseOutcome] = field(default_factory=list)
    promotions: list[PromotionSummary] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # Measurement efficiency and the launches' phases, as one line (report/efficiency.LaunchTime.line).
    launch_time: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


__all__ = ["Verdict", "CheckStatus", "RunStatus", "CaseStatus", "ErrorClass", "CaseOutcome", "RunOutcome",
           "PromotionSummary"]
