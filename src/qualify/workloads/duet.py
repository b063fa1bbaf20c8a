"""Duet measurement inside a workload (gate.regression.baseline: duet): stdlib only, runs in the image.

The driver starts the candidate's and the previous release's launch of a case at the same time on one node and
gives each side a `duet` section in its case document:

    {"duet": {"dir": "/tmp/qualify-duet-XXXX", "side": 0, "cpus": [0], "timeout_s": 600}}

A workload that supports duet calls `enter(case)` first: the process is pinned to its cpu set (children and
threads started afterwards inherit it: torch's OpenMP pool is created later) and gets a `StepBarrier`, at which
it waits before each timed step, so that both sides start step k together: whatever the machine does during
step k (a neighbour's burst, a frequency change) hits both sides of the comparison. Each side records when its
steps started (`step_starts`, time.time()) so that the synchronisation can be checked afterwards.

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
from typing import Any, Mapping

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
        return cls(dir=directory, side=int(side), cpus=tuple(cpus), timeout_s=float(timeout))


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
    alone_from: int | None = None  # the step from which the peer was gone
    alone_reason: str | None = None

    def __post_init__(self) -> None:
        # O_RDWR: never blocks on open, and a read end stays open while we hold it (no EOF when the peer closes).
        self._inbox = os.open(os.path.join(self.spec.dir, f"to{self.spec.side}"), os.O_RDWR)
        self._outbox = os.open(os.path.join(self.spec.dir, f"to{1 - self.spec.side}"), os.O_RDWR)
        self._step = 0

    def wait(self) -> float:
        """Arrive at the barrier of the next step and return when the peer has arrived too: the step's start."""
        step = self._step
        self._step += 1
        if self.alone_from is None:
            arrived = time.perf_counter()
            os.write(self._outbox, _WORD.pack(step))
            got = self._read_word(self.spec.timeout_s)
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
        start = time.time()
        self.step_starts.append(start)
        return start

    def _read_word(self, timeout_s: float) -> int | None:
        """The peer's next word, or None when none came within timeout_s."""
        deadline = time.monotonic() + timeout_s
        data = b""
        while len(data) < _WORD.size:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._inbox], [], [], max(0.0, left))
            if not ready:
                return None
            data += os.read(self._inbox, _WORD.size - len(data))
        return _WORD.unpack(data)[0]

    def close(self) -> None:
        for fd in (self._inbox, self._outbox):
            try:
                os.close(fd)
            except OSError:
                pass

    def report(self) -> dict[str, Any]:
        """What the result's environment records of this side."""
        return {"side": self.spec.side, "cpus": list(self.spec.cpus), "affinity": sorted(os.sched_getaffinity(0)),
                "steps": len(self.step_starts),
                "step_starts": list(self.step_starts), "alone_from_step": self.alone_from,
                "alone_reason": self.alone_reason,
                "wait_s_median": sorted(self.waits_s)[len(self.waits_s) // 2] if self.waits_s else None}


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


def enter(case: Mapping[str, Any]) -> StepBarrier | None:
    """For a duet launch: pin to the side's cpu set and open the step barrier; None for any other launch."""
    spec = DuetSpec.from_case(case)
    if spec is None:
        return None
    pin(spec.cpus)
    return StepBarrier(spec)
