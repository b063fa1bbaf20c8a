"""Finished results reach disk before the database: a failed write never loses a case.

The driver spools each final result (the case's document plus where and how long it ran) as one JSON
file under <data dir>/spool/run-<id>/, writes it to the database with retries, and removes the file once
the row is committed. `qualify run --resume RUN` records whatever a crash left in the spool before it
decides which cases still need to run, so a finished case is never run twice.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from sqlalchemy.exc import OperationalError

T = TypeVar("T")


@dataclass(frozen=True)
class SpooledResult:
    case_id: str
    doc: dict[str, Any]
    attempts: int
    queue_wait_s: float | None
    exec_s: float | None
    node: str | None
    fingerprint: dict[str, Any]


def run_dir(data_dir: Path, run_id: int) -> Path:
    return data_dir / "spool" / f"run-{run_id}"


def _file_name(case_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", case_id) + ".json"


def write(data_dir: Path, run_id: int, result: SpooledResult) -> Path:
    """Atomically (write + rename) and durably (fsync) store one result; returns its path."""
    directory = run_dir(data_dir, run_id)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / _file_name(result.case_id)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(asdict(result), fh, sort_keys=True, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def pending(data_dir: Path, run_id: int) -> Iterator[tuple[Path, SpooledResult]]:
    """What a previous driver of this run spooled and never committed (unreadable files are skipped)."""
    directory = run_dir(data_dir, run_id)
    if not directory.is_dir():
        return
    for path in sorted(directory.glob("*.json")):
        try:
            yield path, SpooledResult(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            continue


def with_retries(write_once: Callable[[], T], *, attempts: int = 6, first_delay_s: float = 1.0,
                 on_retry: Callable[[int, Exception], None] = lambda _n, _e: None,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """Call write_once until it succeeds; retry only what a busy or briefly unreachable database raises
    (OperationalError: locked, connection lost), with exponential backoff (1, 2, 4, ... s)."""
    delay = first_delay_s
    for attempt in range(1, attempts + 1):
        try:
            return write_once()
        except OperationalError as exc:
            if attempt == attempts:
                raise
            on_retry(attempt, exc)
            sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")
