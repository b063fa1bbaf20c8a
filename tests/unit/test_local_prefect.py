"""Reusing this user's Prefect server on the loopback (driver/local_prefect.py): only a listener of this OS user
that answers, read from the kernel's socket table."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qualify.settings import Settings
from qualify_prefect.driver import local_prefect

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _table(tmp_path: Path, *rows: tuple[str, str, int]) -> str:
    lines = [f"   {k}: {addr} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000  {uid}        0 {1000 + k}"
             for k, (addr, state, uid) in enumerate(rows)]
    path = tmp_path / "tcp"
    path.write_text(HEADER + "\n".join(lines) + "\n")
    return str(path)


def test_the_owner_of_a_loopback_or_wildcard_listener_is_read_from_the_socket_table(tmp_path: Path) -> None:
    table = _table(tmp_path, ("0100007F:1068", "0A", 1000),  # 127.0.0.1:4200, listening
                   ("00000000:1F90", "0A", 0),  # 0.0.0.0:8080
                   ("0100007F:0050", "01", 7),  # 127.0.0.1:80, an established connection: not a listener
                   ("0A00000A:1069", "0A", 5))  # 10.0.0.10:4201: not the loopback
    assert local_prefect.listener_uid(4200, table) == 1000
    assert local_prefect.listener_uid(8080, table) == 0
    assert local_prefect.listener_uid(80, table) is None
    assert local_prefect.listener_uid(4201, table) is None
    assert local_prefect.listener_uid(4200, str(tmp_path / "missing")) is None


def test_another_users_listener_is_never_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []
    monkeypatch.setattr(local_prefect.httpx, "get", lambda *a, **k: asked.append(a) or None)
    table = _table(tmp_path, ("0100007F:1068", "0A", os.getuid() + 1))
    assert local_prefect.reusable_api_url(4200, table) is None
    assert local_prefect.reusable_api_url(0, table) is None
    assert asked == []


def test_this_users_healthy_server_is_used_and_an_unhealthy_one_is_not(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    class Answer:
        def __init__(self, status: int) -> None:
            self.status_code = status

    table = _table(tmp_path, ("0100007F:1068", "0A", os.getuid()))
    monkeypatch.setattr(local_prefect.httpx, "get", lambda url, **k: Answer(200))
    assert local_prefect.reusable_api_url(4200, table) == "http://127.0.0.1:4200/api"
    monkeypatch.setattr(local_prefect.httpx, "get", lambda url, **k: Answer(503))
    assert local_prefect.reusable_api_url(4200, table) is None


def test_the_reuse_port_is_a_setting_with_a_clear_error() -> None:
    from qualify.errors import BadInput

    assert Settings.load({}).prefect_reuse_port == 4200
    assert Settings.load({"QUALIFY_PREFECT_REUSE_PORT": "0"}).prefect_reuse_port == 0
    with pytest.raises(BadInput, match="QUALIFY_PREFECT_REUSE_PORT 'yes'"):
        Settings.load({"QUALIFY_PREFECT_REUSE_PORT": "yes"})
