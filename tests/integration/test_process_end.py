"""`qualify run` ends without the interpreter's module teardown (qualify.cli.process_end), in a real subprocess:
what an exit must still do happens, in the interpreter's order (threading's exit callbacks, the non-daemon
threads joined, then every exit handler, then stdout and stderr flushed), the exit status is the command's, and the teardown itself does not run
(an object's finalizer that only the teardown would call stays silent, and does speak in a normal exit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import atexit, os, sys, threading, time
from pathlib import Path
from qualify.cli.process_end import end_now, exit_code
out = Path(sys.argv[1])
order = []
def worker():
    time.sleep(0.3)
    order.append("thread")
threading.Thread(target=worker).start()  # non-daemon: joined before the exit handlers
threading._register_atexit(lambda: order.append("threading-exit"))  # where Prefect's services drain: first
atexit.register(lambda: (order.append("handler"), (out / "order").write_text(",".join(order))))
class Torn:
    def __del__(self, _write=os.write):  # a module global: only the teardown finalizes it (os.write bound now:
        _write(2, b"TEARDOWN")           # the teardown clears the modules' names first)
torn = Torn()
if sys.argv[2] == "normal":
    sys.exit(0)
sys.stdout.write("buffered, never flushed by the script")
try:
    raise SystemExit(eval(sys.argv[2]))
except SystemExit as exc:
    end_now(exit_code(exc))
"""


@pytest.mark.parametrize("raised, status", [("None", 0), ("1", 1), ("3", 3), ("'a message'", 1)])
def test_the_process_ends_with_the_commands_status_after_its_threads_and_exit_handlers(
        tmp_path: Path, raised: str, status: int) -> None:
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), raised], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert res.returncode == status, res.stderr[-2000:]
    assert (tmp_path / "order").read_text() == "threading-exit,thread,handler"
    assert res.stdout == "buffered, never flushed by the script"
    assert "TEARDOWN" not in res.stderr  # the module teardown was skipped
    if raised == "'a message'":
        assert "a message" in res.stderr


def test_the_finalizer_this_file_watches_does_run_in_a_normal_exit(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), "normal"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert res.returncode == 0 and "TEARDOWN" in res.stderr, res.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.prefect
@pytest.mark.ephemeral_prefect
def test_a_run_on_the_temporary_prefect_server_sends_its_last_log_lines_before_the_server_stops(
        tmp_path: Path) -> None:
    """The flow run's last lines (the verdict, then the report's link) are sent while Prefect's temporary API server
    still runs: its log service drains in threading's exit callbacks, before the exit handler that stops the server.
    Skipping that step lost them, and logging's own last flush then waited 5 s for a server already gone."""
    import json
    import sqlite3

    from support.cli import run_qualify
    from support.flows import sleep_manifest

    manifest = sleep_manifest(tmp_path / "m.yaml", [{"name": "nap", "kind": "sleep", "params": {"duration_s": 0.1}}])
    # Lines batched for a minute: none is sent before the exit's drain, whenever the run ends.
    res = run_qualify(["run", str(manifest), "--db", f"sqlite:///{tmp_path / 'q.db'}", "--json"], tmp_path,
                      PREFECT_LOGGING_TO_API_BATCH_INTERVAL="60")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    run_id = json.loads(res.stdout)["run_id"]
    with sqlite3.connect(tmp_path / "prefect" / "prefect.db") as db:  # the temporary server's (PREFECT_HOME)
        messages = [m for (m,) in db.execute("SELECT message FROM log ORDER BY timestamp")]
    assert any(m.startswith(f"verdict of run {run_id}: PASS") for m in messages), messages[-5:]
    assert any(m.startswith("report: ") for m in messages), messages[-5:]
