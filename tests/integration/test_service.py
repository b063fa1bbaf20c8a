"""The gating service (qualify.service) in process: the gate with the rules of `gate check`, runs, health,
OpenAPI, the bearer token, and the registry webhook with a recording stand-in for the registry."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.cli import run_cli
from support.reports import REPOSITORY, seed_release_line

from qualify.registry import ImageManifest, RegistryUnreachable
from qualify.service import EnforcingClient, create_app
from qualify.settings import Settings
from qualify.store.models import RegistryEvent

TOKEN = "t0ken-" + uuid.uuid4().hex
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def client_for(sessions, *, token: str | None = TOKEN, reads_need_token: bool = False, registry=None,
               **settings: Any) -> TestClient:
    settings.setdefault("webhook_registry", "127.0.0.1:5000")
    config = Settings.load(env={}, service_token=token, **settings)
    factory = (lambda: registry) if registry is not None else None
    return TestClient(create_app(config, sessions, reads_need_token=reads_need_token, client_factory=factory))


def test_gate_answers_with_the_rules_of_gate_check(db_url: str, sessions) -> None:
    line = seed_release_line(sessions)
    api = client_for(sessions)
    passed = api.get("/v1/gate", params={"ref": f"{REPOSITORY}@{line.digest_a}"})
    assert passed.status_code == 200 and passed.json()["ok"] is True and passed.json()["verdict"] == "PASS"
    failed = api.get("/v1/gate", params={"ref": f"{REPOSITORY}@{line.digest_b}"})
    # 200 only when it may be pushed (`curl -f ... && push` is safe); a judged refusal is 403 with the same fields
    assert failed.status_code == 403 and failed.json()["ok"] is False and failed.json()["verdict"] == "FAIL"
    assert any(r["check"] == "regression" for r in failed.json()["reasons"])
    # the same answer as the CLI's gate check, field for field
    for digest in (line.digest_a, line.digest_b):
        cli = run_cli("gate", "check", f"{REPOSITORY}@{digest}", "--db", db_url, "--json")
        served = api.get("/v1/gate", params={"ref": f"{REPOSITORY}@{digest}"}).json()
        printed = json.loads(cli.stdout)
        assert {k: v for k, v in served.items() if k in printed} == printed  # a refusal adds the problem's members
    elsewhere = api.get("/v1/gate", params={"ref": f"evil.example.com/x/demo@{line.digest_a}"}).json()
    assert elsewhere["ok"] is False and "is not where" in elsewhere["problems"][0]
    assert api.get("/v1/gate", params={"ref": f"{REPOSITORY}@{line.digest_a}", "release": "other"}).json()["ok"] is False
    never = api.get("/v1/gate", params={"ref": f"{REPOSITORY}@sha256:{'e' * 64}"})
    assert never.status_code == 404 and never.json()["verdict"] is None and "never been judged" in never.json()["detail"]
    assert api.get("/v1/gate", params={"ref": "Not A Ref"}).status_code == 400
    assert api.get("/v1/gate").status_code == 422  # the parameter is required


def test_the_gates_reads_run_outside_a_transaction(db_url: str, sessions) -> None:
    """Issue 27 (the cold path): every statement of a gate answer, the first (a full check) and a repeated one (the
    cache's revalidation), runs with the database connection in autocommit: no BEGIN and ROLLBACK round trips
    beside the query (they cost a PostgreSQL check two thirds of its time)."""
    from sqlalchemy import Engine, event

    line = seed_release_line(sessions)
    engine = Engine  # every engine: the gate reads on its own (store.engine.hot_read_engine)
    seen: list[tuple[str, bool]] = []

    def autocommit(dbapi_conn: Any) -> bool:
        if hasattr(dbapi_conn, "autocommit"):  # psycopg
            return bool(dbapi_conn.autocommit)
        return dbapi_conn.isolation_level is None  # sqlite3 (Python 3.11: no .autocommit)

    def record(conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        seen.append((statement.split()[0], autocommit(conn.connection.dbapi_connection)))

    event.listen(engine, "before_cursor_execute", record)
    try:
        api = client_for(sessions)
        ref = {"ref": f"{REPOSITORY}@{line.digest_a}"}
        answers = [api.get("/v1/gate", params=ref) for _ in range(2)]
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert [(a.status_code, a.json()["verdict"]) for a in answers] == [(200, "PASS")] * 2
    assert len(seen) >= 2 and all(ok for _, ok in seen), seen
    with sessions() as s:  # the sessions (writes: runs, decisions) keep their transactions
        assert not autocommit(s.connection().connection.dbapi_connection)


@pytest.mark.postgres
def test_the_gates_reads_ping_nobody_and_survive_a_dropped_connection(sessions, monkeypatch: pytest.MonkeyPatch
                                                                      ) -> None:
    """Issue 27 (the cold path): a gate answer sends its query alone, no `SELECT 1` pre-ping before it (half of its
    round trips); a connection the server dropped since (a restart, pg_terminate_backend) is then found by the
    query itself, and the answer is still given, from a new connection (store.engine.idempotent_read)."""
    import psycopg
    from sqlalchemy import Engine, event
    from support.db import psycopg_dsn

    if sessions.kw["bind"].dialect.name != "postgresql":
        pytest.skip("PostgreSQL's: a SQLite pool never pings, and its connections are to a file nobody can drop")
    line = seed_release_line(sessions)
    dialect_class = type(sessions.kw["bind"].dialect)  # every PostgreSQL engine's, the service's own included
    pings: list[int] = []
    real_ping = dialect_class.do_ping
    monkeypatch.setattr(dialect_class, "do_ping", lambda self, conn: pings.append(1) or real_ping(self, conn))
    api = client_for(sessions)
    refs = [{"ref": f"{REPOSITORY}@{line.digest_a}"}, {"ref": f"{REPOSITORY}@{line.digest_b}"}]
    assert [api.get("/v1/gate", params=r).status_code for r in refs * 3] == [200, 403] * 3
    assert pings == []
    database = sessions.kw["bind"].url.database
    errors: list[str] = []

    def record(ctx) -> None:  # type: ignore[no-untyped-def]
        errors.append(type(ctx.original_exception).__name__)

    event.listen(Engine, "handle_error", record)
    try:
        with psycopg.connect(psycopg_dsn(), autocommit=True) as admin:
            dropped = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                    "WHERE datname = %s AND pid <> pg_backend_pid()", (database,)).fetchone()
        assert dropped and dropped[0] >= 1
        for r, status in zip(refs * 2, [200, 403] * 2):  # the cached answer's revalidation, then full checks
            assert api.get("/v1/gate", params=r).status_code == status
        assert api.get("/v1/gate", params={"ref": f"{REPOSITORY}@sha256:{'e' * 64}"}).status_code == 404
    finally:
        event.remove(Engine, "handle_error", record)
    assert errors, "the terminated connection was never used: the test proves nothing"


def test_a_new_decision_changes_the_answer_at_once(sessions) -> None:
    """Answers are cached, but only while the digest's newest decision is the one they were computed from."""
    from qualify.store import repo

    line = seed_release_line(sessions)
    api = client_for(sessions)
    ref = {"ref": f"{REPOSITORY}@{line.digest_a}"}
    assert [api.get("/v1/gate", params=ref).json()["verdict"] for _ in range(3)] == ["PASS"] * 3
    with sessions() as s:
        run = repo.get_run(s, line.run_a)
        later = repo.record_decision(s, run, "FAIL", [{"check": "regression", "case_id": None, "status": "FAIL",
                                                       "message": "judged again", "figures": {}}], "0" * 64, None)
        s.commit()
        later_id = later.id
    now = api.get("/v1/gate", params=ref).json()
    assert (now["verdict"], now["ok"], now["decision"]) == ("FAIL", False, later_id)
    assert now["overrides_pass_decision"] is not None
    never = {"ref": f"{REPOSITORY}@sha256:{'5' * 64}"}
    assert api.get("/v1/gate", params=never).status_code == 404
    with sessions() as s:
        run = repo.get_run(s, line.run_a)
        run.candidate_digest = "sha256:" + "5" * 64
        repo.record_decision(s, run, "PASS", [], "0" * 64, None)
        s.commit()
    assert api.get("/v1/gate", params=never).status_code == 200


def test_runs_health_and_openapi(sessions) -> None:
    line = seed_release_line(sessions)
    api = client_for(sessions)
    runs = api.get("/v1/runs").json()
    assert [r["run"] for r in runs] == [line.run_b, line.run_a] and runs[0]["verdict"] == "FAIL"
    detail = api.get(f"/v1/runs/{line.run_a}").json()
    assert detail["run"] == line.run_a and detail["decisions"][-1]["verdict"] == "PASS" and len(detail["cases"]) == 4
    assert api.get("/v1/runs/999").status_code == 404
    assert api.get("/v1/runs", params={"limit": 0}).status_code == 422
    assert api.get("/healthz").json()["status"] == "ok"
    paths = api.get("/openapi.json").json()["paths"]
    assert {"/v1/gate", "/v1/runs", "/v1/runs/{run_id}", "/healthz", "/v1/registry/events"} <= set(paths)


def test_writes_need_the_token_and_reads_beyond_loopback_too(sessions) -> None:
    api = client_for(sessions, protect="*:*")
    envelope = {"events": []}
    assert api.post("/v1/registry/events", json=envelope).status_code == 401
    wrong = api.post("/v1/registry/events", json=envelope, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"].startswith("Bearer")
    assert api.post("/v1/registry/events", json=envelope, headers={"Authorization": TOKEN}).status_code == 401
    assert api.post("/v1/registry/events", json=envelope, headers=AUTH).status_code == 200
    assert api.get("/healthz").status_code == 200  # reads are open on loopback
    closed = client_for(sessions, token=None)
    refused = closed.post("/v1/registry/events", json=envelope, headers=AUTH)
    assert refused.status_code == 401 and "no token configured" in refused.json()["detail"]
    remote = client_for(sessions, reads_need_token=True)
    assert remote.get("/v1/runs").status_code == 401 and remote.get("/v1/runs", headers=AUTH).status_code == 200
    assert TOKEN not in repr(Settings.load(env={"QUALIFY_SERVICE_TOKEN": TOKEN}))


# --------------------------------------------------------------------------- the webhook


@dataclass
class FakeRegistry(EnforcingClient):
    """Stands in for the registry: tags -> digests; records every change."""

    tags: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    fail: bool = False

    def __post_init__(self) -> None:
        super().__init__(())

    def __enter__(self) -> "FakeRegistry":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def digest_if_exists(self, ref) -> str | None:  # type: ignore[no-untyped-def, override]
        if self.fail:
            raise RegistryUnreachable("registry 127.0.0.1:5000 is unreachable")
        return self.tags.get(str(ref))

    def get_manifest(self, ref) -> ImageManifest:  # type: ignore[no-untyped-def, override]
        return ImageManifest(b"{}", "application/vnd.oci.image.manifest.v1+json", ref.digest)

    def put_manifest(self, ref, manifest) -> str:  # type: ignore[no-untyped-def, override]
        self.calls.append(("put", f"{ref} -> {manifest.digest}"))
        self.tags[str(ref)] = manifest.digest
        return manifest.digest

    def delete_manifest(self, ref, digest) -> None:  # type: ignore[no-untyped-def, override]
        self.calls.append(("delete", f"{ref.name}@{digest}"))
        self.tags = {k: v for k, v in self.tags.items() if v != digest}


def push_event(digest: str, tag: str = "stable", repository: str = "qualify/demo", event_id: str | None = None,
               **extra: Any) -> dict[str, Any]:
    return {"id": event_id or uuid.uuid4().hex, "timestamp": "2026-01-01T00:00:00Z", "action": "push",
            "target": {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 500, "digest": digest,
                       "length": 500, "repository": repository, "tag": tag,
                       "url": f"http://127.0.0.1:5000/v2/{repository}/manifests/{digest}", **extra},
            "request": {"id": "r", "addr": "127.0.0.1:5555", "host": "127.0.0.1:5000", "method": "PUT",
                        "useragent": "skopeo"},
            "actor": {"name": "ci-bot"}, "source": {"addr": "vm:5000", "instanceID": "x"}}


def _rows(sessions) -> list[RegistryEvent]:
    with sessions() as s:
        return list(s.query(RegistryEvent).order_by(RegistryEvent.id))


def test_malformed_envelopes_are_refused_and_malformed_events_skipped(sessions) -> None:
    line = seed_release_line(sessions)
    registry = FakeRegistry({"127.0.0.1:5000/qualify/demo:stable": line.digest_b})
    api = client_for(sessions, protect="qualify/*:*", enforce="revert", registry=registry)
    for body in (b"not json", b"[]", json.dumps({"events": "x"}).encode()):  # not an envelope: 400
        refused = api.post("/v1/registry/events", content=body, headers=AUTH)
        assert refused.status_code == 400, (body, refused.text)
    assert _rows(sessions) == []
    # malformed events inside an envelope are recorded as skipped; the good one is enforced; 200 for the envelope
    good = push_event(line.digest_b)
    odd = [{"id": "x", "action": "push"}, push_event("sha256:short"), push_event(line.digest_a, tag="bad tag!"),
           push_event(line.digest_a, event_id="i" * 129), push_event(line.digest_a, repository="Bad/Repo"), 7]
    answer = api.post("/v1/registry/events", json={"events": [*odd, good]}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    outcomes = [e["outcome"] for e in answer.json()["events"]]
    assert outcomes == ["skipped"] * len(odd) + ["deleted"], answer.text
    rows = _rows(sessions)
    assert all("malformed event" in r.detail for r in rows[:-1]) and rows[-1].outcome == "deleted"
    assert api.post("/v1/registry/events", content=b"x" * (1 << 21), headers=AUTH).status_code == 413


def test_pushes_are_judged_recorded_and_enforced(sessions) -> None:
    line = seed_release_line(sessions)
    registry = FakeRegistry()
    api = client_for(sessions, protect="qualify/demo:stable,127.0.0.1:5000/qualify/*:edge", enforce="revert",
                     registry=registry)
    stable, edge = "127.0.0.1:5000/qualify/demo:stable", "127.0.0.1:5000/qualify/demo:edge"

    def post(*events: dict[str, Any]) -> list[dict[str, Any]]:
        answer = api.post("/v1/registry/events", json={"events": list(events)}, headers=AUTH)
        assert answer.status_code == 200, answer.text
        return answer.json()["events"]

    # pulls, blob pushes, deletes and unprotected tags are not recorded
    pull = {**push_event(line.digest_b), "action": "pull"}
    blob = push_event("sha256:" + "9" * 64, tag="")
    assert post(pull, blob, push_event(line.digest_b, tag="nightly")) == []
    # a qualified digest is allowed and remembered
    registry.tags[stable] = line.digest_a
    first = push_event(line.digest_a)
    assert [e["outcome"] for e in post(first)] == ["allowed"]
    # a FAIL digest is reverted to it; a never-judged one too
    registry.tags[stable] = line.digest_b
    reverted = post(push_event(line.digest_b))[0]
    assert (reverted["outcome"], reverted["previous_digest"], reverted["verdict"]) == ("reverted", line.digest_a, "FAIL")
    assert registry.tags[stable] == line.digest_a
    unknown = "sha256:" + "7" * 64
    registry.tags[stable] = unknown
    assert post(push_event(unknown))[0]["outcome"] == "reverted" and registry.tags[stable] == line.digest_a
    # no previous qualified digest for this tag: the manifest is deleted
    registry.tags[edge] = line.digest_b
    deleted = post(push_event(line.digest_b, tag="edge"))[0]
    assert deleted["outcome"] == "deleted" and edge not in registry.tags
    # the tag moved on before the service acted: left alone
    registry.tags[stable] = line.digest_a
    assert post(push_event(unknown))[0]["outcome"] == "skipped" and registry.tags[stable] == line.digest_a
    # a redelivered event is answered from its row, never applied twice
    calls = len(registry.calls)
    again = post(first)[0]
    assert again["replayed"] and again["outcome"] == "allowed" and len(registry.calls) == calls
    # the registry cannot be reached: the failure is recorded and answered 503, so the registry redelivers it
    registry.fail = True
    retried = push_event(line.digest_b)
    answer = api.post("/v1/registry/events", json={"events": [retried]}, headers=AUTH)
    assert answer.status_code == 503 and answer.json()["events"][0]["outcome"] == "failed"
    assert "unreachable" in answer.json()["events"][0]["detail"]
    registry.fail = False
    registry.tags[stable] = line.digest_b
    assert post(retried)[0]["outcome"] == "reverted"  # the redelivery finishes it
    rows = _rows(sessions)
    assert [r.outcome for r in rows] == ["allowed", "reverted", "reverted", "deleted", "skipped", "reverted"]
    assert rows[-1].detail.count("enforcement failed") == 0
    assert all(r.decided_at is not None for r in rows) and rows[1].pushed_by == "ci-bot"
    assert rows[1].repository == "127.0.0.1:5000/qualify/demo" and rows[1].decision_id is not None


def test_enforcement_off_records_only_and_a_half_done_event_is_finished(sessions) -> None:
    line = seed_release_line(sessions)
    registry = FakeRegistry({"127.0.0.1:5000/qualify/demo:stable": line.digest_b})
    api = client_for(sessions, protect="qualify/demo:*", registry=registry)
    recorded = api.post("/v1/registry/events", json={"events": [push_event(line.digest_b)]}, headers=AUTH).json()
    assert recorded["events"][0]["outcome"] == "recorded" and registry.calls == []
    # a delivery that stopped between its intent and its outcome (a crash): the next delivery finishes it
    with sessions() as s:
        s.add(RegistryEvent(event_id="half", action="push", repository="127.0.0.1:5000/qualify/demo", tag="stable",
                            digest=line.digest_b, outcome="enforcing", detail="not qualified"))
        s.commit()
    enforcing = client_for(sessions, protect="qualify/demo:*", enforce="delete", registry=registry)
    done = enforcing.post("/v1/registry/events", json={"events": [push_event(line.digest_b, event_id="half")]},
                          headers=AUTH).json()["events"][0]
    assert done["outcome"] == "deleted" and registry.calls == [("delete", f"{REPOSITORY}@{line.digest_b}")]


def test_serve_refuses_unsafe_settings(db_url: str) -> None:
    from typer.testing import CliRunner

    from qualify.cli import app

    runner = CliRunner()
    wide = runner.invoke(app, ["serve", "--db", db_url, "--host", "0.0.0.0"], env={"QUALIFY_SERVICE_TOKEN": ""})
    assert wide.exit_code == 2 and "not loopback" in wide.output
    no_token = runner.invoke(app, ["serve", "--db", db_url, "--protect", "a/*:*"], env={"QUALIFY_SERVICE_TOKEN": ""})
    assert no_token.exit_code == 2 and "QUALIFY_SERVICE_TOKEN" in no_token.output
    nothing = runner.invoke(app, ["serve", "--db", db_url, "--enforce", "revert"], env={"QUALIFY_SERVICE_TOKEN": "x"})
    assert nothing.exit_code == 2 and "--protect" in nothing.output
    mode = runner.invoke(app, ["serve", "--db", db_url, "--enforce", "maybe"], env={"QUALIFY_SERVICE_TOKEN": "x"})
    assert mode.exit_code == 2 and "off, revert, delete" in mode.output


@pytest.mark.parametrize("pattern, name, tag, expected", [
    ("qualify/*:1.*", "qualify/demo", "1.1", True), ("qualify/*:1.*", "qualify/demo", "2.0", False),
    ("127.0.0.1:5000/qualify/demo", "qualify/demo", "any", True), ("other/*:*", "qualify/demo", "1.1", False)])
def test_protected_patterns(pattern: str, name: str, tag: str, expected: bool) -> None:
    from qualify.service import is_protected
    from qualify.service.webhook import Push
    from qualify.settings import parse_protect

    push = Push("e", "127.0.0.1:5000", name, tag, "sha256:" + "1" * 64, None, None)
    assert is_protected(push, parse_protect(pattern)) is expected
