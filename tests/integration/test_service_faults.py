"""The gating service under attack and under faults (issue 25), each against the real `qualify serve` and the
real Distribution registry (docker-registry) whose notifications reach it: the webhook acts on the registry its
token is bound to whatever Host header the pusher sent, and one odd event never stalls enforcement."""

from __future__ import annotations

import subprocess
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text as sql
from support.registry import skopeo, skopeo_digest
from support.service import put_manifest, wait_for

from qualify.store.engine import open_database

pytestmark = [pytest.mark.registry, pytest.mark.slow]


def _events(db: str, tag: str | None = None) -> list[dict[str, Any]]:
    engine, _ = open_database(db, migrate=False)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sql("SELECT event_id, repository, tag, digest, outcome, pushed_by, detail "
                                    "FROM registry_events ORDER BY id"))
            return [dict(r._mapping) for r in rows if tag is None or r.tag == tag]
    finally:
        engine.dispose()


def _final(db: str, tag: str, digest: str) -> dict[str, Any]:
    return wait_for(lambda: [e for e in _events(db, tag) if e["digest"] == digest
                             and e["outcome"] not in ("enforcing", "failed")], f"the event of {tag}@{digest}")[0]


def test_the_webhook_acts_on_its_bound_registry_whatever_host_the_event_names(
        db_url: str, registry_factory, make_image, service_factory) -> None:
    token = "reg-" + uuid.uuid4().hex
    service = service_factory(db_url, token, start=False)
    bound = registry_factory(notifications=[service.endpoint()])
    other = registry_factory()
    service.args = ["--registry", bound.host, "--insecure-registry", bound.host, "--insecure-registry", other.host,
                    "--protect", f"{bound.host}/team/*:stable", "--protect", "team/*:edge", "--enforce", "delete"]
    service.start()
    port = bound.port
    for k, (host, tag) in enumerate([(f"localhost:{port}", "stable"), (f"LOCALHOST:{port}", "stable"),
                                     (f"localhost:{port}", "edge"), (other.host, "stable")]):
        path = f"team/app{k}"
        digest = make_image(bound, path, "base")
        if host == other.host:  # the same image sits on the other registry under the tag the event names
            copied = skopeo("copy", "--quiet", "--preserve-digests", "--src-tls-verify=false",
                            "--dest-tls-verify=false", f"docker://{bound.ref(path, 'base')}",
                            f"docker://{other.ref(path, tag)}")
            assert copied.returncode == 0, copied.stderr
        assert put_manifest(bound.url, path, digest, tag, host=host).status_code == 201
        row = _final(db_url, tag, digest)
        # judged and enforced on the bound registry; the pusher's host recorded, never used
        assert row["outcome"] == "deleted" and row["repository"] == f"{bound.host}/{path}", row
        assert f"the event named host {host!r}" in row["detail"], row
        assert skopeo_digest(bound.ref(path, tag)) is None
        if host == other.host:
            assert skopeo_digest(other.ref(path, tag)) == digest  # the other registry was never touched
    assert token not in service.log.read_text()


@pytest.mark.parametrize("host", ["x_y:{port}", "localhost.:{port}", "", "h" * 500 + ":{port}"])
def test_one_odd_event_never_stalls_enforcement(host: str, db_url: str, registry_factory, make_image,
                                                service_factory, tmp_path) -> None:
    """Hosts that Go's Host-header check lets through, an empty one, one longer than the column, and an actor name
    longer than its column (PostgreSQL enforces lengths): each push is judged, and so is the next one."""
    token = "reg-" + uuid.uuid4().hex
    service = service_factory(db_url, token, start=False)
    user = ("ci-" + "u" * 197, "pw-" + uuid.uuid4().hex[:8])
    bound = registry_factory(auth=user, notifications=[service.endpoint()])
    service.args = ["--registry", bound.host, "--insecure-registry", bound.host, "--protect", "team/*:stable",
                    "--enforce", "delete"]
    service.env = {"QUALIFY_REGISTRY_USERNAME": user[0], "QUALIFY_REGISTRY_PASSWORD": user[1],
                   "QUALIFY_REGISTRY_HOST": bound.host}
    service.start()
    odd, plain = (make_image(bound, f"team/{name}", "base") for name in ("odd", "plain"))
    answer = put_manifest(bound.url, "team/odd", odd, "stable", host=host.format(port=bound.port), auth=user)
    assert answer.status_code == 201, answer.text
    assert put_manifest(bound.url, "team/plain", plain, "stable", auth=user).status_code == 201
    for path, digest in (("team/odd", odd), ("team/plain", plain)):
        row = _final(db_url, "stable", digest)
        assert row["outcome"] == "deleted" and row["pushed_by"].endswith("…"), row
        gone = skopeo("inspect", "--tls-verify=false", "--no-tags", "--creds", f"{user[0]}:{user[1]}",
                      f"docker://{bound.ref(path, 'stable')}")
        assert gone.returncode != 0 and "manifest unknown" in gone.stderr, gone.stderr


def test_a_malformed_event_is_recorded_and_skipped_by_the_real_service(db_url: str, service_factory) -> None:
    token = "reg-" + uuid.uuid4().hex
    service = service_factory(db_url, token, ["--registry", "127.0.0.1:9", "--protect", "team/*:*"])
    digest = "sha256:" + "ab" * 32
    good = {"id": "good-" + uuid.uuid4().hex, "action": "push", "request": {"host": "evil.example:443"},
            "target": {"repository": "team/app", "tag": "stable", "digest": digest, "mediaType": "application/json"},
            "actor": {"name": "n" * 300}}
    bad = [{**good, "id": "long-tag", "target": {**good["target"], "tag": "t" * 129}},
           {**good, "id": "i" * 129}, {**good, "id": "bad-digest", "target": {**good["target"], "digest": "x" * 200}},
           {**good, "id": "no-target", "target": None}]
    answer = httpx.post(f"{service.url}/v1/registry/events", json={"events": [*bad, good]}, trust_env=False,
                        headers={"Authorization": f"Bearer {token}", "Host": "evil.example"})
    assert answer.status_code == 200, answer.text
    rows = _events(db_url)
    assert [r["outcome"] for r in rows] == ["skipped"] * 4 + ["recorded"], rows
    assert all("malformed event" in r["detail"] for r in rows[:4])
    # the unknown media type is judged like any other push (never judged: recorded), under the bound registry
    assert rows[-1]["repository"] == "127.0.0.1:9/team/app" and len(rows[-1]["pushed_by"]) <= 128


def _push_event(registry, repository: str, tag: str, digest: str) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "action": "push", "request": {"host": registry.host, "method": "PUT"},
            "target": {"mediaType": "application/vnd.oci.image.manifest.v1+json", "repository": repository,
                       "tag": tag, "digest": digest, "size": 500,
                       "url": f"{registry.url}/v2/{repository}/manifests/{digest}"}}


def _deliver(service, token: str, event: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{service.url}/v1/registry/events", json={"events": [event]}, trust_env=False, timeout=120,
                      headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def enforcing(registry_factory, make_image, service_factory, tmp_path):
    """A registry without notifications (the test delivers each event itself, when it chooses) and the service
    enforcing `delete` on team/*:stable."""
    from qualify.store.engine import upgrade

    db = f"sqlite:///{tmp_path / 'q.db'}"
    upgrade(db)
    token = "reg-" + uuid.uuid4().hex
    registry = registry_factory()
    service = service_factory(db, token, ["--registry", registry.host, "--insecure-registry", registry.host,
                                          "--protect", "team/*:stable", "--enforce", "delete"])
    return db, token, registry, service


@pytest.mark.parametrize("media_type", ["application/vnd.docker.distribution.manifest.v1+prettyjws",
                                        "application/vnd.oci.artifact.manifest.v1+json", "application/json"])
def test_a_tagged_push_of_any_media_type_is_judged(media_type: str, enforcing, make_image) -> None:
    """A schema1, OCI artifact or plain JSON manifest on a protected tag is judged by its digest like any other
    (the old webhook skipped media types it did not know)."""
    db, token, registry, service = enforcing
    digest = make_image(registry, "team/odd", "stable")
    event = _push_event(registry, "team/odd", "stable", digest)
    event["target"]["mediaType"] = media_type
    answer = _deliver(service, token, event)
    assert answer.status_code == 200 and answer.json()["events"][0]["outcome"] == "deleted", answer.text
    assert skopeo_digest(registry.ref("team/odd", "stable")) is None
    assert _events(db)[0]["outcome"] == "deleted"


def test_a_push_event_that_comes_before_its_tag_is_enforced_once_the_tag_is_there(enforcing, make_image) -> None:
    """Distribution notifies when the manifest is stored, before it writes the tag: on a busy machine the webhook
    asked for the tag first, found nothing and skipped the push as gone, leaving an unqualified image on a protected
    tag (seen in CI). Here the event is delivered while only the manifest is there, and the tag is written 0.5 s
    later: the push is enforced."""
    import threading

    db, token, registry, service = enforcing
    digest = make_image(registry, "team/late", "base")  # the manifest, under an unprotected tag
    event = _push_event(registry, "team/late", "stable", digest)
    late = threading.Timer(0.5, lambda: put_manifest(registry.url, "team/late", digest, "stable"))
    late.start()
    try:
        answer = _deliver(service, token, event)
    finally:
        late.join()
    assert answer.status_code == 200 and answer.json()["events"][0]["outcome"] == "deleted", answer.text
    assert skopeo_digest(registry.ref("team/late", "stable")) is None
    [row] = _events(db)
    assert row["outcome"] == "deleted" and "manifest deleted" in row["detail"], row


def test_a_push_whose_tag_never_shows_is_deleted_by_digest_and_a_vanished_one_skipped(enforcing, make_image) -> None:
    db, token, registry, service = enforcing
    digest = make_image(registry, "team/never", "base")
    answer = _deliver(service, token, _push_event(registry, "team/never", "stable", digest))
    assert answer.status_code == 200 and answer.json()["events"][0]["outcome"] == "deleted", answer.text
    assert "not in the registry" in answer.json()["events"][0]["detail"]
    assert skopeo_digest(registry.ref("team/never", "base")) is None  # the manifest is gone, every tag with it
    gone = "sha256:" + "cd" * 32  # neither the tag nor the manifest: nothing to enforce
    answer = _deliver(service, token, _push_event(registry, "team/never", "stable", gone))
    assert answer.status_code == 200, answer.text
    assert answer.json()["events"][0]["outcome"] == "skipped" and "gone already" in answer.json()["events"][0]["detail"]


def test_a_redelivery_during_enforcement_waits_for_it_and_gets_its_outcome(enforcing, make_image) -> None:
    """The registry redelivers an envelope it got no answer to within its timeout. A second delivery that took the
    row over while the first was still enforcing saw the tag gone (the first had deleted it) and overwrote the
    row's `deleted` with `skipped`, or failed its own delete: both deliveries now answer the one outcome."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    db, token, registry, service = enforcing
    digest = make_image(registry, "team/twice", "base")
    event = _push_event(registry, "team/twice", "stable", digest)  # its tag comes late: the first delivery waits
    late = threading.Timer(1.0, lambda: put_manifest(registry.url, "team/twice", digest, "stable"))
    late.start()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_deliver, service, token, event)
        wait_for(lambda: _events(db), "the first delivery's row")
        second = pool.submit(_deliver, service, token, event)
        answers = [first.result(), second.result()]
    late.join()
    for answer in answers:
        assert answer.status_code == 200 and answer.json()["events"][0]["outcome"] == "deleted", answer.text
    assert [a.json()["events"][0]["replayed"] for a in answers] == [False, True]
    [row] = _events(db)
    assert row["outcome"] == "deleted", row
    assert skopeo_digest(registry.ref("team/twice", "stable")) is None


def test_a_delivery_that_ended_without_an_outcome_is_finished_by_the_one_that_waited_for_it(
        registry_factory, make_image, tmp_path) -> None:
    """In process (the service's Webhook, a real registry, a real database): another delivery holds the row's
    enforcement and ends without writing an outcome (its thread died); the delivery that waited for it finishes
    the enforcement instead of answering the row's `enforcing` as if it were done."""
    import threading

    from qualify.service.webhook import EnforcingClient, Webhook, parse_envelope
    from qualify.store.engine import open_database, upgrade
    from qualify.store.models import RegistryEvent

    db = f"sqlite:///{tmp_path / 'q.db'}"
    upgrade(db)
    engine, sessions = open_database(db, migrate=False)
    registry = registry_factory()
    digest = make_image(registry, "team/died", "stable")
    webhook = Webhook(sessions, [("team/*", "stable")], "delete",
                      lambda: EnforcingClient([registry.host], timeout=30), registry.host)
    body = {"events": [_push_event(registry, "team/died", "stable", digest)]}
    [push] = parse_envelope(body, registry.host)
    with sessions() as session:  # the other delivery's committed intent...
        row = webhook._judge(session, push)
        session.add(row)
        session.commit()
        row_id = row.id
    assert webhook._claim(row_id)  # ...and its hold, released 0.3 s from now without an outcome
    threading.Timer(0.3, webhook._release, args=([row_id],)).start()
    [answer] = webhook.handle(body)
    assert (answer.outcome, answer.replayed) == ("deleted", False), answer
    with sessions() as session:
        assert session.get(RegistryEvent, row_id).outcome == "deleted"
    assert skopeo_digest(registry.ref("team/died", "stable")) is None
    engine.dispose()
