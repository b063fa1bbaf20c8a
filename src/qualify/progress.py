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
    running: int = 0
    started_at: float = field(default_factory=time.monotonic)
    listeners: list[Callable[["Progress"], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start_case(self) -> None:
        with self._lock:
            self.running += 1
        self._notify()

    def finish_case(self, passed: bool) -> None:
        with self._lock:
            self.running = max(0, self.running - 1)
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

