"""How a registry is reached: the one rule for plain HTTP, shared by the HTTP client, skopeo and builders."""

from __future__ import annotations

import ipaddress
from typing import Iterable


def is_loopback(registry: str) -> bool:
    host = registry.rsplit(":", 1)[0] if not registry.endswith("]") else registry
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plain_http(registry: str, listed: Iterable[str] = ()) -> bool:
    """Plain HTTP (no TLS) only for a registry listed as insecure (`--insecure-registry`,
    `promotion.insecure_registries`); `registry` is host[:port]. Everything else uses verified TLS."""
    names = {r.strip().rstrip("/") for r in listed if r and r.strip()}
    host = registry.rsplit(":", 1)[0] if not registry.endswith("]") else registry
    return registry in names or host in names
