"""A Ray cluster started by qualify listens on loopback only, with Ray's authentication left on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.ray]

PROBE = r"""
import os, subprocess, sys, time
from qualify.execution.ray import start_ray
handle = start_ray(num_cpus=1)
import ray
@ray.remote
def ping():
    return os.getpid()
worker = ray.get(ping.remote())
time.sleep(1)
# This process and everything it started (GCS, raylet, workers, agents): never another Ray on the machine.
table = subprocess.run(["ps", "-eo", "pid,ppid"], capture_output=True, text=True).stdout.split()[2:]
children = {}
for pid, ppid in zip(table[::2], table[1::2]):
    children.setdefault(ppid, []).append(pid)
ours, todo = set(), [str(os.getpid())]
while todo:
    pid = todo.pop()
    if pid not in ours:
        ours.add(pid)
        todo.extend(children.get(pid, []))
ours.add(str(worker))
listen = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
for line in listen.splitlines():
    if any(f"pid={p}," in line for p in ours):
        print("LISTEN", line.split()[3])
print("AUTH", os.environ.get("RAY_AUTH_MODE", "<default>"))
handle.shutdown()
"""


def test_local_cluster_binds_only_loopback(tmp_path: Path) -> None:
    if subprocess.run(["which", "ss"], capture_output=True).returncode != 0:
        pytest.skip("ss (iproute2) is not installed: cannot list listening sockets")
    temp = f"/tmp/qrl-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    env.update({"QUALIFY_RAY_TEMP": temp, "RAY_USAGE_STATS_ENABLED": "0"})
    res = subprocess.run([sys.executable, "-c", PROBE, temp], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    addresses = [line.split(" ", 1)[1] for line in res.stdout.splitlines() if line.startswith("LISTEN")]
    assert addresses, res.stdout  # the probe saw Ray's servers
    wide = [a for a in addresses if not (a.startswith("127.") or a.startswith("[::ffff:127.") or a.startswith("[::1]"))]
    assert wide == [], f"Ray listens beyond loopback: {wide}"
    assert "AUTH disabled" not in res.stdout  # qualify did not switch Ray's token authentication off
