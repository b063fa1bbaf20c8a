"""The runs over HTTP: `GET /v1/runs` (filtered, paged), `/v1/runs/{id}` and `/v1/runs/{id}/report`.

The report is rendered from the database when asked, not read from the data directory: the flow may have written
its file on another machine (a worker), and a report rendered now shows the run's latest decision. The Prefect
artifacts link here when the service's public base URL is configured (Settings.public_url); the report links
back to its flow run in the Prefect UI (Settings.prefect_ui_url).
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.orm import Session, sessionmaker

from qualify.report.html import render
from qualify.report.links import flow_run_url
from qualify.report.views import report_view, run_detail, run_summary
from qualify.service import schemas
from qualify.settings import Settings
from qualify.store import repo


def _json(body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body, default=str, separators=(",", ":")), media_type="application/json",
                    headers=headers)


def runs_router(settings: Settings, sessions: sessionmaker[Session]) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/runs", summary="runs, newest first: filtered by release, digest and verdict, paged",
                description="Pages with `limit` and `offset`; when more runs match, the `Link` header names the "
                            "next page (RFC 8288, `rel=\"next\"`).",
                responses=schemas.ok(list[schemas.RunSummary], "the matching runs (an empty list when none)"))
    def runs(request: Request,
             release: Optional[str] = Query(None, description="release name, or name:tag", max_length=300),
             digest: Optional[str] = Query(None, description="candidate digest (sha256:...)", max_length=100),
             verdict: Optional[Literal["PASS", "FAIL", "INCOMPLETE"]] = Query(
                 None, description="the verdict of the run's latest decision"),
             limit: int = Query(20, ge=1, le=500), offset: int = Query(0, ge=0, le=10_000_000)) -> Response:
        name, _, tag = (release or "").partition(":")
        with sessions() as session:
            found = repo.find_runs(session, release=name or None, tag=tag or None, digest=digest, verdict=verdict,
                                   limit=limit + 1, offset=offset)
            body = [run_summary(session, run) for run in found[:limit]]
        headers = None
        if len(found) > limit:
            query = {k: v for k, v in request.query_params.items() if k not in ("limit", "offset")}
            query.update(limit=str(limit), offset=str(offset + limit))
            headers = {"Link": f'<{request.url.path}?{urlencode(query)}>; rel="next"'}
        return _json(body, headers)

    @router.get("/v1/runs/{run_id}", summary="one run: stages, components, case results, decisions, promotions",
                responses={**schemas.ok(schemas.RunDetail, "the run as `qualify runs show --json` prints it"),
                           404: {"description": "no such run"}})
    def run(run_id: int) -> Response:
        with sessions() as session:
            detail = run_detail(session, run_id)
        if detail is None:
            raise HTTPException(404, f"no run {run_id}")
        return _json(detail)

    @router.get("/v1/runs/{run_id}/report", response_class=HTMLResponse,
                summary="one run's HTML report (verdict and what decided it first; charts embedded)",
                responses={200: {"description": "the report, one self-contained HTML page",
                                 "content": {"text/html": {"schema": {"type": "string"}}}},
                           404: {"description": "no such run"}})
    def run_report(run_id: int) -> HTMLResponse:
        with sessions() as session:
            view = report_view(session, run_id)
        if view is None:
            raise HTTPException(404, f"no run {run_id}")
        view["flow_run_url"] = flow_run_url(settings.prefect_ui_url, view.get("flow_run_id"))
        return HTMLResponse(render(view))

    return router
