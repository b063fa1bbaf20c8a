"""Against a real `prefect server start` on loopback: the deployment from prefect.yaml runs
through a process worker, the UI's API shows one task run per case (named by case id), and
the run publishes its results table, verdict summary and progress artifacts, keyed per release.
"""

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
from support.flows import REPO, db_rows, sleep_manifest
from support.net import free_port

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.prefect]
PREFECT = str(Path(sys.executable).with_name("prefect"))


@pytest.fixture
def prefect_server(tmp_path: Path):
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": api,
           "PREFECT_UI_API_URL": api, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_API_HOST": "127.0.0.1"}
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            time.sleep(1)
        else:
            raise AssertionError("prefect server did not answer: " + (tmp_path / "server.log").read_text()[-3000:])
        yield api, env
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
        log.close()


def _prefect(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PREFECT, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_deployment_runs_and_publishes_artifacts(tmp_path: Path, prefect_server) -> None:
    api, env = prefect_server
    env = {**env, "QUALIFY_DATA_DIR": str(tmp_path / "data"), "QUALIFY_RAY_TEMP": f"/tmp/qrp-{os.getpid()}",
           "PWD": str(REPO)}
    db = f"sqlite:///{tmp_path / 'q.db'}"
    manifest = sleep_manifest(tmp_path / "m.yaml", [
        {"name": "nap", "kind": "sleep", "params": {"duration_s": 0.3}, "count": 3}], name="served", tag="2.0")

    created = _prefect(["work-pool", "create", "qualify-process", "--type", "process"], env)
    assert created.returncode == 0, created.stdout + created.stderr
    deployed = _prefect(["--no-prompt", "deploy", "--name", "qualify-release"], env)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    # The database travels by the worker's environment, never as a (UI-visible) flow parameter.
    env = {**env, "QUALIFY_DATABASE_URL": db}
    started = _prefect(["deployment", "run", "qualify-release/qualify-release", "--param", f"manifest={manifest}"],
                       env)
    assert started.returncode == 0, started.stdout + started.stderr
    # A mistyped manifest, run from the UI as a person would: a field misspelled (issue 26.10).
    mistyped = tmp_path / "mistyped.yaml"
    mistyped.write_text(manifest.read_text().replace("execution:", "exection:", 1))
    assert "exection:" in mistyped.read_text()
    bad = _prefect(["deployment", "run", "qualify-release/qualify-release", "--param", f"manifest={mistyped}"], env)
    assert bad.returncode == 0, bad.stdout + bad.stderr

    worker_log = open(tmp_path / "worker.log", "w")
    worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "qualify-process", "--run-once"], env=env,
                              cwd=REPO, stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        worker.wait(timeout=600)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, 9)
        worker_log.close()

    log_text = (tmp_path / "worker.log").read_text()
    with httpx.Client(base_url=api, timeout=30) as client:
        runs = client.post("/flow_runs/filter", json={}).json()
        assert len(runs) == 2, runs
        [refused] = [r for r in runs if r["parameters"]["manifest"] == str(mistyped)]
        [flow_run] = [r for r in runs if r["parameters"]["manifest"] == str(manifest)]
        assert flow_run["state_type"] == "COMPLETED", log_text[-4000:]
        # the mistyped manifest: Failed, with the field and the file in the state's message, and no traceback
        # anywhere in the worker's log (the error says what to fix)
        assert refused["state_type"] == "FAILED", log_text[-4000:]
        message = refused["state"]["message"] or ""
        assert "exection" in message and "mistyped.yaml" in message, message
        assert "Traceback" not in log_text, log_text[-6000:]
        # after the rename, the run logs under its final name (never the interim `run …`)
        [counted] = [line for line in log_text.splitlines() if ": 3 cases" in line]
        assert "served:2.0 run 1" in counted, counted
        assert not [line for line in log_text.splitlines() if "run …" in line and "candidate" in line], log_text
        # the engine's own last line too
        [finished] = [line for line in log_text.splitlines() if "Finished in state PASS" in line]
        assert "served:2.0 run 1" in finished, finished
        task_runs = client.post("/task_runs/filter", json={}).json()
        names = {t["name"] for t in task_runs}
        assert {"sleep/nap/0000", "sleep/nap/0001", "sleep/nap/0002"} <= names
        assert {"open-run", "obtain-candidate", "verify-components", "gate", "publish-report"} <= {
            n.rsplit("-", 1)[0] for n in names}
        artifacts = client.post("/artifacts/filter", json={}).json()
    by_key = {a["key"]: a for a in artifacts if a.get("key")}
    assert {"qualify-served-2-0-results", "qualify-served-2-0-summary", "qualify-served-2-0-progress"} <= set(by_key)
    assert by_key["qualify-served-2-0-results"]["type"] == "table"
    table = by_key["qualify-served-2-0-results"]["data"]
    rows = json.loads(table) if isinstance(table, str) else table
    assert {r["case"] for r in rows} == {"sleep/nap/0000", "sleep/nap/0001", "sleep/nap/0002"}
    assert all(r["MFU"] == "n/a" for r in rows)  # never "-": the UI draws it as a bullet
    assert by_key["qualify-served-2-0-summary"]["type"] == "markdown"
    assert "PASS" in by_key["qualify-served-2-0-summary"]["data"]
    assert by_key["qualify-served-2-0-progress"]["type"] == "progress"
    assert float(by_key["qualify-served-2-0-progress"]["data"]) == 100.0
    # The run recorded its Prefect flow-run id.
    recorded = db_rows(db, "SELECT flow_run_id, status FROM runs")
    assert recorded == [{"flow_run_id": flow_run["id"], "status": "passed"}]
    shutil.rmtree(f"/tmp/qrp-{os.getpid()}", ignore_errors=True)
