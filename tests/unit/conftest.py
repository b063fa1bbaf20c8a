"""Unit tests run in seconds: no subprocess, no network, no Ray, no Prefect. This guard makes that a fact:
a unit test that starts a process or opens a network connection fails, naming what it tried."""

from __future__ import annotations

import socket
import subprocess

import pytest


class IsolationBreach(AssertionError):
    pass


@pytest.fixture(scope="session", autouse=True)
def _matplotlib_font_cache() -> None:
    """matplotlib builds its font cache on first use by running fc-list: a fact of the machine, not of
    the code under test, so it happens once before the isolation guard (a fresh CI machine has none)."""
    from matplotlib import font_manager

    font_manager.findfont("DejaVu Sans")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_process(self, args, *a, **k):  # type: ignore[no-untyped-def]
        if list(args)[:1] == ["uname"]:  # platform.processor() asks uname: part of the standard library
            return real_popen(self, args, *a, **k)
        raise IsolationBreach(f"a unit test started a process: {args!r} (move it to tests/integration)")

    def no_network(self, address):  # type: ignore[no-untyped-def]
        if self.family == socket.AF_UNIX:
            return real_connect(self, address)
        raise IsolationBreach(f"a unit test opened a network connection to {address!r} (move it to tests/integration)")

    real_connect = socket.socket.connect
    real_popen = subprocess.Popen.__init__
    monkeypatch.setattr(subprocess.Popen, "__init__", no_process)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
