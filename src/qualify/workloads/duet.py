"""Duet measurement inside a workload (gate.regression.baseline: duet): stdlib only, runs in the image.

The driver starts the candidate's and the previous release's launch of a case at the same time on one node and
gives each side a `duet` section in its case document:

    {"duet": {"dir": "/tmp/qualify-duet-XXXX", "side": 0, "cpus": [0], "timeout_s": 600}}

A workload that supports duet calls `enter(case)` first: the process is pinned to its cpu set (children and
threads started afterwards inherit it: torch's OpenMP pool is created later) and gets a `StepBarrier`, at which
it waits before each timed step, so that both sides start step k together: whatever the machine does during
step k (a neighbour's burst, a frequency change) hits both sides of the comparison. Each side records when its
steps started (`step_starts`, time.time()) so that the synchronisation can be checked afterwards.

A side that arrives first keeps its cores busy until the peer arrives (`wait(filler)`: the workload's filler,
a small unit of the same kind of work as its step, run between polls of the barrier), so that a side's step
never runs beside an idle neighbour. Why: the two sides share the node's caches, memory bandwidth and, on a
VM, physical cores. On this machine a matmul on one vCPU runs 2.4 times slower while the other vCPU runs
matmuls too. With an idle wait, the extra work of a slower side ran while its peer slept, at up to twice the
speed, and a 10% regression was measured as +4-5% (benchmarks/paired_vs_history.py; issue 23). With the
filler, each side's step shares the node with the same kind of work whatever the other side is doing.
A workload on a GPU passes no filler: its host thread only waits for the device, and the peer's GPU is its own.

The two sides trade core sets every step (when the driver gives each side its peer's set and the workload's
steps run in one process): step k runs on the side's own cores when k is even, on the peer's when odd. Why:
each vCPU here is fast or slow for seconds at a time, by what the host runs beside it (a side's 20 ms step
took 11 ms for a stretch, then 20 ms again, while the other side's did not change). With fixed cores such a
stretch lands on one release and moves a launch pair's ratio by up to +-30%; with trades, steps 2j and 2j+1
put each release on each core once, and their mean log ratio cancels the cores' difference (execution/duet
pairs them). The sides still swap their starting cores between launch pairs.

Each side also records, per timed step, how long its thread waited on a run queue for a CPU
(`runq_wait_s`, from /proc/thread-self/schedstat): the time something else held its CPU. And the CPU time the
process's other threads used in that step (`other_threads_cpu_s`: process CPU time less this thread's), which
bounds how much of that wait the side's own threads can have caused. The driver takes the rest away from the
step's time (execution/duet.held_step_times): a neighbour's share of a core is not the release's cost.

The barrier is a pair of FIFOs in a directory both sides reach (`to0`, `to1`, made by the driver): a side
writes the step number into its peer's FIFO and blocks (select, with a timeout) on its own until the peer's
step number arrives. A blocking read wakes within microseconds, no polling, no CPU spent while waiting. Each
FIFO is opened read-write (Linux allows it on a FIFO): opening never blocks, whichever side comes first.
"""

from __future__ import annotations

import os
import select
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

SIDES = (0, 1)
_WORD = struct.Struct("!i")
# Written by the driver into a side's FIFO when its peer's process has ended: no step will come.
PEER_GONE = -1
DEFAULT_TIMEOUT_S = 600.0


class DuetError(RuntimeError):
    """The peer arrived at another step than this side: the two sides do not run the same steps."""


@dataclass(frozen=True)
class DuetSpec:
    """The case document's duet section."""

    dir: str
    side: int
    cpus: tuple[int, ...]
    timeout_s: float = DEFAULT_TIMEOUT_S
    peer_cpus: tuple[int, ...] = ()  # the other side's cpu set: the sides trade cores every step (see below)

    @classmethod
    def from_case(cls, case: Mapping[str, Any]) -> "DuetSpec | None":
        raw = case.get("duet")
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise ValueError(f"duet: expected an object, got {type(raw).__name__}")
        side = raw.get("side")
        if side not in SIDES or isinstance(side, bool):
            raise ValueError(f"duet.side: 0 or 1, got {side!r}")
        cpus = raw.get("cpus") or []
        if not isinstance(cpus, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                                 for c in cpus):
            raise ValueError(f"duet.cpus: a list of CPU numbers, got {cpus!r}")
        directory = raw.get("dir")
        if not isinstance(directory, str) or not directory:
            raise ValueError(f"duet.dir: a directory, got {directory!r}")
        timeout = raw.get("timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"duet.timeout_s: a positive number, got {timeout!r}")
        peer = raw.get("peer_cpus") or []
        if not isinstance(peer, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                                 for c in peer):
            raise ValueError(f"duet.peer_cpus: a list of CPU numbers, got {peer!r}")
        if peer and (len(peer) != len(cpus) or set(peer) & set(cpus)):
            raise ValueError(f"duet.peer_cpus: as many CPUs as duet.cpus and none of them, got {peer!r} and {cpus!r}")
        return cls(dir=directory, side=int(side), cpus=tuple(cpus), timeout_s=float(timeout), peer_cpus=tuple(peer))


def make_barrier_dir(directory: str) -> None:
    """The driver's part: the two FIFOs of one launch pair (the directory exists, empty)."""
    for side in SIDES:
        os.mkfifo(os.path.join(directory, f"to{side}"), 0o600)


@dataclass
class StepBarrier:
    """A two-process barrier per step (see the module docstring); records when each step started."""

    spec: DuetSpec
    step_starts: list[float] = field(default_factory=list)
    waits_s: list[float] = field(default_factory=list)
    filler_units: int = 0  # filler units run while waiting for the peer (a busy wait)
    runq_wait_s: list[float] = field(default_factory=list)  # per timed step: time spent waiting for a CPU
    alone_from: int | None = None  # the step from which the peer was gone
    alone_reason: str | None = None
    trade: bool = False  # trade cores with the peer every step (enter(trade_cores=True) with peer_cpus)
    on_own_cpus: list[bool] = field(default_factory=list)  # per timed step: on this side's cpu set, or the peer's
    other_threads_cpu_s: list[float] = field(default_factory=list)  # per timed step: the process's other threads

    def __post_init__(self) -> None:
        # O_RDWR: never blocks on open, and a read end stays open while we hold it (no EOF when the peer closes).
        self._inbox = os.open(os.path.join(self.spec.dir, f"to{self.spec.side}"), os.O_RDWR)
        self._outbox = os.open(os.path.join(self.spec.dir, f"to{1 - self.spec.side}"), os.O_RDWR)
        self._step = 0
        self._runq_at_start: float | None = None
        self._cpu_at_start: tuple[float, float] | None = None  # (process, this thread) CPU time at the step start
        self._pinned = sorted(os.sched_getaffinity(0))  # read back after enter() pinned: the side's own set

    def wait(self, filler: Callable[[], object] | None = None) -> float:
        """Arrive at the barrier of the next step and return when the peer has arrived too: the step's start.
        With a filler, the wait is busy: the filler runs until the peer's word is there (see the module)."""
        self._close_step()
        step = self._step
        self._step += 1
        if self.alone_from is None:
            arrived = time.perf_counter()
            os.write(self._outbox, _WORD.pack(step))
            got = self._read_word(self.spec.timeout_s, filler)
            if got is None or got == PEER_GONE:
                # The peer ended (its launch failed) or hangs: this side finishes its launch alone, and says
                # from which step on (the driver keeps no duet pair without both sides passing).
                self.alone_from = step
                self.alone_reason = "the peer ended" if got == PEER_GONE else \
                    f"the peer did not arrive within {self.spec.timeout_s:g} s"
            elif got != step:
                raise DuetError(f"duet side {self.spec.side}: the peer is at step {got}, this side at {step}")
            else:
                self.waits_s.append(time.perf_counter() - arrived)
        if self.trade:
            # Both sides are at the same step: step k on the own set when k is even, on the peer's when odd, so
            # that each side spends alternate steps on each core set and never shares one with its peer.
            own = step % 2 == 0
            pin_process(self.spec.cpus if own else self.spec.peer_cpus)
            self.on_own_cpus.append(own)
        start = time.time()
        self.step_starts.append(start)
        self._runq_at_start = runq_wait_s()
        self._cpu_at_start = (time.process_time(), time.thread_time())
        return start

    def _close_step(self) -> None:
        """The step that just ended (arrival at the next barrier, or the end): its run-queue wait."""
        if self._cpu_at_start is not None:
            process0, thread0 = self._cpu_at_start
            self.other_threads_cpu_s.append(max(0.0, (time.process_time() - process0) - (time.thread_time() - thread0)))
            self._cpu_at_start = None
        if self._runq_at_start is not None:
            now = runq_wait_s()
            if now is not None:
                self.runq_wait_s.append(max(0.0, now - self._runq_at_start))
            self._runq_at_start = None

    def _read_word(self, timeout_s: float, filler: Callable[[], object] | None = None) -> int | None:
        """The peer's next word, or None when none came within timeout_s; with a filler, run it between
        non-blocking polls instead of sleeping in select."""
        deadline = time.monotonic() + timeout_s
        data = b""
        while len(data) < _WORD.size:
            left = deadline - time.monotonic()
            if filler is None:
                ready, _, _ = select.select([self._inbox], [], [], max(0.0, left))
            else:
                ready, _, _ = select.select([self._inbox], [], [], 0.0)
                if not ready and left > 0:
                    filler()
                    self.filler_units += 1
                    continue
            if not ready:
                return None
            data += os.read(self._inbox, _WORD.size - len(data))
        return _WORD.unpack(data)[0]

    def done(self) -> None:
        """The timed step has ended: record its run-queue wait (the next wait() and close() do it too)."""
        self._close_step()

    def close(self) -> None:
        self._close_step()
        for fd in (self._inbox, self._outbox):
            try:
                os.close(fd)
            except OSError:
                pass

    def report(self) -> dict[str, Any]:
        """What the result's environment records of this side."""
        return {"side": self.spec.side, "cpus": list(self.spec.cpus), "affinity": self._pinned,
                "steps": len(self.step_starts),
                "step_starts": list(self.step_starts), "alone_from_step": self.alone_from,
                "alone_reason": self.alone_reason,
                "wait_s_median": sorted(self.waits_s)[len(self.waits_s) // 2] if self.waits_s else None,
                "busy_wait": self.filler_units > 0, "filler_units": self.filler_units,
                "traded_cores": self.trade, "on_own_cpus": list(self.on_own_cpus) if self.trade else None,
                "runq_wait_s": list(self.runq_wait_s) if len(self.runq_wait_s) == len(self.step_starts) else None,
                "other_threads_cpu_s": list(self.other_threads_cpu_s)
                if len(self.other_threads_cpu_s) == len(self.step_starts) else None}


def runq_wait_s() -> float | None:
    """This thread's total time spent runnable but waiting for a CPU (Linux schedstat, field 2, ns); None where
    the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def peer_gone(directory: str, side: int) -> None:
    """The driver's part: tell `side` that its peer has ended (a side still at a barrier stops waiting)."""
    try:
        fd = os.open(os.path.join(directory, f"to{side}"), os.O_RDWR | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.write(fd, _WORD.pack(PEER_GONE))
    except OSError:  # a full FIFO: the side is not reading anyway
        pass
    finally:
        os.close(fd)


def pin(cpus: tuple[int, ...]) -> list[int]:
    """Pin this process to the cpu set (Linux); returns the affinity now in force."""
    if cpus:
        os.sched_setaffinity(0, set(cpus))
    return sorted(os.sched_getaffinity(0))


def pin_process(cpus: tuple[int, ...]) -> None:
    """Pin every thread of this process to the cpu set (sched_setaffinity(0) moves only the calling thread; a
    torch thread pool keeps the set it was created with)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, set(cpus))
        except OSError:  # a thread that ended meanwhile
            pass


def enter(case: Mapping[str, Any], *, trade_cores: bool = False) -> StepBarrier | None:
    """For a duet launch: pin to the side's cpu set and open the step barrier; None for any other launch.
    trade_cores: the workload's steps all run in this process (one rank), so the two sides may trade core sets
    every step when the driver gave the peer's (duet.peer_cpus)."""
    spec = DuetSpec.from_case(case)
    if spec is None:
        return None
    pin(spec.cpus)
    return StepBarrier(spec, trade=trade_cores and bool(spec.peer_cpus) and bool(spec.cpus))
