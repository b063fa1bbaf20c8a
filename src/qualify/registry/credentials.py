"""Registry credentials: QUALIFY_REGISTRY_USERNAME / QUALIFY_REGISTRY_PASSWORD, else a Docker-style auth
file (REGISTRY_AUTH_FILE, $XDG_RUNTIME_DIR/containers/auth.json, ~/.config/containers/auth.json,
$DOCKER_CONFIG/config.json or ~/.docker/config.json). A Credentials value never prints its secret."""

from __future__ import annotations

import base64
import json
import re
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from qualify.imageref import DEFAULT_REGISTRY

ENV_USERNAME = "QUALIFY_REGISTRY_USERNAME"
ENV_PASSWORD = "QUALIFY_REGISTRY_PASSWORD"
# The registry (host[:port], comma-separated for several) the environment's credentials belong to: without
# it they are sent nowhere, so that `gate check <any-host>/x:y` cannot carry them to another registry.
ENV_HOST = "QUALIFY_REGISTRY_HOST"


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str = ""

    def __repr__(self) -> str:  # never print the secret
        return f"Credentials(username={self.username!r}, source={self.source!r})"

    def basic_header(self) -> str:
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return f"Basic {token}"


def auth_file_candidates(env: Mapping[str, str] | None = None) -> list[Path]:
    env = os.environ if env is None else env
    paths: list[Path] = []
    if env.get("REGISTRY_AUTH_FILE"):
        paths.append(Path(env["REGISTRY_AUTH_FILE"]).expanduser())
    if env.get("XDG_RUNTIME_DIR"):
        paths.append(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
    home = Path(env.get("HOME") or Path.home())
    paths.append(home / ".config" / "containers" / "auth.json")
    docker_dir = Path(env["DOCKER_CONFIG"]).expanduser() if env.get("DOCKER_CONFIG") else home / ".docker"
    paths.append(docker_dir / "config.json")
    return paths


_DOCKER_HUB_KEYS = {"docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"}


def _normalise_key(key: str) -> tuple[str, str]:
    """An auths key ("https://host/v1/", "host", "host/namespace") as (host, path)."""
    key = re.sub(r"^[a-z]+://", "", key.strip()).rstrip("/")
    host, _, path = key.partition("/")
    if host in _DOCKER_HUB_KEYS:
        host, path = DEFAULT_REGISTRY, ("" if path in ("v1", "v2") else path)
    return host, path


def _entry_credentials(entry: Any, source: str) -> Credentials | None:
    if not isinstance(entry, dict):
        return None
    if entry.get("auth"):
        try:
            decoded = base64.b64decode(entry["auth"]).decode()
        except (ValueError, UnicodeDecodeError):
            return None
        user, sep, password = decoded.partition(":")
        return Credentials(user, password, source) if sep else None
    if entry.get("username") and entry.get("password") is not None:
        return Credentials(str(entry["username"]), str(entry["password"]), source)
    return None


def env_hosts(env: Mapping[str, str]) -> set[str]:
    hosts = {h.strip().lower().rstrip("/") for h in env.get(ENV_HOST, "").split(",") if h.strip()}
    return {DEFAULT_REGISTRY if h in _DOCKER_HUB_KEYS else h for h in hosts}


def find_credentials(registry: str, repository: str = "", env: Mapping[str, str] | None = None) -> Credentials | None:
    """Credentials bound to this registry: the environment's when QUALIFY_REGISTRY_HOST names it, else the
    first auth file with an entry for it. Never another registry's."""
    env = os.environ if env is None else env
    host = DEFAULT_REGISTRY if registry in _DOCKER_HUB_KEYS else registry
    if env.get(ENV_USERNAME) and env.get(ENV_PASSWORD) is not None and host in env_hosts(env):
        return Credentials(env[ENV_USERNAME], env.get(ENV_PASSWORD, ""), f"environment ({ENV_HOST})")
    for path in auth_file_candidates(env):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        auths = data.get("auths") if isinstance(data, dict) else None
        if not isinstance(auths, dict):
            continue
        best: tuple[int, Credentials] | None = None
        for key, entry in auths.items():
            k_host, k_path = _normalise_key(str(key))
            if k_host != host:
                continue
            if k_path and not (repository == k_path or repository.startswith(k_path + "/")):
                continue
            creds = _entry_credentials(entry, str(path))
            if creds and (best is None or len(k_path) > best[0]):
                best = (len(k_path), creds)
        if best:
            return best[1]
    return None
