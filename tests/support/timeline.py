"""Where a test run's wall time went, per worker (issue 27: a slow CI must say where its time went).

With QUALIFY_TEST_TIMELINE=<file> (`.ci/run` sets it), the controller writes one JSON line per test phase (setup,
call, teardown) as the workers report it: the worker, the test, the phase, its start and end (epoch seconds, from
pytest's own report). At the end it prints, per worker: its span, the seconds its tests ran, the seconds it had no
test (between tests: collection, the hand-over of modules, the end while the other worker still ran), and its
longest set-ups, which under -n 2 are mostly waits for the other worker's `alone` spell
(support/machine_share.py) or for an image the background build has not made yet.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

LONG_SETUP_S = 10.0  # a set-up this long is reported by name
SHOWN = 6


@dataclass(frozen=True)
class Phase:
    worker: str
    nodeid: str
    when: str
    start: float
    stop: float

    @property
    def seconds(self) -> float:
        return max(0.0, self.stop - self.start)


def phase_of(report: Any) -> Phase | None:
    """The phase a (controller-side) test report describes; None without timestamps (an older pytest)."""
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if start is None or stop is None:
        return None
    node = getattr(report, "node", None)  # xdist's WorkerController on the controller
    worker = getattr(getattr(node, "gateway", None), "id", None) or "main"
    return Phase(str(worker), report.nodeid, report.when, float(start), float(stop))


def append(path: Path, phase: Phase) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(phase.__dict__) + "\n")


def read(path: Path) -> list[Phase]:
    if not path.is_file():
        return []
    return [Phase(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _busy(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of the intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summary(phases: Iterable[Phase]) -> list[str]:
    by_worker: dict[str, list[Phase]] = defaultdict(list)
    for p in phases:
        by_worker[p.worker].append(p)
    if not by_worker:
        return []
    first = min(p.start for ps in by_worker.values() for p in ps)
    last = max(p.stop for ps in by_worker.values() for p in ps)
    lines = [f"timeline: {last - first:.0f} s from the first test phase to the last, {len(by_worker)} worker(s)"]
    for worker in sorted(by_worker):
        ps = by_worker[worker]
        span_start, span_end = min(p.start for p in ps), max(p.stop for p in ps)
        busy = _busy([(p.start, p.stop) for p in ps])
        setups = sorted((p for p in ps if p.when == "setup" and p.seconds >= LONG_SETUP_S),
                        key=lambda p: p.seconds, reverse=True)
        waits = sum(p.seconds for p in setups)
        lines.append(f"timeline: {worker}: tests ran {busy:.0f} s; no test {(last - first) - busy:.0f} s "
                     f"(started +{span_start - first:.0f} s, done {last - span_end:.0f} s before the end); "
                     f"set-ups over {LONG_SETUP_S:.0f} s: {len(setups)}, {waits:.0f} s")
        for p in setups[:SHOWN]:
            lines.append(f"timeline:   {p.seconds:6.1f} s setup at +{p.start - first:.0f} s  {p.nodeid}")
    return lines
