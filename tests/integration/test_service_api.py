"""The gating service as a CI engineer meets it (in process, on a seeded release line): "may I push?" by status
code alone, one error shape (RFC 9457 problem details), a response schema for every success in the OpenAPI
document, /docs and /redoc served from the package (no external URL), ISO 8601 timestamps with their zone, runs
filtered and paged, and each run's HTML report."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from fastapi.testclient import TestClient
from support.reports import REPOSITORY, seed_release_line

from qualify.service import create_app
from qualify.settings import Settings

PROBLEM = "application/problem+json"


def _api(sessions, **settings: Any) -> TestClient:
    return TestClient(create_app(Settings.load(env={}, service_token="t", **settings), sessions))


def _is_problem(answer, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith(PROBLEM), answer.headers
    body = answer.json()
    assert body["status"] == status and body["type"] == "about:blank" and body["title"] and body["detail"]
    return body


def test_may_i_push_by_status_code_alone(sessions) -> None:
    line = seed_release_line(sessions)
    api = _api(sessions)
    passed = api.get("/v1/gate", params={"ref": f"{REPOSITORY}@{line.digest_a}"})
    assert passed.status_code == 200 and passed.headers["content-type"] == "application/json"
    assert passed.json()["ok"] is True
    failed = _is_problem(api.get("/v1/gate", params={"ref": f"{REPOSITORY}@{line.digest_b}"}), 403)
    assert failed["ok"] is False and failed["verdict"] == "FAIL" and failed["reasons"]
    assert failed["detail"].startswith(f"{REPOSITORY}@{line.digest_b} may not be pushed: FAIL: ")
    elsewhere = _is_problem(api.get("/v1/gate", params={"ref": f"evil.example.com/x/demo@{line.digest_a}"}), 403)
    assert elsewhere["verdict"] == "PASS" and "is not where" in elsewhere["detail"]  # PASS, but not for that repo
    never = _is_problem(api.get("/v1/gate", params={"ref": f"{REPOSITORY}@sha256:{'e' * 64}"}), 404)
    assert never["verdict"] is None and "never been judged" in never["detail"]
    # a repeated question is answered from the cache with the same status and shape
    again = api.get("/v1/gate", params={"ref": f"{REPOSITORY}@{line.digest_b}"})
    assert again.status_code == 403 and again.headers["content-type"].startswith(PROBLEM)


def test_one_error_shape_everywhere(sessions) -> None:
    seed_release_line(sessions)
    api = _api(sessions)
    _is_problem(api.get("/v1/gate", params={"ref": "Not A Ref"}), 400)
    missing = _is_problem(api.get("/v1/gate"), 422)
    assert missing["errors"] == [{"location": "query.ref", "message": "Field required"}]
    _is_problem(api.get("/v1/runs", params={"limit": 0}), 422)
    _is_problem(api.get("/v1/runs", params={"verdict": "MAYBE"}), 422)
    assert _is_problem(api.get("/v1/runs/999"), 404)["instance"] == "/v1/runs/999"
    _is_problem(api.get("/v1/runs/999/report"), 404)
    _is_problem(api.get("/no/such/path"), 404)
    _is_problem(api.post("/v1/registry/events", json={"events": []}), 401)
    _is_problem(api.post("/v1/registry/events", content=b"{not json", headers={"Authorization": "Bearer t"}), 400)


def test_openapi_has_a_schema_for_every_success_and_the_problem_for_every_error(sessions) -> None:
    document = _api(sessions).get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert {"Problem", "GateAnswer", "RunSummary", "RunDetail", "Health", "EventsAnswer"} <= set(schemas)
    seen = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for code, response in operation["responses"].items():
                content = response.get("content") or {}
                assert content, (method, path, code)
                if code.startswith("2"):
                    seen += 1
                    for media, body in content.items():
                        schema = body.get("schema") or {}
                        assert schema.get("$ref") or schema.get("type") or schema.get("items"), (path, code, media)
                else:
                    assert set(content) == {PROBLEM}, (path, code)
    assert seen >= 6  # healthz, gate, runs, run, report, events
    gate = document["paths"]["/v1/gate"]["get"]
    assert "200 only when the reference may be pushed" in gate["description"]
    assert {"200", "403", "404"} <= set(gate["responses"])


def test_docs_and_redoc_load_nothing_from_outside(sessions) -> None:
    api = _api(sessions)
    for page in ("/docs", "/redoc"):
        answer = api.get(page)
        assert answer.status_code == 200
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']|url:\s*['"]([^'"]+)['"]|spec-url=["']([^"']+)""",
                          answer.text)
        urls = [u for group in urls for u in group if u]
        assert urls, answer.text[:500]
        outside = [u for u in urls if not u.startswith("/")]
        assert outside == [], outside
        assert not re.search(r"https?://(?!127\.0\.0\.1)", answer.text.replace("http://www.w3.org", "")), page
        for url in urls:  # each asset is served by the service itself
            assert api.get(url).status_code == 200, url


def test_runs_filtered_paged_and_timestamps_with_their_zone(sessions) -> None:
    line = seed_release_line(sessions)
    api = _api(sessions)
    everything = api.get("/v1/runs").json()
    assert [r["run"] for r in everything] == [line.run_b, line.run_a]
    for run in everything:
        for key in ("started_at", "finished_at"):
            if run[key] is not None:
                assert dt.datetime.fromisoformat(run[key]).tzinfo is not None, run[key]
    assert [r["run"] for r in api.get("/v1/runs", params={"verdict": "PASS"}).json()] == [line.run_a]
    assert [r["run"] for r in api.get("/v1/runs", params={"verdict": "FAIL"}).json()] == [line.run_b]
    assert api.get("/v1/runs", params={"verdict": "INCOMPLETE"}).json() == []
    assert [r["run"] for r in api.get("/v1/runs", params={"digest": line.digest_a}).json()] == [line.run_a]
    release = everything[0]["release"]
    assert len(api.get("/v1/runs", params={"release": release.split(":")[0]}).json()) == 2
    assert [r["run"] for r in api.get("/v1/runs", params={"release": release}).json()] == [line.run_b]
    assert api.get("/v1/runs", params={"release": "nope"}).json() == []
    first = api.get("/v1/runs", params={"limit": 1, "verdict": "PASS"})
    assert "link" not in first.headers  # one PASS run: no next page
    first = api.get("/v1/runs", params={"limit": 1})
    assert [r["run"] for r in first.json()] == [line.run_b]
    following = re.fullmatch(r'<([^>]+)>; rel="next"', first.headers["link"]).group(1)
    second = api.get(following)
    assert [r["run"] for r in second.json()] == [line.run_a] and "link" not in second.headers
    detail = api.get(f"/v1/runs/{line.run_b}").json()
    for decision in detail["decisions"]:
        assert dt.datetime.fromisoformat(decision["decided_at"]).tzinfo is not None
    decided = api.get("/v1/gate", params={"ref": f"{REPOSITORY}@{line.digest_a}"}).json()["decided_at"]
    assert dt.datetime.fromisoformat(decided).tzinfo is not None


def test_each_run_has_its_report_linking_to_its_flow_run(sessions) -> None:
    from qualify.store.models import Run

    line = seed_release_line(sessions)
    with sessions() as session:
        session.get(Run, line.run_b).flow_run_id = "0b7e-flow-run"
        session.commit()
    report = _api(sessions, prefect_ui_url="http://127.0.0.1:4200").get(f"/v1/runs/{line.run_b}/report")
    assert report.status_code == 200 and report.headers["content-type"].startswith("text/html")
    assert ": FAIL</h1>" in report.text
    assert "href='http://127.0.0.1:4200/flow-runs/flow-run/0b7e-flow-run'" in report.text
    bare = _api(sessions).get(f"/v1/runs/{line.run_b}/report").text  # no UI configured: the id, unlinked
    assert "0b7e-flow-run" in bare and "/flow-runs/flow-run/" not in bare
