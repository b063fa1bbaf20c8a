"""A `nodes: 2` DeepSpeed training case on a real two-node Ray cluster on this machine.

The cluster is a head and a second Ray node (each its own raylet and logical resources, one
CPU each) on 127.0.0.1 (tests/support/ray_cluster.py says why not `ray start`). The case runs
for real: a placement group with one bundle per node (STRICT_SPREAD), `torchrun --nnodes 2` on
each node with the rendezvous on the first, DeepSpeed over gloo on CPU. Nothing is mocked.
Every TCP listener of the case's processes and of the cluster is sampled while it runs and
must be on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from support.flows import db_rows, results, run_qualify
from support.listeners import ListenerSampler, environ_has, processes_with
from support.ray_cluster import CLIENT_ENV, LocalCluster, loopback_cluster

# Shares the machine under -n 2: its time bounds (a peer's failure stops the other node well inside a third of the
# case timeout; the hung ranks' processes gone within 30 s) held with two busy processes beside it.
pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.workload]

# Few steps, one thread per rank: the test checks the launch, not speed (2 cores for 2 nodes).
QUICK = {"seq_len": 64, "micro_batch": 2, "steps": 2, "warmup_steps": 1, "repeats": 1, "num_threads": 1,
         "data": "memorize"}
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if subprocess.run(["which", "ss"], capture_output=True).returncode != 0:
        pytest.skip("ss (iproute2) is not installed: cannot list listening sockets")
    log = tmp_path_factory.mktemp("cluster") / "cluster.log"
    with loopback_cluster(log, head={"num_cpus": 1, "num_gpus": 0, "resources": {"head_node": 1}},
                          nodes=[{"num_cpus": 1, "num_gpus": 0, "resources": {"second_node": 1}}]) as c:
        yield c


def manifest(path: Path, mark: str) -> Path:
    data = {
        "apiVersion": "qualify/v1",
        "release": {"name": "multinode", "repository": "127.0.0.1:5000/q/multinode", "tag": "1.0",
                    "candidate_tag": "1.0-rc1"},
        "execution": {"executor": "local", "case_timeout_s": TIMEOUT_S, "infra_retries": 0},
        "components": [{"name": "python", "source": "python", "expected": "3.11", "match": "prefix"},
                       {"name": "accelerator-driver", "source": "driver", "expected": "550", "match": "prefix"}],
        "training": {"defaults": {**QUICK, "resources": {"cpus": 2, "nodes": 2}, "env": {"QUALIFY_TEST_MARK": mark}},
                     "models": [{"name": "tiny-llama", "preset": "tiny-llama"}], "variants": [{"name": "base"}]},
        "gate": {"regression": {"baseline": "optional"}},  # a first release
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def assert_loopback_only(sampler: ListenerSampler, what: str) -> None:
    assert sampler.seen, f"no listener of {what} was seen: the check would prove nothing"
    assert sampler.wide() == {}, f"{what} listens beyond loopback: {sampler.wide()}"


def test_two_node_deepspeed_case_runs_one_rank_group_per_ray_node(tmp_path: Path, cluster: LocalCluster) -> None:
    mark = uuid.uuid4().hex
    db = f"sqlite:///{tmp_path / 'q.db'}"
    path = manifest(tmp_path / "m.yaml", mark)
    with ListenerSampler(lambda pid: environ_has(pid, "QUALIFY_TEST_MARK", mark)) as case, \
            ListenerSampler(cluster.owns) as ray_nodes:
        res = run_qualify(["run", str(path), "--db", db, "--ray-address", cluster.address, "--json"], tmp_path,
                          timeout=600, **CLIENT_ENV)
    outcome = json.loads(res.stdout or "{}")
    assert "run_id" in outcome, res.stdout[-2000:] + res.stderr[-3000:]
    got = results(db, outcome["run_id"])["train/tiny-llama/base"]
    assert got["status"] == "passed", (got["error_class"], got["error"])
    env = got["environment"]
    assert env["world_size"] == 2 and env["launcher"] == "torchrun"
    assert {r: v["status"] for r, v in env["ranks"].items()} == {"0": "passed", "1": "passed"}
    nodes = env["nodes"]
    assert [(n["node_rank"], n["ranks"], n["status"]) for n in nodes] == [(0, [0], "passed"), (1, [1], "passed")]
    assert len({n["ray_node_id"] for n in nodes}) == 2 and all(n["ray_node_id"] for n in nodes)
    assert env["rendezvous"].startswith("127.0.0.1:")  # the address Ray reports for the first node
    assert "--nnodes=2" in env["launch_command"] and "--master-addr=127.0.0.1" in env["launch_command"]
    # Host-side driver facts: no GPU on this machine, so unknown on the node; never the image's claim.
    assert all(n["driver"] is None for n in nodes)
    [check] = db_rows(db, "SELECT ok, actual, detail FROM component_checks WHERE name = 'accelerator-driver'")
    assert (bool(check["ok"]), check["actual"]) == (False, None) and "unknown on this node" in check["detail"]
    assert outcome["verdict"] != "PASS"  # that unknown driver is not a pass
    # The store of torchrun's rendezvous (node 0) and gloo's pairs (both ranks): on loopback.
    assert_loopback_only(case, "the case's processes")
    assert any("qualify.workloads.train.torchrun" in cmd for cmd in case.seen.values()), case.seen
    assert_loopback_only(ray_nodes, "the Ray cluster")


DRIVER = r"""
import json, sys
import ray
from qualify.executors import LocalExecutor
from qualify.manifest import Resources
from qualify.execution.ray import run_case_on_ray
from qualify.workloads import protocol
address, params, timeout, mark = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
ray.init(address=address, log_to_driver=False)
case = protocol.make_case("train/2node", "train", params, timeout_s=timeout)
executor = LocalExecutor(extra_env={"QUALIFY_TEST_MARK": mark})
out = run_case_on_ray(executor, case, Resources(cpus=2, nodes=2), timeout)
groups = [g["state"] for g in ray.util.placement_group_table().values()]
print(json.dumps({"doc": out.doc, "exec_s": out.exec_s, "retryable": out.retryable, "groups": groups}))
"""


def launch(cluster: LocalCluster, params: dict, timeout_s: float, mark: str) -> dict:
    """One launch of a nodes: 2 case from a driver process of its own (run_case_on_ray, no Prefect)."""
    res = subprocess.run([sys.executable, "-c", DRIVER, cluster.address, json.dumps(params), str(timeout_s), mark],
                         capture_output=True, text=True, timeout=timeout_s + 200, env={**os.environ, **CLIENT_ENV})
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_nan_on_the_second_node_is_nan_loss_not_a_timeout(cluster: LocalCluster) -> None:
    # Issue 12: a NaN on a rank of another node left rank 0 waiting until the timeout and the real
    # error was lost. Here rank 1 (node 1) gets a NaN at step 1; the case fails nan_loss, promptly.
    params = {"model": "tiny-llama", **QUICK, "steps": 3, "inject": {"nan_at_step": 1, "rank": 1}}
    out = launch(cluster, params, TIMEOUT_S, uuid.uuid4().hex)
    doc = out["doc"]
    assert (doc["status"], doc["error_class"]) == ("failed", "nan_loss"), doc["error"]
    assert doc["error"].startswith("node 1 ") and "rank 1: loss is nan at step 1" in doc["error"]
    env = doc["environment"]
    assert env["ranks"]["1"]["error_class"] == "nan_loss" and env["ranks"]["0"]["status"] != "passed"
    assert [n["ranks"] for n in env["nodes"]] == [[0], [1]]
    assert out["retryable"] is False
    assert out["groups"] and set(out["groups"]) == {"REMOVED"}  # the failed launch gave its nodes back
    assert out["exec_s"] < TIMEOUT_S / 3  # the other node stopped at once, not at a timeout


def test_hung_ranks_time_out_on_every_node_and_leave_nothing(cluster: LocalCluster) -> None:
    # Ranks that hang deaf to SIGTERM once launched (as in a stuck collective): each node's executor
    # stops its whole tree at the case timeout; the group is removed and no process of the case is left.
    mark = uuid.uuid4().hex
    timeout = 25
    out = launch(cluster, {"model": "tiny-llama", **QUICK, "inject": {"hang_after_launch_s": 600}}, timeout, mark)
    doc = out["doc"]
    assert (doc["status"], doc["error_class"]) == ("error", "timeout"), doc["error"]
    assert [n["error_class"] for n in doc["environment"]["nodes"]] == ["timeout", "timeout"]
    assert out["exec_s"] < timeout + 60 and out["retryable"] is False
    assert set(out["groups"]) == {"REMOVED"}
    deadline = time.monotonic() + 30
    while processes_with("QUALIFY_TEST_MARK", mark) and time.monotonic() < deadline:
        time.sleep(1)
    assert processes_with("QUALIFY_TEST_MARK", mark) == []
