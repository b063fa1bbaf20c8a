"""The temporary Prefect API started at once, beside the imports (issue 27: the whole command's fixed cost).

Without a Prefect server, Prefect starts its own temporary API server the first time the flow needs it: a
`uvicorn prefect.server.api.server:create_app` subprocess on a free loopback port, about 5.5 s here before it
answers. It starts only after Prefect and the flow module are imported (3-5 s more), one after the other. The
launcher starts the same server itself, before it imports anything of Prefect, and points PREFECT_API_URL at
it: the imports and the server's start overlap, and the flow waits for its health check only when it needs it.

It is Prefect's server with Prefect's own settings for a temporary one (no UI, ephemeral, final settings),
listening on 127.0.0.1 only, started after the lifetime watcher is bound (it dies with the driver, even on
kill -9), and stopped by the launcher when the run ends (terminate, then kill after 5 s), as Prefect stops its
own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

# Prefect's own environment for its temporary server (prefect.server.api.server.SubprocessASGIServer).
SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
ADDRESS_IN_USE = 3  # uvicorn's exit code when its port was taken meanwhile
STARTS = 5


@dataclass
class TemporaryServer:
    port: int
    process: subprocess.Popen
    started_at: float = field(default_factory=time.monotonic)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def wait_healthy(self, timeout_s: float) -> None:
        """Return once /api/health answers 200; RuntimeError when the server ended or did not answer in time."""
        import httpx

        deadline = time.monotonic() + timeout_s
        with httpx.Client(trust_env=False, timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    if self.process.returncode == ADDRESS_IN_USE:  # the free port was taken before uvicorn bound it
                        self._restart()
                        continue
                    raise RuntimeError(f"the temporary Prefect API server ended with exit code "
                                       f"{self.process.returncode} before it answered")
                try:
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        raise RuntimeError(f"the temporary Prefect API server on {self.api_url} did not answer within {timeout_s:g} s")

    def _restart(self) -> None:
        self.port = free_port()
        self.process = _spawn(self.port)
        os.environ["PREFECT_API_URL"] = self.api_url

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _prefect_dir() -> Path:
    spec = find_spec("prefect")  # where Prefect is, without importing it (its import is what this overlaps)
    assert spec is not None and spec.origin is not None, "prefect is not installed"
    return Path(spec.origin).parent


def _spawn(port: int) -> subprocess.Popen:
    # As Prefect runs its own (SubprocessASGIServer._run_uvicorn_command), with this process's environment: the
    # Prefect settings prepare_environment put there, PREFECT_HOME and its database.
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(_prefect_dir().parent), "--factory",
         "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "error", "--lifespan", "on"],
        env={**env, **SERVER_ENV}, stdin=subprocess.DEVNULL)


def start() -> TemporaryServer:
    """Start the server and point PREFECT_API_URL at it (Prefect, imported afterwards, uses it as any server)."""
    port = free_port()
    server = TemporaryServer(port, _spawn(port))
    os.environ["PREFECT_API_URL"] = server.api_url
    return server
