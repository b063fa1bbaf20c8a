"""Where a launch's time goes: the workload process's wall time cut into named phases.

A launch is a fresh process (execution/launches.py), and most of its seconds are not measurement: the
interpreter, the torch/DeepSpeed imports, the model build, quantization, warm-up. The workload marks the
start of each phase on the process's one clock; the result document carries the seconds per phase
(`environment.phases`), the case sums them over its launches, and the run's *measurement efficiency* is the
timed-measurement seconds over the cases stage's wall seconds (report/efficiency.py).

Standard library only: imported by every workload before torch.
"""

from __future__ import annotations

import os
import time

# The phases a workload may report, in the order they happen. `start` is the interpreter and the workload
# module's own imports (from exec to the protocol's entry), measured from the kernel's process start time.
START = "start"
MEASURE = "measure"  # the timed steps or the timed serving repeats: the only seconds the gate tests
# `parked`: waiting at the measurement gate (workloads/measure_gate.py) while other launches of the case measure.
PHASES = (START, "imports", "model_build", "quantize", "agreement", "parked", "warmup", MEASURE, "probes", "report")


def process_age_s() -> float | None:
    """Seconds since the kernel started this process (Linux /proc), None where that cannot be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            # Field 22 (starttime, clock ticks after boot) follows the command name, which may hold spaces.
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class PhaseClock:
    """Seconds per phase: `enter(name)` ends the current phase and starts `name` (a phase entered twice adds up)."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._current: str | None = None
        self._since = clock()
        self.seconds: dict[str, float] = {}

    def start(self, already_s: float | None) -> None:
        """Begin the clock at the protocol's entry; `already_s` (the process's age) is booked as `start`."""
        self._current, self._since, self.seconds = None, self._clock(), {}
        if already_s is not None:
            self.seconds[START] = already_s
        self._current = "imports"

    @property
    def current(self) -> str | None:
        return self._current

    def enter(self, name: str) -> None:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; one of {PHASES}")
        now = self._clock()
        if self._current is not None:
            self.seconds[self._current] = self.seconds.get(self._current, 0.0) + (now - self._since)
        self._current, self._since = name, now

    def finish(self) -> dict[str, float]:
        """The seconds per phase so far, the current one included (it keeps running)."""
        now = self._clock()
        out = dict(self.seconds)
        if self._current is not None:
            out[self._current] = out.get(self._current, 0.0) + (now - self._since)
        return {name: round(out[name], 4) for name in PHASES if name in out}


# The workload process's one clock (a launch is one process).
CLOCK = PhaseClock()


def enter(name: str) -> None:
    CLOCK.enter(name)
