"""A case measured in several independent process launches: the launch documents merged into one.

Run-to-run variance (process start, clocks, placement, allocator state) is only sampled by starting
the workload again. A throughput case therefore runs as `launches` separate processes on the same node
(one Ray task holds the node's resources for all of them, see execution/ray.py) and the gate tests one figure
per launch (gate.stats, the non-inferiority rule on logs); the steps and repeats inside a launch give the spread, not the
sample count.

Merged document (pure function, tested directly):
  * status: passed only when every launch passed; otherwise the first launch that did not pass, with
    its error class (later launches are not started after a failure).
  * metrics: every numeric figure is the median over the launches, except memory figures, whose
    maximum is kept (a peak is a peak); `launches` is the number of launches that ran, and
    `cv_<metric>_between_launches` and `cv_<series>_within_launch` (median of the launches' own CV,
    e.g. of the step times) are given for the throughput metric(s).
  * samples: `per_launch.<metric>` = one value per launch for every numeric metric (what the gate
    tests); the launches' own series concatenated under their names, with `launch_index.<series>`
    saying which launch each sample came from.
  * environment: the first launch's, plus `launches`: index, status, duration of each launch.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Mapping, Sequence

from qualify.execution import setup_overlap
from qualify.gate import sequential
from qualify.numbers import finite
from qualify.result_document import LAUNCH_INDEX, PAIRED_BASELINE, PER_LAUNCH

# Figures whose worst launch is the honest figure (a peak), not the median.
_MAX_METRICS_SUFFIX = ("memory_bytes",)
# Throughput series whose launch-to-launch and within-launch spread is reported.
SPREAD_METRICS = ("tokens_per_s", "output_tokens_per_s", "wall_s")
# Series whose spread inside a launch is reported (one timed step each).
WITHIN_ONLY_SERIES = ("step_time_s",)


def launch_document(case_doc: Mapping[str, Any], index: int, count: int) -> dict[str, Any]:
    """The case document of one launch: the case's, told which launch it is (a workload may seed by it)."""
    doc = {k: v for k, v in case_doc.items() if k not in ("launches", sequential.KEY)}
    doc["launch"] = {"index": index, "of": count}
    return doc


def launch_count(case_doc: Mapping[str, Any]) -> int:
    value = case_doc.get("launches", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def sum_phases(launches: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The seconds per phase (workloads/phases.py) summed over the launches, and `executor`: each launch's wall
    time outside its workload's phases (spawning the process, reading its document), summed."""
    total: dict[str, float] = {}
    outside = 0.0
    for launch in launches:
        phases = launch.get("phases") or {}
        for name, seconds in phases.items():
            value = finite(seconds)
            if value is not None:
                total[name] = round(total.get(name, 0.0) + value, 4)
        wall = finite(launch.get("duration_s"))
        if wall is not None and phases:
            outside += max(0.0, wall - sum(finite(v) or 0.0 for v in phases.values()))
    if total:
        total["executor"] = round(outside, 4)
    return total


def _cv(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


def merge_launches(docs: Sequence[Mapping[str, Any]], durations_s: Sequence[float | None] = (),
                   planned: int | None = None) -> dict[str, Any]:
    """One result document from the launches' documents (in launch order); see the module docstring."""
    assert docs, "at least one launch ran"
    planned = planned or len(docs)
    first_bad = next((d for d in docs if d.get("status") != "passed"), None)
    base = dict(first_bad or docs[0])
    env = dict(base.get("environment") or {})
    env["launches"] = [{"index": i, "status": d.get("status"), "error_class": d.get("error_class"),
                        "duration_s": (durations_s[i] if i < len(durations_s) else d.get("duration_s")),
                        "phases": (d.get("environment") or {}).get("phases")}
                       for i, d in enumerate(docs)]
    env["launches_planned"] = planned
    env["phases"] = sum_phases(env["launches"])
    base["environment"] = env
    if first_bad is not None:
        index = docs.index(first_bad)
        if len(docs) > 1 or planned > 1:
            base["error"] = f"launch {index + 1} of {planned}: {first_bad.get('error')}"
        return base
    metrics: dict[str, Any] = {}
    samples: dict[str, list[float]] = {}
    names = [k for d in docs for k in (d.get("metrics") or {})]
    for name in dict.fromkeys(names):
        values = [finite((d.get("metrics") or {}).get(name)) for d in docs]
        present = [v for v in values if v is not None]
        if not present:
            metrics[name] = docs[0].get("metrics", {}).get(name)
            continue
        metrics[name] = max(present) if name.endswith(_MAX_METRICS_SUFFIX) else statistics.median(present)
        if len(present) == len(values):
            samples[PER_LAUNCH + name] = present
    for name in dict.fromkeys(k for d in docs for k in (d.get("samples") or {})):
        merged: list[float] = []
        index: list[float] = []
        for i, d in enumerate(docs):
            series = list((d.get("samples") or {}).get(name) or [])
            merged += series
            index += [i] * len(series)
        samples[name] = merged
        if len(docs) > 1:
            samples[LAUNCH_INDEX + name] = index
    for name in SPREAD_METRICS:
        launch_values = samples.get(PER_LAUNCH + name)
        if launch_values:
            metrics[f"cv_{name}_between_launches"] = _cv(launch_values)
    for name in SPREAD_METRICS + WITHIN_ONLY_SERIES:
        within = [_cv([float(x) for x in (d.get("samples") or {}).get(name) or []]) for d in docs]
        within = [w for w in within if w is not None]
        if within:
            metrics[f"cv_{name}_within_launch"] = statistics.median(within)
    metrics["launches"] = len(docs)
    base["metrics"] = metrics
    base["samples"] = samples
    base["duration_s"] = sum(finite(d.get("duration_s")) or 0.0 for d in docs)
    return base


def _figure(doc: Mapping[str, Any], metric: str) -> float | None:
    return finite((doc.get("metrics") or {}).get(metric))


def _stop_record(block: Mapping[str, Any] | None, planned: int, ran: int, step: sequential.Step | None) -> dict:
    if block is None:
        return {"launches": ran, "planned": planned, "reason": "the planned launches (no sequential decision)"}
    return {"launches": ran, "planned": planned, "budget": block["max_launches"],
            "reason": step.reason if step else f"{ran} launches: a launch did not pass"}


def run_launches(case_doc: Mapping[str, Any], launch: Callable[[dict[str, Any]], tuple[dict[str, Any], float]],
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the case's launches in order (stopping at the first that does not pass); with a `sequential` block
    (gate.sequential, history mode), more launches while the gate's decision is undecided, up to the budget.
    With `setup_overlap` > 1 in the case document, the planned launches start that many at a time and are
    measured one at a time (execution/setup_overlap.py); the extra launches of the sequential rule run alone.

    launch(doc) -> (result document, seconds). Returns the merged document and the launch documents.
    """
    count = launch_count(case_doc)
    block = case_doc.get(sequential.KEY)
    docs: list[dict[str, Any]] = []
    durations: list[float] = []
    step: sequential.Step | None = None
    overlap = Overlap(setup_overlap.batch_size(case_doc))
    timeout_s = float(case_doc.get("timeout_s") or 0) or 3600.0
    index = 0
    while True:
        size = min(overlap.size, count - index) if index < count else 1
        batch = setup_overlap.run_batch([(launch_document(case_doc, index + i, count), launch) for i in range(size)],
                                        timeout_s)
        overlap.saw(batch, size)
        for doc, seconds in batch.results:
            docs.append(doc)
            durations.append(seconds)
        index += len(batch.results)
        if docs[-1].get("status") != "passed":
            step = None
            break
        if index < count:
            continue
        if block is None:
            break
        step = sequential.next_step(block, [_figure(d, block["metric"]) for d in docs])
        if not step.more or index >= int(block["max_launches"]):  # the budget bounds the loop, whatever the rule
            break
    merged = merge_launches(docs, durations, planned=count)
    merged.setdefault("environment", {})["sequential"] = _stop_record(block, count, len(docs), step)
    overlap.record(merged)
    return merged, docs


class Overlap:
    """A case's set-up overlap as it went: the batch size asked, whether any batch ran, and a fallback's reason."""

    def __init__(self, size: int) -> None:
        self.asked = size
        self.size = size
        self.batches = 0
        self.fallback: str | None = None

    def saw(self, batch: setup_overlap.BatchOutcome, size: int) -> None:
        if size > 1:
            self.batches += 1
        if batch.fallback and self.fallback is None:
            self.fallback, self.size = batch.fallback, 1

    def record(self, merged: dict[str, Any]) -> None:
        """environment.setup_overlap: only for a case that asked for it (the others' documents stay as they were)."""
        if self.asked > 1:
            merged.setdefault("environment", {})[setup_overlap.CASE_KEY] = {
                "batch": self.asked, "batches": self.batches, "used": self.batches > 0 and self.fallback is None,
                "fallback": self.fallback}


# --------------------------------------------------------------------------- paired (gate.regression.baseline: paired)


def pair_order(pair: int) -> tuple[str, str]:
    """Which side launches first in pair k: the Thue-Morse sequence, A B | B A | B A | A B | B A | A B ...
    (A B B A B A A B ...), so that a drift or an order effect (the second launch of two warmer, a cache
    filled by the first) falls on both sides alike instead of passing for a regression."""
    return ("A", "B") if bin(pair).count("1") % 2 == 0 else ("B", "A")


def run_paired(case_doc: Mapping[str, Any], baseline_doc: Mapping[str, Any],
               launch_candidate: Callable[[dict[str, Any]], tuple[dict[str, Any], float]],
               launch_baseline: Callable[[dict[str, Any]], tuple[dict[str, Any], float]],
               baseline_label: str, kept: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Candidate (A) and baseline (B) launches in counterbalanced pairs on this node (pair_order); the
    candidate's merged document with the baseline side attached (samples `paired_baseline.per_launch.<metric>`,
    environment `paired`). Each launch document carries its slot in the whole sequence (`launch.slot`).
    After the planned pairs, a `sequential` block (gate.sequential) adds pairs while the decision is undecided,
    up to the budget.

    A candidate launch that does not pass ends the case as usual. A baseline launch that does not pass ends
    the baseline side only: the case's result stands, and the pairing says why it has no baseline (the gate
    then calls the regression check INCOMPLETE for the case, never a pass).

    `kept`: receives the candidate's launch documents that were kept, in order (with set-up overlap, a launch
    stopped at its gate runs but is dropped).
    """
    count = launch_count(case_doc)
    block = case_doc.get(sequential.KEY)
    cand_docs: list[dict[str, Any]] = []
    cand_s: list[float] = []
    base_docs: list[dict[str, Any]] = []
    base_s: list[float] = []
    order: list[str] = []
    problem: str | None = None
    step: sequential.Step | None = None
    # With setup_overlap >= 2 the two launches of a pair start together and are measured in the pair's order.
    overlap = Overlap(setup_overlap.batch_size(case_doc))
    timeout_s = float(case_doc.get("timeout_s") or 0) or 3600.0
    pair = 0
    while True:
        sides = [side for side in pair_order(pair) if side == "A" or problem is None]
        items = []
        for i, side in enumerate(sides):
            doc = launch_document(case_doc if side == "A" else baseline_doc, pair, count)
            doc["launch"]["slot"] = len(order) + i
            items.append((doc, launch_candidate if side == "A" else launch_baseline))
        size = min(overlap.size, len(items))
        results: list[tuple[dict[str, Any], float]] = []
        for start in range(0, len(items), size):
            batch = setup_overlap.run_batch(
                items[start:start + size], timeout_s,
                stops=lambda k, d, first=start: sides[first + k] == "A" and d.get("status") != "passed")
            overlap.saw(batch, size)
            results += batch.results
            if len(batch.results) < size or (batch.results and sides[start + len(batch.results) - 1] == "A"
                                             and batch.results[-1][0].get("status") != "passed"):
                break
        for side, (rdoc, seconds) in zip(sides, results):
            if side == "A":
                cand_docs.append(rdoc)
                cand_s.append(seconds)
                order.append(f"A{pair}")
            else:
                base_docs.append(rdoc)
                base_s.append(seconds)
                order.append(f"B{pair}")
                if rdoc.get("status") != "passed" and problem is None:
                    problem = (f"the baseline ({baseline_label}) did not pass its launch {pair + 1}: "
                               f"{rdoc.get('error_class')}: {str(rdoc.get('error') or '')[:300]}")
        pair += 1
        if cand_docs[-1].get("status") != "passed":
            step = None
            break
        if pair < count:
            continue
        if block is None or problem is not None:
            break
        step = sequential.next_step(block, [_figure(d, block["metric"]) for d in cand_docs],
                                    [_figure(d, block["metric"]) for d in base_docs])
        if not step.more or pair >= int(block["max_launches"]):  # the budget bounds the loop, whatever the rule
            break
    merged = merge_launches(cand_docs, cand_s, planned=count)
    merged.setdefault("environment", {})["sequential"] = _stop_record(block, count, len(cand_docs), step)
    overlap.record(merged)
    if kept is not None:
        kept.extend(cand_docs)
    return attach_pairing(merged, base_docs, base_s, order=order, label=baseline_label, problem=problem)


def attach_pairing(merged: dict[str, Any], base_docs: Sequence[Mapping[str, Any]], base_s: Sequence[float], *,
                   order: Sequence[str], label: str, problem: str | None) -> dict[str, Any]:
    """Add the baseline side to the candidate's merged document (see run_paired)."""
    paired: dict[str, Any] = {"baseline": label, "order": list(order), "reason": problem, "pairs": 0}
    cand_n = merged.get("metrics", {}).get("launches") if merged.get("status") == "passed" else None
    if problem is None and base_docs and cand_n == len(base_docs):
        base = merge_launches(base_docs, base_s)
        for name, values in base["samples"].items():
            if name.startswith(PER_LAUNCH):
                merged["samples"][PAIRED_BASELINE + name] = values
        paired.update(pairs=len(base_docs), baseline_metrics=base["metrics"],
                      baseline_phases=base["environment"].get("phases") or {},
                      baseline_environment={k: base["environment"].get(k) for k in
                                            ("torch", "deepspeed", "transformers", "python", "hostname")
                                            if k in base["environment"]})
    elif problem is None and merged.get("status") != "passed":
        paired["reason"] = "the candidate did not pass: nothing to compare"
    merged.setdefault("environment", {})["paired"] = paired
    return merged


def unpaired(doc: dict[str, Any], label: str | None, reason: str) -> dict[str, Any]:
    """A case that should have been paired but could not be (the previous release's image cannot be had)."""
    doc.setdefault("environment", {})["paired"] = {"baseline": label, "order": [], "reason": reason, "pairs": 0}
    return doc
