"""A digest's standing, per release (issue 24.4): what `gate check`, the service, the webhook and `promote` trust.

The standing of a digest in one release is the latest decision (by id) of that release's newest run (by id)
that judged the digest. So:
- another release's decision never clears it: a laxer release that PASSes a digest leaves the FAIL of a
  stricter release standing;
- re-judging an older run never overrides a newer run of the same release: the older run's new decision is
  not the standing, however recent it is;
- a run that has not been judged yet (running, or ended before the gate) has no say until it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from qualify.outcomes import Verdict
from qualify.store.decision_rows import DecisionRow, RunRow

if TYPE_CHECKING:  # the rules below are pure; only the readers need SQLAlchemy (the lean `gate check` has none)
    from sqlalchemy.orm import Session

    from qualify.store.models import Run


@dataclass(frozen=True)
class Standing:
    run: RunRow
    decision: DecisionRow  # the run's own latest decision

    @property
    def release_id(self) -> int:
        return self.run.release_id

    @property
    def release(self) -> str:
        return f"{self.run.release.name}:{self.run.release.tag}"

    @property
    def passed(self) -> bool:
        return self.decision.verdict == Verdict.PASS

    def to_dict(self) -> dict[str, object]:
        return {"release": self.release, "run": self.run.id, "decision": self.decision.id,
                "verdict": self.decision.verdict}


def standings(session: Session, digest: str) -> list[Standing]:
    """One standing per release that judged the digest, ordered by release id."""
    from qualify.store.digest_decisions import decisions_for_digest

    return by_release(decisions_for_digest(session, digest))


def by_release(decisions: Sequence[tuple[DecisionRow, RunRow]]) -> list[Standing]:
    """The standings among (decision, run) pairs of one digest: per release, the newest judged run's latest
    decision. Pure: ids decide, never a clock."""
    newest_run: dict[int, RunRow] = {}
    latest: dict[int, DecisionRow] = {}
    for decision, run in decisions:
        current = newest_run.get(run.release_id)
        if current is None or run.id > current.id:
            newest_run[run.release_id] = run
        if decision.id > getattr(latest.get(run.id), "id", -1):
            latest[run.id] = decision
    return [Standing(run, latest[run.id]) for _, run in sorted(newest_run.items())]


def standing_of_run(session: Session, run: Run, digest: str | None = None) -> Standing | None:
    """The standing of the release of `run` for the run's digest, or one of its further images' `digest` (None
    when nothing judged it)."""
    digest = digest or run.candidate_digest
    if not digest:
        return None
    return next((s for s in standings(session, digest) if s.release_id == run.release_id), None)
