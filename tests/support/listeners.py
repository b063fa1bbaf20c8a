"""Which TCP ports processes listen on, sampled while they run (`ss -ltnp` and /proc), and which
processes carry a marker variable."""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path
from typing import Callable

_PID = re.compile(r"pid=(\d+),")
LOOPBACK_PREFIXES = ("127.", "[::ffff:127.", "[::1]")


def listening() -> list[tuple[int, str]]:
    """(pid, local address) of every listening TCP socket on the machine."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        for pid in set(_PID.findall(line)):
            found.append((int(pid), fields[3]))
    return found


def environ_has(pid: int, name: str, value: str) -> bool:
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{name}={value}".encode() in data.split(b"\0")


def processes_with(name: str, value: str) -> list[int]:
    """Living processes whose environment holds name=value (what a case started carries it down)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and environ_has(int(entry.name), name, value):
            try:
                if (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            except OSError:
                continue
            found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def is_loopback(address: str) -> bool:
    return address.startswith(LOOPBACK_PREFIXES)


class ListenerSampler:
    """Samples, in a thread, the listeners of the processes `select(pid)` accepts."""

    def __init__(self, select: Callable[[int], bool], every_s: float = 0.3) -> None:
        self.select, self.every_s = select, every_s
        self.seen: dict[tuple[int, str], str] = {}  # (pid, address) -> command line
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for pid, address in listening():
                if (pid, address) not in self.seen and self.select(pid):
                    self.seen[(pid, address)] = cmdline(pid)
            self._stop.wait(self.every_s)

    def __enter__(self) -> "ListenerSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def wide(self) -> dict[tuple[int, str], str]:
        """The sampled listeners that are not on loopback."""
        return {k: v for k, v in self.seen.items() if not is_loopback(k[1])}
