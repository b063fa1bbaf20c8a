"""Hostile manifests through the CLI, as a user runs it: each exits 2 within seconds, names the file and the
field or the cap, never prints a traceback, and prints a bounded output. The CLI runs as a subprocess with a
timeout and a memory limit, because the holes these close were hangs and crashes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.hostile import FIXTURES, GENERATED, SMOKE, expectations, limits
from support.paths import REPO

RUN_TIMEOUT_S = 20  # a refusal takes about a second; the holes were hangs of minutes
MAX_LINES = 100
MAX_CHARS = 20_000
CHILD_MEMORY = 4 << 30  # /dev/zero and the alias bomb ate memory until MemoryError


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def run_cli(*args: str) -> tuple[int, str, float]:
    """`python -m qualify ARGS` in a child process: exit code, stdout+stderr, seconds."""
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "qualify", *args], cwd=REPO, capture_output=True,
                              timeout=RUN_TIMEOUT_S, preexec_fn=_limit_memory if os.name == "posix" else None)
    except subprocess.TimeoutExpired:
        pytest.fail(f"qualify {' '.join(args)}: no answer within {RUN_TIMEOUT_S} s")
    output = (proc.stdout + proc.stderr).decode("utf-8", errors="replace")
    return proc.returncode, output, time.monotonic() - start


def assert_refused(result: tuple[int, str, float], path: Path | str, fragments: list[str]) -> None:
    code, output, _ = result
    shown = output if len(output) < 3000 else output[:1500] + "\n...\n" + output[-1500:]
    assert "Traceback" not in output, shown
    assert code == 2, f"exit {code}:\n{shown}"
    assert str(path) in output, f"the file is not named:\n{shown}"
    for fragment in fragments:
        assert fragment in output, f"{fragment!r} not in:\n{shown}"
    assert len(output.splitlines()) < MAX_LINES, f"{len(output.splitlines())} lines:\n{shown}"
    assert len(output) < MAX_CHARS, f"{len(output):,} characters:\n{shown}"


@pytest.mark.parametrize("command", ["validate", "cases"])
@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_hostile_fixture_cli(fixture: Path, command: str) -> None:
    path = fixture.relative_to(REPO)
    assert_refused(run_cli(command, str(path)), path, expectations(fixture))


@pytest.mark.parametrize("command", ["validate", "cases"])
@pytest.mark.parametrize("name", sorted(GENERATED))
def test_hostile_generated_cli(tmp_path: Path, name: str, command: str) -> None:
    if name in ("fifo", "dev_zero", "symlink_to_dev_zero") and not Path("/dev/zero").exists():
        pytest.skip("needs a POSIX system")
    build, expect = GENERATED[name]
    path = build(tmp_path)
    assert_refused(run_cli(command, str(path)), path, expect(limits()))


def test_validate_names_every_hostile_file_at_once() -> None:
    paths = [str(p.relative_to(REPO)) for p in FIXTURES]
    code, output, _ = run_cli("validate", *paths, str(SMOKE.relative_to(REPO)))
    assert code == 2 and "Traceback" not in output, output
    for path in paths:
        assert path in output, path
    assert "ok releases/cpu-smoke.yaml" in output
