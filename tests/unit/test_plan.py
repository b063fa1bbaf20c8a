"""The planner (qualify plan): the lower bound's formula, longest-first placement with gangs on distinct
nodes, shapes no node can hold, and the 25.05 release's matrix on 4 x 8 GPUs against its bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.paths import REPO

from qualify.manifest.cases import expand
from qualify.manifest.load import load_manifest
from qualify.plan import CaseDemand, ClusterShape, demand_of, lower_bound, schedule, shape_problem

SHAPE = ClusterShape(nodes=2, gpus_per_node=8, cpus_per_node=64)


def demand(case_id: str, seconds: float, gpus: float = 8, cpus: float = 8, nodes: int = 1) -> CaseDemand:
    return CaseDemand(case_id, seconds, "estimate", nodes, gpus, cpus)


def test_lower_bound_is_the_larger_of_the_longest_case_and_the_work_over_capacity() -> None:
    # GPU work 3 x 8 x 100 = 2,400 GPU-s over 16 GPUs = 150 s > the longest case (100 s).
    assert lower_bound([demand("a", 100), demand("b", 100), demand("c", 100)], SHAPE) == pytest.approx(150.0)
    # One long case dominates: 500 s > (8 x 500 + 8 x 10) / 16 = 255 s.
    assert lower_bound([demand("a", 500), demand("b", 10)], SHAPE) == pytest.approx(500.0)
    # CPU-bound: 2 cases x 64 CPUs x 100 s / 128 CPUs = 100 s; 4 of them 200 s although GPUs are idle.
    cpu_heavy = [demand(f"c{k}", 100, gpus=0, cpus=64) for k in range(4)]
    assert lower_bound(cpu_heavy, SHAPE) == pytest.approx(200.0)


def test_the_longest_case_starts_first_even_when_listed_last() -> None:
    plan = schedule([demand("short1", 10), demand("short2", 10), demand("short3", 10), demand("long", 100)],
                    ClusterShape(nodes=1, gpus_per_node=8, cpus_per_node=64))
    starts = {p.demand.case_id: p.start_s for p in plan.cases}
    assert starts["long"] == 0.0 and plan.makespan_s == pytest.approx(130.0)
    assert plan.cases[0].demand.case_id == "long"


def test_a_gang_takes_distinct_nodes_at_once() -> None:
    plan = schedule([demand("gang", 50, gpus=8, nodes=2), demand("one", 50, gpus=4)], SHAPE)
    gang = next(p for p in plan.cases if p.demand.case_id == "gang")
    assert len(set(gang.node_indices)) == 2
    one = next(p for p in plan.cases if p.demand.case_id == "one")
    assert one.start_s == pytest.approx(50.0)  # both nodes are full while the gang runs


def test_a_gang_no_node_can_hold_is_refused_with_the_shape_that_would_fit() -> None:
    why = shape_problem(demand("big", 10, gpus=16, cpus=64, nodes=1), ClusterShape(4, 8, 64))
    assert why is not None and "nodes: 2" in why and "8 GPUs" in why
    plan = schedule([demand("big", 10, gpus=16, cpus=64)], ClusterShape(4, 8, 64))
    assert plan.cases == () and plan.refused[0][0] == "big"
    assert shape_problem(demand("wide", 10, nodes=5), ClusterShape(4, 8, 64)) == "needs 5 nodes; the cluster has 4"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 1000), st.sampled_from([0, 1, 2, 4, 8]), st.sampled_from([1, 8, 32]),
                          st.sampled_from([1, 2])), min_size=1, max_size=25))
def test_no_node_is_ever_over_its_capacity_and_every_case_runs_once(rows: list[tuple[float, int, int, int]]) -> None:
    shape = ClusterShape(nodes=3, gpus_per_node=8, cpus_per_node=32)
    demands = [demand(f"c{k}", s, gpus=g, cpus=c, nodes=n) for k, (s, g, c, n) in enumerate(rows)]
    plan = schedule(demands, shape)
    assert len(plan.cases) == len(demands)
    times = sorted({p.start_s for p in plan.cases})
    for t in times:
        for node in range(shape.nodes):
            live = [p for p in plan.cases if p.start_s <= t < p.end_s and node in p.node_indices]
            assert sum(p.demand.gpus_per_node for p in live) <= shape.gpus_per_node + 1e-9
            assert sum(p.demand.cpus_per_node for p in live) <= shape.cpus_per_node + 1e-9
    assert plan.makespan_s >= plan.lower_bound_s - 1e-6


def test_the_25_05_matrix_on_four_eight_gpu_nodes_is_within_15_percent_of_its_bound() -> None:
    cases = expand(load_manifest(Path(REPO) / "releases" / "training-xpu-pytorch-25.05.yaml").release)
    plan = schedule([demand_of(c) for c in cases], ClusterShape(nodes=4, gpus_per_node=8, cpus_per_node=64))
    assert plan.refused == () and len(plan.cases) == len(cases)
    assert plan.ratio is not None and plan.ratio <= 1.15, (plan.makespan_s, plan.lower_bound_s)


def test_history_beats_the_estimate() -> None:
    case = expand(load_manifest(Path(REPO) / "releases" / "cpu-smoke.yaml").release)[0]
    assert demand_of(case, {case.case_id: 42.0}).duration_s == 42.0
    assert demand_of(case, {case.case_id: 42.0}).source == "history"
    assert demand_of(case).source == "estimate"


def test_the_flow_submits_in_the_plans_own_order_bigger_gangs_first_among_equals() -> None:
    """attempts.pending_cases hands cases to Ray in plan.submission_order; it must be the order schedule() planned
    (the 2-node cases of 25.05 were planned before the 1-GPU ones of the same estimate, and submitted after them)."""
    from qualify.manifest.cases import expand
    from qualify.manifest.load import load_manifest
    from qualify.plan import ClusterShape, demand_of, schedule, submission_order

    cases = expand(load_manifest(REPO / "releases" / "training-xpu-pytorch-25.05.yaml").release)
    plan = schedule([demand_of(c) for c in cases], ClusterShape(4, 8, 64))
    planned = [p.demand.case_id for p in sorted(plan.cases, key=lambda p: p.order)]
    assert [c.case_id for c in submission_order(cases)] == planned
    deepseek = [planned.index(c) for c in planned if c.startswith("infer/deepseek-r1/")]
    small = [planned.index(c) for c in planned if c.startswith("infer/qwen3-8b/")]
    assert max(deepseek) < min(small)


def test_a_case_measured_beside_another_image_is_planned_as_it_runs() -> None:
    """Paired: both sides' launches one after the other (twice the estimate); duet: one task holding both sides (twice
    the resources), or paired where no node of the shape can hold both, as the runner falls back; a case nothing
    re-measures is alone. A measured duration already includes its other side."""
    from support.gate import release as make_release

    from qualify.plan import pairing_of

    reference = {"image": "127.0.0.1:5000/std/p@sha256:" + "ab" * 32, "python": "/opt/std/bin/python",
                 "min_gain": 0.1, "cases": "train/*/base"}
    rel = make_release(gate_extra={"reference": {**reference, "mode": "duet"}})
    cases = {c.case_id: c for c in expand(rel)}
    ref, own = cases["reference/train/tiny/base"], cases["train/tiny/base"]
    wide = ClusterShape(nodes=1, gpus_per_node=8, cpus_per_node=64)
    narrow = ClusterShape(nodes=1, gpus_per_node=8, cpus_per_node=ref.resources.cpus)  # one side's CPUs only
    assert pairing_of(rel, own, wide) == "alone"  # history mode: the previous release is not re-measured
    assert pairing_of(rel, ref, wide) == "duet" and pairing_of(rel, ref, narrow) == "paired"
    alone, duet, paired = (demand_of(ref, None, p) for p in ("alone", "duet", "paired"))
    assert (duet.cpus_per_node, duet.duration_s) == (2 * alone.cpus_per_node, alone.duration_s)
    assert (paired.cpus_per_node, paired.duration_s) == (alone.cpus_per_node, 2 * alone.duration_s)
    assert demand_of(ref, {ref.case_id: 42.0}, "paired").duration_s == 42.0
    paired_rel = make_release(gate_extra={"reference": reference, "regression": {"baseline": "paired"}})
    assert pairing_of(paired_rel, next(c for c in expand(paired_rel) if c.case_id == "train/tiny/base")) == "paired"
