"""Loopback ports for the servers tests start."""

from __future__ import annotations

import socket


def free_port(preferred: int | None = None) -> int:
    """`preferred` when it is free, else any free loopback port."""
    if preferred:
        with socket.socket() as sock:
            # As Go's listener does: connections in TIME_WAIT from the last session do not block it.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", preferred))
                return preferred
            except OSError:
                pass
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
