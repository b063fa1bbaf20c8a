"""The gating service: an HTTP API over the results database (FastAPI, served by uvicorn: `qualify serve`).

* ``GET /v1/gate?ref=IMAGE_REF`` -- may this reference be pushed? The rules of `qualify gate check`
  (qualify.gate.push_check.check_push: the digest's latest decision by id, the repository it was qualified
  for, a tag resolved in the registry must point to that digest). 200 with the verdict and the reasons when
  the digest was ever judged (``ok`` says whether it may be pushed), 404 when it never was.
* ``GET /v1/runs``, ``GET /v1/runs/{id}`` -- the runs, as `qualify runs list|show --json` print them.
* ``GET /healthz`` -- the database answers.
* ``POST /v1/registry/events`` -- the registry's notifications (qualify.service.webhook).
* ``GET /openapi.json`` (and ``/docs``).

Every write needs the bearer token (Settings.service_token, QUALIFY_SERVICE_TOKEN); without it, or with
another, 401. Reads are open when the service listens on loopback, else they need the token too.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections import OrderedDict
from contextlib import asynccontextmanager
from typing import Any, Callable, Optional

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from sqlalchemy import select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, joinedload, sessionmaker

from qualify.errors import BadInput
from qualify.gate.push_check import check_push
from qualify.imageref import ImageRef, InvalidReference, parse_reference
from qualify.registry import ImageNotFound, RegistryError
from qualify.report.views import run_detail, run_summary
from qualify.service.webhook import EnforcingClient, MalformedEvents, Webhook
from qualify.settings import Settings
from qualify.store import repo
from qualify.store.models import GateDecision, Run

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
                response = _json({"detail": why}, 401, {"WWW-Authenticate": 'Bearer realm="qualify"'})
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
    blocking work (database, registry)."""
    token = (settings.service_token or "").encode()
    insecure = tuple(settings.insecure_registries)
    make_client = client_factory or (lambda: EnforcingClient(insecure))
    webhook = Webhook(sessions, settings.protect, settings.enforce, make_client)
    answers = AnswerCache()
    engine = sessions.kw["bind"]
    @asynccontextmanager
    async def lifespan(_app: FastAPI):  # type: ignore[no-untyped-def]
        # Sync endpoints run in AnyIO's thread pool (40 threads by default): on a few cores, that many threads
        # fight over the GIL and the tail latency grows; a few threads overlap the database waits enough.
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        yield

    app = FastAPI(title="qualify gating service", version="1", lifespan=lifespan,
                  description="Is this image qualified? The release-qualification results database over HTTP.")

    app.add_middleware(TokenGuard, token=token, reads_need_token=reads_need_token)

    @app.get("/healthz", summary="the service and its database answer")
    def healthz() -> Response:
        try:
            with sessions() as session:
                session.execute(text("SELECT 1"))
        except SQLAlchemyError as exc:
            return _json({"status": "unavailable", "database": type(exc).__name__}, 503)
        return _json({"status": "ok", "database": "ok", "protect": [f"{r}:{t}" for r, t in settings.protect],
                      "enforce": settings.enforce})

    @app.get("/v1/gate", summary="may this image reference be pushed? (the rules of `qualify gate check`)",
             responses={200: {"description": "the digest's latest decision; `ok` says whether the reference may "
                                             "be pushed"},
                        404: {"description": "the digest was never judged"}})
    def gate(ref: str = Query(..., description="registry/repository[:tag][@digest]"),
             release: Optional[str] = Query(None, description="also require the decision to be about this release"),
             policy: Optional[str] = Query(None, description="also require this gate policy hash (a prefix)")
             ) -> Response:
        # Run in the thread pool (database and registry waits overlap). A repeated question costs one indexed
        # query: the digest's newest decision id, against which the cached answer is still valid or not.
        try:
            image = parse_reference(ref)
        except InvalidReference as exc:
            raise HTTPException(400, str(exc)) from None
        tag_digest = None
        if image.tag:
            try:
                tag_digest = resolve_tag(image)
            except ImageNotFound as exc:
                return _json({"reference": ref, "ok": False, "verdict": None, "detail": str(exc)}, 404)
            except RegistryError as exc:
                raise HTTPException(503, f"the registry cannot answer: {exc}") from None
        digest = image.digest or tag_digest
        assert digest is not None
        key = (str(image), digest, tag_digest, release, policy)
        with engine.connect() as conn:
            latest = conn.execute(LATEST_DECISION, {"digest": digest}).scalar()
        answer = answers.get(key, latest) or full_check(key, image, digest, tag_digest, release, policy)
        return Response(answer[1], status_code=answer[0], media_type="application/json")

    def resolve_tag(image: ImageRef) -> str:
        with make_client() as client:
            return client.resolve(image.with_tag(image.tag or "latest"))

    def full_check(key: tuple[Any, ...], image: ImageRef, digest: str, tag_digest: str | None,
                   release: str | None, policy: str | None) -> tuple[int, bytes]:
        with sessions() as session:
            # Load the run of the digest's newest decision with its release and image in one query, so that
            # check_push finds them in the session instead of asking for each.
            session.execute(select(Run).options(joinedload(Run.release), joinedload(Run.image)).where(
                Run.id == select(GateDecision.run_id).where(GateDecision.digest == digest)
                .order_by(GateDecision.id.desc()).limit(1).scalar_subquery())).unique().all()
            result = check_push(session, image, digest, tag_digest=tag_digest, release_name=release,
                                policy_sha256=policy)
        body = result.to_dict()
        status = 200
        if result.verdict is None:
            body["detail"] = f"{digest} has never been judged by the gate"
            status = 404
        answer = (status, json.dumps(body, default=str, separators=(",", ":")).encode())
        answers.put(key, result.decision, answer)
        return answer

    @app.get("/v1/runs", summary="the newest runs")
    def runs(limit: int = Query(20, ge=1, le=500)) -> Response:
        with sessions() as session:
            return _json([run_summary(session, run) for run in repo.list_runs(session, limit)])

    @app.get("/v1/runs/{run_id}", summary="one run: stages, components, case results, decisions, promotions")
    def run(run_id: int) -> Response:
        with sessions() as session:
            detail = run_detail(session, run_id)
        if detail is None:
            raise HTTPException(404, f"no run {run_id}")
        return _json(detail)

    @app.post("/v1/registry/events", summary="the registry's notifications (bearer token required)",
              responses={400: {"description": "malformed envelope: nothing recorded"},
                         401: {"description": "no or wrong bearer token"}})
    async def registry_events(request: Request) -> Response:
        raw = await request.body()
        if len(raw) > MAX_BODY:
            raise HTTPException(413, f"the envelope is larger than {MAX_BODY} bytes")
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise HTTPException(400, f"the body is not JSON: {exc}") from None
        try:
            results = await run_in_threadpool(webhook.handle, body)
        except MalformedEvents as exc:
            raise HTTPException(400, str(exc)) from None
        except SQLAlchemyError as exc:  # nothing committed: the registry delivers the envelope again
            LOG.error("registry events not recorded (database: %s): the registry will retry", type(exc).__name__)
            raise HTTPException(503, "the database cannot record the events now") from None
        return _json({"events": [r.to_dict() for r in results]})

    @app.exception_handler(BadInput)
    async def bad_input(_request: Request, exc: BadInput) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 400)

    @app.exception_handler(SQLAlchemyError)
    async def database_down(_request: Request, exc: SQLAlchemyError) -> JSONResponse:
        LOG.error("database error: %s", type(exc).__name__)
        return JSONResponse({"detail": f"database: {type(exc).__name__}"}, 503)

    return app
