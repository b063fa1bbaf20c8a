"""A real two-node Ray cluster on this machine (`ray start --head` + a node declaring logical
GPUs): GPU cases land on the GPU node with the device ids Ray assigned; a case asking for
more than the cluster has fails with a clear message instead of hanging.

The GPUs are logical (Ray resources): no device exists here, which is why the cases are
`sleep` workloads that report the CUDA_VISIBLE_DEVICES they were given.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.flows import results, run_qualify, sleep_manifest
from support.net import free_port
from support.processes import stop_group

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.prefect]
RAY = str(Path(sys.executable).with_name("ray"))
JOIN_ENV = {"RAY_AUTH_MODE": "disabled"}


@pytest.fixture
def ray_cluster(tmp_path: Path):
    """`ray start --head` and a second `ray start` node, each --block in its own process group,
    so that the teardown stops exactly this cluster (never `ray stop`, which stops every Ray)."""
    # The user's own cluster with its own settings (token authentication off here); qualify, joining it,
    # brings the same settings (JOIN_ENV), as any client of that cluster must.
    # Ray's single-machine switch must not reach a multi-node cluster: it refuses a second node.
    # No drain on SIGTERM: the teardown signals the head's whole group, its GCS included, and a head that drains
    # first waits Ray's 30 s for a GCS that is gone (seen: every teardown took 30.7 s).
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}, **JOIN_ENV,
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    port = free_port()
    temp = f"/tmp/qrc-{port}"
    address = f"127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], name: str) -> None:
        log = open(tmp_path / f"{name}.log", "wb")
        procs.append(subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", *args], env=env,
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def nodes_alive(n: int) -> bool:
        res = subprocess.run([sys.executable, "-c", "import ray, sys; ray.init(address=sys.argv[1]); "
                              "print(sum(x['Alive'] for x in ray.nodes()))", address],
                             env=env, capture_output=True, text=True, timeout=120)
        return res.returncode == 0 and res.stdout.strip().endswith(str(n))

    try:
        start(["--head", f"--port={port}", "--num-cpus=1", "--num-gpus=0", "--include-dashboard=false",
               f"--temp-dir={temp}"], "head")
        deadline = time.monotonic() + 180
        while not nodes_alive(1):
            assert time.monotonic() < deadline, (tmp_path / "head.log").read_text()[-3000:]
            time.sleep(2)
        start([f"--address={address}", "--num-cpus=2", "--num-gpus=2", '--resources={"gpu_node": 1}'], "gpu-node")
        while not nodes_alive(2):
            assert time.monotonic() < deadline, (tmp_path / "gpu-node.log").read_text()[-3000:]
            time.sleep(2)
        yield address
    finally:
        for proc in reversed(procs):
            stop_group(proc)
        shutil.rmtree(temp, ignore_errors=True)
    for name in ("head", "gpu-node"):  # no node waited out a drain (what Ray logs when it starts one)
        assert "Draining for up to" not in (tmp_path / f"{name}.log").read_text(errors="replace"), name


def test_gpu_cases_land_on_the_gpu_node_and_infeasible_cases_fail_fast(tmp_path: Path, ray_cluster: str) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    manifest = sleep_manifest(tmp_path / "m.yaml", [
        {"name": "cpu", "kind": "sleep", "params": {"duration_s": 0.2}, "resources": {"cpus": 1}},
        {"name": "gpu1", "kind": "sleep", "params": {"duration_s": 0.2}, "resources": {"cpus": 0.5, "gpus": 1}},
        {"name": "gpu2", "kind": "sleep", "params": {"duration_s": 0.2}, "resources": {"cpus": 0.5, "gpus": 2}},
        {"name": "too-big", "kind": "sleep", "params": {"duration_s": 0.2}, "resources": {"cpus": 1, "gpus": 4}},
        {"name": "no-such-accel", "kind": "sleep", "params": {"duration_s": 0.2},
         "resources": {"cpus": 1, "accelerator_type": "PPU"}},
    ], timeout_s=120)
    res = run_qualify(["run", str(manifest), "--db", db, "--ray-address", ray_cluster, "--json"], tmp_path,
                      timeout=600, **JOIN_ENV)
    assert res.returncode == 1, res.stdout + res.stderr  # the infeasible cases make the verdict non-PASS
    outcome = json.loads(res.stdout)
    got = results(db, outcome["run_id"])
    by_case = {c["case_id"]: c for c in outcome["cases"]}
    assert got["sleep/cpu"]["status"] == "passed"
    for case_id, n in (("sleep/gpu1", 1), ("sleep/gpu2", 2)):
        assert got[case_id]["status"] == "passed", got[case_id]
        visible = got[case_id]["environment"]["visible_devices"]
        assert visible is not None and len(visible.split(",")) == n
        # The workload saw exactly the devices Ray assigned to its task.
        assert visible.split(",") == by_case[case_id]["gpu_ids"]
    for case_id in ("sleep/too-big", "sleep/no-such-accel"):
        assert (got[case_id]["status"], got[case_id]["error_class"]) == ("error", "infra")
        assert "no node of the Ray cluster can run this case" in got[case_id]["error"]
    assert "GPU=4" in got["sleep/too-big"]["error"] and "GPU=2" in got["sleep/too-big"]["error"]
    assert outcome["verdict"] == "INCOMPLETE"
