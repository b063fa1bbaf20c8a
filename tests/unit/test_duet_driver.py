"""Duet, driver side (execution.duet) and its gate check: the two sides' resources, the swaps between launch
pairs, the merged document, sampling until decided, and the fallback to paired with the reason. The launches
here are functions (unit tests start no process): tests/integration/test_duet_e2e.py runs real ones on Ray.
GPU ids are made up in these tests (no GPU here): only the split of a task's GPU ids is tested."""

from __future__ import annotations

import math
import random
import threading
import time
from typing import Any, Sequence

import pytest

from qualify.execution import duet
from qualify.manifest.cases import expand
from qualify.gate.checks import ResultData, check_regression
from qualify.manifest import Resources
from support.gate import release as make_release

pytestmark = pytest.mark.unit

DUET = {"regression": {"baseline": "duet", "max_regression": 0.05, "alpha": 0.05, "min_samples": 3}}
CASE = {"case_id": "train/tiny/base", "kind": "train", "params": {}, "launches": 3}


def test_two_sides_get_disjoint_cores_and_gpus() -> None:
    plan = duet.plan_sides([0, 1, 2, 3, 4, 5, 6, 7], 4, [f"gpu{i}" for i in range(16)], 8)  # made-up GPU ids
    assert isinstance(plan, duet.SidePlan)
    assert plan.cpus == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert plan.gpus[0] == tuple(f"gpu{i}" for i in range(8)) and plan.gpus[1] == tuple(f"gpu{i}" for i in range(8, 16))
    assert duet.plan_sides([0, 1], 0.5).cpus == ((0,), (1,))  # type: ignore[union-attr]


@pytest.mark.parametrize("cpus, per_side, gpus, gpus_per_side, why", [
    ([0, 1], 2, [], 0, "two sides of 2 core(s) each do not fit"),
    ([0, 1, 2, 3], 1, ["g0"] * 8, 8, "8 GPU(s): two sides of 8 do not fit"),  # an 8-GPU case needs 16
    ([0, 1, 2, 3], 1, ["g0"], 0.5, "fractional GPU"),
])
def test_a_task_that_cannot_hold_both_sides_says_why(cpus, per_side, gpus, gpus_per_side, why) -> None:
    reason = duet.plan_sides(cpus, per_side, gpus, gpus_per_side)
    assert isinstance(reason, str) and why in reason


def test_the_duet_task_holds_both_sides() -> None:
    both = duet.doubled(Resources(cpus=2, gpus=8, memory_gb=10, custom={"hpu": 1}))
    assert (both.cpus, both.gpus, both.memory_gb, both.custom) == (4, 16, 20, {"hpu": 2})


class Sides:
    """Two fake workloads that meet like the real ones: each records its cpu set, GPUs and when it started."""

    def __init__(self, cand_step: float = 0.011, base_step: float = 0.010, side_bias: float = 0.0,
                 fail_base_at: int | None = None, steps: int = 8, pair_sd: float = 0.0,
                 neighbour_on_side: dict[int, int] | None = None) -> None:
        self.cand_step, self.base_step, self.side_bias = cand_step, base_step, side_bias
        # {pair: side}: a neighbour process shares that side's core in that pair (half of each step waits)
        self.neighbour_on_side = neighbour_on_side or {}
        self.fail_base_at, self.steps, self.pair_sd = fail_base_at, steps, pair_sd
        self.calls: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def launch(self, who: str):
        def run(doc: dict[str, Any], gpus: Sequence[str]) -> tuple[dict[str, Any], float]:
            section = doc["duet"]
            with self.lock:
                self.calls.append({"who": who, "pair": doc["launch"]["index"], "side": section["side"],
                                   "cpus": section["cpus"], "gpus": list(gpus), "at": time.monotonic()})
            if who == "base" and doc["launch"]["index"] == self.fail_base_at:
                return {"status": "error", "error_class": "crash", "error": "segfault"}, 0.1
            step = (self.cand_step if who == "cand" else self.base_step)
            step *= (1 + self.side_bias) if section["side"] == 0 else 1.0
            rng = random.Random(f"{who}{doc['launch']['index']}")
            step *= rng.lognormvariate(0, self.pair_sd)  # a process-level effect of this launch
            times = [step * rng.lognormvariate(0, 0.002) for _ in range(self.steps)]
            runq = [0.0002 * t for t in times]  # background daemons: well under the clean share
            if self.neighbour_on_side.get(doc["launch"]["index"]) == section["side"]:
                runq = [t for t in times]  # waited as long again for a CPU
                times = [2 * t for t in times]
            time.sleep(0.02)
            return {"status": "passed", "metrics": {"tokens_per_s": 1 / statistics_median(times)},
                    "samples": {"step_time_s": times}, "environment": {"python": "3.11", "duet": {
                        "side": section["side"], "step_starts": [1000.0 + k for k in range(self.steps)],
                        "runq_wait_s": runq, "busy_wait": True}},
                    "duration_s": 0.1}, 0.1
        return run


def statistics_median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


PLAN = duet.SidePlan(cpus=((0,), (1,)), gpus=(("g0",), ("g1",)))


def test_both_sides_run_at_once_and_swap_cores_between_launch_pairs() -> None:
    sides = Sides()
    merged = duet.run_duet(CASE, CASE, PLAN, sides.launch("cand"), sides.launch("base"), label="prev", timeout_s=60)
    cand = [c for c in sides.calls if c["who"] == "cand"]
    base = [c for c in sides.calls if c["who"] == "base"]
    assert len(cand) == len(base) == 4  # 3 launches rounded up to an even number, at least 4
    assert [c["side"] for c in sorted(cand, key=lambda c: c["pair"])] == [0, 1, 0, 1]
    for c in cand:
        b = next(x for x in base if x["pair"] == c["pair"])
        assert b["side"] == 1 - c["side"] and b["cpus"] != c["cpus"] and b["gpus"] != c["gpus"]
        assert abs(b["at"] - c["at"]) < 0.5  # started together (the barrier aligns the steps themselves)
    record = merged["environment"]["duet"]
    assert [p["candidate_side"] for p in record["pairs"]] == [0, 1, 0, 1]
    assert [p["candidate_cpus"] for p in record["pairs"]] == [[0], [1], [0], [1]]
    assert merged["samples"][duet.CANDIDATE_SIDE] == [0.0, 1.0, 0.0, 1.0]
    assert len(merged["samples"][duet.LOG_RATIO]) == 32
    assert merged["samples"]["paired_baseline.per_launch.tokens_per_s"]  # the baseline side, as for paired
    blocks = duet.blocks_from_samples(merged["samples"])
    assert len(blocks) == 4 and all(len(b.log_ratios) == 8 for b in blocks)
    assert math.exp(blocks[0].summary) == pytest.approx(1.1, rel=0.02)


@pytest.mark.parametrize("params, min_steps, steps", [
    ({"steps": 6, "repeats": 1}, 32, 32),     # raised to the duet's minimum
    ({"steps": 6, "repeats": 2}, 32, 16),     # steps x repeats, not steps alone
    ({"steps": 5, "repeats": 3}, 32, 12),     # 11 x 3 = 33 is odd: the traded units are two steps
    ({"steps": 40, "repeats": 1}, 32, 40),    # a case that times more keeps its own
    ({"steps": 6}, 0, 6),                     # 0: the case's own steps
])
def test_a_duet_launch_times_at_least_the_duet_steps(params, min_steps, steps) -> None:  # type: ignore[no-untyped-def]
    doc = {**CASE, "params": params}
    out = duet.with_duet_steps(doc, min_steps)
    assert out["params"]["steps"] == steps
    assert doc["params"] == params  # the case's own document is left alone
    assert duet.with_duet_steps({**CASE, "params": {"samples": {"x": [1.0]}}}, 32)["params"] == {"samples": {"x": [1.0]}}


@pytest.mark.parametrize("params, min_steps, repeats", [
    ({"num_prompts": 8, "repeats": 3}, 24, 3),    # 8 requests x 3 repeats: already 24
    ({"num_prompts": 8, "repeats": 1}, 24, 3),    # more repeats of the same requests
    ({"num_prompts": 5, "repeats": 2}, 24, 6),    # 5 x 5 = 25 is odd: one more repeat
    ({}, 40, 5),                                  # the workload's defaults: 8 prompts, 3 repeats
    ({"num_prompts": 8, "repeats": 9}, 24, 9),    # a case that times more keeps its own
])
def test_an_inference_duet_launch_times_more_repeats_of_the_same_requests(params, min_steps, repeats
                                                                          ) -> None:  # type: ignore[no-untyped-def]
    doc = {"kind": "infer", "params": params}
    out = duet.with_duet_steps(doc, min_steps)
    assert out["params"].get("repeats", 3) == repeats
    assert out["params"].get("num_prompts", 8) == params.get("num_prompts", 8)  # the prompts stay the case's
    assert duet.timed_steps(out) == repeats * params.get("num_prompts", 8)
    assert doc["params"] == params


def test_both_sides_of_a_duet_run_the_duet_steps_and_the_record_says_so() -> None:
    sides = Sides()
    policy = duet.DuetPolicy(max_regression=0.05, alpha=0.05, max_pairs=4, min_steps=20)
    case = {**CASE, "params": {"steps": 6, "repeats": 1}}
    seen: list[int] = []

    def counting(launch):  # type: ignore[no-untyped-def]
        def run(doc, gpus):  # type: ignore[no-untyped-def]
            seen.append(doc["params"]["steps"])
            return launch(doc, gpus)
        return run

    merged = duet.run_duet(case, case, PLAN, counting(sides.launch("cand")), counting(sides.launch("base")),
                           label="prev", timeout_s=60, policy=policy)
    assert seen and set(seen) == {20}  # the candidate's and the baseline's launches alike
    record = merged["environment"]["duet"]
    assert (record["timed_steps_per_launch"], record["case_timed_steps"]) == (20, 6)


def test_the_manifests_duet_steps_reach_the_duet_policy() -> None:
    rel = make_release(gate_extra={"regression": {**DUET["regression"], "duet_steps": 48}})
    [case, *_] = expand(rel)
    policy = duet.duet_choice(rel, case, infeasible=lambda r: None)
    assert isinstance(policy, duet.DuetPolicy) and policy.min_steps == 48


def test_a_failing_baseline_ends_the_duet_with_the_reason() -> None:
    sides = Sides(fail_base_at=1)
    merged = duet.run_duet(CASE, CASE, PLAN, sides.launch("cand"), sides.launch("base"), label="prev", timeout_s=60)
    assert merged["status"] == "passed"
    assert "segfault" in merged["environment"]["duet"]["reason"]
    assert duet.LOG_RATIO not in merged["samples"]


def test_an_undecided_duet_runs_more_pairs_up_to_its_budget() -> None:
    # 3% slower with 3% launch-to-launch noise against a 5% tolerance: undecided, so pairs are added two at a
    # time, up to the budget.
    sides = Sides(cand_step=0.0103, pair_sd=0.03)
    policy = duet.DuetPolicy(max_regression=0.05, alpha=0.05, max_pairs=8)
    merged = duet.run_duet(CASE, CASE, PLAN, sides.launch("cand"), sides.launch("base"), label="prev",
                           timeout_s=60, policy=policy)
    from qualify.gate.duet_stats import DuetCall, decide, duet_interval

    ran = len(merged["environment"]["duet"]["pairs"])
    assert ran in (6, 8)  # two at a time
    from qualify.gate.duet_stats import Looks

    looks = Looks.for_planned(4)
    first4 = duet.blocks_from_samples(merged["samples"])[:4]
    assert decide(duet_interval(first4, alpha=looks.alpha_at(4, 0.05)), 0.05) == DuetCall.UNDECIDED  # why more ran
    blocks = duet.blocks_from_samples(merged["samples"])
    final = decide(duet_interval(blocks, alpha=looks.alpha_at(len(blocks), 0.05)), 0.05)
    assert ran == 8 or final != DuetCall.UNDECIDED  # stopped when decided, else at the budget
    decided = Sides(cand_step=0.010)  # identical: decided (PASS) after the planned 4
    merged = duet.run_duet(CASE, CASE, PLAN, decided.launch("cand"), decided.launch("base"), label="prev",
                           timeout_s=60, policy=policy)
    assert len(merged["environment"]["duet"]["pairs"]) == 4


def test_a_pair_with_a_neighbour_on_a_sides_core_is_left_out_and_replaced() -> None:
    # A neighbour process shares the baseline's core in pair 1 (its steps wait for a CPU half the time): that pair
    # would say the candidate is much faster. It is left out, with the reason, and the looks run more pairs.
    sides = Sides(cand_step=0.011, neighbour_on_side={1: 0})  # pair 1: candidate on side 1, baseline on side 0
    policy = duet.DuetPolicy(max_regression=0.05, alpha=0.05, max_pairs=8)
    merged = duet.run_duet(CASE, CASE, PLAN, sides.launch("cand"), sides.launch("base"), label="prev",
                           timeout_s=60, policy=policy)
    record = merged["environment"]["duet"]
    left_out = [p for p in record["pairs"] if p["problem"]]
    assert [p["index"] for p in left_out] == [1]
    assert left_out[0]["disturbed_units"] == 8 and "neighbour" in left_out[0]["problem"]
    assert len(record["pairs"]) >= 6  # three usable pairs after four: the look was undecided, two more ran
    blocks = duet.blocks_from_samples(merged["samples"])
    assert len(blocks) == len(record["pairs"]) - 1
    assert all(math.exp(b.summary) == pytest.approx(1.1, rel=0.02) for b in blocks)  # only clean pairs
    assert record["busy"] is None


def test_a_node_busy_on_most_pairs_stops_the_duet_and_says_so() -> None:
    # A neighbour on a side's core in every pair: no pair is usable; after the planned four the runner stops
    # rather than spend its whole budget on pairs that would be left out too.
    sides = Sides(cand_step=0.010, neighbour_on_side={i: i % 2 for i in range(8)})
    policy = duet.DuetPolicy(max_regression=0.05, alpha=0.05, max_pairs=8)
    merged = duet.run_duet(CASE, CASE, PLAN, sides.launch("cand"), sides.launch("base"), label="prev",
                           timeout_s=60, policy=policy)
    record = merged["environment"]["duet"]
    assert len(record["pairs"]) == 4 and "too busy" in record["busy"]
    assert duet.blocks_from_samples(merged["samples"]) == []


def test_disturbed_steps_are_left_out_of_a_pairs_ratios() -> None:
    def side(times: list[float], runq: list[float] | None) -> dict[str, Any]:
        env = {"duet": {"runq_wait_s": runq}} if runq is not None else {}
        return {"samples": {"step_time_s": times}, "environment": env}

    cand = side([1.1, 2.2, 1.1, 1.1], [0.0, 1.1, 0.0, 0.01])
    base = side([1.0, 1.0, 1.0, 2.0], [0.0, 0.0, 0.0, 1.0])
    got = duet.pair_log_ratios(cand, base)
    assert got.steps == 4 and got.disturbed == 2 and got.problem is None
    assert got.ratios == pytest.approx([math.log(1.1)] * 2)
    # The boundary is the clean share of the step, on each side (a mutated threshold or side fails here).
    edge = duet.CLEAN_RUNQ_SHARE
    assert len(duet.pair_log_ratios(side([1.0], [edge * 0.99]), side([1.0], [0.0])).ratios) == 1
    assert duet.pair_log_ratios(side([1.0], [edge * 1.01]), side([1.0], [0.0])).disturbed == 1
    assert duet.pair_log_ratios(side([1.0], [0.0]), side([1.0], [edge * 1.01])).disturbed == 1
    # Mostly disturbed: the whole pair is left out, and says why.
    bad = duet.pair_log_ratios(side([1.0] * 4, [0.5] * 3 + [0.0]), side([1.0] * 4, [0.0] * 4))
    assert bad.ratios == [] and "3 of 4 steps had a neighbour" in (bad.problem or "")
    # An image whose workload does not measure the wait: every step counts, as before.
    assert len(duet.pair_log_ratios(side([1.1] * 3, None), side([1.0] * 3, None)).ratios) == 3


def test_sides_that_trade_cores_every_step_are_compared_two_steps_at_a_time() -> None:
    # Core 1 is 40% slower than core 0 for this stretch (what the host ran beside it). The candidate is 10%
    # slower; it starts on core 0, the baseline on core 1, and they trade every step.
    def side(times: list[float]) -> dict[str, Any]:
        own = [k % 2 == 0 for k in range(len(times))]
        return {"samples": {"step_time_s": times}, "environment": {"duet": {
            "traded_cores": True, "on_own_cpus": own, "runq_wait_s": [0.0] * len(times)}}}

    core = [1.0, 1.4]
    cand = side([1.1 * core[k % 2] for k in range(8)])
    base = side([1.0 * core[(k + 1) % 2] for k in range(8)])
    got = duet.pair_log_ratios(cand, base)
    assert got.steps == 4 and got.ratios == pytest.approx([math.log(1.1)] * 4)  # the cores' difference cancels
    # Step by step, the ratios would swing between log(1.1/1.4) and log(1.1*1.4): no one of them is the effect.
    untraded = {**base, "environment": {"duet": {"runq_wait_s": [0.0] * 8}}}
    assert duet.pair_log_ratios(cand, untraded).ratios[0] == pytest.approx(math.log(1.1 / 1.4))
    # A neighbour on core 1 (a burner: whoever runs there waits for the CPU half the time, twice as long a step)
    # slows each release on alternate steps: the pair's units cancel it, and nothing is left out for it.
    burned = [0.5 if k % 2 else 0.0 for k in range(8)]
    cand = side([1.1 * core[k % 2] * (2 if k % 2 else 1) for k in range(8)])
    base = side([1.0 * core[(k + 1) % 2] * (1 if k % 2 else 2) for k in range(8)])
    cand["environment"]["duet"]["runq_wait_s"] = [w * t for w, t in zip(burned, cand["samples"]["step_time_s"])]
    base_burned = burned[1:] + [0.0]  # the baseline is on core 1 at even steps
    base["environment"]["duet"]["runq_wait_s"] = [w * t for w, t in zip(base_burned, base["samples"]["step_time_s"])]
    got = duet.pair_log_ratios(cand, base)
    assert got.disturbed == 0 and got.problem is None and got.ratios == pytest.approx([math.log(1.1)] * 4)


def _traded(times: list[float], waits: list[float], others: list[float] | None = None) -> dict[str, Any]:
    report: dict[str, Any] = {"traded_cores": True, "on_own_cpus": [k % 2 == 0 for k in range(len(times))],
                              "runq_wait_s": waits}
    if others is not None:
        report["other_threads_cpu_s"] = others
    return {"samples": {"step_time_s": times}, "environment": {"duet": report}}


def test_traded_units_are_compared_on_the_time_each_step_held_its_cpu() -> None:
    # The candidate's step holds its CPU for 1.1 s, the baseline's for 1.0 s. A burner that the scheduler moves
    # between the two cores lands on the two steps of each unit unevenly: a step it shares waits half its time.
    rng = random.Random(3)
    burned_c = [rng.random() < 0.5 for _ in range(8)]
    burned_b = [rng.random() < 0.5 for _ in range(8)]
    c_t = [1.1 * (2 if x else 1) for x in burned_c]
    b_t = [1.0 * (2 if x else 1) for x in burned_b]
    c_w = [1.1 if x else 0.0 for x in burned_c]
    b_w = [1.0 if x else 0.0 for x in burned_b]
    held = duet.pair_log_ratios(_traded(c_t, c_w, [0.0] * 8), _traded(b_t, b_w, [0.0] * 8))
    assert held.held and held.ratios == pytest.approx([math.log(1.1)] * 4)  # the burner is gone
    # On wall times (a side that did not record its other threads' CPU) the units carry where the burner sat.
    wall = duet.pair_log_ratios(_traded(c_t, c_w), _traded(b_t, b_w, [0.0] * 8))
    assert not wall.held and max(abs(r - math.log(1.1)) for r in wall.ratios) > 0.2


def test_a_wait_the_candidates_own_threads_can_have_caused_is_never_removed() -> None:
    # The candidate's own extra thread computes beside its step on its core: its step waits 0.5 s of 1.5 s for a
    # CPU in every step, and that thread used 0.5 s of CPU meanwhile. The wait is the candidate's cost: it stays.
    own = duet.pair_log_ratios(_traded([1.5] * 8, [0.5] * 8, [0.5] * 8), _traded([1.0] * 8, [0.0] * 8, [0.0] * 8))
    assert own.ratios == pytest.approx([math.log(1.5)] * 4)
    # Only the wait beyond the other threads' CPU is a neighbour's: 0.5 s waited, 0.2 s of it its own threads'.
    assert duet.held_step_times(_traded([1.5], [0.5], [0.2])) == pytest.approx([1.2])
    # Never more than HELD_MAX_REMOVED of a step; malformed records are not used.
    assert duet.held_step_times(_traded([1.0], [5.0], [0.0])) == pytest.approx([1.0 - duet.HELD_MAX_REMOVED])
    assert duet.held_step_times(_traded([1.0], [-1.0], [0.0])) is None
    assert duet.held_step_times(_traded([1.0, 1.0], [0.1], [0.0])) is None


def test_the_driver_gives_cpu_sides_each_others_cores_to_trade_and_gpu_sides_none() -> None:
    cpu = duet._side_doc(CASE, 0, 4, "/d", 1, duet.SidePlan(cpus=((0,), (1,))), 60)
    assert cpu["duet"]["cpus"] == [1] and cpu["duet"]["peer_cpus"] == [0]
    gpu = duet._side_doc(CASE, 0, 4, "/d", 1, PLAN, 60)
    assert "peer_cpus" not in gpu["duet"]


def test_a_node_that_cannot_hold_both_sides_is_measured_paired_with_the_reason() -> None:
    class Exec:
        def __init__(self, tps: float) -> None:
            self.tps = tps

        def describe(self) -> str:
            return "prev-image"

        def run(self, doc, *, timeout_s, gpu_ids=()):  # type: ignore[no-untyped-def]
            assert "duet" not in doc
            return type("Outcome", (), {"doc": {"status": "passed", "metrics": {"tokens_per_s": self.tps},
                                                "environment": {}, "duration_s": 0.1}, "exec_s": 0.1})()

    merged, outcomes = duet.measure(Exec(90.0), Exec(100.0), dict(CASE), dict(CASE), cpus_per_side=2,
                                    gpus_per_side=0, gpu_ids=[], timeout_s=60, policy=None, cpus=[0, 1])
    assert len(outcomes) == 3 and merged["environment"]["paired"]["pairs"] == 3
    record = merged["environment"]["duet"]
    assert record["mode"] == "paired" and "two sides of 2 core(s)" in record["reason"]


def test_the_driver_sends_duet_only_where_it_can_run() -> None:
    args = dict(resources=Resources(cpus=1), case_doc=CASE, max_regression=0.05, alpha=0.05)
    assert isinstance(duet.driver_choice("train", "local", infeasible=lambda r: None, **args), duet.DuetPolicy)
    no_room = duet.driver_choice("train", "local", infeasible=lambda r: f"needs CPU={r.cpus:g}", **args)
    assert isinstance(no_room, str) and "no node can hold both sides (needs CPU=2)" in no_room
    # Inference: the transformers engine's requests are the duet's steps; vLLM batches in its own process.
    infer = {"kind": "infer", "params": {"engine": "transformers", "scheme": "int8_weight_only"}}
    assert isinstance(duet.driver_choice("infer", "local", infeasible=lambda r: None,
                                         **{**args, "case_doc": infer}), duet.DuetPolicy)
    assert isinstance(duet.driver_choice("infer", "local", infeasible=lambda r: None,
                                         **{**args, "case_doc": {"kind": "infer", "params": {}}}), duet.DuetPolicy)
    vllm = duet.driver_choice("infer", "local", infeasible=lambda r: None,
                              **{**args, "case_doc": {"kind": "infer", "params": {"engine": "vllm"}}})
    assert isinstance(vllm, str) and "the vllm inference engine has no duet hook" in vllm and "paired" in vllm
    assert "no duet hook" in duet.driver_choice("probe", "local", infeasible=lambda r: None, **args)
    # The container executor mounts the barrier folder into each side's container: duet there too.
    assert isinstance(duet.driver_choice("train", "container", infeasible=lambda r: None, **args), duet.DuetPolicy)


def _duet_result(effect: float, pairs: int = 4, block_sd: float = 0.005, seed: int = 0,
                 plan: tuple[int, int] | None = (4, 8)) -> ResultData:
    rng = random.Random(seed)
    ratios, pair, sides = [], [], []
    for i in range(pairs):
        shared = rng.gauss(0, block_sd)
        for _ in range(20):
            ratios.append(math.log1p(effect) + shared + rng.gauss(0, 0.01))
            pair.append(float(i))
        sides.append(float(i % 2))
    return ResultData(case_id="train/tiny/base", kind="train", status="passed", metrics={"tokens_per_s": 100.0},
                      samples={duet.LOG_RATIO: ratios, duet.PAIR: pair, duet.CANDIDATE_SIDE: sides},
                      environment={"duet": {"baseline": "prev", "mode": "duet", "reason": None,
                                            **({"pairs_planned": plan[0], "pairs_budget": plan[1]} if plan else {})}})


def test_the_gate_judges_a_duet_case() -> None:
    rel = make_release(gate_extra=DUET)
    case = next(c for c in expand(rel) if c.case_id == "train/tiny/base")

    def judge(result: ResultData) -> list:
        return [r for r in check_regression(rel.gate, [case], {case.case_id: result}, None, "")
                if r.check == "regression"]

    [same] = judge(_duet_result(0.0))
    assert same.status == "PASS" and same.figures["design"] == "duet" and same.figures["n"] == 4
    assert "side bias" in same.message
    [slow] = judge(_duet_result(0.10))
    assert slow.status == "FAIL" and "regression shown: even the best end is beyond -5%" in slow.message
    [edge] = judge(_duet_result(0.03, block_sd=0.03))
    assert edge.status == "INCOMPLETE" and "undecided" in edge.message
    assert "80 synchronized steps" in same.message
    traded = _duet_result(0.0)
    traded.environment["duet"]["pairs"] = [{"index": i, "traded_cores": True, "problem": None} for i in range(4)]
    [same_traded] = judge(traded)
    assert same_traded.status == "PASS" and "80 two-step units on traded cores" in same_traded.message
    # Measured paired (the node could not hold both sides): judged pair by pair, the reason said.
    fallback = ResultData(case_id=case.case_id, kind="train", status="passed", metrics={"tokens_per_s": 90.0},
                          samples={"per_launch.tokens_per_s": [90.0, 63.0, 117.0],
                                   "paired_baseline.per_launch.tokens_per_s": [100.0, 70.0, 130.0]},
                          environment={"paired": {"baseline": "prev", "order": [], "reason": None},
                                       "duet": {"mode": "paired", "reason": "no node can hold both sides"}})
    [paired] = judge(fallback)
    assert paired.status == "FAIL" and "no node can hold both sides" in paired.message


def test_a_duet_whose_pairs_were_all_disturbed_is_incomplete_not_judged_as_paired() -> None:
    rel = make_release(gate_extra=DUET)
    case = next(c for c in expand(rel) if c.case_id == "train/tiny/base")
    problem = "8 of 8 steps had a neighbour on a side's core: the pair is left out"
    result = ResultData(case_id=case.case_id, kind="train", status="passed", metrics={"tokens_per_s": 90.0},
                        samples={"per_launch.tokens_per_s": [90.0] * 4,
                                 "paired_baseline.per_launch.tokens_per_s": [90.0] * 4},
                        environment={"paired": {"baseline": "prev", "order": [], "reason": None},
                                     "duet": {"mode": "duet", "baseline": "prev", "reason": None,
                                              "pairs_planned": 4, "pairs_budget": 8,
                                              "pairs": [{"index": i, "problem": problem} for i in range(8)]}})
    [reason] = [r for r in check_regression(rel.gate, [case], {case.case_id: result}, None, "")
                if r.check == "regression"]
    assert reason.status == "INCOMPLETE" and "none of the 8 launch pairs is usable" in reason.message
    assert "neighbour" in reason.message


def test_the_gate_judges_a_duet_at_its_last_looks_share_of_alpha() -> None:
    from qualify.gate.duet_stats import Looks

    rel = make_release(gate_extra=DUET)
    case = next(c for c in expand(rel) if c.case_id == "train/tiny/base")
    looks = Looks.for_planned(4)

    def regression(result: ResultData):  # type: ignore[no-untyped-def]
        [reason] = [r for r in check_regression(rel.gate, [case], {case.case_id: result}, None, "")
                    if r.check == "regression"]
        return reason

    for pairs in (4, 6, 8):
        reason = regression(_duet_result(0.0, pairs=pairs))
        assert reason.figures["look_alpha"] == pytest.approx(looks.alpha_at(pairs, 0.05)), pairs
        assert reason.figures["look_alpha"] < 0.05
    # no schedule recorded: the smallest plan the runner makes (never a single look at full alpha)
    bare = regression(_duet_result(0.0, pairs=8, plan=None))
    assert bare.figures["look_alpha"] == pytest.approx(looks.alpha_at(8, 0.05))
    # the interval really is at that level: its worst end is further out than at full alpha
    from qualify.gate.duet_stats import duet_interval

    blocks = duet.blocks_from_samples(_duet_result(0.0, pairs=6).samples)
    judged = regression(_duet_result(0.0, pairs=6))
    assert judged.figures["lower"] == pytest.approx(duet_interval(blocks, alpha=looks.alpha_at(6, 0.05)).lower)
    assert judged.figures["lower"] < duet_interval(blocks, alpha=0.05).lower


# --------------------------------------------------------------------------- the case's attempts (driver)


def _duet_ctx(tmp_path):  # type: ignore[no-untyped-def]
    from support.flows import sleep_manifest

    from qualify import pipeline
    from qualify.execution.paired import PairedBaseline
    from qualify.executors import LocalExecutor
    from qualify.store.engine import open_database

    _, sessions = open_database(f"sqlite:///{tmp_path / 'q.db'}")
    manifest = sleep_manifest(tmp_path / "m.yaml", [{"name": "steps", "kind": "synthetic",
                                                     "params": {"samples": {}, "steps": 3}}],
                              extra={"gate": {"regression": {"baseline": "duet"}}})
    ctx = pipeline.open_run(sessions, manifest)
    ctx.executor = LocalExecutor()
    ctx.paired = PairedBaseline(LocalExecutor(), "prev@sha256:x")
    return ctx


class Recorder:
    """Stands in for the Ray backend: records what it was asked (duet or paired) and answers a passed case."""

    def __init__(self) -> None:
        self.kwargs: list[dict[str, Any]] = []

    def __call__(self, executor, case_doc, resources, timeout_s, **kwargs):  # type: ignore[no-untyped-def]
        from qualify.execution.result import CaseRunResult
        from qualify.workloads import protocol

        self.kwargs.append(kwargs)
        doc = protocol.make_result(case_doc, "passed", metrics={"tokens_per_s": 1.0})
        doc["environment"]["paired"] = {"baseline": "prev", "order": [], "reason": None, "pairs": 3}
        return CaseRunResult(doc=doc, exit_code=0, exec_s=0.1, queue_wait_s=0.0, node="fake", node_id="n")


def test_a_duet_run_sends_the_case_in_duet_when_a_node_holds_both_sides(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from qualify.execution import attempts

    ctx = _duet_ctx(tmp_path)
    runner = Recorder()
    attempts.run_case(ctx, ctx.cases[0], runner=runner, infeasible=lambda r: None)
    [kwargs] = runner.kwargs
    assert isinstance(kwargs["duet"], duet.DuetPolicy) and kwargs["duet"].max_pairs == 8
    assert kwargs["baseline"] is ctx.paired.executor


def test_a_duet_run_measures_paired_with_the_reason_when_no_node_holds_both_sides(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from qualify.execution import attempts
    from support.flows import results

    ctx = _duet_ctx(tmp_path)
    runner = Recorder()
    # The case fits a node (1 CPU), both sides do not (2 CPUs).
    outcome = attempts.run_case(ctx, ctx.cases[0], runner=runner,
                                infeasible=lambda r: None if r.cpus <= 1 else f"it needs CPU={r.cpus:g}")
    [kwargs] = runner.kwargs
    assert "duet" not in kwargs and kwargs["baseline"] is ctx.paired.executor  # paired
    assert outcome.passed
    stored = results(f"sqlite:///{tmp_path / 'q.db'}", ctx.run_id)[ctx.cases[0].case_id]["environment"]
    assert stored["duet"]["mode"] == "paired"
    assert "no node can hold both sides (it needs CPU=2)" in stored["duet"]["reason"]


def test_concurrent_duets_on_one_node_claim_different_cores(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Ray assigns no cores: two duet tasks on a node must not pin their sides to the same ones.
    with duet.CoreClaim(range(8), 4, str(tmp_path)) as first:
        with duet.CoreClaim(range(8), 4, str(tmp_path)) as second:
            assert first.cores == [0, 1, 2, 3] and second.cores == [4, 5, 6, 7]
            with duet.CoreClaim(range(8), 2, str(tmp_path)) as third:
                assert third.cores == [] and third.busy == 8
    with duet.CoreClaim(range(8), 4, str(tmp_path)) as again:  # released when a claim ends
        assert again.cores == [0, 1, 2, 3]
