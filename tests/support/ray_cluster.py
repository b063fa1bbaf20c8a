"""A real Ray cluster of several nodes on this one machine, on 127.0.0.1 only.

Each node is a real Ray node (its own raylet, object store, workers and logical resources)
registered with one GCS. Why not `ray start` (as tests/integration/test_ray_cluster.py does):
Ray resolves a --node-ip-address of 127.0.0.1 to the machine's routable address and binds its
servers to every interface (measured: 15 non-loopback listeners for a head and a node), and its
single-machine mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which keeps everything on loopback,
see execution.ray.bind_local_cluster_to_loopback) makes `ray start --address` refuse a second
node. `ray.cluster_utils.Cluster` adds nodes without that refusal, so a helper process holds
such a cluster in single-machine mode until its stdin closes. A client of it needs the same
mode (CLIENT_ENV), as a client of any cluster needs that cluster's settings.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

CLIENT_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
START_TIMEOUT_S = 240

_HOLDER = r"""
import json, sys
from qualify.execution.ray import bind_local_cluster_to_loopback
bind_local_cluster_to_loopback()
from ray.cluster_utils import Cluster
spec = json.loads(sys.argv[1])
cluster = Cluster(initialize_head=True, connect=False, head_node_args=spec["head"])
for node in spec["nodes"]:
    cluster.add_node(**node)
cluster.wait_for_nodes()
print("ADDRESS", cluster.address, flush=True)
try:
    sys.stdin.read()
finally:
    cluster.shutdown()
"""


@dataclass(frozen=True)
class LocalCluster:
    address: str  # host:port of the GCS, on 127.0.0.1
    pgid: int  # the process group of the holder and every Ray process of the cluster

    def owns(self, pid: int) -> bool:
        try:
            return os.getpgid(pid) == self.pgid
        except OSError:
            return False


@contextmanager
def loopback_cluster(log: Path, head: dict[str, Any], nodes: list[dict[str, Any]]) -> Iterator[LocalCluster]:
    """A head and one node per entry of nodes (Cluster.add_node arguments: num_cpus, resources...)."""
    env = {**os.environ, **CLIENT_ENV}
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", _HOLDER, json.dumps({"head": head, "nodes": nodes})],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                                start_new_session=True)
    try:
        address = _read_address(proc, log)
        yield LocalCluster(address, proc.pid)
    finally:
        _stop(proc)


def _read_address(proc: subprocess.Popen[bytes], log: Path) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    for line in proc.stdout:  # the holder prints one ADDRESS line once every node is up
        if line.startswith(b"ADDRESS "):
            return line.split()[1].decode()
        assert time.monotonic() < deadline, log.read_text()[-3000:]
    raise AssertionError(f"the cluster did not start: {log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Close the holder's stdin (it shuts the cluster down), then end whatever is left of its group."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        time.sleep(2)


def run_ray_script(script: str, *args: str, timeout_s: float = 600) -> dict:
    """`script` in a fresh Python process of its own (its only Ray sessions are the script's), with no RAY_ variable
    of this one, src and tests importable, and its own short Ray temp folder; the JSON its last line prints."""
    import shutil
    import tempfile

    from support.paths import REPO

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])
    env["QUALIFY_RAY_TEMP"] = temp = tempfile.mkdtemp(prefix="qs-")  # short: Ray's socket paths have a limit
    try:
        run = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
                             timeout=timeout_s, cwd=REPO)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert run.returncode == 0, run.stderr[-4000:]
    return {"stderr": run.stderr, **json.loads(run.stdout.strip().splitlines()[-1])}
