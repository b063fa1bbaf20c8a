"""The gating service: an HTTP API over the results database (FastAPI, served by uvicorn: `qualify serve`).

* ``GET /v1/gate?ref=IMAGE_REF`` -- may this reference be pushed? The rules of `qualify gate check`
  (qualify.gate.push_check.check_push: the digest's standing per release -- qualify.gate.standing --, the
  repository it was qualified for, a tag resolved in the registry must point to that digest), answered by status code alone
  (qualify.service.gate_answers): 200 only when it may be pushed, 403 when judged but refused, 404 when never
  judged; each answer carries the verdict and the reasons. Every error is RFC 9457 problem details
  (qualify.service.problems).
* ``GET /v1/runs``, ``GET /v1/runs/{id}`` -- the runs, as `qualify runs list|show --json` print them;
  ``GET /v1/runs/{id}/report`` its HTML report (qualify.service.runs).
* ``GET /healthz`` -- the database answers.
* ``POST /v1/registry/events`` -- the registry's notifications (qualify.service.webhook), read as a capped
  stream with a JSON depth limit (qualify.service.limits).
* ``GET /openapi.json`` (and ``/docs``, ``/redoc``, served offline).

Every write needs the bearer token (Settings.service_token, QUALIFY_SERVICE_TOKEN); without it, or with
another, 401. Reads are open when the service listens on loopback, else they need the token too.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, Callable, Optional

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import Response
from fastapi_offline import FastAPIOffline
from starlette.concurrency import run_in_threadpool
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from qualify.errors import BadInput
from qualify.gate.judged import judged_note
from qualify.gate.push_check import check_push
from qualify.imageref import ImageRef, InvalidReference, parse_reference
from qualify.registry import ImageNotFound, RegistryError
from qualify.service import problems, schemas
from qualify.service.gate_answers import gate_answer
from qualify.service.limits import parse_json, read_capped
from qualify.service.problems import problem
from qualify.service.registry_calls import RegistryCalls
from qualify.service.runs import runs_router
from qualify.service.webhook import EnforcingClient, MalformedEvents, Webhook
from qualify.settings import Settings
from qualify.store.engine import hot_read_engine, idempotent_read

LOG = logging.getLogger("qualify.service")
MAX_BODY = 1 << 20  # a registry envelope is a few kB


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body, default=str, separators=(",", ":")), status_code=status,
                    media_type="application/json", headers=headers)


# The newest decision about a digest: gate answers are cached until it changes (decisions are append-only, and
# what else check_push reads -- the decision's run, its release, image and stored manifest -- never changes).
LATEST_DECISION = text("SELECT max(id) FROM gate_decisions WHERE digest = :digest")


class AnswerCache:
    """Serialised /v1/gate answers by (reference, digest, tag digest, release, policy), each valid while the
    digest's newest decision id is the one it was computed from. Bounded; thread-safe."""

    def __init__(self, size: int = 50_000) -> None:
        self.size = size
        self._items: OrderedDict[tuple[Any, ...], tuple[int | None, tuple[int, bytes]]] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, key: tuple[Any, ...]) -> bool:
        with self._lock:
            return key in self._items

    def get(self, key: tuple[Any, ...], latest: int | None) -> tuple[int, bytes] | None:
        with self._lock:
            item = self._items.get(key)
            if item is None or item[0] != latest:
                return None
            self._items.move_to_end(key)
            return item[1]

    def put(self, key: tuple[Any, ...], decision: int | None, answer: tuple[int, bytes]) -> None:
        with self._lock:
            self._items[key] = (decision, answer)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


class TokenGuard:
    """ASGI middleware: writes always need the bearer token; reads only when the service is reachable beyond
    loopback. (A plain ASGI class: Starlette's BaseHTTPMiddleware costs about a millisecond a request.)"""

    def __init__(self, app: Any, token: bytes, reads_need_token: bool) -> None:
        self.app, self.token, self.reads_need_token = app, token, reads_need_token

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            write = scope["method"] not in ("GET", "HEAD", "OPTIONS")
            if (write or self.reads_need_token) and not self._authorised(scope):
                why = ("a bearer token is required" if self.token else
                       "this service has no token configured (QUALIFY_SERVICE_TOKEN): it accepts no writes")
                response = problem(401, why, scope.get("path"), {"WWW-Authenticate": 'Bearer realm="qualify"'})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _authorised(self, scope: dict[str, Any]) -> bool:
        header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
        scheme, _, given = header.partition(b" ")
        return bool(self.token) and scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)


def create_app(settings: Settings, sessions: sessionmaker[Session], *, reads_need_token: bool = False,
               client_factory: Callable[[], EnforcingClient] | None = None, threads: int = 8) -> FastAPI:
    """The service over `sessions`; `reads_need_token` when it listens beyond loopback; `threads` for the
    database work. Registry calls have their own pool (RegistryCalls), and so does the webhook, which waits on
    registries while it enforces: a hung registry never holds a thread a database read needs."""
    if settings.protect and not settings.webhook_registry:
        raise BadInput("protected tags need the registry the webhook is bound to (Settings.webhook_registry)")
    token = (settings.service_token or "").encode()
    insecure = tuple(settings.insecure_registries)
    registry_calls = RegistryCalls()
    make_client = client_factory or (lambda: EnforcingClient(insecure, timeout=registry_calls.timeout_s))
    webhook_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="webhook")
    webhook = Webhook(sessions, settings.protect, settings.enforce, make_client, settings.webhook_registry or "")
    answers = AnswerCache()
    # The gate's reads (one Core statement, a second for a run's further images, or the newest decision's id) run
    # outside a transaction, on connections nobody pings before use (store.engine.hot_read_engine): a transaction
    # paid a BEGIN and a ROLLBACK round trip beside each query (a digest's check 1.75-2.1 ms against 0.56-0.75 ms,
    # PostgreSQL, 10,000 runs x 50 results, 2026-12-07), and the pool's pre-ping a `SELECT 1` before it. Each
    # statement sees every commit before it, which is what the answer cache revalidates against; a connection
    # the server dropped is replaced and the read run again (store.engine.idempotent_read).
    engine = hot_read_engine(sessions.kw["bind"])

    @asynccontextmanager
    async def lifespan(_app: FastAPI):  # type: ignore[no-untyped-def]
        # Sync endpoints run in AnyIO's thread pool (40 threads by default): on a few cores, that many threads
        # fight over the GIL and the tail latency grows; a few threads overlap the database waits enough.
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        yield
        if engine.pool is not sessions.kw["bind"].pool:
            engine.dispose()
        registry_calls.shutdown()
        webhook_pool.shutdown(wait=False, cancel_futures=True)

    # /docs and /redoc from the assets shipped in fastapi-offline's wheel (FastAPI's own pages load a CDN).
    app = FastAPIOffline(title="qualify gating service", version="1", lifespan=lifespan,
                         description="Is this image qualified? The release-qualification results database "
                                     "over HTTP.")

    app.add_middleware(TokenGuard, token=token, reads_need_token=reads_need_token)
    problems.install(app)  # every error answers as RFC 9457 problem details
    schemas.document_errors(app)

    @app.get("/healthz", summary="the service and its database answer",
             responses={**schemas.ok(schemas.Health, "the service and its database answer"),
                        503: {"description": "the database does not answer"}})
    def healthz() -> Response:
        try:
            with sessions() as session:
                session.execute(text("SELECT 1"))
        except SQLAlchemyError as exc:
            return problem(503, f"the database does not answer ({type(exc).__name__})", "/healthz",
                           database=type(exc).__name__)
        return _json({"status": "ok", "database": "ok", "protect": [f"{r}:{t}" for r, t in settings.protect],
                      "enforce": settings.enforce})

    @app.get("/v1/gate", summary="may this image reference be pushed? (the rules of `qualify gate check`)",
             description="Usable by status code alone: **200 only when the reference may be pushed** (its "
                         "digest's latest decision is PASS, for this repository, and its tag points to it), so "
                         "`curl -fsS \"$QUALIFY/v1/gate?ref=$IMAGE\" && push` is safe. 403: judged, but FAIL, "
                         "INCOMPLETE or not for this reference (the body says why, with the gate's fields); 404: "
                         "never judged, or the tag is not in the registry. The tag form says which digest it "
                         "judged (`judged`): before a push, ask by digest.",
             responses={**schemas.ok(schemas.GateAnswer, "the reference may be pushed (`ok` is true)"),
                        400: {"description": "not an image reference"},
                        403: {"description": "judged, but it may not be pushed: a problem with the gate's fields"},
                        404: {"description": "the digest was never judged, or the tag is not in the registry"},
                        503: {"description": "the registry or the database cannot answer"}})
    async def gate(ref: str = Query(..., description="registry/repository[:tag][@digest]"),
                   release: Optional[str] = Query(None, description="also require the decision to be about this "
                                                                    "release"),
                   policy: Optional[str] = Query(None, description="also require this gate policy hash (a prefix)")
                   ) -> Response:
        # The tag (if any) is resolved on the registry pool, the database is read on the database pool. A
        # repeated question costs one indexed query: the digest's newest decision id, against which the cached
        # answer is still valid or not.
        try:
            image = parse_reference(ref)
        except InvalidReference as exc:
            raise HTTPException(400, str(exc)) from None
        tag_digest = None
        if image.tag:
            try:
                tag_digest = await registry_calls.run(lambda: resolve_tag(image), f"resolve {image}")
            except ImageNotFound as exc:
                return problem(404, str(exc), "/v1/gate", reference=ref, ok=False, verdict=None)
            except RegistryError as exc:
                raise HTTPException(503, f"the registry cannot answer: {exc}") from None
        digest = image.digest or tag_digest
        assert digest is not None
        key = (str(image), digest, tag_digest, release, policy)
        answer = await run_in_threadpool(answer_for, key, image, digest, tag_digest, release, policy)
        return Response(answer[1], status_code=answer[0],
                        media_type="application/json" if answer[0] == 200 else problems.MEDIA_TYPE)

    def answer_for(key: tuple[Any, ...], image: ImageRef, digest: str, tag_digest: str | None,
                   release: str | None, policy: str | None) -> tuple[int, bytes]:
        if key not in answers:  # never answered (CI's question after a build): straight to the check
            return full_check(key, image, digest, tag_digest, release, policy)
        latest = idempotent_read(engine, lambda conn: conn.execute(LATEST_DECISION, {"digest": digest}).scalar())
        return answers.get(key, latest) or full_check(key, image, digest, tag_digest, release, policy)

    def resolve_tag(image: ImageRef) -> str:
        with make_client() as client:
            return client.resolve(image.with_tag(image.tag or "latest"))

    def full_check(key: tuple[Any, ...], image: ImageRef, digest: str, tag_digest: str | None,
                   release: str | None, policy: str | None) -> tuple[int, bytes]:
        # One Core statement: the digest's decisions with what is read of their runs.
        result = idempotent_read(engine, lambda conn: check_push(conn, image, digest, tag_digest=tag_digest,
                                                                 release_name=release, policy_sha256=policy))
        body = gate_answer(result, digest)
        note = judged_note(image, digest)  # the tag form judged what the tag points to now
        if note:
            body["judged"] = note
        status = body.get("status", 200)
        answer = (status, json.dumps(body, default=str, separators=(",", ":")).encode())
        answers.put(key, result.newest_decision, answer)  # what the cache re-validates against
        return answer

    @app.post("/v1/registry/events", summary="the registry's notifications (bearer token required)",
              responses={**schemas.ok(schemas.EventsAnswer, "the events were recorded (and acted on)"),
                         400: {"description": "not an envelope, or nested too deeply: nothing recorded"},
                         413: {"description": "larger than 1 MiB"},
                         503: {"description": "an enforcement failed or the database is down: redeliver"},
                         401: {"description": "no or wrong bearer token"}})
    async def registry_events(request: Request) -> Response:
        body = parse_json(await read_capped(request, MAX_BODY))  # 413 past the cap, 400 too deep
        try:
            results = await asyncio.get_running_loop().run_in_executor(webhook_pool, webhook.handle, body)
        except MalformedEvents as exc:
            raise HTTPException(400, str(exc)) from None
        except SQLAlchemyError as exc:  # nothing committed: the registry delivers the envelope again
            LOG.error("registry events not recorded (database: %s): the registry will retry", type(exc).__name__)
            raise HTTPException(503, "the database cannot record the events now") from None
        # A failed enforcement answers 503: Distribution redelivers the envelope, and the failed event is tried
        # again (the others are answered from their rows); so does one still being enforced by another delivery
        # past the wait for it (webhook.Webhook._answer_when_done).
        failed = any(r.outcome in ("failed", "enforcing") for r in results)
        return _json({"events": [r.to_dict() for r in results]}, 503 if failed else 200)

    app.include_router(runs_router(settings, sessions))  # /v1/runs, /v1/runs/{id}, /v1/runs/{id}/report
    return app
