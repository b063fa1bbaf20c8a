"""A workload process ends right after its document (protocol.exit_now), in a real subprocess: a later launch of
its case skips the interpreter's teardown, the first launch runs it (a crash there is still seen)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _run_sleep(tmp_path: Path, launch: dict | None) -> tuple[subprocess.CompletedProcess, bool]:
    marker = tmp_path / f"atexit-{launch and launch['index']}"
    code = ("import atexit, sys\n"
            f"atexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
            "from qualify.workloads import protocol, sleep\n"
            "protocol.exit_now(protocol.run_workload('sleep', sleep.handler))\n")
    case = {"protocol": 1, "case_id": "sleep/x", "kind": "sleep", "params": {"duration_s": 0}, "env": {},
            "timeout_s": 30, **({"launch": launch} if launch else {})}
    res = subprocess.run([sys.executable, "-c", code], input=json.dumps(case), capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return res, marker.exists()


@pytest.mark.parametrize("launch, teardown", [(None, True), ({"index": 0, "of": 3}, True),
                                              ({"index": 1, "of": 3}, False), ({"index": 2, "of": 3}, False)])
def test_a_later_launch_skips_the_teardown_and_the_first_runs_it(tmp_path: Path, launch: dict | None,
                                                                  teardown: bool) -> None:
    res, ran = _run_sleep(tmp_path, launch)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1])["status"] == "passed"  # the document survived
    assert ran is teardown
