"""Prefect's temporary API server, started by the launcher before Prefect is imported (driver/early_prefect.py,
issue 27): it must be Prefect's own server, started Prefect's own way, on the loopback only. The command line is
compared with the one Prefect builds itself (SubprocessASGIServer), so an upgrade of Prefect that changes it
fails (tests/integration/test_early_prefect_command.py: it imports Prefect's server, seconds of imports)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest

from qualify_prefect.driver import early_prefect


class _Recorded:
    def __init__(self, args: list[str], env: dict[str, str] | None = None, **_kw: Any) -> None:
        self.args, self.env = list(args), dict(env or {})


def test_start_points_prefect_at_it_and_the_server_is_not_told_its_own_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(early_prefect.subprocess, "Popen", _Recorded)
    monkeypatch.setenv("PREFECT_API_URL", "http://stale.example/api")
    server = early_prefect.start()
    assert os.environ["PREFECT_API_URL"] == f"http://127.0.0.1:{server.port}/api" == server.api_url
    assert "PREFECT_API_URL" not in server.process.env  # a server is no client of another one


def test_a_server_that_ends_before_it_answers_is_an_error_naming_its_exit_code() -> None:
    class Ended:
        returncode = 1

        def poll(self) -> int:
            return 1

    server = early_prefect.TemporaryServer(port=1, process=Ended())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="exit code 1 before it answered"):
        server.wait_healthy(5)


def test_a_port_taken_meanwhile_is_given_up_for_another(monkeypatch: pytest.MonkeyPatch) -> None:
    class Taken:
        returncode = early_prefect.ADDRESS_IN_USE

        def poll(self) -> int:
            return early_prefect.ADDRESS_IN_USE

    class Up:
        returncode = None

        def poll(self) -> None:
            return None

    monkeypatch.setattr(early_prefect, "_spawn", lambda port: Up())
    monkeypatch.setattr(early_prefect, "free_port", lambda: 4321)
    server = early_prefect.TemporaryServer(port=1, process=Taken())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="did not answer within"):  # the new one never answers here (no network)
        import httpx

        monkeypatch.setattr(httpx.Client, "get", lambda self, url: (_ for _ in ()).throw(httpx.ConnectError("no")))
        server.wait_healthy(0.3)
    assert server.port == 4321 and isinstance(server.process, Up)
    assert os.environ["PREFECT_API_URL"] == "http://127.0.0.1:4321/api"
    assert subprocess  # the module under test spawns with subprocess.Popen (replaced above)
