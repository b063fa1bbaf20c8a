"""Bounds on what a client can make the service hold: request bodies, JSON nesting, and time to send a request.

* A body is read as a stream and refused with 413 as soon as it passes the cap (or its Content-Length says it
  will): nothing beyond the cap is ever buffered.
* JSON nested deeper than MAX_JSON_DEPTH is refused with 400 (Python's parser would recurse until it fails).
* A connection must deliver each request, headers and body, within REQUEST_READ_TIMEOUT_S of being opened or
  of its previous response; a client that trickles (slowloris) is disconnected. uvicorn only times idle
  keep-alive connections, and its timer stops at the first byte of a request.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
from fastapi import HTTPException, Request
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_JSON_DEPTH = 32  # a registry envelope nests 3 levels
REQUEST_READ_TIMEOUT_S = 10.0


async def read_capped(request: Request, cap: int) -> bytes:
    """The body, or HTTPException 413 as soon as it is known to pass `cap` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > cap):
        raise HTTPException(413, f"the body is larger than {cap} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise HTTPException(413, f"the body is larger than {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def depth(value: Any) -> int:
    """How deeply containers nest in a parsed JSON value (iterative: no recursion to exhaust)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level)
            todo.extend((child, level + 1) for child in item if isinstance(child, (dict, list)))
    return deepest


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The parsed body, or HTTPException 400: not JSON, or nested deeper than `max_depth`."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise HTTPException(400, f"the JSON nests deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise HTTPException(400, f"the body is not JSON: {exc}") from None
    if depth(value) > max_depth:
        raise HTTPException(400, f"the JSON nests deeper than {max_depth} levels")
    return value


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers and body (REQUEST_READ_TIMEOUT_S),
    counted from the connection or from the previous response."""

    read_timeout_s = REQUEST_READ_TIMEOUT_S
    _read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
        self._read_deadline = self.loop.call_later(self.read_timeout_s, self._read_expired)

    def _read_expired(self) -> None:
        # IDLE: the request's headers never completed; SEND_BODY: its body never did. DONE: the request is in,
        # the application is answering: not a read to time.
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
            self.transport.close()
