"""The measurement gate inside a workload: set-up may overlap other launches' set-up, never a measurement.

Most of a launch's seconds are set-up (the interpreter, the torch/DeepSpeed/transformers imports, the model
build, a compile-cache load). The driver may therefore start several launches of one case at once
(execution/setup_overlap.py) and give each a `measure_gate` section in its case document:

    {"measure_gate": {"dir": "/tmp/qualify-gate-XXXX", "slot": 1, "timeout_s": 1800}}

A workload that supports the gate calls `wait(case)` between its set-up and its measurement (its remaining
warm-up and its timed steps): the process says it has arrived (writes its slot into the folder's `ready`
FIFO), then blocks until the driver's word comes in its own FIFO `go<slot>`. The driver releases one launch
at a time, and only when every other launch it started is parked here or has ended: so a launch's timed steps
never run beside another launch's set-up, and each launch is still a fresh process (nothing is shared between
launches but the folder).

The words: GO (measure now), STOP (the driver no longer wants this launch: a launch before it did not pass;
the process ends at once with no document). A blocking read: no CPU is spent while parked. Each FIFO is opened
read-write (Linux allows it on a FIFO), so no open ever blocks, whichever side comes first.

While parked, the workload's own alarm (its case timeout) is paused: the time spent waiting for the other
launches' measurements is not the launch's. What the wait was is recorded (`RECORD`, put into the result's
environment by protocol.run_workload): when the launch parked and was released, by the wall clock, so that a
test can check that no measurement overlapped another launch's set-up.

Standard library only: runs in the image.
"""

from __future__ import annotations

import os
import select
import signal
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from qualify.workloads import phases

SECTION = "measure_gate"
READY = "ready"
GO, STOP = 1, 0
_WORD = struct.Struct("!i")
DEFAULT_TIMEOUT_S = 3600.0

# This process's gate (armed by protocol.run_workload from the case document) and the record of its wait (None:
# no gate in this launch, or not reached yet): see the module docstring.
SPEC: "GateSpec | None" = None
RECORD: dict[str, Any] | None = None


class GateTimeout(RuntimeError):
    """No word came from the driver within the section's timeout."""


class GateStopped(RuntimeError):
    """The driver said STOP (raised only when on_stop returns)."""


def go_name(slot: int) -> str:
    return f"go{slot}"


@dataclass(frozen=True)
class GateSpec:
    """The case document's measure_gate section."""

    dir: str
    slot: int
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_case(cls, case: Mapping[str, Any]) -> "GateSpec | None":
        raw = case.get(SECTION)
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise ValueError(f"{SECTION}: expected an object, got {type(raw).__name__}")
        directory, slot = raw.get("dir"), raw.get("slot")
        if not isinstance(directory, str) or not directory:
            raise ValueError(f"{SECTION}.dir: a directory, got {directory!r}")
        if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
            raise ValueError(f"{SECTION}.slot: a non-negative integer, got {slot!r}")
        timeout = raw.get("timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"{SECTION}.timeout_s: a positive number, got {timeout!r}")
        return cls(dir=directory, slot=slot, timeout_s=float(timeout))


def make_folder(directory: str, slots: int) -> None:
    """The driver's part: the `ready` FIFO and one `go<slot>` FIFO per launch (the directory exists, empty)."""
    os.mkfifo(os.path.join(directory, READY), 0o600)
    for slot in range(slots):
        os.mkfifo(os.path.join(directory, go_name(slot)), 0o600)


def arm(case: Mapping[str, Any]) -> None:
    """Read the case's gate (ValueError for a malformed section: the workload reports a bad case)."""
    global SPEC, RECORD
    SPEC, RECORD = GateSpec.from_case(case), None


def wait() -> dict[str, Any] | None:
    """This process at its gate (see Gate.wait); None at once when the case has no gate or the process passed it
    already. STOP ends the process: no document, no teardown (the driver drops this launch)."""
    global RECORD
    if SPEC is None or RECORD is not None:
        return None
    previous_phase = phases.CLOCK.current
    phases.enter("parked")
    alarm_left = signal.alarm(0)  # the case's own timeout does not run while parked
    try:
        RECORD = Gate(SPEC, on_stop=_stopped).wait()
    finally:
        if alarm_left:
            signal.alarm(alarm_left)
    if previous_phase is not None:
        phases.enter(previous_phase)
    return RECORD


class Gate:
    """One launch's side of the gate: say it has arrived, then block until the driver's word."""

    def __init__(self, spec: GateSpec, on_stop: Callable[[], None]) -> None:
        self.spec = spec
        self.on_stop = on_stop

    def wait(self) -> dict[str, Any]:
        """The record of the wait once the driver said GO; on STOP, on_stop(); GateTimeout without a word."""
        spec = self.spec
        parked_at = time.time()
        ready = os.open(os.path.join(spec.dir, READY), os.O_RDWR)
        inbox = os.open(os.path.join(spec.dir, go_name(spec.slot)), os.O_RDWR)
        try:
            os.write(ready, _WORD.pack(spec.slot))  # the inbox is open first: a word sent now waits in it
            word = _read_word(inbox, spec.timeout_s)
        finally:
            os.close(ready)
            os.close(inbox)
        if word is None:
            raise GateTimeout(f"no word from the driver at the measurement gate within {spec.timeout_s:g} s")
        if word == STOP:
            self.on_stop()
            raise GateStopped(f"stopped at the measurement gate (slot {spec.slot})")
        released_at = time.time()
        return {"slot": spec.slot, "parked_at": parked_at, "released_at": released_at,
                "waited_s": round(released_at - parked_at, 4)}


def _read_word(fd: int, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    data = b""
    while len(data) < _WORD.size:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            data += os.read(fd, _WORD.size - len(data))
    return _WORD.unpack(data)[0]


def _stopped() -> None:
    """The driver dropped this launch: end now, quietly, without a document or the interpreter's teardown."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)
