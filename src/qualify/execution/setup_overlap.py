"""Set-up together, measurement in turn: several launches of a case started at once, each measured alone.

A launch is a fresh process, and most of its seconds are set-up: on this 2-core machine a tiny training launch
spent about 2 s importing torch, DeepSpeed and transformers and 2.6 s building its model and engine, for 0.9 s
of timed steps (issue 27). Those seconds are not measurement, and nothing is measured while they run, so the
launches of a case may spend them side by side, provided that no launch's timed steps ever run beside another
launch's set-up. That is what this module guarantees:

- a batch of launches starts at once, each with a `measure_gate` section (workloads/measure_gate.py): it parks
  between its set-up and its measurement, in a blocking read that costs no CPU;
- launch k of the batch is released only when every later launch of the batch is parked or has ended, and launch
  k-1 has ended: so a launch measures alone, its own process as fresh as ever (nothing is shared between launches
  but a folder of FIFOs), and launches still run in their order;
- a launch that did not pass stops the batch: the launches not yet released are told STOP at their gate (they end
  without a document and are dropped), as the sequential runner would not have started them;
- a launch that passed without ever parking (a workload without the gate: an image that bakes in an older
  workload package) may have measured beside the others' set-up: its result is dropped, it runs again alone,
  and the case's later launches run one at a time (`fallback` says why).

Who gets a batch is the driver's choice (manifest.cases: `execution.overlap_setup`; only a single-node CPU case,
as many launches at once as the CPUs it holds, never beside a neighbour's cores; execution/launches.py runs the
batches). A GPU case is never batched: its launches' set-up would hold the device's memory at once.
"""

from __future__ import annotations

import os
import select
import shutil
import struct
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from qualify.executors.container import GATE_DIR_PREFIX  # a container launch gets the folder mounted
from qualify.manifest.cases import SETUP_OVERLAP as CASE_KEY  # the case document's batch size
from qualify.workloads import measure_gate
_WORD = struct.Struct("!i")
_POLL_S = 0.05  # how long the coordinator sleeps in select between checks of the launches' threads

Launch = Callable[[dict[str, Any]], tuple[dict[str, Any], float]]


def batch_size(case_doc: Mapping[str, Any]) -> int:
    value = case_doc.get(CASE_KEY, 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def launch_timeout(doc: Mapping[str, Any], timeout_s: float) -> float:
    """The executor's bound for one launch: a launch in slot k of a batch may also wait at its gate while the k
    launches before it measure, each bounded by the case timeout."""
    section = doc.get(measure_gate.SECTION)
    slot = section.get("slot", 0) if isinstance(section, Mapping) else 0
    return timeout_s * (1 + (slot if isinstance(slot, int) and not isinstance(slot, bool) and slot > 0 else 0))


@dataclass
class BatchOutcome:
    """The batch's launches in order, (document, seconds) each, cut after the first that stops the batch."""

    results: list[tuple[dict[str, Any], float]]
    fallback: str | None = None  # why the case's later launches must run one at a time


def passed(doc: Mapping[str, Any]) -> bool:
    return doc.get("status") == "passed"


def run_batch(items: Sequence[tuple[dict[str, Any], Launch]], timeout_s: float,
              stops: Callable[[int, Mapping[str, Any]], bool] = lambda _k, doc: not passed(doc)) -> BatchOutcome:
    """Run the launches (each a case document and the callable that runs it) as one batch (module docstring).
    `stops(k, doc)`: whether launch k's result ends the batch (default: when it did not pass). One item runs as
    it always did, with no gate."""
    if len(items) == 1:
        doc, launch = items[0]
        return BatchOutcome([launch(doc)])
    folder = tempfile.mkdtemp(prefix=GATE_DIR_PREFIX)
    try:
        gates = _Gates(folder, len(items))
        try:
            return _run(items, gates, folder, timeout_s, stops)
        finally:
            gates.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(items: Sequence[tuple[dict[str, Any], Launch]], gates: "_Gates", folder: str, timeout_s: float,
         stops: Callable[[int, Mapping[str, Any]], bool]) -> BatchOutcome:
    n = len(items)
    gated = [{**doc, measure_gate.SECTION: {"dir": folder, "slot": k, "timeout_s": timeout_s * (k + 1)}}
             for k, (doc, _launch) in enumerate(items)]
    results: list[tuple[dict[str, Any], float] | None] = [None] * n
    dropped: list[int] = []
    end = n
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="qualify-launch") as pool:
        futures: list[Future] = [pool.submit(launch, doc) for doc, (_d, launch) in zip(gated, items)]
        try:
            for k in range(n):
                gates.settle(futures, range(k, n))  # nothing of the batch is in its set-up from here on
                if k in gates.parked:
                    gates.say(k, measure_gate.GO)
                doc, seconds = futures[k].result()
                if k not in gates.parked and passed(doc):
                    dropped.append(k)  # measured without waiting at the gate: maybe beside another's set-up
                    continue
                results[k] = (doc, seconds)
                if stops(k, doc):
                    end = k + 1
                    break
        finally:
            for j in range(n):  # every launch not released (after a stop, or an error here) ends at its gate
                if not futures[j].done():
                    gates.say(j, measure_gate.STOP)
    fallback = None
    if dropped:
        fallback = (f"launch slot(s) {', '.join(map(str, dropped))} of a batch passed without waiting at the "
                    "measurement gate (a workload without it): measured again alone, the later launches one at a time")
        for k in dropped:
            if k >= end:
                continue
            doc, launch = items[k]
            results[k] = launch(doc)
            if stops(k, results[k][0]):
                end = k + 1
                break
    out = [r for r in results[:end] if r is not None]
    return BatchOutcome(out, fallback=fallback)


class _Gates:
    """The driver's side of a batch's FIFOs: which launches are parked, and the words to them. Every FIFO is held
    open read-write for the batch's life, so that a word written to a launch still in its set-up waits in the
    FIFO until the launch reads it."""

    def __init__(self, folder: str, n: int) -> None:
        measure_gate.make_folder(folder, n)
        self.parked: set[int] = set()
        self._ready = os.open(os.path.join(folder, measure_gate.READY), os.O_RDWR | os.O_NONBLOCK)
        self._go = [os.open(os.path.join(folder, measure_gate.go_name(k)), os.O_RDWR | os.O_NONBLOCK)
                    for k in range(n)]
        self._said: set[int] = set()
        self._pending = b""

    def settle(self, futures: Sequence[Future], slots: range) -> None:
        """Return when every launch in `slots` is parked at its gate or has ended."""
        while True:
            waiting = [k for k in slots if k not in self.parked and not futures[k].done()]
            if not waiting:
                return
            ready, _, _ = select.select([self._ready], [], [], _POLL_S)
            if ready:
                self._read()

    def _read(self) -> None:
        try:
            self._pending += os.read(self._ready, 4096)
        except BlockingIOError:
            return
        while len(self._pending) >= _WORD.size:
            (slot,), self._pending = _WORD.unpack(self._pending[:_WORD.size]), self._pending[_WORD.size:]
            if 0 <= slot < len(self._go):
                self.parked.add(slot)

    def say(self, slot: int, word: int) -> None:
        if slot in self._said:
            return
        self._said.add(slot)
        try:
            os.write(self._go[slot], _WORD.pack(word))
        except OSError:  # a full FIFO cannot happen (one word each); a closed one: the launch is gone anyway
            pass

    def close(self) -> None:
        for fd in (self._ready, *self._go):
            try:
                os.close(fd)
            except OSError:
                pass
