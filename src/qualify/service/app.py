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
from typing import Any, Callable, Optional

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from qualify.errors import BadInput
from qualify.gate.push_check import check_push
from qualify.imageref import InvalidReference, parse_reference
from qualify.registry import ImageNotFound, RegistryError
from qualify.reporting import run_detail, run_summary
from qualify.service.webhook import EnforcingClient, MalformedEvents, Webhook
from qualify.settings import Settings
from qualify.store import repo

LOG = logging.getLogger("qualify.service")
MAX_BODY = 1 << 20  # a registry envelope is a few kB


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body, default=str, separators=(",", ":")), status_code=status,
                    media_type="application/json", headers=headers)


def create_app(settings: Settings, sessions: sessionmaker[Session], *, reads_need_token: bool = False,
               client_factory: Callable[[], EnforcingClient] | None = None) -> FastAPI:
    """The service over `sessions`; `reads_need_token` when it listens beyond loopback."""
    token = (settings.service_token or "").encode()
    insecure = tuple(settings.insecure_registries)
    make_client = client_factory or (lambda: EnforcingClient(insecure))
    webhook = Webhook(sessions, settings.protect, settings.enforce, make_client)
    app = FastAPI(title="qualify gating service", version="1",
                  description="Is this image qualified? The release-qualification results database over HTTP.")

    def authorised(request: Request) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token)

    def refuse(why: str) -> Response:
        return _json({"detail": why}, 401, {"WWW-Authenticate": 'Bearer realm="qualify"'})

    @app.middleware("http")
    async def guard(request: Request, call_next):  # type: ignore[no-untyped-def]
        """Writes always need the token; reads only when the service is reachable beyond loopback."""
        write = request.method not in ("GET", "HEAD", "OPTIONS")
        if (write or reads_need_token) and not authorised(request):
            return refuse("a bearer token is required" if token else
                          "this service has no token configured (QUALIFY_SERVICE_TOKEN): it accepts no writes")
        return await call_next(request)

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
        try:
            image = parse_reference(ref)
        except InvalidReference as exc:
            raise HTTPException(400, str(exc)) from None
        tag_digest = None
        if image.tag:
            try:
                with make_client() as client:
                    tag_digest = client.resolve(image.with_tag(image.tag))
            except ImageNotFound as exc:
                return _json({"reference": ref, "ok": False, "verdict": None, "detail": str(exc)}, 404)
            except RegistryError as exc:
                raise HTTPException(503, f"the registry cannot answer: {exc}") from None
        digest = image.digest or tag_digest
        assert digest is not None
        with sessions() as session:
            result = check_push(session, image, digest, tag_digest=tag_digest, release_name=release,
                                policy_sha256=policy)
        body = result.to_dict()
        if result.verdict is None:
            body["detail"] = f"{digest} has never been judged by the gate"
            return _json(body, 404)
        return _json(body)

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
        from starlette.concurrency import run_in_threadpool

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
