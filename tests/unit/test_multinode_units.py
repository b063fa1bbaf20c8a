"""Multi-node launch (execution.multinode) and the loopback rendezvous pieces of the training
launcher: the pure parts, without Ray or processes.

The real thing (a two-node Ray cluster on this machine, DeepSpeed over gloo) is
tests/integration/test_multinode.py.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from qualify.manifest.cases import devices_per_node
from qualify.executors import LocalExecutor
from qualify.executors.container import ContainerExecutor
from qualify.manifest import Resources
from qualify.execution.ray import infeasible_reason
from qualify.execution.multinode import (NodeRun, merge_node_docs, multinode_problem, node_bundle, node_case_doc,
                                   )
from qualify.execution.result import bundle_task_options as task_options
from qualify.workloads import protocol
from qualify.workloads.train import torchrun
from qualify.workloads.train.ranks import gloo_env

CASE = protocol.make_case("train/tiny/base", "train", {"model": "tiny-llama", "devices": 2, "nodes": 2})


def node_doc(ranks: dict[int, tuple[str, str | None]], world: int = 4, error: str | None = None) -> dict[str, Any]:
    """A node's document as the training workload merges it over its own ranks."""
    failing = [(r, c) for r, (s, c) in ranks.items() if s != "passed"]
    status, cls = (ranks[failing[0][0]][0], failing[0][1]) if failing else ("passed", None)
    env = {"world_size": world, "rank": min(ranks),
           "ranks": {str(r): {"status": s, "error_class": c, "error": None} for r, (s, c) in ranks.items()}}
    return protocol.make_result(CASE, status, error_class=cls, error=error, environment=env,
                                metrics={"tokens_per_s": 10.0}, duration_s=5.0 + min(ranks))


def run(k: int, doc: dict[str, Any], node_id: str | None = None) -> NodeRun:
    return NodeRun(k, doc, 0 if doc["status"] == "passed" else 1, 5.0, 0.0, "vm", node_id or f"n{k}", "127.0.0.1",
                   facts={"driver": None, "driver_source": "none here"})


def test_bundle_is_one_nodes_share_of_the_totals() -> None:
    res = Resources(cpus=16, gpus=16, nodes=2, memory_gb=64, accelerator_type="H200", custom={"ib": 2})
    bundle = node_bundle(res)
    assert bundle == {"CPU": 8, "GPU": 8, "ib": 1, "accelerator_type:H200": 0.001, "memory": float(32 * 2**30)}
    opts = task_options(bundle)
    assert (opts["num_cpus"], opts["num_gpus"], opts["memory"]) == (8, 8, 32 * 2**30)
    assert opts["resources"] == {"ib": 1, "accelerator_type:H200": 0.001} and opts["max_retries"] == 0
    assert node_bundle(Resources(cpus=0, nodes=2)) == {"CPU": 0.001}  # Ray refuses an empty bundle


def test_the_bundle_holds_exactly_the_ranks_the_case_starts_per_node() -> None:
    # cases.devices_per_node (tests/unit/test_cases.py) and the bundle divide the total alike.
    res = Resources(cpus=4, gpus=16, nodes=2)
    assert node_bundle(res)["GPU"] == devices_per_node(res) == 8


def test_infeasible_multinode_case_is_refused_with_a_reason() -> None:
    one = [{"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 8.0, "GPU": 8.0}},
           {"Alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 8.0}}]
    reason = infeasible_reason(Resources(cpus=8, gpus=16, nodes=2), one)
    assert reason is not None and "set of 2 nodes" in reason and "GPU=8 per node" in reason
    two = [dict(one[0]), dict(one[0], NodeManagerAddress="10.0.0.3")]
    assert infeasible_reason(Resources(cpus=8, gpus=16, nodes=2), two) is None


def test_what_cannot_run_over_several_nodes_is_a_bad_case() -> None:
    local = LocalExecutor()
    assert multinode_problem(CASE, local) is None
    sleep = protocol.make_case("sleep/x", "sleep", {"duration_s": 1})
    assert "train cases only" in (multinode_problem(sleep, local) or "")
    ds = protocol.make_case("train/x", "train", {"model": "tiny-llama", "launcher": "deepspeed"})
    assert "ssh" in (multinode_problem(ds, local) or "")
    boxed = ContainerExecutor(image="localhost/x@sha256:" + "0" * 64)
    assert "network" in (multinode_problem(CASE, boxed) or "")


def test_each_node_gets_its_rank_and_the_rendezvous() -> None:
    doc = node_case_doc(CASE, node_rank=1, nodes=2, address="127.0.0.1", port=29555)
    assert doc["params"] == {**CASE["params"], "nodes": 2, "node_rank": 1, "master_addr": "127.0.0.1",
                             "master_port": 29555}
    assert "node_rank" not in CASE["params"]  # the case itself is left alone


def test_every_rank_of_every_node_passed_is_a_pass_with_the_rank_map() -> None:
    runs = [run(0, node_doc({0: ("passed", None), 1: ("passed", None)})),
            run(1, node_doc({2: ("passed", None), 3: ("passed", None)}))]
    doc = merge_node_docs(CASE, runs, devices=2, rendezvous="127.0.0.1:29555")
    assert (doc["status"], doc["error_class"]) == ("passed", None)
    env = doc["environment"]
    assert sorted(env["ranks"]) == ["0", "1", "2", "3"] and env["rendezvous"] == "127.0.0.1:29555"
    assert [(n["node_rank"], n["ray_node_id"], n["ranks"]) for n in env["nodes"]] == [(0, "n0", [0, 1]),
                                                                                      (1, "n1", [2, 3])]
    assert env["rank"] == 0 and doc["duration_s"] == 7.0  # rank 0's figures; the slowest node's time
    assert protocol.validate_result(doc) == []


def test_a_failing_rank_on_another_node_wins_over_what_it_caused() -> None:
    # Issue 12: a NaN on a rank of node 1 made rank 0 crash (or wait for the timeout) and the
    # real error was lost; the failing rank's class wins, and the error names its node.
    runs = [run(0, node_doc({0: ("error", "timeout"), 1: ("error", "crash")}, error="rank 0: timed out")),
            run(1, node_doc({2: ("passed", None), 3: ("failed", "nan_loss")}, error="rank 3: loss is nan"))]
    doc = merge_node_docs(CASE, runs, devices=2, rendezvous=None)
    assert (doc["status"], doc["error_class"]) == ("failed", "nan_loss")
    assert doc["error"].startswith("node 1 (vm): rank 3: loss is nan") and "node 0: timeout" in doc["error"]
    assert doc["environment"]["ranks"]["3"]["error_class"] == "nan_loss"


@pytest.mark.parametrize("runs, problem", [
    ([run(0, node_doc({0: ("passed", None), 1: ("passed", None)})),
      run(1, node_doc({2: ("passed", None), 3: ("passed", None)}, world=2))], "world size 2, expected 4"),
    ([run(0, node_doc({0: ("passed", None), 1: ("passed", None)})),
      run(1, node_doc({2: ("passed", None)}))], "node 1 ran ranks [2], expected [2, 3]"),
    ([run(0, node_doc({0: ("passed", None), 1: ("passed", None)}), node_id="same"),
      run(1, node_doc({2: ("passed", None), 3: ("passed", None)}), node_id="same")], "distinct Ray nodes"),
])
def test_passed_nodes_that_do_not_form_the_world_are_not_a_pass(runs: list[NodeRun], problem: str) -> None:
    doc = merge_node_docs(CASE, runs, devices=2, rendezvous=None)
    assert (doc["status"], doc["error_class"]) == ("error", "crash") and problem in doc["error"]


def test_gloo_binds_loopback_only_for_a_loopback_rendezvous() -> None:
    # A default (relaunch's `defaults`): a GLOO_SOCKET_IFNAME the user set stays.
    assert gloo_env("127.0.0.1") == {"GLOO_SOCKET_IFNAME": "lo"}
    assert gloo_env("10.1.2.3") == {}


def test_torchrun_store_gets_a_listener_bound_to_the_master_address() -> None:
    made: list[tuple[Any, ...]] = []

    class FakeStore:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append((args, kwargs))

    make = torchrun._bound_tcp_store(FakeStore)
    make("127.0.0.1", 0, 2, True, multi_tenant=True)
    make("127.0.0.1", 1234, 2, False)
    (master_args, master_kwargs), (_, client_kwargs) = made
    fd = master_kwargs["master_listen_fd"]
    with socket.socket(fileno=fd) as sock:  # the store would own it; here the test closes it
        assert sock.getsockname()[0] == "127.0.0.1"
        assert os.get_inheritable(fd) is False
    assert master_args[3] is True and master_kwargs["multi_tenant"] is True
    assert "master_listen_fd" not in client_kwargs  # a client listens on nothing
