"""A multi-rank or multi-node case's figures are the world's, not rank 0's (issue 24.7): memory the worst
rank's, throughput the slowest rank's (the world's pace), evidence every rank's."""

from __future__ import annotations

import pytest
from test_multinode_units import CASE, node_doc, run

from qualify.execution.multinode import merge_node_docs
from qualify.workloads import protocol
from qualify.workloads.train.ranks import merge_rank_results


def rank_doc(rank: int, *, tps: float, mem: int, graphs: int | None = 3, layers: int | None = None) -> dict:
    env = {"world_size": 4, "zero_stage": 2, "dtype": "bf16", "model": "tiny-llama", "rank": rank,
           "activation_memory_bytes": mem // 10}
    if graphs is not None:
        env["compile_graphs"] = graphs
    if layers is not None:
        env["checkpointed_layers"] = layers
    return protocol.make_result(CASE, "passed", environment=env, samples={"tokens_per_s": [tps, tps * 1.01]},
                                metrics={"tokens_per_s": tps, "tokens_per_s_per_device": tps / 4, "mfu": tps / 1e4,
                                         "peak_memory_bytes": mem, "tokens_per_step": 4096, "repeats": 2,
                                         "step_time_s_median": 4096 / tps})


@pytest.mark.parametrize("worst", [0, 1, 2, 3])
def test_memory_is_the_worst_rank_and_throughput_the_slowest(worst: int) -> None:
    docs = {r: rank_doc(r, tps=200.0 if r == worst else 400.0, mem=9_000 if r == worst else 1_000)
            for r in range(4)}
    out = merge_rank_results(docs, expected=[0, 1, 2, 3], launcher_exit_code=0)
    m = out["metrics"]
    assert out["status"] == "passed"
    assert m["peak_memory_bytes"] == 9_000 and m["tokens_per_s"] == 200.0 and m["mfu"] == pytest.approx(0.02)
    assert m["step_time_s_median"] == pytest.approx(4096 / 200.0)
    assert out["samples"]["tokens_per_s"][0] == 200.0 and out["environment"]["throughput_rank"] == str(worst)
    assert out["environment"]["rank_figures"]["peak_memory_bytes"][str(worst)] == 9_000


@pytest.mark.parametrize("eager", [0, 3])
def test_evidence_is_checked_on_every_rank(eager: int) -> None:
    docs = {r: rank_doc(r, tps=400.0, mem=1_000, graphs=0 if r == eager else 3, layers=None if r == eager else 4)
            for r in range(4)}
    env = merge_rank_results(docs, expected=[0, 1, 2, 3], launcher_exit_code=0)["environment"]
    assert env["compile_graphs"] == 0 and env["checkpointed_layers"] is None


def test_nodes_merge_to_the_world_figures() -> None:
    fast, slow = node_doc({0: ("passed", None), 1: ("passed", None)}), node_doc({2: ("passed", None),
                                                                                 3: ("passed", None)})
    fast["metrics"].update(tokens_per_s=400.0, peak_memory_bytes=1_000)
    fast["environment"]["compile_graphs"] = 3
    slow["metrics"].update(tokens_per_s=250.0, peak_memory_bytes=7_000)
    slow["environment"]["compile_graphs"] = 0
    doc = merge_node_docs(CASE, [run(0, fast), run(1, slow)], devices=2, rendezvous=None)
    assert doc["status"] == "passed"
    assert (doc["metrics"]["tokens_per_s"], doc["metrics"]["peak_memory_bytes"]) == (250.0, 7_000)
    assert doc["environment"]["compile_graphs"] == 0
    assert protocol.validate_result(doc) == []


def test_one_rank_keeps_its_own_figures() -> None:
    out = merge_rank_results({0: rank_doc(0, tps=300.0, mem=5)}, expected=[0], launcher_exit_code=0)
    assert out["metrics"]["tokens_per_s"] == 300.0 and "rank_figures" not in out["environment"]
