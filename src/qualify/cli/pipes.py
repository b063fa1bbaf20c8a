"""Output to a pipe that closed (`qualify gate check --json | head`): not an error of the candidate or of the
infrastructure (issue 24.12). Once the reader is gone, what the command still prints is dropped and the
command goes on to its own exit code; nothing is reported."""

from __future__ import annotations

import os
from typing import Any, TextIO


class ClosedPipeSafe:
    """A text stream that swallows BrokenPipeError: the first one points its file descriptor at /dev/null (so
    that the interpreter's own flush at exit does not fail either) and every later write is dropped."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_by_reader = False

    def _closed(self) -> None:
        self.closed_by_reader = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # no descriptor (a test's stream): dropping is enough
            pass

    def write(self, text: str) -> int:
        if self.closed_by_reader:
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._closed()
            return len(text)

    def flush(self) -> None:
        if self.closed_by_reader:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._closed()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ...
        return getattr(self._stream, name)
