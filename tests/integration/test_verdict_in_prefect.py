"""The verdict where people look, against a real `prefect server start` and a real `qualify serve` on loopback:
a PASS, a FAIL and an INCOMPLETE run (sleep cases) end in flow-run states that the API, a state filter and the
runs list tell apart; the verdict and its deciding reasons are in the flow run's logs; the summary artifact
belongs to the flow run; the report link in the artifacts opens over HTTP and links back to the flow run.
With chromium, screenshots of the runs list, a failed run's logs, its report and the service's offline /docs
(QUALIFY_TEST_SCREENSHOTS=DIR keeps them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from support.flows import run_qualify, sleep_manifest
from support.net import free_port
from test_prefect_server import prefect_server  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.prefect]


def _serve(tmp_path: Path, db: str, port: int, ui: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "QUALIFY_PUBLIC_URL": f"http://127.0.0.1:{port}", "QUALIFY_PREFECT_UI_URL": ui}
    env.pop("QUALIFY_SERVICE_TOKEN", None)
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - the process owns it until the test ends
    proc = subprocess.Popen([sys.executable, "-m", "qualify", "serve", "--port", str(port), "--db", db,
                             "--no-access-log"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2, trust_env=False).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        time.sleep(0.5)
    raise AssertionError("qualify serve did not answer: " + (tmp_path / "serve.log").read_text()[-3000:])


def test_the_verdict_in_prefect_and_the_report_one_click_away(tmp_path: Path, prefect_server) -> None:  # noqa: F811
    api, _server_env = prefect_server
    ui = api.rsplit("/api", 1)[0]
    db = f"sqlite:///{tmp_path / 'q.db'}"
    port = free_port()
    public = f"http://127.0.0.1:{port}"
    upgrade = run_qualify(["db", "upgrade", "--db", db], tmp_path)
    assert upgrade.returncode == 0, upgrade.stderr
    serve = _serve(tmp_path, db, port, ui)
    try:
        plans = {
            # two cases that each need every CPU of the local Ray: the second waits in Ray's queue for the first
            "PASS": ([{"name": "nap", "kind": "sleep", "params": {"duration_s": 2.0}, "count": 2,
                       "resources": {"cpus": os.cpu_count() or 2}}], None, 0),
            "FAIL": ([{"name": "nap", "kind": "sleep", "params": {"duration_s": 0.2}},
                      {"name": "crash", "kind": "sleep", "params": {"exit_code": 3}}], None, 1),
            # a previous release that was never run: no baseline to compare with, so nothing may pass
            "INCOMPLETE": ([{"name": "nap", "kind": "sleep", "params": {"duration_s": 0.2}}], "0.9", 1),
        }
        outcomes = {}
        for k, (verdict, (cases, previous, code)) in enumerate(plans.items()):
            manifest = sleep_manifest(tmp_path / f"{verdict}.yaml", cases, name="shown", tag=f"1.{k}",
                                      previous=previous, retries=0)
            proc = run_qualify(["run", str(manifest), "--db", db, "--json"], tmp_path, PREFECT_API_URL=api,
                               QUALIFY_PUBLIC_URL=public)
            assert proc.returncode == code, proc.stdout + proc.stderr[-3000:]
            outcomes[verdict] = json.loads(proc.stdout)
            assert outcomes[verdict]["verdict"] == verdict

        with httpx.Client(base_url=api, timeout=30, trust_env=False) as client:
            flow_runs = {f["name"]: f for f in client.post("/flow_runs/filter", json={}).json()}
            by_verdict = {v: flow_runs[f"shown:1.{k} run {outcomes[v]['run_id']}"] for k, v in enumerate(plans)}
            # The API tells the three apart: state type (the runs list's colour) and state name (its label).
            states = {v: (f["state_type"], f["state_name"]) for v, f in by_verdict.items()}
            assert states == {"PASS": ("COMPLETED", "PASS"), "FAIL": ("FAILED", "FAIL"),
                              "INCOMPLETE": ("FAILED", "INCOMPLETE")}, states
            assert "crash" in by_verdict["FAIL"]["state"]["message"]
            assert "baseline" in by_verdict["INCOMPLETE"]["state"]["message"].lower()
            # The state-based filter the README documents (what an automation or a CI job asks).
            incomplete = client.post("/flow_runs/filter", json={
                "flow_runs": {"state": {"name": {"any_": ["INCOMPLETE"]}}}}).json()
            assert [f["id"] for f in incomplete] == [by_verdict["INCOMPLETE"]["id"]]
            logs = {v: [log["message"] for log in client.post("/logs/filter", json={
                "logs": {"flow_run_id": {"any_": [f["id"]]}, "task_run_id": {"is_null_": True}},
                "sort": "TIMESTAMP_ASC", "limit": 200}).json()] for v, f in by_verdict.items()}
            artifacts = client.post("/artifacts/filter", json={}).json()
            # A case's task run is Running while its Ray task runs, not while Ray queues it (issue 26.4): the two
            # task runs of the PASS run do not overlap, though both cases were handed to Ray at once.
            naps = [t for t in client.post("/task_runs/filter", json={
                "flow_runs": {"id": {"any_": [by_verdict["PASS"]["id"]]}}}).json() if t["name"].startswith("sleep/nap")]
            assert len(naps) == 2 and all(t["state_type"] == "COMPLETED" for t in naps), naps
            # A case that did not pass is a red task run, its error as the state's message; a passed one stays green.
            fail_tasks = {t["name"]: t for t in client.post("/task_runs/filter", json={
                "flow_runs": {"id": {"any_": [by_verdict["FAIL"]["id"]]}}}).json()}
            crash = next(t for name, t in fail_tasks.items() if name.startswith("sleep/crash"))
            nap = next(t for name, t in fail_tasks.items() if name.startswith("sleep/nap"))
            assert (crash["state_type"], nap["state_type"]) == ("FAILED", "COMPLETED"), (crash, nap)
            assert crash["state"]["message"].startswith("sleep/crash: error (") or \
                crash["state"]["message"].startswith("sleep/crash: failed ("), crash["state"]
            from datetime import datetime

            first, second = sorted(naps, key=lambda t: t["start_time"])
            began = [datetime.fromisoformat(t["start_time"]) for t in (first, second)]
            # the second case could not start before the first case's 2 s sleep was over
            assert (began[1] - began[0]).total_seconds() >= 2.0, (first, second)
            # An automation triggers on events: the INCOMPLETE state is the event prefect.flow-run.INCOMPLETE.
            resource = f"prefect.flow-run.{by_verdict['INCOMPLETE']['id']}"
            deadline = time.monotonic() + 120
            while True:  # the server stores events asynchronously
                events = client.post("/events/filter", json={
                    "filter": {"event": {"name": ["prefect.flow-run.INCOMPLETE"]}}}).json()["events"]
                if any(e["resource"]["prefect.resource.id"] == resource for e in events) or time.monotonic() > deadline:
                    break
                time.sleep(2)
            assert [e["resource"]["prefect.resource.id"] for e in events] == [resource], events

        for verdict, lines in logs.items():
            run_id = outcomes[verdict]["run_id"]
            assert any(m.startswith(f"verdict of run {run_id}: {verdict}") for m in lines), lines
            assert any(m == f"report: {public}/v1/runs/{run_id}/report" for m in lines), lines
        assert any("FAIL" in m and "sleep/crash" in m for m in logs["FAIL"]), logs["FAIL"]
        assert any(m.strip().startswith("INCOMPLETE") and "regression" in m for m in logs["INCOMPLETE"])

        for k, verdict in enumerate(plans):
            flow_run = by_verdict[verdict]
            mine = {a["key"]: a for a in artifacts if a.get("flow_run_id") == flow_run["id"]}
            summary = mine[f"qualify-shown-1-{k}-summary"]
            assert summary["task_run_id"] is None  # the flow run's own, not a task's
            assert f"**{verdict}**" in summary["data"]
            link = mine[f"qualify-shown-1-{k}-report"]
            url = f"{public}/v1/runs/{outcomes[verdict]['run_id']}/report"
            assert link["task_run_id"] is None and link["type"] == "markdown" and f"]({url})" in link["data"]
            assert f"]({url})" in summary["data"]
            opened = httpx.get(url, timeout=30, trust_env=False)
            assert opened.status_code == 200 and opened.headers["content-type"].startswith("text/html")
            assert f": {verdict}</h1>" in opened.text
            # ... and the report links back to its flow run in the Prefect UI
            assert f"href='{ui}/flow-runs/flow-run/{flow_run['id']}'" in opened.text
        written = Path(outcomes["FAIL"]["report"]).read_text()
        assert f"/flow-runs/flow-run/{by_verdict['FAIL']['id']}'" in written  # the flow's own copy links too

        _screenshots(tmp_path, ui, public, by_verdict, outcomes)
    finally:
        os.killpg(serve.pid, 15)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, 9)


def _screenshots(tmp_path: Path, ui: str, public: str, by_verdict: dict[str, dict], outcomes: dict[str, dict]) -> None:
    from support.browser import Browser, chromium_path

    try:
        chromium_path()
    except pytest.skip.Exception:
        return  # the API checks above stand; the screenshots need chromium
    shots = []
    names = [f["name"] for f in by_verdict.values()]
    with Browser(tmp_path, width=1400, height=1250) as browser:
        browser.goto(f"{ui}/runs", until="document.body && " + " && ".join(
            f"document.body.innerText.includes({json.dumps(n)})" for n in names), timeout=180)
        text = browser.evaluate("document.body.innerText")
        assert "INCOMPLETE" in text and "FAIL" in text and "PASS" in text, text[:2000]
        shots.append(browser.screenshot(tmp_path / "prefect-runs-pass-fail-incomplete.png", full_page=False))
        fail = by_verdict["FAIL"]
        browser.goto(f"{ui}/runs/flow-run/{fail['id']}",
                     until="document.body && document.body.innerText.includes('verdict of run')", timeout=180)
        # the verdict lines at the middle of the screen (the log list starts below the timeline)
        browser.evaluate("[...document.querySelectorAll('body *')].filter(e => e.children.length === 0 && "
                         "e.textContent.startsWith('verdict of run')).pop().scrollIntoView({block: 'center'})")
        time.sleep(1)
        shots.append(browser.screenshot(tmp_path / "prefect-flow-run-logs-fail.png", full_page=False))
        browser.goto(f"{public}/v1/runs/{outcomes['FAIL']['run_id']}/report",
                     until="document.body && document.body.innerText.includes('What decided the verdict')")
        shots.append(browser.screenshot(tmp_path / "report-of-failed-run.png", full_page=False))
        browser.goto(f"{public}/docs", until="document.querySelector('.opblock-summary-path') !== null", timeout=120)
        loaded = browser.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
        assert loaded and all(url.startswith(public) for url in loaded), loaded
        shots.append(browser.screenshot(tmp_path / "service-docs-offline.png", full_page=False))
    if os.environ.get("QUALIFY_TEST_SCREENSHOTS"):
        keep = Path(os.environ["QUALIFY_TEST_SCREENSHOTS"])
        keep.mkdir(parents=True, exist_ok=True)
        for png in shots:
            shutil.copy(png, keep / png.name)


def test_the_run_form_shows_described_parameters_and_no_callback() -> None:
    """The deployment's run form is built from the flow's parameter schema: every parameter is described, and no
    callback (the CLI's progress line is registered in-process, qualify.progress.listening) is among them."""
    from prefect.utilities.callables import parameter_schema

    from qualify_prefect.flows.qualify_release import qualify_release

    properties = parameter_schema(qualify_release.fn).model_dump()["properties"]
    assert set(properties) == {"manifest", "ray_address", "resume_run", "wait", "promote", "triggered_by"}
    undescribed = [name for name, prop in properties.items() if len(prop.get("description") or "") < 20]
    assert undescribed == []
