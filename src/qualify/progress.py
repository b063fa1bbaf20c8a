"""Live counters of a run's cases, for the CLI's progress line and the Prefect progress artifact."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable


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
