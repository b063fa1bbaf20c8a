"""Duet measurement, driver side (gate.regression.baseline: duet): the candidate's and the previous release's
launches of a case at the same time on one node, each side on its own cores (and GPUs), step k of both started
together (workloads/duet.py), the sides swapped between launch pairs; one merged document.

One Ray task holds both sides' resources (twice the case's CPUs and GPUs). Inside it, launch pair i gives the
candidate side i % 2: side 0 is the first half of the task's cores (and GPUs), side 1 the second half, so that
a slower core or GPU falls on each release equally often and its bias is estimated from the swaps
(gate/duet_stats.py). Both sides' executors run at once (a thread each); when one side's process ends, the
other is told at its barrier, so that it never waits for a dead peer.

Merged document: the candidate's launches merged as usual (qualify.launches.merge_launches), the baseline's
attached as for a paired case (`paired_baseline.per_launch.<metric>`, environment `paired`), and the duet
record: samples `duet.log_ratio` (one per timed step: log(candidate step time / baseline step time)),
`duet.pair` (the launch pair of each), `duet.candidate_side` (one per pair), environment `duet` (sides, cpu
sets, GPUs, how closely the steps started together, the reason when the case fell back to paired).

Sampling until decided: the planned pairs (the case's launches, rounded up to an even number and at least 4,
so that each side assignment has two) are run; while the gate's rule on the interval (gate/duet_stats) is
undecided, two more pairs are run, up to `DuetPolicy.max_pairs`. A pair measured with a neighbour on a side's
core (pair_log_ratios) is left out of the interval and made up for by two more pairs, within the same budget.

Why the pairs run one after the other, each set up only when the one before it has ended (not started two at a
time, set up together and measured in turn, as execution/setup_overlap.py does for a case's launches): a pair
already keeps both of its cores busy in every phase, one side's set-up on each core, then both sides' steps.
Tried on this 2-core machine (2026-12-07, AMD EPYC): four set-ups at once took twice as long as two
(torch, DeepSpeed and transformers imported: 7.75 s against 3.64 s), and their model builds 3.3 times as long, so
the smoke case in duet took 61 s (one run) against 41 s (3 runs) one pair at a time (benchmarks/paired_vs_history.py
--cases identical --modes history,duet). setup_overlap gains only where a launch leaves cores idle (one set-up
on a 2-CPU case).

Where duet cannot run, the case is measured paired (A B A B) and the result says why: the cluster has no node
with both sides' resources (decided on the driver, pipeline), the node's cores cannot be split into two sets
of the case's size, or the workload has no duet hook (inference on the vLLM engine: it batches requests in its own
engine-core process, and there is no step both sides could start together). With the container executor, each
side's container gets the barrier folder mounted at the same path (executors/container.duet_barrier_dir). An
inference case on the transformers engine runs in duet: its timed requests are the steps (one request at a time,
the same prompts and token count on both sides).
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from qualify import result_document as rd
from qualify.execution import launches, setup_overlap
from qualify.executors.container import DUET_DIR_PREFIX
from qualify.manifest import Resources
from qualify.workloads import duet as wduet

LOG_RATIO, PAIR, CANDIDATE_SIDE = rd.DUET_LOG_RATIO, rd.DUET_PAIR, rd.DUET_CANDIDATE_SIDE
# Kinds whose workload waits at the barrier before each timed step (the others fall back to paired); an
# inference case too, on an engine of workloads/infer/engines.DUET_ENGINES (unsupported_reason).
DUET_KINDS = ("train", "synthetic", "infer")
STEP_SERIES = "step_time_s"

Launch = Callable[[dict[str, Any], Sequence[str]], tuple[dict[str, Any], float]]


@dataclass(frozen=True)
class DuetPolicy:
    """What the Ray task needs of the gate's policy to sample until decided."""

    max_regression: float
    alpha: float
    max_pairs: int
    min_steps: int = 0  # gate.regression.duet_steps: timed steps of each side's launch, at least (0: the case's)


@dataclass(frozen=True)
class SidePlan:
    """The two sides' resources on this node: side 0 and side 1 cpu sets and GPU ids."""

    cpus: tuple[tuple[int, ...], tuple[int, ...]]
    gpus: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())


def doubled(resources: Resources) -> Resources:
    """The one Ray task of a duet case holds both sides: twice the case's CPUs, GPUs and memory."""
    return resources.model_copy(update={
        "cpus": resources.cpus * 2, "gpus": resources.gpus * 2,
        "memory_gb": resources.memory_gb * 2 if resources.memory_gb else None,
        "custom": {k: v * 2 for k, v in resources.custom.items()}})


def plan_sides(available_cpus: Sequence[int], cpus_per_side: float, gpu_ids: Sequence[str] = (),
               gpus_per_side: float = 0) -> SidePlan | str:
    """Two disjoint cpu sets (and GPU sets) of the case's size from what this task may use, or why not."""
    need = max(1, math.ceil(cpus_per_side))
    cores = sorted(available_cpus)
    if len(cores) < 2 * need:
        return (f"this node's task can use {len(cores)} core(s) ({_span(cores)}): two sides of {need} core(s) "
                "each do not fit")
    g = int(gpus_per_side)
    if g != gpus_per_side:
        return f"a fractional GPU share ({gpus_per_side:g}) cannot be split into two sides"
    if len(gpu_ids) < 2 * g:
        return f"this task holds {len(gpu_ids)} GPU(s): two sides of {g} do not fit"
    return SidePlan(cpus=(tuple(cores[:need]), tuple(cores[need:2 * need])),
                    gpus=(tuple(gpu_ids[:g]), tuple(gpu_ids[g:2 * g])))


def _span(cores: Sequence[int]) -> str:
    return ",".join(str(c) for c in cores) or "none"


def _step_shape(doc: Mapping[str, Any]) -> tuple[str, int, str, int] | None:
    """How a workload's timed steps are counted: (the per-repeat field, its count, the repeats field, its count),
    or None when the document times no steps. Training and synthetic cases time `steps` per repeat; an inference
    case times `num_prompts` requests per repeat (its defaults are the workload's own)."""
    params = doc.get("params") or {}
    if doc.get("kind") == "infer":
        from qualify.workloads.infer.params import InferParams  # stdlib only: the workload's own defaults

        defaults = InferParams.__dataclass_fields__
        prompts = _count(params.get("num_prompts", defaults["num_prompts"].default))
        repeats = _count(params.get("repeats", defaults["repeats"].default))
        return None if prompts is None or repeats is None else ("num_prompts", prompts, "repeats", repeats)
    steps = _count(params.get("steps"))
    return None if steps is None else ("steps", steps, "repeats", _count(params.get("repeats", 1)) or 1)


def with_duet_steps(doc: Mapping[str, Any], min_steps: int) -> dict[str, Any]:
    """The case document with at least `min_steps` timed steps per launch (an even count: the traded units are
    two steps), the same for both sides: more steps per repeat for a workload that times steps (params.steps),
    more repeats of the same requests for an inference case (params.repeats; its prompts stay the case's).

    Why a duet takes more steps than the case: the launch pair is the block, and its summary is only as steady as
    its steps are many. A launch's fixed cost (interpreter, imports, model build, warm-up: about 7 s of a tiny
    training launch here) is paid whatever it measures, while a timed step costs a tenth of a second; six steps
    give a pair three traded units, whose median moved by +-8% between pairs of identical code on this machine."""
    out = dict(doc)
    shape = _step_shape(doc)
    if shape is None or min_steps < 1:
        return out
    per_field, per, rep_field, repeats = shape
    params = dict(out.get("params") or {})
    if per_field == "steps":
        want = max(per, math.ceil(min_steps / repeats))
        if (want * repeats) % 2:
            want += 1
        if want != per:
            params["steps"] = want
    else:
        want = max(repeats, math.ceil(min_steps / per))
        if (want * per) % 2:
            want += 1
        if want != repeats:
            params[rep_field] = want
    if params != (out.get("params") or {}):
        out["params"] = params
    return out


def timed_steps(doc: Mapping[str, Any]) -> int | None:
    """The timed steps of one launch of this case document (steps x repeats, or requests x repeats for an
    inference case), or None when it times none."""
    shape = _step_shape(doc)
    return None if shape is None else shape[1] * shape[3]


def _count(value: Any) -> int | None:
    """A positive count from a case's params, or None (the workload itself names a bad one)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def candidate_side(pair: int) -> int:
    """The candidate's side in launch pair `pair`: the sides swap every pair."""
    return pair % 2


def planned_pairs(case_doc: Mapping[str, Any]) -> int:
    count = launches.launch_count(case_doc)
    return max(4, count + count % 2)


def unsupported_reason(kind: str, executor_kind: str, engine: str | None = None) -> str | None:
    """Why this case cannot run in duet (it is then paired), or None. `engine`: an inference case's engine."""
    if kind == "infer":
        from qualify.workloads.infer.engines import DUET_ENGINES  # the registry imports the standard library only

        name = engine or "transformers"
        if name not in DUET_ENGINES:
            return (f"the {name} inference engine has no duet hook (it batches requests in its own engine-core "
                    "process: no step both sides could start together); measured paired")
    elif kind not in DUET_KINDS:
        return f"a {kind} case has no duet hook (no timed step both sides could start together); measured paired"
    if executor_kind not in ("local", "container"):
        return f"the {executor_kind} executor cannot share the barrier directory with the workload; measured paired"
    return None


def _side_doc(doc: Mapping[str, Any], index: int, count: int, directory: str, side: int,
              plan: SidePlan, timeout_s: float) -> dict[str, Any]:
    out = launches.launch_document(doc, index, count)
    out["duet"] = {"dir": directory, "side": side, "cpus": list(plan.cpus[side]), "timeout_s": timeout_s}
    if not any(plan.gpus):
        # CPU sides trade core sets every step (workloads/duet.py); a GPU side's model lives on its own device.
        out["duet"]["peer_cpus"] = list(plan.cpus[1 - side])
    return out


@dataclass
class _PairRun:
    index: int
    candidate_side: int
    cand: tuple[dict[str, Any], float] | None = None
    base: tuple[dict[str, Any], float] | None = None
    errors: list[str] = field(default_factory=list)


def run_pair(index: int, count: int, case_doc: Mapping[str, Any], baseline_doc: Mapping[str, Any],
             plan: SidePlan, launch_candidate: Launch, launch_baseline: Launch, timeout_s: float) -> _PairRun:
    """Launch pair `index`: both sides at once, each in a thread, on their cpu sets; a barrier directory of
    their own; when a side's process ends, the other is told (it then finishes alone, never waits)."""
    run = _PairRun(index, candidate_side(index))
    directory = tempfile.mkdtemp(prefix=DUET_DIR_PREFIX)  # a container side gets it mounted at the same path
    try:
        wduet.make_barrier_dir(directory)
        cs = run.candidate_side
        bs = 1 - cs

        def side(which: str, launch: Launch, doc: Mapping[str, Any], s: int) -> None:
            try:
                result = launch(_side_doc(doc, index, count, directory, s, plan, timeout_s), plan.gpus[s])
                setattr(run, which, result)
            except Exception as exc:  # noqa: BLE001 - reported as the side's failure, never lost in a thread
                run.errors.append(f"{which}: {type(exc).__name__}: {exc}")
            finally:
                wduet.peer_gone(directory, 1 - s)

        threads = [threading.Thread(target=side, args=("cand", launch_candidate, case_doc, cs), daemon=True),
                   threading.Thread(target=side, args=("base", launch_baseline, baseline_doc, bs), daemon=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return run


# A step is clean when neither side's thread waited on a run queue for more than this share of the step: no
# other process held its core for long. Background daemons cost a side under 1% of most steps here (a blip of
# a few ms now and then, which matters only for steps of a few tens of ms); a neighbour that shares a side's
# core (a CPU burner, a second job) costs it a third to a half of every step.
CLEAN_RUNQ_SHARE = 0.10
# held_step_times removes at most this share of a step (a burner beside a side takes about half of its core).
HELD_MAX_REMOVED = 0.8
# A pair with fewer clean steps than this share is left out of the interval (the runner's looks then run more
# pairs): its ratio would say where the neighbour sat, not what the candidate costs.
MIN_CLEAN_SHARE = 0.5


@dataclass(frozen=True)
class PairRatios:
    """One launch pair's per-step log ratios (clean steps only) and what was left out."""

    ratios: list[float]  # one per clean unit: a step, or two steps when the sides traded cores
    steps: int  # units compared (steps both sides ran together, in twos when they traded cores)
    disturbed: int  # of those, units with a neighbour on a side's core (only without trades)
    problem: str | None
    runq_share: tuple[float | None, float | None] = (None, None)  # (candidate, baseline): median share of a step
    held: bool = False  # traded units compared on held step times (held_step_times): the neighbours' share removed


def _steps(doc: Mapping[str, Any]) -> list[Any]:
    return list((doc.get("samples") or {}).get(STEP_SERIES) or [])


def traded(doc: Mapping[str, Any]) -> bool:
    """Did this side trade core sets with its peer every step, starting on its own (workloads/duet.py)?"""
    report = _side_report(doc)
    own = report.get("on_own_cpus")
    return bool(report.get("traded_cores")) and isinstance(own, list) and \
        all(o == (k % 2 == 0) for k, o in enumerate(own))


def held_step_times(doc: Mapping[str, Any]) -> list[float] | None:
    """Each timed step's time with its CPU held: the step's time less the part of its run-queue wait that no thread
    of its own process can have caused (the wait beyond the CPU time its other threads used in that step). None
    where the side did not record both (then its step times are compared as they are).

    Why: a neighbour that shares a core takes about half of it from whichever release runs there, and a burner that
    the scheduler moves between the two vCPUs every step or so (it does, as the sides re-pin at each trade) lands
    on the two steps of a traded unit unevenly: units of identical code then ranged over +-0.6 in log time and the
    pairs' medians by 0.02 (benchmarks/paired_vs_history.py's burner; the time a step's thread held its CPU
    stayed within a few percent). What is removed cannot hide a regression of the candidate's own: a wait that its
    own threads caused is bounded by their CPU time, which is never removed; a step that waits for a lock, the
    disk or a device is not waiting on a run queue and keeps its time."""
    times = [float(x) for x in _steps(doc)]
    report = _side_report(doc)
    waits, others = report.get("runq_wait_s"), report.get("other_threads_cpu_s")
    if not all(isinstance(v, list) and len(v) == len(times) and
               all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                   for x in v) for v in (waits, others)):
        return None
    assert isinstance(waits, list) and isinstance(others, list)
    # Never more than HELD_MAX_REMOVED of a step: a step whose thread waited nearly all of it says little.
    return [t - min(HELD_MAX_REMOVED * t, max(0.0, float(w) - float(o))) for t, w, o in zip(times, waits, others)]


def runq_shares(doc: Mapping[str, Any]) -> list[float] | None:
    """A side's run-queue wait as a share of each timed step; None where its workload did not measure it."""
    times = [float(x) for x in _steps(doc)]
    raw = _side_report(doc).get("runq_wait_s")
    if not isinstance(raw, list) or len(raw) != len(times) or not all(isinstance(x, (int, float)) for x in raw):
        return None
    return [float(w) / t if t > 0 else 0.0 for w, t in zip(raw, times)]


def pair_log_ratios(cand: Mapping[str, Any], base: Mapping[str, Any]) -> PairRatios:
    """Per-step log(candidate time / baseline time) of one launch pair, step k with step k (sides that traded
    cores: the mean of steps 2j and 2j+1, one on each core set, which cancels what the cores' neighbours do, on
    the steps' held times where both sides recorded them, held_step_times):
    the steps a side ran alone (its peer gone) are left out, and without trades the disturbed steps (a side
    waited on a run queue for more than CLEAN_RUNQ_SHARE of it) too; the whole pair is, when fewer than
    MIN_CLEAN_SHARE of its steps are clean. Leaving steps out by the run-queue wait cannot hide a regression:
    a candidate whose own threads keep its step waiting for a CPU has no clean steps, and its case is never
    PASS (INCOMPLETE, with why)."""
    c = [float(x) for x in (cand.get("samples") or {}).get(STEP_SERIES) or []]
    b = [float(x) for x in (base.get("samples") or {}).get(STEP_SERIES) or []]
    if not c or not b:
        return PairRatios([], 0, 0, f"a side reported no {STEP_SERIES}")
    if len(c) != len(b):
        return PairRatios([], 0, 0, f"the sides ran {len(c)} and {len(b)} timed steps")
    alone = [_side_report(d).get("alone_from_step") for d in (cand, base)]
    stop = min([a for a in alone if isinstance(a, int)], default=len(c))
    share_c, share_b = runq_shares(cand), runq_shares(base)
    medians = (statistics.median(share_c) if share_c else None, statistics.median(share_b) if share_b else None)
    share_c, share_b = share_c or [0.0] * len(c), share_b or [0.0] * len(b)
    # Sides that traded cores every step are compared two steps at a time (each release once on each core set):
    # the mean log ratio of steps 2j and 2j+1 cancels the two core sets' difference at that moment.
    width = 2 if traded(cand) and traded(base) else 1
    held_c, held_b = (held_step_times(cand), held_step_times(base)) if width == 2 else (None, None)
    held = held_c is not None and held_b is not None
    if held:
        assert held_c is not None and held_b is not None
        c, b = held_c, held_b
    clean, disturbed = [], 0
    for k in range(0, stop - width + 1, width):
        span = range(k, k + width)
        if any(c[j] <= 0 or b[j] <= 0 for j in span):
            continue
        # A neighbour on one core set slows whichever release is on it: with trades, each release once, and
        # the unit's mean cancels it (so a traded unit is never left out for it); without trades it lands on
        # one release, and the step is left out.
        if width == 1 and (share_c[k] > CLEAN_RUNQ_SHARE or share_b[k] > CLEAN_RUNQ_SHARE):
            disturbed += 1
            continue
        clean.append(statistics.fmean(math.log(c[j] / b[j]) for j in span))
    steps = len(clean) + disturbed
    if not steps:
        return PairRatios([], 0, 0, "no timed step ran with both sides together", medians)
    if len(clean) < MIN_CLEAN_SHARE * steps:
        return PairRatios([], steps, disturbed,
                          f"{disturbed} of {steps} {'step pairs' if width == 2 else 'steps'} had a neighbour on a "
                          f"side's core (a side waited for a CPU "
                          f"more than {CLEAN_RUNQ_SHARE:.0%} of the step): the pair is left out", medians)
    return PairRatios(clean, steps, disturbed, None, medians, held)


def _side_report(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """What a side's workload reported of its duet launch (workloads/duet.StepBarrier.report)."""
    return (doc.get("environment") or {}).get("duet") or {}


def step_skew(cand: Mapping[str, Any], base: Mapping[str, Any]) -> float | None:
    """The largest gap between the two sides' starts of the same step (seconds): the synchronisation achieved."""
    a = _side_report(cand).get("step_starts") or []
    b = _side_report(base).get("step_starts") or []
    gaps = [abs(x - y) for x, y in zip(a, b)]
    return max(gaps) if gaps else None


def run_duet(case_doc: Mapping[str, Any], baseline_doc: Mapping[str, Any], plan: SidePlan,
             launch_candidate: Launch, launch_baseline: Launch, *, label: str, timeout_s: float,
             policy: DuetPolicy | None = None) -> dict[str, Any]:
    """The duet of one case (see the module docstring): the candidate's merged document with both the paired
    baseline side and the duet record attached."""
    from qualify.gate import duet_stats  # the gate reads this module's keys: imported late, no cycle

    count = planned_pairs(case_doc)
    budget = max(count, policy.max_pairs if policy else count)
    case_steps = timed_steps(case_doc)
    if policy is not None and policy.min_steps:
        case_doc = with_duet_steps(case_doc, policy.min_steps)
        baseline_doc = with_duet_steps(baseline_doc, policy.min_steps)
    # The two sides' launch documents and seconds, as run_paired keeps them (merged the same way below).
    cand_docs, base_docs = [], []
    cand_s, base_s = [], []
    order: list[str] = []
    problem: str | None = None
    pairs: list[dict[str, Any]] = []
    ratios, pair_of, sides = [], [], []  # the duet record: per step, per step, per pair
    index = left_out = 0
    busy: str | None = None
    while index < count:
        run = run_pair(index, budget, case_doc, baseline_doc, plan, launch_candidate, launch_baseline, timeout_s)
        if run.cand is None:
            raise RuntimeError(f"duet pair {index + 1}: the candidate side raised: {'; '.join(run.errors)}")
        cand_docs.append(run.cand[0])
        cand_s.append(run.cand[1])
        cs = run.candidate_side
        order.append(f"A{index}|B{index} (candidate on side {cs})")
        if run.cand[0].get("status") != "passed":
            break
        bdoc = run.base[0] if run.base else None
        if bdoc is None or bdoc.get("status") != "passed":
            why = "; ".join(run.errors) if bdoc is None else f"{bdoc.get('error_class')}: " \
                f"{str(bdoc.get('error') or '')[:300]}"
            problem = f"the baseline ({label}) did not pass its launch {index + 1}: {why}"
            break
        assert run.base is not None
        base_docs.append(bdoc)
        base_s.append(run.base[1])
        got = pair_log_ratios(run.cand[0], bdoc)
        pr, why = got.ratios, got.problem
        pairs.append({"index": index, "candidate_side": cs, "candidate_cpus": list(plan.cpus[cs]),
                      "disturbed_units": got.disturbed,
                      "baseline_cpus": list(plan.cpus[1 - cs]), "candidate_gpus": list(plan.gpus[cs]),
                      "baseline_gpus": list(plan.gpus[1 - cs]),
                      "steps": min(len(_steps(run.cand[0])), len(_steps(bdoc))),
                      "traded_cores": traded(run.cand[0]) and traded(bdoc), "units": got.steps,
                      "held_times": got.held,
                      "clean_units": len(pr),
                      "candidate_runq_share": got.runq_share[0], "baseline_runq_share": got.runq_share[1],
                      "problem": why,
                      "busy_wait": bool(_side_report(run.cand[0]).get("busy_wait")),
                      "step_start_skew_s": step_skew(run.cand[0], bdoc),
                      # the cpu sets the two processes ran on, as each read its own affinity back after pinning
                      "candidate_affinity": _side_report(run.cand[0]).get("affinity"),
                      "baseline_affinity": _side_report(bdoc).get("affinity"),
                      "median_log_ratio": statistics.median(pr) if pr else None})
        if pr:
            ratios += pr
            pair_of += [float(index)] * len(pr)
            sides.append(float(cs))
        else:
            sides.append(float("nan"))
            left_out += 1
            if not _node_busy(left_out, index + 1) and count + duet_stats.LOOK_STEP <= budget:
                count += duet_stats.LOOK_STEP  # a pair left out is made up for, one pair per side assignment
        index += 1
        if index == count and _node_busy(left_out, index):
            busy = (f"{left_out} of {index} launch pairs had a neighbour on a side's core: the node is too busy "
                    "for a duet now; no more pairs were run")
            break
        if index == count and policy is not None and count + duet_stats.LOOK_STEP <= budget:
            # A look, at its share of alpha (duet_stats.Looks): the gate judges the last look at the same level.
            looks = duet_stats.Looks(planned_pairs(case_doc), budget)
            interval = duet_stats.duet_interval(blocks_from_samples(
                {LOG_RATIO: ratios, PAIR: pair_of, CANDIDATE_SIDE: sides}),
                alpha=looks.alpha_at(index, policy.alpha))
            if duet_stats.decide(interval, policy.max_regression) == duet_stats.DuetCall.UNDECIDED:
                count += duet_stats.LOOK_STEP  # undecided: two more pairs (one per side assignment)
    merged = launches.merge_launches(cand_docs, cand_s, planned=count)
    merged = launches.attach_pairing(merged, base_docs, base_s, order=order, label=label, problem=problem)
    if merged.get("status") == "passed" and problem is None:
        merged["samples"].update({LOG_RATIO: ratios, PAIR: pair_of, CANDIDATE_SIDE: sides})
    merged["environment"]["duet"] = {
        "baseline": label, "mode": "duet", "reason": problem, "busy": busy, "pairs": pairs,
        "pairs_planned": planned_pairs(case_doc),
        "timed_steps_per_launch": timed_steps(case_doc), "case_timed_steps": case_steps,
        "pairs_budget": budget, "sides": {"cpus": [list(c) for c in plan.cpus], "gpus": [list(g) for g in plan.gpus]},
        "step_start_skew_s_max": max((p["step_start_skew_s"] for p in pairs
                                      if p["step_start_skew_s"] is not None), default=None)}
    return merged


def _node_busy(left_out: int, ran: int) -> bool:
    """More than half the pairs so far were left out (a neighbour on a side's core): more pairs would mostly be
    left out too, at the full cost of a launch pair each; the case ends INCOMPLETE, saying so."""
    return 2 * left_out > ran


def fell_back(doc: dict[str, Any], label: str | None, reason: str) -> dict[str, Any]:
    """Mark a case that should have run in duet but was measured paired (or not at all), with the reason."""
    doc.setdefault("environment", {})["duet"] = {"baseline": label, "mode": "paired", "reason": reason, "pairs": []}
    return doc


def blocks_from_samples(samples: Mapping[str, Sequence[float]]) -> list[Any]:
    """The launch pairs of a duet result's samples as the gate's blocks (gate.duet_stats.DuetBlock)."""
    from qualify.gate import duet_stats

    return [duet_stats.DuetBlock(side, tuple(ratios)) for side, ratios in rd.duet_pairs(samples)]


# --------------------------------------------------------------------------- the Ray task


def available_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def measure(executor: Any, baseline: Any, case_doc: dict[str, Any], baseline_doc: dict[str, Any], *,
            cpus_per_side: float, gpus_per_side: float, gpu_ids: Sequence[str], timeout_s: float,
            policy: DuetPolicy | None, cpus: Sequence[int] | None = None) -> tuple[dict[str, Any], list[Any]]:
    """Inside the case's one Ray task: the duet, or paired (A B A B) with the reason when this node's task
    cannot hold two sides. Returns the merged document and the candidate's execution outcomes."""
    outcomes: list[Any] = []
    label = baseline.describe()

    def side(chosen: Any, keep: bool) -> Launch:
        def one_launch(doc: dict[str, Any], gpus: Sequence[str]) -> tuple[dict[str, Any], float]:
            outcome = chosen.run(doc, timeout_s=setup_overlap.launch_timeout(doc, timeout_s), gpu_ids=list(gpus))
            if keep:
                outcomes.append(outcome)
            return outcome.doc, outcome.exec_s
        return one_launch

    need = 2 * max(1, math.ceil(cpus_per_side))
    with CoreClaim(available_cpus() if cpus is None else cpus, need) as claimed:
        plan = plan_sides(claimed.cores, cpus_per_side, gpu_ids, gpus_per_side)
        if isinstance(plan, str):
            if claimed.busy:
                plan += f" ({claimed.busy} more held by other duet cases on this node)"
            cand, base = side(executor, True), side(baseline, False)
            kept: list[dict[str, Any]] = []
            merged = launches.run_paired(case_doc, baseline_doc, lambda d: cand(d, gpu_ids),
                                         lambda d: base(d, gpu_ids), label, kept=kept)
            # With set-up overlap a launch stopped at its gate ran too: only the kept launches' outcomes count.
            kept_ids = {id(d) for d in kept}
            return fell_back(merged, label, f"{plan}; measured paired"), [o for o in outcomes if id(o.doc) in kept_ids]
        merged = run_duet(case_doc, baseline_doc, plan, side(executor, True), side(baseline, False), label=label,
                          timeout_s=timeout_s, policy=policy)
    return merged, outcomes


class CoreClaim:
    """The cores this duet pins its two sides to, claimed on the node for as long as it runs.

    Ray counts CPUs but assigns no cores, so two duet cases on one node would otherwise both take the first
    cores. Each core is claimed by an exclusive flock on a node-local file (`<tmp>/qualify-duet-cores/<n>`):
    the kernel releases it when the holder ends, however it ends, so a crashed worker never leaks a core.
    """

    def __init__(self, available: Sequence[int], need: int, directory: str | None = None) -> None:
        self.available, self.need = sorted(available), need
        self.directory = directory or os.path.join(tempfile.gettempdir(), "qualify-duet-cores")
        self.cores: list[int] = []
        self.busy = 0
        self._fds: list[int] = []

    def __enter__(self) -> "CoreClaim":
        import fcntl

        os.makedirs(self.directory, exist_ok=True)
        for core in self.available:
            if len(self.cores) == self.need:
                break
            fd = os.open(os.path.join(self.directory, str(core)), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                self.busy += 1
                continue
            self._fds.append(fd)
            self.cores.append(core)
        return self

    def __exit__(self, *_exc: Any) -> None:
        for fd in self._fds:
            os.close(fd)  # closing releases the flock
        self._fds.clear()


def driver_choice(kind: str, executor_kind: str, resources: Resources, case_doc: Mapping[str, Any],
                  max_regression: float, alpha: float,
                  infeasible: Callable[[Resources], str | None], min_steps: int = 0) -> DuetPolicy | str:
    """On the driver: the duet policy for this case, or why it is measured paired instead (said in its result)."""
    engine = (case_doc.get("params") or {}).get("engine")
    reason = unsupported_reason(kind, executor_kind, engine if isinstance(engine, str) else None)
    if reason:
        return reason
    why = infeasible(doubled(resources))
    if why:
        return f"no node can hold both sides ({why}); measured paired"
    from qualify.gate.duet_stats import Looks  # the gate's own look schedule: imported late, no cycle

    return DuetPolicy(max_regression=max_regression, alpha=alpha,
                      max_pairs=Looks.for_planned(planned_pairs(case_doc)).budget, min_steps=min_steps)


def duet_choice(manifest: Any, case: Any, infeasible: Callable[[Resources], str | None]) -> DuetPolicy | str | None:
    """For a paired-able case of a run: None unless its rule (gate.regression, or gate.reference for a reference
    case) says duet; then the case's duet policy, or why it is measured paired instead (said in its result)."""
    reg = manifest.gate.regression_for(case)
    if reg.baseline != "duet":
        return None
    return driver_choice(case.kind, manifest.execution.executor, case.resources, case.document(),
                         reg.max_regression, reg.alpha, infeasible, min_steps=reg.duet_steps)
