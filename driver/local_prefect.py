"""Reuse this user's Prefect server on the loopback when one is running, instead of starting the ephemeral API.

Prefect's ephemeral API server takes about 9 s to start here (the longest fixed cost of a short run), and its
runs vanish from every UI when it stops. A release manager who runs `prefect server start` wants the runs in
that UI. So, when PREFECT_API_URL is unset, `qualify run` looks for a server on 127.0.0.1:<port> (settings:
QUALIFY_PREFECT_REUSE_PORT, default Prefect's 4200; 0 turns this off) and uses it only when

* the listening socket belongs to this OS user (the kernel's socket table, /proc/net/tcp): another user's
  process on that port would otherwise receive the flow's logs and parameters; and
* it answers Prefect's health check.

Otherwise nothing changes: the ephemeral API starts as before.
"""

from __future__ import annotations

import os

import httpx

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp
_ADDRESSES = ("0100007F", "00000000")  # 127.0.0.1 and 0.0.0.0, as the kernel writes them (little-endian hex)


def listener_uid(port: int, table: str = "/proc/net/tcp") -> int | None:
    """The uid owning a TCP socket listening on 127.0.0.1 or 0.0.0.0 at `port`; None when there is none (or no
    socket table to read: then nothing is reused)."""
    try:
        with open(table, encoding="ascii") as fh:
            lines = fh.read().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 8 or fields[3] != LISTEN:
            continue
        address, _, port_hex = fields[1].partition(":")
        if address in _ADDRESSES and port_hex and int(port_hex, 16) == port:
            return int(fields[7])
    return None


def reusable_api_url(port: int, table: str = "/proc/net/tcp", timeout_s: float = 1.0) -> str | None:
    """The API URL of this user's healthy Prefect server on the loopback at `port`, else None."""
    if port <= 0 or listener_uid(port, table) != os.getuid():
        return None
    api = f"http://127.0.0.1:{port}/api"
    try:
        healthy = httpx.get(f"{api}/health", timeout=timeout_s, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return None
    return api if healthy else None
