"""The real gating service (`qualify serve`) as a process on a free loopback port, and the registry-side
helpers its tests share: a registry endpoint that notifies it, and a manifest push with a chosen Host header
(Distribution copies the pusher's Host header into the event's `request.host`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from support.net import free_port
from support.paths import REPO

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Service:
    """`qualify serve` with `args`, its token in the environment, its output in `log`."""

    db: str
    token: str
    root: Path
    args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)  # more environment (e.g. registry credentials)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.root / "serve.log"

    def endpoint(self) -> dict[str, Any]:
        """A registry's notifications endpoint for this service (as README's example configures it)."""
        return {"name": "qualify", "url": f"{self.url}/v1/registry/events",
                "headers": {"Authorization": [f"Bearer {self.token}"]}, "timeout": "3s", "threshold": 3,
                "backoff": "1s", "ignoredmediatypes": ["application/octet-stream"]}

    def start(self, timeout: float = 60.0, url: str | None = None) -> "Service":
        """Start it and wait for /healthz at `url` (default: self.url)."""
        self.root.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "QUALIFY_SERVICE_TOKEN": self.token, "QUALIFY_DATA_DIR": str(self.root / "data"),
               **self.env}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "qualify", "serve", "--db", self.db, "--port",
                                          str(self.port), "--no-access-log", *self.args], env=env, cwd=REPO,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"qualify serve exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url or self.url}/healthz", timeout=2, trust_env=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"qualify serve did not answer within {timeout}s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def make(db: str, token: str, args: list[str] | None = None, start: bool = True) -> Service:
        service = Service(db, token, tmp_path / f"service-{len(started)}", list(args or []))
        started.append(service)
        return service.start() if start else service

    yield make
    for service in started:
        service.stop()


def put_manifest(registry_url: str, repository: str, digest: str, tag: str, host: str | None = None,
                 auth: tuple[str, str] | None = None, media_type: str | None = None) -> httpx.Response:
    """Tag `digest` as `tag` by a manifest PUT, as any pusher can, with the Host header `host` (default: the
    registry's own address). `media_type` overrides the Content-Type Distribution records for it."""
    with httpx.Client(base_url=registry_url, trust_env=False, timeout=30, auth=auth) as client:
        got = client.get(f"/v2/{repository}/manifests/{digest}", headers={"Accept": OCI_MANIFEST})
        got.raise_for_status()
        headers = {"Content-Type": media_type or got.headers["content-type"]}
        if host is not None:
            headers["Host"] = host
        return client.put(f"/v2/{repository}/manifests/{tag}", content=got.content, headers=headers)
