"""One error shape for every answer that is not a success: RFC 9457 problem details (`application/problem+json`).

`{"type", "title", "status", "detail", "instance"}` plus extension members where they help a client: the
validation errors of a 422 (`errors`), or the gate's own fields when a push is refused (`ok`, `verdict`,
`reasons`, ...). Installed once on the app (install); the token guard and the gate build theirs with `problem`.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from qualify.errors import BadInput

LOG = logging.getLogger("qualify.service")
MEDIA_TYPE = "application/problem+json"


def problem_body(status: int, detail: str, instance: str | None = None, **extensions: Any) -> dict[str, Any]:
    """The members of a problem (type about:blank: the status code says what kind of problem it is)."""
    body: dict[str, Any] = {"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status,
                            "detail": detail}
    if instance:
        body["instance"] = instance
    body.update(extensions)
    return body


def problem(status: int, detail: str, instance: str | None = None, headers: dict[str, str] | None = None,
            **extensions: Any) -> Response:
    return Response(json.dumps(problem_body(status, detail, instance, **extensions), default=str,
                               separators=(",", ":")), status_code=status, media_type=MEDIA_TYPE, headers=headers)


def _path(request: Request) -> str:
    return request.url.path


def install(app: FastAPI) -> None:
    """Every error the app raises answers as a problem: HTTP errors (404, 413, ...), invalid parameters (422),
    bad input (400) and an unreachable database (503, the driver's name only: never a URL or a query)."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return problem(exc.status_code, str(exc.detail), _path(request), headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        errors = [{"location": ".".join(str(part) for part in error.get("loc", ())), "message": error.get("msg")}
                  for error in exc.errors()]
        detail = "; ".join(f"{e['location']}: {e['message']}" for e in errors) or "invalid request"
        return problem(422, detail, _path(request), errors=errors)

    @app.exception_handler(BadInput)
    async def bad_input(request: Request, exc: BadInput) -> Response:
        return problem(400, str(exc), _path(request))

    @app.exception_handler(SQLAlchemyError)
    async def database_down(request: Request, exc: SQLAlchemyError) -> Response:
        LOG.error("database error: %s", type(exc).__name__)
        return problem(503, f"database: {type(exc).__name__}", _path(request))


PROBLEM_RESPONSE: dict[str, Any] = {
    "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
