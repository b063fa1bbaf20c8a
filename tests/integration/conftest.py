"""Integration tests run the real pieces (Ray, Prefect, PostgreSQL, the registry, containers, workloads)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support import shared_prefect


@pytest.fixture(scope="session", autouse=True)
def _shared_prefect_server(tmp_path_factory: pytest.TempPathFactory):
    """One Prefect server for every `qualify run` of the session (support/shared_prefect.py says why)."""
    if os.environ.get("PREFECT_API_URL"):  # the caller's own server
        yield
        return
    home: Path = tmp_path_factory.mktemp("shared-prefect")
    with shared_prefect.running(home) as api:
        if api:
            os.environ["PREFECT_API_URL"] = api
        try:
            yield
        finally:
            os.environ.pop("PREFECT_API_URL", None)


@pytest.fixture(autouse=True)
def _ephemeral_prefect_when_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """`@pytest.mark.ephemeral_prefect`: this test is about the path without a server (Prefect's ephemeral API)."""
    if request.node.get_closest_marker("ephemeral_prefect"):
        monkeypatch.delenv("PREFECT_API_URL", raising=False)
        monkeypatch.setenv("QUALIFY_PREFECT_REUSE_PORT", "0")  # nor a server someone runs on 4200
