"""The service's calls to registries, apart from everything else it does.

A registry that hangs must not take the database reads with it: registry calls run on their own small thread
pool (THREADS), each with a short client timeout (TIMEOUT_S), and at most QUEUE of them wait at once; beyond
that a caller is answered at once (RegistryBusy -> 503) instead of queueing behind a hung registry. The event
loop and the database thread pool never wait on a registry."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from qualify.registry import RegistryError, RegistryUnreachable

T = TypeVar("T")
THREADS = 4
QUEUE = 16  # calls running or waiting for a thread
TIMEOUT_S = 5.0  # per registry operation (connect, read): a registry answers a manifest HEAD in milliseconds


class RegistryBusy(RegistryError):
    """Too many registry calls are already waiting (a registry hangs): answered at once, not queued."""


class RegistryCalls:
    def __init__(self, threads: int = THREADS, queue: int = QUEUE, timeout_s: float = TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="registry")
        self._slots = threading.BoundedSemaphore(queue)

    async def run(self, call: Callable[[], T], what: str) -> T:
        """`call()` on the registry pool; RegistryBusy when the queue is full, RegistryUnreachable when it
        takes longer than twice the client timeout (a registry trickling bytes)."""
        if not self._slots.acquire(blocking=False):
            raise RegistryBusy(f"{what}: too many registry calls are waiting (a registry does not answer)")
        try:
            future = self._pool.submit(call)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _f: self._slots.release())
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), 2 * self.timeout_s)
        except asyncio.TimeoutError:
            raise RegistryUnreachable(f"{what}: no answer within {2 * self.timeout_s:g}s") from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
