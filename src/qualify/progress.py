"""Live counters of a run's cases, for the CLI's progress line and the Prefect progress artifact."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator


@dataclass
class Progress:
    """Thread-safe live counters for the CLI and the Prefect progress artifact."""

    total: int = 0
    done: int = 0
    failed: int = 0
    # Cases handed to Ray and not finished, by name, in submission order. Ray queues a task until its resources
    # are free; a case is running from the moment its Ray task tells the driver it started (execution.ray).
    submitted: list[str] = field(default_factory=list)
    started: dict[str, float] = field(default_factory=dict)  # running case -> monotonic time it started
    # Expected seconds per case (plan.estimates: earlier results of its fingerprint, else its parameters): the
    # estimate of the end. Empty: no estimate is shown.
    expected_s: dict[str, float] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    listeners: list[Callable[["Progress"], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def running_cases(self) -> list[str]:
        return [case for case in self.submitted if case in self.started]

    @property
    def queued_cases(self) -> list[str]:
        return [case for case in self.submitted if case not in self.started]

    @property
    def running(self) -> int:  # the count the Prefect progress artifact reads
        return len(self.running_cases)

    def start_case(self, case_id: str = "") -> None:
        """Handed to Ray: queued until case_started."""
        with self._lock:
            self.submitted.append(case_id)
        self._notify()

    def case_started(self, case_id: str) -> None:
        """Its Ray task runs."""
        with self._lock:
            self.started.setdefault(case_id, time.monotonic())
        self._notify()

    def finish_case(self, passed: bool, case_id: str = "") -> None:
        with self._lock:
            if case_id in self.submitted:
                self.submitted.remove(case_id)
            elif self.submitted:
                self.submitted.pop(0)
            self.started.pop(case_id, None)
            self.done += 1
            self.failed += 0 if passed else 1
        self._notify()

    def remaining_s(self, now: float | None = None) -> float | None:
        """Seconds until the last case ends, estimated: the work left (each running case's expected time less
        what it has run, floored at 10% of it; each queued case's expected time) spread over the cases running
        at once now. None without an estimate for every unfinished case, or before anything runs."""
        now = time.monotonic() if now is None else now
        with self._lock:
            submitted, started = list(self.submitted), dict(self.started)
        pending = self.total - self.done - len(submitted)  # not yet handed to Ray
        if not submitted or not started or pending > 0 or any(c not in self.expected_s for c in submitted):
            return None
        left = 0.0
        for case in submitted:
            expected = self.expected_s[case]
            ran = now - started[case] if case in started else 0.0
            left += max(expected - ran, 0.1 * expected)
        longest = max(max(self.expected_s[c] - (now - started[c]), 0.1 * self.expected_s[c]) for c in started)
        return max(left / len(started), longest)

    def _notify(self) -> None:
        for listener in list(self.listeners):
            try:
                listener(self)
            except Exception:  # noqa: BLE001 - a display problem never stops a run
                pass

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_at


# Progress listeners of this process (the CLI's progress line), kept out of the flow's parameters: a callback is
# no parameter a person could set in the Prefect UI, and Prefect would store it with every run. The launcher
# registers its callback around the flow call; the flow attaches whatever is registered to its run's Progress.
_PROCESS_LISTENERS: list[Callable[[Progress], None]] = []


@contextlib.contextmanager
def listening(listener: Callable[[Progress], None]) -> Iterator[None]:
    """Register `listener` for the runs this process drives while the block lasts."""
    _PROCESS_LISTENERS.append(listener)
    try:
        yield
    finally:
        _PROCESS_LISTENERS.remove(listener)


def process_listeners() -> list[Callable[[Progress], None]]:
    return list(_PROCESS_LISTENERS)

