"""Bounds on what a client can make the service hold: request bodies, JSON nesting, and time to send a request.

* A body is read as a stream and refused with 413 as soon as it passes the cap (or its Content-Length says it
  will): nothing beyond the cap is ever buffered.
* JSON nested deeper than MAX_JSON_DEPTH is refused with 400 (Python's parser would recurse until it fails).
* A connection must deliver each request, headers and body, within REQUEST_READ_TIMEOUT_S of being opened or
  of its previous response; a client that trickles (slowloris) is disconnected. uvicorn only times idle
  keep-alive connections, and its timer stops at the first byte of a request.
* A request's head (request line and headers) larger than MAX_HEAD_BYTES is answered 431 and the connection closed:
  the parser would otherwise keep an endless header in memory until the deadline.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import HTTPException, Request
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_JSON_DEPTH = 32  # a registry envelope nests 3 levels
REQUEST_READ_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 16 * 1024  # a request line and headers: a registry's or a CI job's need a few hundred bytes


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


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a head past the cap (httptools re-raises it as its own
    callback error, which uvicorn answers 400 unless send_400_response sees _head_refused)."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (a C parser: a fraction of h11's cost per request) with a deadline for each
    request's headers and body (REQUEST_READ_TIMEOUT_S), counted from the connection or from the previous
    response, and a cap on a request's head (MAX_HEAD_BYTES: answered 431, then closed)."""

    read_timeout_s = REQUEST_READ_TIMEOUT_S
    max_head_bytes = MAX_HEAD_BYTES
    _read_deadline: asyncio.TimerHandle | None = None
    _head_open = True  # between a request's start (the connection, or the previous request's end) and its headers
    _head_bytes = 0
    _heads_ended = 0  # requests whose headers were read
    _received = 0  # requests read to their end
    _answered = 0  # requests answered
    _parsed_head = 0  # the current request's URL and headers as the parser hands them over
    _head_refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        was_open, heads_before = self._head_open, self._heads_ended
        super().data_received(data)
        if not self._head_open or self.transport.is_closing():
            return
        # Still inside a head: all of this chunk was head when no head ended in it; otherwise a new head began
        # somewhere in it (after a body), counted from the next chunk (at most one chunk goes uncounted).
        self._head_bytes = self._head_bytes + len(data) if was_open and heads_before == self._heads_ended else 0
        if self._head_bytes > self.max_head_bytes:
            self._refuse_head()

    # A head that arrives whole in one chunk is counted as the parser hands it over (the raw count above only
    # sees heads still open at a chunk's end): URL and headers, with their separators.
    def on_message_begin(self) -> None:
        self._parsed_head = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_parsed(len(url) + 16)  # the method and version around it
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_parsed(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count_parsed(self, size: int) -> None:
        self._parsed_head += size
        if self._parsed_head > self.max_head_bytes:
            self._head_refused = True
            raise _HeadTooLarge()

    def send_400_response(self, msg: str) -> None:
        if self._head_refused:  # our own callback stopped the parser
            self._refuse_head()
            return
        super().send_400_response(msg)

    def on_headers_complete(self) -> None:
        self._head_open, self._head_bytes = False, 0
        self._heads_ended += 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._received += 1
        self._head_open = True
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._answered += 1
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
        # Every request read is answered, so the client owes the next one (its head or its body): close. A request
        # read in full and not yet answered is the application's time, not a read to time.
        if self._received == self._answered and not self.transport.is_closing():
            self.transport.close()

    def _refuse_head(self) -> None:
        if self.transport.is_closing():
            return
        message = f"the request head is larger than {self.max_head_bytes} bytes".encode()
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8"
                             b"\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(message), message))
        self.transport.close()
