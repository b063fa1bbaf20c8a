"""Two test workers share this 2-core machine (`pytest -n 2`), except while a test module that measures runs.

Most integration tests wait: on Prefect, Ray, a registry, a subprocess. Run two at a time, the suite takes far less
wall time than one after the other. But some modules measure what a neighbour moves: throughput ratios (duet,
paired, a reference image to beat, the ablation gains of the smoke), or how fast a kill lands. A module marked
`alone` runs with the machine to itself.

A readers-writer lock across the workers, on two files under the session's shared temp folder: every module holds
the machine shared; an `alone` module holds it exclusively. The turnstile gives a waiting `alone` module priority:
while it waits for the other worker's current module to end, that worker starts no new one. flock(2): released by
the kernel if a worker dies.
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def held(folder: Path, alone: bool) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "turnstile", "a+b") as turnstile, open(folder / "machine", "a+b") as machine:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if alone:
            try:
                fcntl.flock(machine, fcntl.LOCK_EX)  # the other worker's module ends; it starts none meanwhile
                yield
            finally:
                fcntl.flock(machine, fcntl.LOCK_UN)
                fcntl.flock(turnstile, fcntl.LOCK_UN)
            return
        try:
            fcntl.flock(machine, fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
