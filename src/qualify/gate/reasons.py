"""What the gate's checks read and write: result and component data, a Reason, the check statuses, and the
small formatting and selection helpers every check module shares."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from qualify.manifest.cases import Case
from qualify.outcomes import CheckStatus


PASS, FAIL, WAIVED, NO_BASELINE, INCOMPLETE, NOTE = (CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.WAIVED,
                                                     CheckStatus.NO_BASELINE, CheckStatus.INCOMPLETE, CheckStatus.NOTE)


REASON_STATUSES = tuple(CheckStatus)


@dataclass(frozen=True)
class ResultData:
    """One final case result as the gate sees it (from a CaseResult row or a result document)."""

    case_id: str
    kind: str
    status: str  # passed | failed | error
    error_class: str | None = None
    error: str | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    samples: Mapping[str, Sequence[float]] = field(default_factory=dict)
    probes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    model: str | None = None
    variant: str | None = None
    fingerprint: Mapping[str, Any] | None = None  # qualify.manifest.fingerprint: what it may be compared with
    attempts: int = 1
    environment: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Any) -> "ResultData":
        return cls(case_id=row.case_id, kind=row.kind, status=row.status, error_class=row.error_class,
                   error=row.error, metrics=dict(row.metrics or {}), samples=dict(row.samples or {}),
                   probes=dict(row.probes or {}), model=row.model, variant=row.variant,
                   fingerprint=dict(row.fingerprint) if row.fingerprint else None, attempts=row.attempts or 1,
                   environment=dict(row.environment or {}))

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], *, model: str | None = None, variant: str | None = None,
                 fingerprint: Mapping[str, Any] | None = None, attempts: int = 1) -> "ResultData":
        return cls(case_id=doc["case_id"], kind=doc.get("kind") or "", status=doc["status"],
                   error_class=doc.get("error_class"), error=doc.get("error"),
                   metrics=dict(doc.get("metrics") or {}), samples=dict(doc.get("samples") or {}),
                   probes=dict(doc.get("probes") or {}), model=model, variant=variant,
                   fingerprint=fingerprint, attempts=attempts, environment=dict(doc.get("environment") or {}))


@dataclass(frozen=True)
class ComponentData:
    name: str
    ok: bool
    expected: str = ""
    actual: str | None = None
    rule: str = "exact"
    optional: bool = False
    detail: str = ""
    image: str = ""  # the release image it was checked in: "" the release's own, else its name in `images:`

    @classmethod
    def from_row(cls, row: Any) -> "ComponentData":
        return cls(name=row.name, ok=bool(row.ok), expected=row.expected, actual=row.actual, rule=row.rule,
                   optional=bool(row.optional), detail=row.detail or "", image=getattr(row, "image", "") or "")


@dataclass
class Reason:
    check: str
    case_id: str | None
    status: str
    message: str
    figures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # The stored message names its case: `qualify runs show` prints status, check and message only.
        message = self.message
        if self.case_id and not message.startswith(self.case_id):
            message = f"{self.case_id}: {message}"
        return {"check": self.check, "case_id": self.case_id, "status": self.status,
                "message": message, "figures": _json_safe(self.figures)}


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    return value


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(float(value)) else None


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4g}"


def _pct(value: float) -> str:
    return f"{value * 100:+.1f}%"


def _short(text: str | None, limit: int = 300) -> str:
    if not text:
        return "no message"
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _passed(cases: Sequence[Case], results: Mapping[str, ResultData]) -> list[tuple[Case, ResultData]]:
    out = []
    for case in cases:
        result = results.get(case.case_id)
        if result is not None and result.status == "passed":
            out.append((case, result))
    return out


def _judged(cases: Sequence[Case], results: Mapping[str, ResultData],
            metric: str) -> list[tuple[Case, ResultData]]:
    """The results a metric check applies to: every passed result (a missing metric then fails), and
    every failed or errored result that still reports the metric. A waiver of another check (or a
    case's failure) never exempts a figure from its own check."""
    out = []
    for case in cases:
        result = results.get(case.case_id)
        if result is None:
            continue
        if result.status == "passed" or _num(result.metrics.get(metric)) is not None:
            out.append((case, result))
    return out


def _metric_problem(result: ResultData, metric: str) -> str | None:
    if metric not in result.metrics:
        return f"{metric} is missing from the result"
    value = result.metrics[metric]
    if value is None:
        return f"{metric} is null in the result (not measured or not finite)"
    if _num(value) is None:
        return f"{metric} is not a number ({value!r})"
    return None

