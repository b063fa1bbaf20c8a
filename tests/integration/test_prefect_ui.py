"""What an operator sees in the Prefect UI of a real `prefect server start` after `qualify run`: the flow run is
named `<release>:<tag> run <id>`, the flow and every case's task run have INFO logs (its Ray task started, result line,
the workload's log tail on failure) while the CLI's console stays quiet, the summary artifact leads with the
failures and the artifacts point at the HTML report. With chromium, the flow-run page is opened in a
headless browser and a screenshot kept (QUALIFY_TEST_SCREENSHOTS=DIR keeps a copy)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest
from support.flows import run_qualify, sleep_manifest
from test_prefect_server import prefect_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


def test_a_run_in_the_prefect_ui(tmp_path: Path, prefect_server) -> None:  # noqa: F811
    api, _server_env = prefect_server
    db = f"sqlite:///{tmp_path / 'q.db'}"
    manifest = sleep_manifest(tmp_path / "m.yaml", [
        {"name": "nap", "kind": "sleep", "params": {"duration_s": 0.2}, "count": 2},
        {"name": "crash", "kind": "sleep", "params": {"exit_code": 3}},
    ], name="served", tag="2.0", retries=0)
    proc = run_qualify(["run", str(manifest), "--db", db, "--json"], tmp_path, PREFECT_API_URL=api)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    outcome = json.loads(proc.stdout)
    run_id = outcome["run_id"]
    # The console stays quiet: the progress line only, no Prefect INFO lines.
    assert "| INFO" not in proc.stderr, proc.stderr[-2000:]

    with httpx.Client(base_url=api, timeout=30) as client:
        flow_runs = client.post("/flow_runs/filter", json={}).json()
        assert [f["name"] for f in flow_runs] == [f"served:2.0 run {run_id}"]
        flow_run = flow_runs[0]
        logs = client.post("/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run["id"]]}},
                                                 "sort": "TIMESTAMP_ASC", "limit": 200}).json()
        task_runs = {t["id"]: t["name"] for t in client.post("/task_runs/filter", json={}).json()}
        artifacts = client.post("/artifacts/filter", json={}).json()
    flow_lines = [log["message"] for log in logs if log["task_run_id"] is None]
    assert any(f"run {run_id} of served 2.0: 3 cases" in m for m in flow_lines), flow_lines
    by_task: dict[str, list[str]] = {}
    for log in logs:
        if log["task_run_id"]:
            by_task.setdefault(task_runs.get(log["task_run_id"], "?"), []).append(log["message"])
    for case in ("sleep/nap/0000", "sleep/nap/0001", "sleep/crash"):
        lines = by_task.get(case, [])
        assert any(m.startswith(f"{case}: its Ray task started") for m in lines), (case, lines)
        assert any(m.startswith(f"{case}: passed") or m.startswith(f"{case}: error") for m in lines), (case, lines)
    crash = "\n".join(by_task["sleep/crash"])
    assert "the workload's log, last" in crash and "exiting with code 3 as asked" in crash
    assert {log["level"] for log in logs} >= {20, 40}  # INFO and ERROR both reached the API

    by_key = {a["key"]: a for a in artifacts if a.get("key")}
    summary = by_key["qualify-served-2-0-summary"]["data"]
    assert summary.startswith(f"# served:2.0 run {run_id}: **FAIL**")
    assert summary.index("Needs attention") < summary.index("Passed checks")
    assert summary.index("sleep/crash") < summary.index("Passed checks")
    report = Path(outcome["report"])
    assert report.is_absolute() and report.exists() and report.as_uri() in summary
    link = by_key["qualify-served-2-0-report"]
    assert link["type"] == "markdown" or link["type"] == "link"
    assert report.as_uri() in link["data"]

    from support.browser import Browser, chromium_path

    try:
        chromium_path()
    except pytest.skip.Exception:
        return  # the API checks above stand; the screenshot needs chromium
    ui = api.rsplit("/api", 1)[0]
    with Browser(tmp_path, width=1400, height=1000) as browser:
        browser.goto(f"{ui}/runs/flow-run/{flow_run['id']}",
                     until="document.body && document.body.innerText.includes('its Ray task started')"
                           f" && document.body.innerText.includes('served:2.0 run {run_id}')", timeout=120)
        text = browser.evaluate("document.body.innerText")
        assert "This run didn't generate logs" not in text
        shot = browser.screenshot(tmp_path / "prefect-flow-run.png", full_page=False)
        browser.goto(f"{ui}/runs", until=f"document.body && document.body.innerText.includes('served:2.0 run {run_id}')",
                     timeout=120)
        runs_shot = browser.screenshot(tmp_path / "prefect-runs.png", full_page=False)
        crash_id = next(i for i, name in task_runs.items() if name == "sleep/crash")
        browser.goto(f"{ui}/runs/task-run/{crash_id}", until="document.body && "
                     "document.body.innerText.includes('exiting with code 3 as asked')", timeout=120)
        task_shot = browser.screenshot(tmp_path / "prefect-task-run-crash.png", full_page=False)
        browser.goto(f"{ui}/artifacts/artifact/{by_key['qualify-served-2-0-summary']['id']}",
                     until="document.body && document.body.innerText.includes('Needs attention')", timeout=120)
        summary_shot = browser.screenshot(tmp_path / "prefect-summary-artifact.png", full_page=False)
    if os.environ.get("QUALIFY_TEST_SCREENSHOTS"):
        keep = Path(os.environ["QUALIFY_TEST_SCREENSHOTS"])
        keep.mkdir(parents=True, exist_ok=True)
        for png in (shot, runs_shot, task_shot, summary_shot):
            shutil.copy(png, keep / png.name)
