"""Registry credentials go only to the registry they are bound to, never over plain HTTP to a host that is
not loopback, and each side of a copy gets only its own. A fake registry on loopback records every
Authorization header it receives."""

from __future__ import annotations

import base64
import http.server
import threading
from typing import Iterator

import httpx
import pytest

from qualify.imageref import parse_reference
from qualify.registry import RegistryClient, RegistryUnauthorized
from qualify.registry.copier import _auth_files

SECRET = "pa55-word-never-leaks"


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).seen.append(self.headers.get("Authorization"))
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="fake"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_registry() -> Iterator[tuple[str, list[str | None]]]:
    Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", Recorder.seen
    finally:
        server.shutdown()
        server.server_close()


def _env(host: str) -> dict[str, str]:
    return {"QUALIFY_REGISTRY_USERNAME": "ci", "QUALIFY_REGISTRY_PASSWORD": SECRET, "HOME": "/nonexistent",
            "QUALIFY_REGISTRY_HOST": host}


def test_credentials_bound_elsewhere_are_never_sent(fake_registry) -> None:
    host, seen = fake_registry
    with RegistryClient([host], env=_env("registry.example.com")) as client, pytest.raises(RegistryUnauthorized):
        client.resolve(f"{host}/x/y:1")
    assert seen and all(h is None for h in seen), seen


def test_credentials_bound_to_the_registry_are_sent_to_it(fake_registry) -> None:
    host, seen = fake_registry
    with RegistryClient([host], env=_env(host)) as client, pytest.raises(RegistryUnauthorized):
        client.resolve(f"{host}/x/y:1")  # the fake refuses everyone: what matters is what it received
    expected = "Basic " + base64.b64encode(f"ci:{SECRET}".encode()).decode()
    assert expected in seen


def test_no_basic_credentials_over_plain_http_to_a_remote_host() -> None:
    """A remote plain-HTTP registry cannot exist on this machine: httpx's MockTransport stands in for it."""
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization"))
        return httpx.Response(401, headers={"WWW-Authenticate": 'Basic realm="r"'})

    with RegistryClient(["plain.example.com"], env=_env("plain.example.com"),
                        transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(RegistryUnauthorized, match="plain HTTP"):
            client.resolve("plain.example.com/x/y:1")
    assert seen == [None]


def test_each_side_of_a_copy_gets_only_its_own_credentials() -> None:
    src, dst = parse_reference("src.example.com/a/b@sha256:" + "1" * 64), parse_reference("dst.example.com/a/b:1")
    import json
    from pathlib import Path

    with _auth_files(src, dst, _env("src.example.com")) as args:
        assert args[0] == "--src-authfile" and "--dest-authfile" not in args
        auths = json.loads(Path(args[1]).read_text())["auths"]
        assert set(auths) == {"src.example.com"}
