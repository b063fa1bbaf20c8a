"""A workload process ends right after its document (protocol.exit_now), in a real subprocess."""

from __future__ import annotations

import os


def test_a_workload_process_ends_right_after_its_document_without_the_teardown(tmp_path) -> None:
    """protocol.exit_now: what was printed survives (flushed), the exit code is kept, atexit handlers do not run."""
    import subprocess
    import sys

    marker = tmp_path / "atexit-ran"
    code = ("import atexit, sys\n"
            f"atexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
            "from qualify.workloads.protocol import exit_now\n"
            "sys.stdout.write('{\"document\": 1}')\n"
            "exit_now(3)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert res.returncode == 3 and res.stdout == '{"document": 1}'
    assert not marker.exists()
