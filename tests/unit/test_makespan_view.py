"""The report's schedule line (report/makespan.py): the achieved makespan against the lower bound of the cluster
the run recorded, with each case's measured seconds and manifest resources."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from qualify.report.makespan import makespan_view


def _case(case_id: str, cpus: float, gpus: float = 0.0, nodes: int = 1) -> SimpleNamespace:
    return SimpleNamespace(case_id=case_id, resources=SimpleNamespace(cpus=cpus, gpus=gpus, nodes=nodes))


def test_the_bound_is_resource_seconds_over_capacity_or_the_longest_case() -> None:
    cases = [_case("train/a", 2), _case("train/b", 2), _case("infer/c", 1), _case("infer/d", 1)]
    exec_s = {"train/a": 20.0, "train/b": 10.0, "infer/c": 8.0, "infer/d": 12.0}
    view = makespan_view(cases, exec_s, {"nodes": [{"CPU": 2.0, "GPU": 0.0}]}, {"cases": 55.0})
    assert view is not None
    assert view.lower_bound_s == pytest.approx((2 * 20 + 2 * 10 + 8 + 12) / 2)  # 40 CPU-seconds per CPU
    assert view.ratio == pytest.approx(55.0 / 40.0)
    assert "ratio 1.38" in view.line() and "1 node," in view.line()
    # Two such nodes: the CPU term halves and the longest case (20 s) bounds it.
    two = makespan_view(cases, exec_s, {"nodes": [{"CPU": 2.0}, {"CPU": 2.0}]}, {"cases": 30.0})
    assert two is not None and two.lower_bound_s == pytest.approx(20.0)


def test_gpu_gangs_count_every_node_they_hold() -> None:
    cases = [_case("infer/big", cpus=64, gpus=16, nodes=2), _case("infer/small", cpus=8, gpus=1)]
    nodes = [{"CPU": 64.0, "GPU": 8.0}] * 4
    view = makespan_view(cases, {"infer/big": 100.0, "infer/small": 50.0}, {"nodes": nodes}, {"cases": 110.0})
    assert view is not None and view.lower_bound_s == pytest.approx(100.0)  # the longest case; GPUs: 1650/32
    many = [_case(f"infer/big{k}", cpus=64, gpus=16, nodes=2) for k in range(8)]
    view = makespan_view(many, {c.case_id: 100.0 for c in many}, {"nodes": nodes}, {"cases": 400.0})
    assert view is not None and view.lower_bound_s == pytest.approx(8 * 16 * 100 / 32)


def test_no_cluster_no_stage_or_no_case_time_means_no_line() -> None:
    cases = [_case("a", 1)]
    assert makespan_view(cases, {"a": 1.0}, None, {"cases": 3.0}) is None
    assert makespan_view(cases, {"a": 1.0}, {"nodes": [{"CPU": 1}]}, {}) is None
    assert makespan_view(cases, {"a": None}, {"nodes": [{"CPU": 1}]}, {"cases": 3.0}) is None
