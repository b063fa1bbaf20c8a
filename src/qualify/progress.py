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
    # Cases handed to Ray and not finished, by name. Ray queues a task until its resources are free, so these
    # are "submitted" (queued or running), never all "running" (the driver does not see a task start).
    submitted: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)
    listeners: list[Callable[["Progress"], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def running(self) -> int:  # the count the Prefect progress artifact and older callers read
        return len(self.submitted)

    def start_case(self, case_id: str = "") -> None:
        with self._lock:
            self.submitted.append(case_id)
        self._notify()

    def finish_case(self, passed: bool, case_id: str = "") -> None:
        with self._lock:
            if case_id in self.submitted:
                self.submitted.remove(case_id)
            elif self.submitted:
                self.submitted.pop(0)
            self.done += 1
            self.failed += 0 if passed else 1
        self._notify()

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

