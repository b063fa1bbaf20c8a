"""The real `qualify` entry point in a subprocess (the exit codes CI relies on), one way for every test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.paths import REPO


def cli_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a run that keeps its data, Ray session and Prefect home under `tmp`."""
    env = dict(os.environ)
    env.update({"QUALIFY_DATA_DIR": str(tmp / "data"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                # AF_UNIX socket paths must stay under 108 bytes: Ray's session folder goes short.
                "QUALIFY_RAY_TEMP": f"/tmp/qr-{abs(hash(str(tmp))) % 10**8}", "PREFECT_HOME": str(tmp / "prefect")})
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m qualify ARGS` with the test process's environment (plus `env`)."""
    return subprocess.run([sys.executable, "-m", "qualify", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd or REPO, timeout=timeout)


def run_qualify(args: list[str], tmp: Path, timeout: float = 900, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m qualify ARGS` with its data under `tmp` (cli_env)."""
    return run_cli(*args, env=cli_env(tmp, **env), timeout=timeout)
