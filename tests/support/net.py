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


class Blackhole:
    """A loopback listener that accepts every connection and never answers (a registry that hangs). A context
    manager; `host` is its host:port."""

    def __init__(self) -> None:
        import threading

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(1024)
        self.host = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self._held: list[socket.socket] = []  # every connection accepted: how many callers wait on it
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._held.append(conn)

    def __enter__(self) -> "Blackhole":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        except OSError:
            pass
        self._sock.close()
        for conn in self._held:
            conn.close()
