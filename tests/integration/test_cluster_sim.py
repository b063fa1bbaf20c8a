"""The 25.05 release's matrix on a simulated cluster of 4 nodes x 8 GPUs (benchmarks/cluster_sim.py): real Ray
nodes on loopback that declare GPUs, each case a sleep of its planned duration, handed to Ray as the flow hands
them. The GPUs are declared, not present: what is tested is the scheduling, which needs no device."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from cluster_sim import CaseTiming  # noqa: E402 - the benchmark's own record of a case, read back from its JSON

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _simulate(scale: float) -> tuple[str, float, list[CaseTiming]]:
    """benchmarks/cluster_sim.py in a process of its own, whose only Ray session is the simulated cluster's. In this
    test process, after other tests' Ray sessions, the cluster's workers once had every streamed item refused by
    the driver ("Failed to report streaming generator return ... InvalidAuthToken" in their logs). The cause: a
    local `ray.init()` turns token authentication on for its process (the environment, Ray's cached config and
    token), and the conftest then restored the environment alone: a driver whose cached state said token while
    its environment did not. Now a local Ray gives the process back at its shutdown and a join re-reads the state
    (execution/ray_auth.py, tests/integration/test_ray_auth.py), and the conftest re-reads it after restoring
    the environment; the simulation still runs in a process of its own, whose only Ray session is the one it
    joins, as a benchmark run is."""
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cluster_sim.py"),
                          str(REPO / "releases" / "training-xpu-pytorch-25.05.yaml"), "--nodes", "4",
                          "--gpus-per-node", "8", "--cpus-per-node", "64", "--scale", str(scale), "--json"],
                         capture_output=True, text=True, timeout=850, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    return doc["line"], doc["ratio"], [CaseTiming(**{**c, "nodes": tuple(c["nodes"])}) for c in doc["cases"]]


def test_the_release_matrix_runs_on_a_simulated_4x8_gpu_cluster_close_to_its_lower_bound() -> None:
    scale = 0.003  # 1,830 planned seconds -> 5.5 s of sleep
    line, ratio, cases = _simulate(scale)
    print(line)
    assert len(cases) == 26  # 12 training, 12 inference, 2 against the reference image (gate.reference)
    nodes_used = {n for c in cases for n in c.nodes}
    assert len(nodes_used) == 4  # every node got work
    for case in cases:
        if case.case_id.startswith("infer/deepseek-r1/"):  # 2-node gangs: two distinct nodes, together
            assert len(set(case.nodes)) == 2
    # GPUs are never oversubscribed: at any start, the 8-GPU cases running on one node are at most one.
    eight = [c for c in cases if not c.case_id.startswith("infer/qwen3-8b/")]
    for case in eight:
        overlapping = [o for o in eight if o is not case and set(o.nodes) & set(case.nodes)
                       and o.start_s < case.end_s - 1e-6 and case.start_s < o.end_s - 1e-6]
        assert not overlapping, (case, overlapping)
    # Per-case start-up (a Ray worker, a process) is a large share of a 2-5.5 s sleep here, and grows with the
    # machine's load (1.26 measured beside the whole suite): the benchmark, at a larger scale, measures the ratio
    # the issue asks (<= 1.15: 1.085 at scale 0.01). This bounds what no load explains: the cases one after the
    # other would be 4.1.
    assert ratio < 2.0, line
