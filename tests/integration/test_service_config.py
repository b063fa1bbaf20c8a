"""Configuration traps through the real CLI (issue 25 item 9): secrets in database URLs never printed, a
registry address alone refused as a protected pattern, and `qualify serve --host ::1` served on IPv6 loopback."""

from __future__ import annotations

import socket
import uuid

import httpx
import pytest
from support.cli import run_cli


@pytest.mark.parametrize("url, secret", [("postgresql+psycopg://u@127.0.0.1:1/db?password=qs3cret", "qs3cret"),
                                         ("postgresql+psycopg://u:pa@ssw0rd@127.0.0.1:1/db", "ssw0rd")])
def test_database_url_passwords_are_never_printed(url: str, secret: str) -> None:
    for args in (["runs", "list", "--db", url], ["serve", "--db", url, "--port", "1"]):
        out = run_cli(*args, env={"QUALIFY_SERVICE_TOKEN": ""}, timeout=120)
        assert out.returncode in (2, 3), out
        assert secret not in out.stdout + out.stderr, out.stdout + out.stderr


def test_a_registry_address_alone_is_refused_as_a_protected_pattern(db_url: str) -> None:
    out = run_cli("serve", "--db", db_url, "--protect", "127.0.0.1:5600", "--registry", "127.0.0.1:5600",
                  env={"QUALIFY_SERVICE_TOKEN": "x"}, timeout=120)
    assert out.returncode == 2 and "127.0.0.1:5600/*" in out.stdout + out.stderr, out


def test_serve_listens_on_ipv6_loopback(db_url: str, service_factory) -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    service = service_factory(db_url, "t-" + uuid.uuid4().hex, ["--host", "::1"], start=False)
    service.start(url=f"http://[::1]:{service.port}")
    assert httpx.get(f"http://[::1]:{service.port}/healthz", trust_env=False).json()["status"] == "ok"
