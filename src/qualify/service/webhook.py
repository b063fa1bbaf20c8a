"""The Distribution registry's notifications: a push to a protected tag whose digest has no PASS.

The registry (docker-registry, `notifications.endpoints`) POSTs an envelope `{"events": [...]}` after each
push, pull and delete. The endpoint's token is bound to ONE registry (Settings.webhook_registry): every push is
placed on that registry, whatever host the event names (`request.host` is the pusher's Host header: recorded,
never trusted). Only manifest pushes with a tag (any media type) to a protected repository/tag pattern matter:
each is judged with the rules of `gate check` (qualify.gate.push_check.check_push) and recorded in
`registry_events`. When the digest may not carry that tag and enforcement is on, the tag is re-pointed to the
previous qualified digest (`revert`; deleted when there is none) or the manifest deleted (`delete`).

One malformed event is recorded as `skipped` with the reason and never refuses the envelope (Distribution
retries a refused envelope forever, stalling every later push); values are checked against the columns'
lengths. Every change to the registry is preceded by a committed row saying what is about to be done (outcome
`enforcing`) and followed by its result; a redelivered event (same id) is answered from its row, and an
unfinished or failed one is tried again (a failure answers 503, so the registry redelivers). The tag is
re-checked right before the change: when it has moved on since the push, nothing is changed (`skipped`).

Two races, both seen on a busy machine:
* Distribution sends a manifest's push event when the manifest is stored, before it writes the tag: the webhook
  can ask for the tag before it exists. A tag not there yet is waited for (`tag_wait_s`); if it still is not
  there while the pushed manifest is, the manifest is deleted by its digest (a tag written later points to
  nothing). Only a manifest that is gone too is `skipped` as gone.
* The registry redelivers an envelope it got no answer to within its timeout, while the first delivery is still
  enforcing. In this process one delivery enforces an event at a time: another delivery of it waits for that
  one's outcome and answers from its row. Across processes, a final outcome is never overwritten.

Distribution 2.x cannot delete a tag alone: deleting removes the manifest (by digest) and every tag of that
repository pointing to it. That is what `delete` (and `revert` without a previous digest) does.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from qualify.errors import BadInput
from qualify.gate.push_check import check_push
from qualify.imageref import ImageRef
from qualify.registry import ImageNotFound, RegistryClient, RegistryError
from qualify.store.models import Promotion, RegistryEvent, utcnow

LOG = logging.getLogger("qualify.service")
MAX_EVENTS = 1000  # per envelope (the registry sends small batches)
_DIGEST = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-fA-F0-9]{32,}$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_REPOSITORY = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")


def _width(column: str) -> int:
    """The database column's length (PostgreSQL enforces it): what the webhook validates against."""
    length = RegistryEvent.__table__.c[column].type.length  # type: ignore[attr-defined]
    assert isinstance(length, int)
    return length


FAILED = "enforcement failed:"


class _Off(Exception):
    """Enforcement is off (raised to leave the registry alone)."""


class MalformedEvents(BadInput):
    """The envelope itself is not what the registry sends (HTTP 400; nothing recorded). One malformed event
    inside a well-formed envelope is not this: it is recorded as skipped (qualify.service.webhook.Malformed)."""


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class Push:
    """A manifest push with a tag, as the registry reported it, placed on the registry the endpoint is bound to."""

    event_id: str
    registry: str  # host[:port]: the registry this notification endpoint is bound to (never the event's word)
    repository: str  # path inside the registry
    tag: str
    digest: str
    media_type: str | None
    pushed_by: str | None
    reported_host: str | None = None  # request.host as the event gave it (the pusher's Host header): recorded only

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    @property
    def ref(self) -> ImageRef:
        return ImageRef(self.registry, self.repository, self.tag, None)


@dataclass(frozen=True)
class Malformed:
    """An event that cannot be judged: recorded as skipped with the reason; the rest of the envelope goes on."""

    event_id: str
    reason: str
    repository: str = ""
    tag: str = ""
    digest: str = ""


def _clip(value: object, column: str) -> str:
    text = value if isinstance(value, str) else ("" if value is None else json.dumps(value, default=str))
    width = _width(column)
    return text if len(text) <= width else text[:width - 1] + "…"


def _optional(obj: dict[str, Any], key: str, column: str) -> str | None:
    value = obj.get(key)
    return _clip(value, column) if isinstance(value, str) and value else None


def _event_id(event: Any) -> str:
    """The registry's id when usable; else a stable id from the event's content (a redelivery maps to it too)."""
    given = event.get("id") if isinstance(event, dict) else None
    if isinstance(given, str) and given and len(given) <= _width("event_id") and given.isprintable():
        return given
    body = json.dumps(event, sort_keys=True, default=str).encode()
    return "malformed-" + hashlib.sha256(body).hexdigest()[:40]


def parse_event(event: Any, registry: str, where: str) -> Push | Malformed | None:
    """One event: a Push to judge, None when it moved no tag (pulls, deletes, blobs, pushes by digest), or
    Malformed with the reason. The registry the push landed on is `registry` (the endpoint's binding)."""
    event_id = _event_id(event)
    if not isinstance(event, dict):
        return Malformed(event_id, f"{where} is not an object")
    target = event.get("target")
    if not isinstance(target, dict):
        return Malformed(event_id, f"{where}: 'target' must be an object")
    action, tag = event.get("action"), target.get("tag")
    if action != "push" or tag in (None, ""):
        return None  # no tag moved (a tag exists only on manifest pushes, whatever the media type says)
    repository, digest = target.get("repository"), target.get("digest")
    found = Malformed(event_id, "", _clip(f"{registry}/{repository}", "repository"), _clip(tag, "tag"),
                      _clip(digest, "digest"))
    if event.get("id") != event_id:
        return dataclasses.replace(found, reason=f"{where}: 'id' must be a string of 1-{_width('event_id')} "
                                                 "printable characters")
    if not isinstance(repository, str) or not _REPOSITORY.match(repository) \
            or len(registry) + 1 + len(repository) > _width("repository"):
        return dataclasses.replace(found, reason=f"{where}.target: 'repository' {_clip(repository, 'tag')!r} is "
                                                 "not a repository path that fits")
    if not isinstance(tag, str) or not _TAG.match(tag):
        return dataclasses.replace(found, reason=f"{where}.target: 'tag' {_clip(tag, 'tag')!r} is not a tag")
    if not isinstance(digest, str) or not _DIGEST.match(digest) or len(digest) > _width("digest"):
        return dataclasses.replace(found, reason=f"{where}.target: 'digest' {_clip(digest, 'tag')!r} is not a digest")
    request = event.get("request") if isinstance(event.get("request"), dict) else {}
    actor = event.get("actor") if isinstance(event.get("actor"), dict) else {}
    return Push(event_id, registry, repository, tag, digest, _optional(target, "mediaType", "media_type"),
                _optional(actor, "name", "pushed_by"), _optional(request, "host", "repository"))


def parse_envelope(body: Any, registry: str) -> list[Push | Malformed]:
    """The envelope's pushes with a tag and its malformed events; MalformedEvents only when the envelope itself
    is not `{"events": [...]}` (a registry never sends that)."""
    if not isinstance(body, dict) or not isinstance(body.get("events"), list):
        raise MalformedEvents("the body must be a JSON object with an 'events' list")
    events = body["events"]
    if len(events) > MAX_EVENTS:
        raise MalformedEvents(f"{len(events)} events in one envelope: at most {MAX_EVENTS}")
    parsed = (parse_event(event, registry, f"events[{k}]") for k, event in enumerate(events))
    return [p for p in parsed if p is not None]


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
    # The registry (host:port) this endpoint's token is bound to: every push is placed there, and only there is
    # anything changed, whatever host the event names (Distribution copies it from the pusher's Host header).
    registry: str = ""
    # How long a pushed tag that is not in the registry yet is waited for (Distribution notifies before it writes
    # the tag); well inside the registry's notification timeout, so that the wait does not cause a redelivery.
    tag_wait_s: float = 2.0
    # The rows an enforcement in this process is working on, each with the event its end sets.
    _in_flight: dict[int, threading.Event] = field(default_factory=dict, init=False, repr=False)
    _flight_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def handle(self, body: Any, _again: bool = True) -> list[EventResult]:
        parsed = parse_envelope(body, self.registry)
        events = [p for p in parsed if isinstance(p, Malformed) or is_protected(p, self.patterns)]
        results: list[EventResult] = []
        planned: list[tuple[int, Push]] = []
        elsewhere: list[tuple[int, Push]] = []  # rows another delivery here is enforcing now: answered from its end
        # 1. Judge and record every event of the envelope in one transaction (intent before any change).
        try:
            with self.sessions() as session:
                for event in events:
                    existing = session.scalar(select(RegistryEvent).where(RegistryEvent.event_id == event.event_id))
                    if existing is not None and (existing.outcome not in ("enforcing", "failed")
                                                 or isinstance(event, Malformed)):
                        results.append(_result(existing, replayed=True))
                        continue
                    if existing is not None:  # an earlier delivery stopped or failed before its outcome: finish it
                        assert isinstance(event, Push)
                        if self._claim(existing.id):
                            planned.append((existing.id, event))
                        else:
                            elsewhere.append((existing.id, event))
                        continue
                    row = _skip(event) if isinstance(event, Malformed) else self._judge(session, event)
                    session.add(row)
                    session.flush()
                    if row.outcome == "enforcing":
                        assert isinstance(event, Push)
                        self._claim(row.id)  # before the commit makes the row visible to another delivery
                        planned.append((row.id, event))
                    else:
                        results.append(_result(row))
                        _log(row)
                session.commit()
        except IntegrityError:  # a concurrent delivery of the same event recorded it first: answer from it
            self._release(row_id for row_id, _ in planned)
            if not _again:
                raise
            return self.handle(body, _again=False)
        except BaseException:
            self._release(row_id for row_id, _ in planned)
            raise
        # 2. Change the registry, one event at a time, each outcome committed as soon as it is known.
        held = [row_id for row_id, _ in planned]
        try:
            for row_id, push in planned:
                results.append(self._enforce(row_id, push))
                self._release([held.pop(0)])
        finally:
            self._release(held)  # what an exception left claimed
        for row_id, push in elsewhere:
            results.append(self._answer_when_done(row_id, push))
        return results

    def _claim(self, row_id: int) -> bool:
        """Take the row's enforcement for this delivery; False when another delivery in this process has it."""
        with self._flight_lock:
            if row_id in self._in_flight:
                return False
            self._in_flight[row_id] = threading.Event()
            return True

    def _release(self, row_ids: Iterable[int]) -> None:
        with self._flight_lock:
            for row_id in list(row_ids):
                done = self._in_flight.pop(row_id, None)
                if done is not None:
                    done.set()

    def _answer_when_done(self, row_id: int, push: Push, timeout_s: float = 120.0) -> EventResult:
        """The outcome another delivery's enforcement gave the row (`failed`: 503, redelivered). One that ended
        without an outcome (the row still `enforcing`) is finished here; one still running after timeout_s
        answers `enforcing`, 503 too: the registry redelivers later."""
        with self._flight_lock:
            done = self._in_flight.get(row_id)
        if done is not None:
            done.wait(timeout_s)
        with self.sessions() as session:
            row = session.get(RegistryEvent, row_id)
            assert row is not None
            answer = _result(row, replayed=True)
        if answer.outcome == "enforcing" and self._claim(row_id):
            try:
                return self._enforce(row_id, push)
            finally:
                self._release([row_id])
        return answer

    def _judge(self, session: Session, push: Push) -> RegistryEvent:
        check = check_push(session, push.ref, push.digest)
        row = RegistryEvent(event_id=push.event_id, action="push", repository=push.name, tag=push.tag,
                            digest=push.digest, media_type=push.media_type, pushed_by=push.pushed_by,
                            verdict=check.verdict.value if check.verdict else None, decision_id=check.decision,
                            received_at=utcnow())
        reported = (f" [the event named host {push.reported_host!r}; this endpoint is bound to {push.registry}]"
                    if push.reported_host and push.reported_host != push.registry else "")
        if check.ok:
            row.outcome = "allowed"
            row.detail = f"qualified: decision {check.decision} of run {check.run} is PASS{reported}"
            row.decided_at = utcnow()
            return row
        why = ("never judged by the gate" if check.verdict is None else
               f"latest decision {check.decision} (run {check.run}) is {check.verdict.value}")
        why = "; ".join([why, *check.problems])
        if self.enforce == "off":
            row.outcome, row.detail = "recorded", f"not qualified ({why}); enforcement is off{reported}"
            row.decided_at = utcnow()
        else:
            row.outcome, row.detail = "enforcing", f"not qualified ({why}); enforcing: {self.enforce}{reported}"
        return row

    def _enforce(self, row_id: int, push: Push) -> EventResult:
        outcome, previous, detail = "failed", None, ""
        try:
            if self.enforce == "off":  # a failed event redelivered after enforcement was turned off
                raise _Off
            with self.client_factory() as client:
                current = client.digest_if_exists(push.ref) or self._tag_once_written(client, push)
                if current is None and client.digest_if_exists(push.ref.with_digest(push.digest)) == push.digest:
                    # The tag never showed up, the pushed manifest did: delete it by digest, so that the tag,
                    # whenever the registry writes it, points to nothing.
                    client.delete_manifest(push.ref, push.digest)
                    outcome = "deleted"
                    detail = (f"the tag was not in the registry {self.tag_wait_s:g} s after its push event, the "
                              "pushed manifest was: manifest deleted by digest (the tag points to nothing)")
                elif current != push.digest:
                    outcome = "skipped"
                    detail = (f"the tag moved on to {current} before enforcement: left alone" if current else
                              "the tag and its manifest are gone already: nothing to do")
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
        except _Off:
            outcome, detail = "recorded", "enforcement is off now: recorded only"
        except (RegistryError, OSError) as exc:
            outcome, detail = "failed", f"{FAILED} {type(exc).__name__}: {exc} (the registry will redeliver it)"
        with self.sessions() as session:
            row = session.get(RegistryEvent, row_id)
            assert row is not None
            if row.outcome not in ("enforcing", "failed"):  # another process's delivery finished it first
                return _result(row, replayed=True)
            row.outcome, row.previous_digest = outcome, previous
            row.detail = f"{row.detail.split('; ' + FAILED)[0]}; {detail}"  # a retry replaces the last failure
            row.decided_at = utcnow()
            session.commit()
            _log(row)
            return _result(row)

    def _tag_once_written(self, client: EnforcingClient, push: Push) -> str | None:
        """The tag's digest once the registry has written it, waited for up to tag_wait_s; None if it never was."""
        deadline = time.monotonic() + self.tag_wait_s
        while time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
            current = client.digest_if_exists(push.ref)
            if current is not None:
                return current
        return None

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


def _skip(event: Malformed) -> RegistryEvent:
    now = utcnow()
    return RegistryEvent(event_id=event.event_id, action="push", repository=event.repository, tag=event.tag,
                         digest=event.digest, outcome="skipped", received_at=now, decided_at=now,
                         detail=f"malformed event, not judged: {event.reason}")


def _result(row: RegistryEvent, replayed: bool = False) -> EventResult:
    return EventResult(row.event_id, f"{row.repository}:{row.tag}", row.digest, row.verdict, row.outcome,
                       row.previous_digest, row.detail, replayed)


def _log(row: RegistryEvent) -> None:
    level = logging.INFO if row.outcome in ("allowed", "skipped") else logging.WARNING
    if row.outcome == "failed":
        level = logging.ERROR
    LOG.log(level, "registry event %s: push of %s:%s@%s (verdict %s): %s - %s", row.event_id, row.repository,
            row.tag, row.digest, row.verdict or "none", row.outcome, row.detail)
