"""Where a launch's time goes (workloads/phases.py), summed per case (execution/launches.sum_phases) and per
run into the measurement efficiency (report/efficiency.py)."""

from __future__ import annotations

import os

import pytest

from qualify.execution.launches import attach_pairing, merge_launches, sum_phases
from qualify.report.efficiency import launch_time
from qualify.workloads import phases


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_phase_gets_the_seconds_until_the_next_one_and_a_repeated_phase_adds_up() -> None:
    clock = FakeClock()
    pc = phases.PhaseClock(clock)
    pc.start(already_s=0.8)  # the interpreter, before the protocol's entry
    clock.now += 2.0
    pc.enter("model_build")
    clock.now += 1.5
    pc.enter("warmup")
    clock.now += 0.5
    pc.enter(phases.MEASURE)
    clock.now += 3.0
    pc.enter("report")
    clock.now += 0.25
    pc.enter(phases.MEASURE)
    clock.now += 1.0
    assert pc.finish() == {"start": 0.8, "imports": 2.0, "model_build": 1.5, "warmup": 0.5, "measure": 4.0,
                           "report": 0.25}


def test_an_unknown_phase_is_refused_rather_than_silently_uncounted() -> None:
    with pytest.raises(ValueError, match="unknown phase"):
        phases.PhaseClock().enter("measuring")


def test_the_process_age_is_read_from_the_kernel_and_is_plausible() -> None:
    age = phases.process_age_s()
    if not os.path.exists("/proc/self/stat"):
        assert age is None
        return
    assert age is not None and 0.0 <= age < 24 * 3600


def _launch(measure: float, imports: float, wall: float) -> dict:
    return {"status": "passed", "metrics": {"tokens_per_s": 10.0}, "samples": {},
            "environment": {"phases": {"imports": imports, "measure": measure}}, "duration_s": wall}


def test_a_case_sums_its_launches_phases_and_books_the_rest_of_each_launch_to_the_executor() -> None:
    docs = [_launch(1.0, 3.0, 5.0), _launch(2.0, 4.0, 6.5)]
    merged = merge_launches(docs, [5.0, 6.5])
    env = merged["environment"]
    assert env["phases"] == {"imports": 7.0, "measure": 3.0, "executor": 1.5}
    assert [launch["phases"]["measure"] for launch in env["launches"]] == [1.0, 2.0]


def test_launches_without_phases_report_none_rather_than_an_invented_executor_share() -> None:
    assert sum_phases([{"duration_s": 4.0, "phases": None}, {"duration_s": 2.0}]) == {}


def test_the_efficiency_is_measurement_over_the_cases_wall_and_counts_the_baseline_side() -> None:
    merged = merge_launches([_launch(1.0, 3.0, 5.0), _launch(1.0, 3.0, 5.0)], [5.0, 5.0])
    merged = attach_pairing(merged, [_launch(0.5, 3.0, 4.0), _launch(0.5, 3.0, 4.0)], [4.0, 4.0],
                            order=["A0", "B0", "B1", "A1"], label="0.0", problem=None)
    other = {"phases": {"imports": 1.0, "measure": 2.0}}
    spent = launch_time([merged["environment"], other, None], {"cases": 20.0, "gate": 1.0})
    assert spent.measure_s == pytest.approx(2.0 + 1.0 + 2.0)
    assert spent.efficiency == pytest.approx(5.0 / 20.0)
    assert "measurement efficiency 0.25" in spent.line()
    assert spent.phases["imports"] == pytest.approx(6.0 + 6.0 + 1.0)


def test_no_phases_or_no_cases_stage_means_no_efficiency_not_zero() -> None:
    assert launch_time([{"phases": {"measure": 1.0}}], {}).efficiency is None
    assert launch_time([{}], {"cases": 10.0}).efficiency is None
    assert "n/a" in launch_time([{}], {"cases": 10.0}).line()


def test_a_later_inference_launch_times_the_engine_and_repeats_only_the_degenerate_probe(monkeypatch) -> None:
    """The first launch evaluates the agreement and every probe; later launches (deterministic probes on the
    same weights and data) keep only the check of their own outputs. The engine is a recorder here: this test
    is about what the handler asks of an engine, and the engines' own tests run them."""
    import logging

    from qualify.workloads.infer import runner

    asked = []

    class Recorder:
        @staticmethod
        def run(p, log):
            asked.append(p)
            return {"metrics": {"output_tokens_per_s": 10.0}, "samples": {}, "probes": {}, "environment": {}}

    monkeypatch.setattr(runner, "get_engine", lambda name: Recorder)
    params = {"model": "tiny-qwen3", "scheme": "none", "probes": ["prefix_cache", "max_model_len", "degenerate"]}
    for index in (0, 1, 2):
        runner.handler({"params": params, "launch": {"index": index, "of": 3}}, logging.getLogger("t"))
    assert [p.evaluate_agreement for p in asked] == [True, False, False]
    assert asked[0].probes == ("prefix_cache", "max_model_len", "degenerate")
    assert asked[1].probes == asked[2].probes == runner.EVERY_LAUNCH_PROBES == ("degenerate",)

