"""A process that started a local Ray, then joins a cluster (tests/support/ray_cluster.py): Ray caches token
authentication in the process once a local `ray.init()` turned it on. Before the support cluster ran with token
authentication too, the driver then refused every worker's report of a streamed item (its log: "Missing
authorization header in request!"; the workers': "InvalidAuthToken"), and the cases' streams never delivered: what
test_cluster_sim met, in a pytest worker that had hosted other tests' local Ray. Runs in a fresh process of its own,
so that the order is the test's and not the suite's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SCRIPT = r"""
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
import ray
from qualify.execution.ray import start_local_ray
from support.ray_cluster import CLIENT_ENV, loopback_cluster

before = dict(os.environ)
start_local_ray(num_cpus=1)          # the product's local Ray, as an earlier test in the same worker ran it
ray.shutdown()
os.environ.clear()                   # and the test's environment restored after it (tests/conftest.py)
os.environ.update(before)

@ray.remote(num_returns="streaming")
def items(n):
    for k in range(n):
        yield k

os.environ.update(CLIENT_ENV)        # then a client of the support cluster, as test_cluster_sim's driver was
log = os.path.join(tempfile.mkdtemp(prefix="qs-auth-"), "cluster.log")
with loopback_cluster(__import__("pathlib").Path(log), {"num_cpus": 1}, [{"num_cpus": 1}]) as cluster:
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    got = []
    stream = items.remote(3)
    for _ in range(3):
        ready, _ = ray.wait([stream], timeout=60, fetch_local=True)   # a refused item never arrives
        if not ready:
            break
        got.append(ray.get(next(stream)))
    ray.shutdown()
print(json.dumps({"got": got}))
"""


def test_a_driver_that_started_a_local_ray_gets_the_streamed_items_of_a_cluster_it_joins() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])
    env["QUALIFY_RAY_TEMP"] = temp = tempfile.mkdtemp(prefix="qs-")  # short: Ray's socket paths have a limit
    try:
        run = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO / "tests")], capture_output=True, text=True,
                             env=env, timeout=600, cwd=REPO)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert run.returncode == 0, run.stderr[-4000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"got": [0, 1, 2]}, run.stderr[-4000:]
