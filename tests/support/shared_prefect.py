"""One real Prefect server for the whole integration session, on loopback.

Every `qualify run` a test starts would otherwise start Prefect's ephemeral API server of its own (about 8 s
here, of a 2-core machine's time, before the flow does anything; measured 8.3 s against 2.0 s for an empty flow
with a server): over the suite's runs that is minutes. The runs reach this server through PREFECT_API_URL, as a
deployment's worker reaches its server. Tests that are about the ephemeral path (the README's main job) opt out
with the `ephemeral_prefect` marker; tests that need a server of their own (deployments, the UI) set their own
PREFECT_API_URL. Without a server that answers, the suite falls back to the ephemeral API, said once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from support.net import free_port
from support.processes import stop_group

PREFECT = str(Path(sys.executable).with_name("prefect"))
START_TIMEOUT_S = 180


@contextmanager
def running(home: Path) -> Iterator[str | None]:
    """A server under `home` for the duration of the block: its API URL, or None when it did not answer."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_API_URL": api}
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "server.log", "wb")  # noqa: SIM115 - the server owns it until the session ends
    server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        up = False
        while time.monotonic() < deadline and server.poll() is None:
            try:
                up = httpx.get(f"{api}/health", timeout=2, trust_env=False).status_code == 200
            except httpx.HTTPError:
                up = False
            if up:
                break
            time.sleep(1)
        if not up:
            print(f"shared Prefect server did not answer (log: {home / 'server.log'}); runs use the ephemeral API",
                  file=sys.stderr)
        yield api if up else None
    finally:
        stop_group(server)
        log.close()
