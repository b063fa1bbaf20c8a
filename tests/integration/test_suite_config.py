"""The suite's own pytest configuration (pyproject.toml): a crashed test worker under `-n 2 --dist loadfile` (the
README's test command) fails the run at once. With xdist's default restarts, loadfile scheduling waited for ever
on the lost worker's files: CI would spend its whole budget hanging instead of going red in minutes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_a_crashed_worker_fails_the_run_instead_of_hanging_it(tmp_path: Path) -> None:
    (tmp_path / "test_crash.py").write_text("import os, time\n\ndef test_first():\n    time.sleep(0.5)\n\n"
                                            "def test_crash():\n    os._exit(1)\n")
    for k in range(4):
        (tmp_path / f"test_more{k}.py").write_text("import time\n\ndef test_x():\n    time.sleep(0.5)\n")
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir",
                              str(tmp_path), "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
                              str(tmp_path)], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"pytest still ran 180 s after a worker crashed (restarts allowed?): {str(exc.stdout)[-1500:]}")
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    # xdist names the lost test when it handles the worker's loss first ("crashed while running"). When a loaded
    # controller is still handling the test the worker finished just before it died, it sends that worker more work
    # and stops on its closed channel instead (INTERNALERROR "cannot send (already closed?)", seen once in CI, exit 3).
    # Both end the run red at once, which is what the configuration must guarantee; the second is xdist's race.
    named = "crashed while running" in out and "test_crash" in out
    lost_worker = "INTERNALERROR" in out and "cannot send (already closed?)" in out
    assert named or lost_worker, out[-3000:]
