"""The Distribution registry's notifications: a push to a protected tag whose digest has no PASS.

The registry (docker-registry, `notifications.endpoints`) POSTs an envelope `{"events": [...]}` after each
push, pull and delete. Only manifest pushes with a tag to a protected repository/tag pattern matter: each
is judged with the rules of `gate check` (qualify.gate.push_check.check_push) and recorded in
`registry_events`. When the digest may not carry that tag and enforcement is on, the tag is re-pointed to
the previous qualified digest (`revert`; deleted when there is none) or the manifest deleted (`delete`).

Nothing is half-applied: the whole envelope is validated before anything is recorded (a malformed one is
refused whole); every change to the registry is preceded by a committed row saying what is about to be done
(outcome `enforcing`) and followed by its result; a redelivered event (same id) is answered from its row and
an unfinished one is finished. The tag is re-checked right before the change: when it has moved on since
the push, nothing is changed (`skipped`).

Distribution 2.x cannot delete a tag alone: deleting removes the manifest (by digest) and every tag of that
repository pointing to it. That is what `delete` (and `revert` without a previous digest) does.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from qualify.errors import BadInput
from qualify.gate.push_check import check_push
from qualify.imageref import ImageRef, InvalidReference, parse_reference
from qualify.registry import ImageNotFound, RegistryClient, RegistryError
from qualify.registry.client import MANIFEST_TYPES
from qualify.store.models import Promotion, RegistryEvent, utcnow

LOG = logging.getLogger("qualify.service")
MAX_EVENTS = 1000  # per envelope (the registry sends small batches)
_DIGEST = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-fA-F0-9]{32,}$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")


class MalformedEvents(BadInput):
    """The envelope or one of its events is not what the registry sends (HTTP 400; nothing recorded)."""


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class Push:
    """A manifest push with a tag, as the registry reported it."""

    event_id: str
    registry: str  # host[:port] the pusher used
    repository: str  # path inside the registry
    tag: str
    digest: str
    media_type: str | None
    pushed_by: str | None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    @property
    def ref(self) -> ImageRef:
        return ImageRef(self.registry, self.repository, self.tag, None)


def _text(obj: dict[str, Any], key: str, where: str, *, required: bool = True) -> str | None:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > 1024:
        raise MalformedEvents(f"{where}: '{key}' must be a non-empty string")
    return value


def parse_envelope(body: Any) -> list[Push]:
    """Every manifest push with a tag in the envelope; MalformedEvents when any event is malformed."""
    if not isinstance(body, dict) or not isinstance(body.get("events"), list):
        raise MalformedEvents("the body must be a JSON object with an 'events' list")
    events = body["events"]
    if len(events) > MAX_EVENTS:
        raise MalformedEvents(f"{len(events)} events in one envelope: at most {MAX_EVENTS}")
    pushes: list[Push] = []
    for k, event in enumerate(events):
        where = f"events[{k}]"
        if not isinstance(event, dict):
            raise MalformedEvents(f"{where} is not an object")
        event_id = _text(event, "id", where)
        action = _text(event, "action", where)
        target = event.get("target")
        if not isinstance(target, dict):
            raise MalformedEvents(f"{where}: 'target' must be an object")
        repository = _text(target, "repository", f"{where}.target")
        media_type = target.get("mediaType")
        tag = target.get("tag")
        if action != "push" or not tag or (media_type and media_type not in MANIFEST_TYPES):
            continue  # pulls, deletes, blobs and pushes by digest: no tag moved
        if not isinstance(tag, str) or not _TAG.match(tag):
            raise MalformedEvents(f"{where}.target: 'tag' {tag!r} is not a tag")
        digest = _text(target, "digest", f"{where}.target")
        assert digest is not None and event_id is not None and repository is not None
        if not _DIGEST.match(digest):
            raise MalformedEvents(f"{where}.target: 'digest' {digest!r} is not a digest")
        request = event.get("request") if isinstance(event.get("request"), dict) else {}
        host = request.get("host") if isinstance(request.get("host"), str) else None
        if not host and isinstance(target.get("url"), str):
            host = urlsplit(target["url"]).netloc or None
        if not host:
            raise MalformedEvents(f"{where}: no registry host (request.host or target.url)")
        try:
            parse_reference(f"{host}/{repository}:{tag}@{digest}")
        except InvalidReference as exc:
            raise MalformedEvents(f"{where}: {exc}") from None
        actor = event.get("actor") if isinstance(event.get("actor"), dict) else {}
        pushed_by = actor.get("name") if isinstance(actor.get("name"), str) else None
        pushes.append(Push(event_id, host, repository, tag, digest,
                           media_type if isinstance(media_type, str) else None, pushed_by))
    return pushes


def is_protected(push: Push, patterns: Sequence[tuple[str, str]]) -> bool:
    """A pattern's repository glob matches the full name (host/path) or the path alone; its tag glob the tag."""
    return any((fnmatch.fnmatchcase(push.name, repo) or fnmatch.fnmatchcase(push.repository, repo))
               and fnmatch.fnmatchcase(push.tag, tag) for repo, tag in patterns)


# --------------------------------------------------------------------------- the registry side


class EnforcingClient(RegistryClient):
    """RegistryClient plus the one call enforcement needs that promotion never does: delete a manifest."""

    def delete_manifest(self, ref: ImageRef, digest: str) -> None:
        what = f"delete {ref.name}@{digest}"
        resp = self._request("DELETE", ref, f"{ref.repository}/manifests/{digest}", what=what,
                             actions="pull,push,delete")
        if resp.status_code == 404:
            raise ImageNotFound(f"{what}: not found")
        if resp.status_code not in (200, 202):
            raise RegistryError(f"{what}: HTTP {resp.status_code} (is storage.delete.enabled set on the registry?)")


# --------------------------------------------------------------------------- judging and enforcing


@dataclass
class EventResult:
    event_id: str
    reference: str
    digest: str
    verdict: str | None
    outcome: str
    previous_digest: str | None = None
    detail: str = ""
    replayed: bool = False  # answered from an earlier delivery of the same event

    def to_dict(self) -> dict[str, Any]:
        return {"event_id": self.event_id, "reference": self.reference, "digest": self.digest,
                "verdict": self.verdict, "outcome": self.outcome, "previous_digest": self.previous_digest,
                "detail": self.detail, "replayed": self.replayed}


@dataclass
class Webhook:
    sessions: sessionmaker[Session]
    patterns: Sequence[tuple[str, str]]
    enforce: str = "off"  # off | revert | delete
    client_factory: Callable[[], EnforcingClient] = field(default=lambda: EnforcingClient())

    def handle(self, body: Any, _again: bool = True) -> list[EventResult]:
        pushes = [p for p in parse_envelope(body) if is_protected(p, self.patterns)]
        results: list[EventResult] = []
        planned: list[tuple[int, Push]] = []
        # 1. Judge and record every event of the envelope in one transaction (intent before any change).
        with self.sessions() as session:
            for push in pushes:
                existing = session.scalar(select(RegistryEvent).where(RegistryEvent.event_id == push.event_id))
                if existing is not None and existing.outcome != "enforcing":
                    results.append(_result(existing, replayed=True))
                    continue
                if existing is not None:  # an earlier delivery stopped between intent and outcome: finish it
                    planned.append((existing.id, push))
                    continue
                row = self._judge(session, push)
                session.add(row)
                session.flush()
                if row.outcome == "enforcing":
                    planned.append((row.id, push))
                else:
                    results.append(_result(row))
                    _log(row)
            try:
                session.commit()
            except IntegrityError:  # a concurrent delivery of the same event recorded it first: answer from it
                session.rollback()
                if not _again:
                    raise
                return self.handle(body, _again=False)
        # 2. Change the registry, one event at a time, each outcome committed as soon as it is known.
        for row_id, push in planned:
            results.append(self._enforce(row_id, push))
        return results

    def _judge(self, session: Session, push: Push) -> RegistryEvent:
        check = check_push(session, push.ref, push.digest)
        row = RegistryEvent(event_id=push.event_id, action="push", repository=push.name, tag=push.tag,
                            digest=push.digest, media_type=push.media_type, pushed_by=push.pushed_by,
                            verdict=check.verdict.value if check.verdict else None, decision_id=check.decision,
                            received_at=utcnow())
        if check.ok:
            row.outcome, row.detail = "allowed", f"qualified: decision {check.decision} of run {check.run} is PASS"
            row.decided_at = utcnow()
            return row
        why = ("never judged by the gate" if check.verdict is None else
               f"latest decision {check.decision} (run {check.run}) is {check.verdict.value}")
        why = "; ".join([why, *check.problems])
        if self.enforce == "off":
            row.outcome, row.detail = "recorded", f"not qualified ({why}); enforcement is off"
            row.decided_at = utcnow()
        else:
            row.outcome, row.detail = "enforcing", f"not qualified ({why}); enforcing: {self.enforce}"
        return row

    def _enforce(self, row_id: int, push: Push) -> EventResult:
        outcome, previous, detail = "failed", None, ""
        try:
            with self.client_factory() as client:
                current = client.digest_if_exists(push.ref)
                if current != push.digest:
                    outcome = "skipped"
                    detail = (f"the tag moved on to {current} before enforcement: left alone" if current else
                              "the tag is gone already: nothing to do")
                else:
                    if self.enforce == "revert":
                        previous = self._previous_qualified(push)
                    if previous is not None:
                        manifest = client.get_manifest(push.ref.with_digest(previous))
                        client.put_manifest(push.ref, manifest)
                        outcome, detail = "reverted", f"tag re-pointed to the previous qualified digest {previous}"
                    else:
                        client.delete_manifest(push.ref, push.digest)
                        outcome = "deleted"
                        detail = ("manifest deleted (with every tag of the repository on it): "
                                  + ("no previous qualified digest to re-point to" if self.enforce == "revert"
                                     else "enforcement is delete"))
        except (RegistryError, OSError) as exc:
            outcome, detail = "failed", f"enforcement failed: {type(exc).__name__}: {exc}"
        with self.sessions() as session:
            row = session.get(RegistryEvent, row_id)
            assert row is not None
            row.outcome, row.previous_digest = outcome, previous
            row.detail = f"{row.detail}; {detail}"
            row.decided_at = utcnow()
            session.commit()
            _log(row)
            return _result(row)

    def _previous_qualified(self, push: Push) -> str | None:
        """The newest digest this tag was allowed to carry (a push the service allowed, else a promotion to
        it) that may still carry it now (the rules of gate check again)."""
        with self.sessions() as session:
            for digest in self._candidates(session, push):
                if digest != push.digest and check_push(session, push.ref, digest).ok:
                    return digest
        return None

    @staticmethod
    def _candidates(session: Session, push: Push) -> Iterator[str]:
        seen: set[str] = set()
        allowed = session.scalars(select(RegistryEvent.digest).where(
            RegistryEvent.repository == push.name, RegistryEvent.tag == push.tag, RegistryEvent.outcome == "allowed")
            .order_by(RegistryEvent.id.desc()).limit(50))
        promoted = session.scalars(select(Promotion.source_digest).where(
            Promotion.target_ref == f"{push.name}:{push.tag}", Promotion.outcome.in_(("promoted", "skipped")))
            .order_by(Promotion.id.desc()).limit(50))
        for digest in [*allowed, *promoted]:
            if digest not in seen:
                seen.add(digest)
                yield digest


def _result(row: RegistryEvent, replayed: bool = False) -> EventResult:
    return EventResult(row.event_id, f"{row.repository}:{row.tag}", row.digest, row.verdict, row.outcome,
                       row.previous_digest, row.detail, replayed)


def _log(row: RegistryEvent) -> None:
    level = logging.INFO if row.outcome in ("allowed", "skipped") else logging.WARNING
    if row.outcome == "failed":
        level = logging.ERROR
    LOG.log(level, "registry event %s: push of %s:%s@%s (verdict %s): %s - %s", row.event_id, row.repository,
            row.tag, row.digest, row.verdict or "none", row.outcome, row.detail)
