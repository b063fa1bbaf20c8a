"""`gate check`: may this image reference be pushed? Same rules for the CLI and any service.

PASS only when (1) the digest stands PASS in every release that judged it for this repository (per release,
the newest judged run's latest decision: qualify.gate.standing), (2) the reference's repository is
the one that was qualified or one of its promotion targets (a digest qualified as `a/b` does not
make `evil/thing@<digest>` qualified), (3) a tag, when given, resolves to that digest (the caller
resolves it), and (4) the release name and policy hash match when the caller requires them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence, TypeAlias

from qualify.imageref import ImageRef, InvalidReference, parse_reference
from qualify.outcomes import CheckStatus, Verdict
from qualify.gate.standing import by_release
from qualify.store.decision_rows import DecisionRow, RunRow
from qualify.timestamps import iso

if TYPE_CHECKING:  # the rules are pure: SQLAlchemy only for the reader (the lean `gate check` has none)
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session

    from qualify.store.models import Run

# A run as the rules below read it: the ORM row (attestations) or the plain row of the digest's decisions (checks).
RunLike: TypeAlias = "Run | RunRow"


@dataclass
class PushCheck:
    reference: str
    digest: str
    verdict: Verdict | None  # the digest's latest decision, None when never judged
    decision: int | None = None
    run: int | None = None
    release: str | None = None
    policy_sha256: str | None = None
    decided_at: dt.datetime | None = None
    overrides_pass_decision: int | None = None
    standings: list[dict[str, Any]] = field(default_factory=list)  # per release: run, decision, verdict
    newest_decision: int | None = None  # the newest decision about the digest: an answer holds until it changes
    reasons: list[dict[str, Any]] = field(default_factory=list)  # the decision's FAIL/INCOMPLETE reasons
    problems: list[str] = field(default_factory=list)  # why this reference is refused despite the verdict

    @property
    def ok(self) -> bool:
        return self.verdict == Verdict.PASS and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "digest": self.digest, "ok": self.ok,
                "verdict": self.verdict, "decision": self.decision, "run": self.run, "release": self.release,
                "policy_sha256": self.policy_sha256,
                "decided_at": iso(self.decided_at),
                "overrides_pass_decision": self.overrides_pass_decision, "standings": self.standings,
                "reasons": self.reasons,
                "problems": self.problems}


def qualified_repositories(run: RunLike, digest: str | None = None) -> set[str]:
    """Where the run's digest may be pushed: the release repository, the candidate's, and every target's. For one
    of the run's further images (`digest` is one of theirs): that image's repository and its own targets only
    (a serving image's digest is not qualified as the training image)."""
    further = _further(run, digest)
    names = _own_repositories(run, further) | _target_names(run, further.name if further is not None else None)
    names.discard(None)
    return {n for n in names if n}


def qualifies(run: RunLike, digest: str, name: str) -> bool:
    """Whether `name` is one of qualified_repositories(run, digest), reading the stored manifest's targets only
    when it is not the image's own repository (the common case for CI's check after a build: no manifest parse)."""
    further = _further(run, digest)
    return name in _own_repositories(run, further) or name in _target_names(
        run, further.name if further is not None else None)


def _further(run: RunLike, digest: str | None) -> Any:
    if not digest or digest == run.candidate_digest:
        return None
    return next((r for r in run.further_images if r.digest == digest), None)


def _own_repositories(run: RunLike, further: Any) -> set[str | None]:
    if further is not None:
        return {_name(further.image.repository)}
    names = {_name(run.release.repository)}
    if run.image is not None:
        names.add(_name(run.image.repository))
    return names


# The promotion targets depend on the stored manifest's text alone: they are parsed once per text (keyed by the
# sha256 of the text itself, computed here, not the stored column) and remembered, so that a service answering
# many checks does not re-read it, and runs that share a manifest share the parse.
_TARGETS: dict[str, frozenset[str | None]] = {}
_TARGETS_MAX = 20_000


def _target_names(run: RunLike, image: str | None = None) -> frozenset[str | None]:
    key = hashlib.sha256((run.manifest_text or "").encode()).hexdigest() + (f"/{image}" if image else "")
    found = _TARGETS.get(key)
    if found is not None:
        return found
    from qualify.manifest.load import ManifestError  # the manifest model loads only when a run has to be read
    from qualify.store import repo

    try:
        targets = repo.run_manifest(run).release.for_image(image).expanded_targets()
    except (ManifestError, KeyError):
        targets = []
    found = frozenset(_name(t.reference) for t in targets)
    if len(_TARGETS) >= _TARGETS_MAX:
        _TARGETS.clear()
    _TARGETS[key] = found
    return found


def _name(reference: str) -> str | None:
    try:
        return parse_reference(reference).name
    except InvalidReference:
        return None


def check_push(session: "Session | Connection", ref: ImageRef, digest: str, *, tag_digest: str | None = None,
               release_name: str | None = None, policy_sha256: str | None = None) -> PushCheck:
    """Judge a reference whose digest is known (`tag_digest`: what its tag resolves to, when it has one), from
    the database (judge_push says how)."""
    from qualify.store.digest_decisions import decisions_for_digest

    return judge_push(decisions_for_digest(session, digest), ref, digest, tag_digest=tag_digest,
                      release_name=release_name, policy_sha256=policy_sha256)


def judge_push(decisions: Sequence[tuple[DecisionRow, RunRow]], ref: ImageRef, digest: str, *,
               tag_digest: str | None = None, release_name: str | None = None,
               policy_sha256: str | None = None) -> PushCheck:
    """The answer from the digest's decisions, oldest first (pure).

    The digest's standing per release (qualify.gate.standing) decides, over the releases that qualify the
    reference's repository (else over all, with the repository named as a problem) and, with
    `release_name`, only that release's: PASS only when every one of them stands PASS. A non-PASS standing
    is what is reported; another release's PASS never clears it."""
    out = PushCheck(reference=str(ref), digest=digest, verdict=None)
    if ref.tag and tag_digest is not None and tag_digest != digest:
        out.problems.append(f"tag {ref.tag} resolves to {tag_digest}, not {digest}")
    every = by_release(decisions)
    if not every:
        return out
    out.newest_decision = decisions[-1][0].id
    scope = [s for s in every if qualifies(s.run, digest, ref.name)]
    if not scope:
        allowed = set().union(*(qualified_repositories(s.run, digest) for s in every))
        out.problems.append(f"repository {ref.name} is not where {digest} was qualified "
                            f"(qualified for: {', '.join(sorted(allowed))})")
        scope = every
    if release_name is not None:
        named = [s for s in scope if s.run.release.name == release_name]
        if not named:
            judged = sorted({s.run.release.name for s in scope})
            out.problems.append(f"the decision is about release {', '.join(map(repr, judged))}, "
                                f"not {release_name!r}")
        scope = named or scope
    blocking = [s for s in scope if not s.passed]
    shown = max(blocking or scope, key=lambda s: s.decision.id)
    latest = shown.decision
    out.verdict = Verdict(latest.verdict)
    out.decision, out.run, out.decided_at = latest.id, latest.run_id, latest.decided_at
    out.release, out.policy_sha256 = shown.release, latest.policy_sha256
    out.standings = [s.to_dict() for s in every]
    out.reasons = [r for r in latest.reasons or [] if r.get("status") in (CheckStatus.FAIL, CheckStatus.INCOMPLETE)]
    if out.verdict != Verdict.PASS:  # the newest PASS among the decisions already read (no second query)
        earlier = [d.id for d, _run in decisions if d.verdict == Verdict.PASS]
        out.overrides_pass_decision = max(earlier) if earlier else None
    if policy_sha256 is not None:
        for s in scope:
            if not (s.decision.policy_sha256 or "").startswith(policy_sha256):
                out.problems.append(f"the decision {s.decision.id} ({s.release}) applied policy "
                                    f"{(s.decision.policy_sha256 or '')[:12]}, not {policy_sha256}")
    return out
