"""Set-up together, measurement in turn (issue 27: a launch's seconds are mostly set-up): the batch runner and the
measurement gate, with threads playing the workloads over the real FIFOs (no process: these are unit tests).

What must hold whatever the launches' timings: no launch measures while another launch of its batch is in its
set-up, measurements run one at a time in launch order, a launch that does not pass stops the ones not yet
released, and a launch that measured without waiting at its gate is never kept."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from qualify.execution import launches, setup_overlap
from qualify.executors.container import measure_gate_dir
from qualify.workloads import measure_gate

pytestmark = pytest.mark.unit


@dataclass
class Timeline:
    """Per launch index: when its set-up ran and when it measured (time.monotonic)."""

    setup: dict[int, tuple[float, float]] = field(default_factory=dict)
    measure: dict[int, tuple[float, float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    apart: bool = False  # a launch's set-up began while another launch of its batch had not started

    def overlaps(self) -> list[str]:
        out = []
        for k, (m0, m1) in self.measure.items():
            for j, (s0, s1) in self.setup.items():
                if j != k and s0 < m1 and m0 < s1:
                    out.append(f"launch {k} measured during launch {j}'s set-up")
            for j, (n0, n1) in self.measure.items():
                if j != k and n0 < m1 and m0 < n1:
                    out.append(f"launches {k} and {j} measured at once")
        return out


def _passed(value: float = 100.0) -> dict[str, Any]:
    return {"status": "passed", "metrics": {"tokens_per_s": value}, "samples": {}, "environment": {}}


def fake_workload(timeline: Timeline, setup_s: dict[int, float], measure_s: float = 0.03, *, gated: bool = True,
                  fail: set[int] = frozenset(), fail_in_setup: set[int] = frozenset(),
                  together: threading.Barrier | None = None):
    """A launch callable: `setup_s[index]` of set-up, the gate (as workloads/measure_gate.py does it), then the
    measurement; what it did goes into the timeline. `together`: a barrier every launch of the batch meets at the
    start of its set-up (bounded): it is passed only when the runner started them all at once."""

    def launch(doc: dict[str, Any]) -> tuple[dict[str, Any], float]:
        index = doc["launch"]["index"]
        if together is not None:
            try:
                together.wait(timeout=10)
            except threading.BrokenBarrierError:
                timeline.apart = True
        t0 = time.monotonic()
        time.sleep(setup_s.get(index, 0.01))
        with timeline.lock:
            timeline.setup[index] = (t0, time.monotonic())
        if index in fail_in_setup:
            return {"status": "error", "error_class": "crash", "error": "died in set-up"}, 0.1
        spec = measure_gate.GateSpec.from_case(doc)
        record = None
        if gated and spec is not None:
            def stopped() -> None:
                raise measure_gate.GateStopped("stop")
            try:
                record = measure_gate.Gate(spec, on_stop=stopped).wait()
            except measure_gate.GateStopped:
                return {"status": "error", "error_class": "crash", "error": "no document (stopped)"}, 0.1
        m0 = time.monotonic()
        time.sleep(measure_s)
        with timeline.lock:
            timeline.measure[index] = (m0, time.monotonic())
        if index in fail:
            return {"status": "failed", "error_class": "degenerate", "error": "asked"}, 0.2
        out = _passed(100.0 + index)
        if record is not None:
            out["environment"] = {measure_gate.SECTION: record}
        return out, 0.2

    return launch


CASE = {"case_id": "train/x/base", "kind": "train", "params": {}, "launches": 3, "timeout_s": 60}


@pytest.mark.parametrize("setups", [{0: 0.05, 1: 0.15, 2: 0.01}, {0: 0.2, 1: 0.01, 2: 0.1}, {0: 0.01, 1: 0.01, 2: 0.3}])
def test_launches_set_up_together_and_measure_alone_in_their_order(setups: dict[int, float]) -> None:
    timeline = Timeline()
    merged, docs = launches.run_launches({**CASE, "setup_overlap": 3},
                                         fake_workload(timeline, setups, together=threading.Barrier(3)))
    assert merged["status"] == "passed" and len(docs) == 3
    assert timeline.overlaps() == []
    starts = sorted(timeline.measure, key=lambda k: timeline.measure[k][0])
    assert starts == [0, 1, 2]  # measured in launch order, whichever finished its set-up first
    assert not timeline.apart  # the three set-ups began together
    assert merged["samples"]["per_launch.tokens_per_s"] == [100.0, 101.0, 102.0]
    assert merged["environment"]["setup_overlap"] == {"batch": 3, "batches": 1, "used": True, "fallback": None}
    assert all(measure_gate.SECTION in (d.get("environment") or {}) for d in docs)


def test_batches_of_two_cover_three_launches_and_never_overlap_a_measurement() -> None:
    timeline = Timeline()
    merged, docs = launches.run_launches({**CASE, "setup_overlap": 2}, fake_workload(timeline, {0: 0.1, 1: 0.02}))
    assert len(docs) == 3 and timeline.overlaps() == []
    assert merged["environment"]["setup_overlap"]["batches"] == 1  # the third launch ran alone
    # The third launch started after the second one's measurement: its set-up overlapped nothing measured.
    assert timeline.setup[2][0] >= timeline.measure[1][1]


def test_without_overlap_the_launches_run_one_after_the_other_and_the_document_is_unchanged() -> None:
    timeline = Timeline()
    merged, docs = launches.run_launches(dict(CASE), fake_workload(timeline, {}))
    assert len(docs) == 3 and timeline.overlaps() == []
    assert "setup_overlap" not in merged["environment"]
    for k in (1, 2):
        assert timeline.setup[k][0] >= timeline.measure[k - 1][1]


def test_a_launch_that_does_not_pass_stops_the_launches_not_yet_released() -> None:
    timeline = Timeline()
    merged, docs = launches.run_launches({**CASE, "setup_overlap": 3}, fake_workload(timeline, {}, fail={0}))
    assert len(docs) == 1 and merged["status"] == "failed"
    assert set(timeline.measure) == {0}  # 1 and 2 were told STOP at their gate and never measured
    assert merged["environment"]["launches_planned"] == 3


def test_a_launch_that_dies_in_its_set_up_ends_the_case_after_the_earlier_ones_measured() -> None:
    timeline = Timeline()
    merged, docs = launches.run_launches({**CASE, "setup_overlap": 3},
                                         fake_workload(timeline, {1: 0.05}, fail_in_setup={1}))
    assert [d["status"] for d in docs] == ["passed", "error"]
    assert set(timeline.measure) == {0}  # launch 2 was stopped at its gate
    assert merged["error"] == "launch 2 of 3: died in set-up"


def test_a_launch_that_measured_without_waiting_at_the_gate_is_dropped_and_measured_again_alone() -> None:
    timeline = Timeline()
    calls: list[bool] = []
    ungated = fake_workload(timeline, {}, gated=False)

    def launch(doc: dict[str, Any]) -> tuple[dict[str, Any], float]:
        calls.append(measure_gate.SECTION in doc)
        return ungated(doc)

    merged, docs = launches.run_launches({**CASE, "setup_overlap": 3}, launch)
    overlap = merged["environment"]["setup_overlap"]
    assert overlap["used"] is False and "without waiting at the measurement gate" in overlap["fallback"]
    assert calls == [True, True, True, False, False, False]  # the batch, then each launch again alone, no gate
    assert len(docs) == 3 and all(d["status"] == "passed" for d in docs)


def test_paired_launches_set_up_together_and_measure_in_the_pairs_order() -> None:
    timeline = Timeline()
    order: list[str] = []
    base = fake_workload(timeline, {}, measure_s=0.02)

    def side(name: str):
        def launch(doc: dict[str, Any]) -> tuple[dict[str, Any], float]:
            out = base({**doc, "launch": {**doc["launch"], "index": doc["launch"]["slot"]}})
            order.append(f"{name}{doc['launch']['index']}")
            return out
        return launch

    kept: list[dict] = []
    merged = launches.run_paired({**CASE, "setup_overlap": 2}, dict(CASE), side("A"), side("B"), "prev", kept=kept)
    assert merged["environment"]["paired"]["order"] == ["A0", "B0", "B1", "A1", "B2", "A2"]
    assert timeline.overlaps() == []
    assert len(kept) == 3 and merged["environment"]["paired"]["pairs"] == 3
    assert merged["environment"]["setup_overlap"]["used"] is True


def test_a_failing_baseline_launch_does_not_stop_the_candidate_launch_of_its_batch() -> None:
    timeline = Timeline()
    fake = fake_workload(timeline, {})

    def baseline(doc: dict[str, Any]) -> tuple[dict[str, Any], float]:
        return {"status": "error", "error_class": "oom", "error": "baseline died"}, 0.1

    merged = launches.run_paired({**CASE, "setup_overlap": 2}, dict(CASE), fake, baseline, "prev")
    assert merged["status"] == "passed" and merged["metrics"]["launches"] == 3
    assert "did not pass its launch 1" in merged["environment"]["paired"]["reason"]


def test_a_launch_in_a_later_slot_may_wait_for_the_measurements_before_it() -> None:
    assert setup_overlap.launch_timeout({}, 100.0) == 100.0
    assert setup_overlap.launch_timeout({measure_gate.SECTION: {"slot": 2}}, 100.0) == 300.0
    assert setup_overlap.launch_timeout({measure_gate.SECTION: {"slot": True}}, 100.0) == 100.0


def test_the_gate_waits_for_the_drivers_word_and_times_out_without_one(tmp_path) -> None:
    measure_gate.make_folder(str(tmp_path), 1)
    spec = measure_gate.GateSpec(dir=str(tmp_path), slot=0, timeout_s=0.2)
    with pytest.raises(measure_gate.GateTimeout, match="within 0.2 s"):
        measure_gate.Gate(spec, on_stop=lambda: None).wait()


@pytest.mark.parametrize("section, problem", [
    ("x", "expected an object"), ({"dir": "", "slot": 0}, "dir"), ({"dir": "/tmp/a", "slot": -1}, "slot"),
    ({"dir": "/tmp/a", "slot": True}, "slot"), ({"dir": "/tmp/a", "slot": 0, "timeout_s": 0}, "timeout_s")])
def test_a_malformed_gate_section_is_refused_by_name(section: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=f"measure_gate.*{problem}" if problem != "expected an object" else problem):
        measure_gate.GateSpec.from_case({measure_gate.SECTION: section})


@pytest.mark.parametrize("folder", ["/etc", "relative/qualify-gate-x", "/tmp/qualify-gate-x:/etc", "/tmp/../etc/qualify-gate-x",
                                    "/tmp/qualify-duet-x", "/tmp/qualify-gate-x,ro"])
def test_a_container_launch_mounts_only_a_gate_folder_the_runner_made(folder: str) -> None:
    with pytest.raises(ValueError, match="not a measurement gate folder"):
        measure_gate_dir({measure_gate.SECTION: {"dir": folder, "slot": 0}})
    assert measure_gate_dir({measure_gate.SECTION: {"dir": "/tmp/qualify-gate-ab_1", "slot": 0}}) == \
        "/tmp/qualify-gate-ab_1"
    assert measure_gate_dir({}) is None


def _train_with(resources: dict[str, Any], **execution: Any):
    from support.gate import release

    rel = release(training={"defaults": {"resources": dict(resources)}, "models": [{"name": "tiny"}],
                            "variants": [{"name": "base"}]},
                  inference={"defaults": {"resources": dict(resources)},
                             "models": [{"name": "tq", "model": "tiny-qwen3", "schemes": [{"scheme": "none"}]},
                                        {"name": "tv", "model": "tiny-qwen3", "schemes": [{"scheme": "none"}],
                                         "settings": {"engine": "vllm"}}]},
                  gate_extra={"variant_gains": [], "agreement": {}},
                  **({"execution": execution} if execution else {}))
    from qualify.manifest.cases import expand

    return {c.case_id: c for c in expand(rel)}


def test_who_overlaps_its_set_up_a_single_node_cpu_case_of_two_cpus_or_more() -> None:
    cases = _train_with({"cpus": 2})
    assert cases["train/tiny/base"].setup_overlap == 3  # twice its CPUs, at most its launches
    assert cases["train/tiny/base"].document()["setup_overlap"] == 3
    assert cases["infer/tq/none"].setup_overlap == 3
    assert cases["infer/tv/none"].setup_overlap == 1  # each vLLM engine reserves host memory for its KV cache
    assert _train_with({"cpus": 8}, launches=8)["train/tiny/base"].setup_overlap == 8
    assert _train_with({"cpus": 2}, launches=8)["train/tiny/base"].setup_overlap == 4  # twice its CPUs
    assert _train_with({"cpus": 2.5})["train/tiny/base"].setup_overlap == 3  # whole CPUs
    assert _train_with({"cpus": 1.5})["train/tiny/base"].setup_overlap == 1  # a neighbour shares the node
    assert _train_with({"cpus": 4, "gpus": 1})["train/tiny/base"].setup_overlap == 1  # device memory
    assert _train_with({"cpus": 4, "nodes": 2})["train/tiny/base"].setup_overlap == 1
    assert _train_with({"cpus": 4}, overlap_setup=False)["train/tiny/base"].setup_overlap == 1
    from dataclasses import replace

    from support.gate import release
    from qualify.manifest.cases import setup_overlap as overlap_of

    assert overlap_of(release(), replace(cases["train/tiny/base"], launches=1)) == 1  # one launch: nothing to overlap
    one = _train_with({"cpus": 1})["train/tiny/base"]
    assert one.setup_overlap == 1 and "setup_overlap" not in one.document()


def test_the_case_fingerprint_says_only_what_was_used() -> None:
    from qualify.manifest.fingerprint import of_case

    case = _train_with({"cpus": 2})["train/tiny/base"]
    plain = of_case(case, {})
    assert "setup_overlap" not in plain  # a case that ran one launch after the other keeps its fingerprint
    assert "setup_overlap" not in of_case(case, {"setup_overlap": {"batch": 2, "used": False}})
    assert of_case(case, {"setup_overlap": {"batch": 2, "used": True}}) == {**plain, "setup_overlap": 2}
    assert "setup_overlap" not in case.to_dict()
