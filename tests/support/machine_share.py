"""Two test workers share this 2-core machine (`pytest -n 2`), except while a test that measures runs.

Most integration tests wait: on Prefect, Ray, a registry, a subprocess. Run two at a time, the suite takes far less
wall time than one after the other. But some tests measure what a neighbour moves: throughput ratios (duet, paired,
a reference image to beat, the ablation gains of the smoke), or how fast a kill lands. A test or a whole module
marked `alone` runs with the machine to itself.

A readers-writer lock across the workers, on two files under the session's shared temp folder: every module holds
the machine shared for as long as it runs; an `alone` module holds it exclusively, and an `alone` test of a shared
module trades its module's shared hold for an exclusive one while it runs. The turnstile gives a waiting `alone`
holder priority: while it waits for the other worker's current holder to let go, that worker takes no new hold.
flock(2): released by the kernel if a worker dies.

A shared module lets a waiting `alone` holder in between two of its tests (`let_an_alone_holder_in`), not only at
its end: the `alone` holder then waits for the other worker's current test, not its whole module (in a warm CI of
2026-12-07, such waits came to 212 s of an idle worker: 78, 55, 41, 22 and 16 s). Meanwhile the module's own
fixtures stay up, idle (a two-node Ray cluster idle: 1.8% of the machine).
"""

from __future__ import annotations

import fcntl
from pathlib import Path


class MachineShare:
    """One module's hold on the machine (its own open files: flock locks belong to an open file)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._turnstile = open(folder / "turnstile", "a+b")  # noqa: SIM115 - held across the module's tests
        self._machine = open(folder / "machine", "a+b")  # noqa: SIM115
        self._in_spell = False

    def shared(self) -> None:
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._machine, fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)

    def alone(self) -> None:
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)  # no new shared hold from here on
        fcntl.flock(self._machine, fcntl.LOCK_EX)  # the other worker's current holder lets go

    def release(self) -> None:
        fcntl.flock(self._machine, fcntl.LOCK_UN)
        fcntl.flock(self._turnstile, fcntl.LOCK_UN)  # a no-op after a shared hold

    def close(self) -> None:
        self.release()
        self._turnstile.close()
        self._machine.close()

    def let_an_alone_holder_in(self) -> None:
        """Between two tests of a shared module: when the other worker waits to hold the machine alone (it holds
        the turnstile), let go and share again after it. A no-op in a spell, or when nobody waits."""
        if self._in_spell:
            return
        try:
            fcntl.flock(self._turnstile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # an alone holder waits (or a shared one passes the turnstile: a harmless yield)
            self.release()
            self.shared()
            return
        fcntl.flock(self._turnstile, fcntl.LOCK_UN)

    def begin_alone_spell(self) -> None:
        """A shared holder's exclusive spell begins (an `alone` test of a shared module); within a spell, a no-op:
        consecutive `alone` tests of one module keep the machine, rather than hand it to the other worker between
        them and wait for that worker's whole next module (tests/conftest.py ends the spell after the last)."""
        if self._in_spell:
            return
        self.release()
        self.alone()
        self._in_spell = True

    def end_alone_spell(self) -> None:
        """Back to a shared hold after a spell (a no-op outside one)."""
        if not self._in_spell:
            return
        self.release()
        self.shared()
        self._in_spell = False
