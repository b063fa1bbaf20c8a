"""Prefect's temporary API server as the launcher starts it (driver/early_prefect.py, issue 27) is Prefect's own: the
command line is compared with the one Prefect builds itself (SubprocessASGIServer), so an upgrade of Prefect that
changes it fails here rather than running a server Prefect would not have. Nothing is started (Popen recorded): an
integration test only because it imports Prefect's server application (seconds)."""

from __future__ import annotations

from typing import Any

import pytest

from qualify_prefect.driver import early_prefect


class _Recorded:
    def __init__(self, args: list[str], env: dict[str, str] | None = None, **_kw: Any) -> None:
        self.args, self.env = list(args), dict(env or {})


def test_the_server_is_started_as_prefect_starts_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.server.api import server as prefect_server

    monkeypatch.setattr(prefect_server.subprocess, "Popen", _Recorded)
    theirs = prefect_server.SubprocessASGIServer(port=8765)._run_uvicorn_command()
    monkeypatch.setattr(early_prefect.subprocess, "Popen", _Recorded)
    ours = early_prefect._spawn(8765)
    assert ours.args == theirs.args  # the same interpreter, module, app factory, host, port, log level, lifespan
    assert "127.0.0.1" == ours.args[ours.args.index("--host") + 1]
    for key, value in early_prefect.SERVER_ENV.items():  # no UI, an ephemeral server, final settings
        assert theirs.env[key] == value == ours.env[key]
    prefect_server.SubprocessASGIServer._instances.pop(8765, None)
