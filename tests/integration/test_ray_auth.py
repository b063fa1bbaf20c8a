"""A process that ran a local Ray and then joins a cluster without token authentication (execution/ray_auth.py).

A local ray.init() turns token authentication on for its whole process (environment, cached config, cached token),
and nothing turned it off at shutdown. Once the environment changed back (the conftest restores it) while the
cache still said token, a cluster the process joined had its workers' reports refused, and every streamed case
result was lost ("lost or refused on the way"; the workers' logs: InvalidAuthToken): what test_cluster_sim met in
a pytest worker. Runs in a fresh
process of its own, so that the order is the test's and not the suite's: the product's local Ray started in place
and, as `qualify run` starts it, in the background; each shut down; then a join of the support cluster, whose
streaming task must deliver all its items."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.ray_cluster import run_ray_script

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SCRIPT = r"""
import json, os, pathlib, sys, tempfile
sys.path.insert(0, sys.argv[1])
import ray
from qualify.execution import early_ray, ray_auth
from qualify.execution.ray import start_local_ray, start_ray
from support.ray_cluster import CLIENT_ENV, loopback_cluster

seen = {"before": [ray_auth.token_mode_cached(), os.environ.get("RAY_AUTH_MODE")]}
handle = start_ray(num_cpus=1)                       # the product's local Ray, started in place
seen["local up"] = [ray_auth.token_mode_cached(), os.environ.get("RAY_AUTH_MODE")]
handle.shutdown()
seen["local down"] = [ray_auth.token_mode_cached(), os.environ.get("RAY_AUTH_MODE")]
early_ray.start_in_background(lambda: start_local_ray(1))   # as `qualify run` starts it, beside Prefect
handle = start_ray()
seen["early up"] = [ray_auth.token_mode_cached(), os.environ.get("RAY_AUTH_MODE")]
handle.shutdown()
early_ray.stop()
seen["early down"] = [ray_auth.token_mode_cached(), os.environ.get("RAY_AUTH_MODE")]

@ray.remote(num_returns="streaming")
def items(n):
    for k in range(n):
        yield k

os.environ.update(CLIENT_ENV)                        # a client of the support cluster (no token authentication)
log = pathlib.Path(tempfile.mkdtemp(prefix="qs-auth-")) / "cluster.log"
with loopback_cluster(log, {"num_cpus": 1}, [{"num_cpus": 1}]) as cluster:
    handle = start_ray(address=cluster.address)      # the product's join
    got = []
    stream = items.remote(3)
    for _ in range(3):
        ready, _ = ray.wait([stream], timeout=60, fetch_local=True)   # a refused item never arrives
        if not ready:
            break
        got.append(ray.get(next(stream)))
    handle.shutdown()
seen["got"] = got
print(json.dumps(seen))
"""


def test_a_process_that_ran_a_local_ray_joins_a_cluster_without_tokens_and_gets_its_streamed_items() -> None:
    seen = run_ray_script(SCRIPT, str(REPO / "tests"))
    assert seen["before"] == [False, None]
    # The premise: a local Ray turns token authentication on for the process (else this test proves nothing) ...
    assert seen["local up"] == [True, "token"] and seen["early up"] == [True, "token"], seen
    # ... and its shutdown gives the process back as it was, whichever way it was started.
    assert seen["local down"] == [False, None] and seen["early down"] == [False, None], seen
    assert seen["got"] == [0, 1, 2], seen["stderr"][-4000:]
