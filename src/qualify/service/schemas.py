"""What the service answers, as OpenAPI schemas: a model for every success, the problem shape for every error.

The endpoints serialise their own answers (cached bytes, `runs list|show --json` dicts), so these models document
the answers rather than validate them; tests/integration/test_service_api.py checks that every 2xx answer of
the OpenAPI document has a schema and that the served bodies carry the documented fields.
"""

from __future__ import annotations

from typing import Any, Optional

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

from qualify.service.problems import MEDIA_TYPE


class Problem(BaseModel):
    """RFC 9457 problem details; extension members (e.g. `errors`, or the gate's fields) may follow."""

    model_config = ConfigDict(extra="allow")
    type: str = Field("about:blank", description="about:blank: the status code says what kind of problem")
    title: str = Field(..., description="the status code's phrase")
    status: int
    detail: str = Field(..., description="what went wrong, for a person")
    instance: Optional[str] = Field(None, description="the request path")


class Reason(BaseModel):
    model_config = ConfigDict(extra="allow")
    check: str
    case_id: Optional[str] = None
    status: str = Field(..., description="PASS, FAIL, INCOMPLETE, WAIVED, NO-BASELINE or NOTE (disclosed, not a check)")
    message: str
    figures: dict[str, Any] = {}


class GateAnswer(BaseModel):
    """The rules of `qualify gate check`. Answered 200 only when `ok` (the reference may be pushed); a judged
    digest that may not be pushed is a 403 problem carrying these same fields."""

    reference: str
    digest: str
    ok: bool
    verdict: Optional[str] = Field(None, description="PASS, FAIL or INCOMPLETE: the digest's latest decision")
    decision: Optional[int] = None
    run: Optional[int] = None
    release: Optional[str] = None
    policy_sha256: Optional[str] = None
    decided_at: Optional[str] = Field(None, description="ISO 8601 with its time zone")
    overrides_pass_decision: Optional[int] = None
    reasons: list[Reason] = []
    problems: list[str] = []


class RunSummary(BaseModel):
    run: int
    release: str = Field(..., description="name:tag")
    status: str = Field(..., description="running, passed, failed, incomplete, error or aborted")
    stage: Optional[str] = None
    verdict: Optional[str] = Field(None, description="the latest decision's verdict (none yet: null)")
    cases_total: int
    cases_passed: int
    digest: Optional[str] = None
    started_at: Optional[str] = Field(None, description="ISO 8601 with its time zone")
    finished_at: Optional[str] = Field(None, description="ISO 8601 with its time zone")


class RunDetail(RunSummary):
    """A run as `qualify runs show --json` prints it."""

    model_config = ConfigDict(extra="allow")
    repository: str
    tag: str
    image: Optional[dict[str, Any]] = None
    error: Optional[str] = None
    triggered_by: Optional[str] = None
    flow_run_id: Optional[str] = Field(None, description="the Prefect flow run of this run")
    components: list[dict[str, Any]] = []
    cases: list[dict[str, Any]] = []
    decisions: list[dict[str, Any]] = []
    promotions: list[dict[str, Any]] = []


class Health(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: str
    database: str


class EventsAnswer(BaseModel):
    events: list[dict[str, Any]] = Field(..., description="what was recorded (and done) for each event")


def ok(model: type[BaseModel], description: str) -> dict[int | str, dict[str, Any]]:
    return {200: {"model": model, "description": description}}


def document_errors(app: FastAPI) -> None:
    """Every non-2xx answer in the OpenAPI document is `application/problem+json` with the Problem schema (what
    qualify.service.problems sends), whatever a route declared for it."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = Problem.model_json_schema()
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    for code, response in (operation.get("responses") or {}).items():
                        if not str(code).startswith("2"):
                            response["content"] = {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}
            schema["components"]["schemas"].pop("HTTPValidationError", None)
            schema["components"]["schemas"].pop("ValidationError", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
