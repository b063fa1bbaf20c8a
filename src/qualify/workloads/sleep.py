"""A workload of fixed duration: the overhead benchmark's unit, and a fault-injection target.

params: duration_s (sleep this long), exit_code (exit with it and no document),
hang (sleep far past any timeout), fail (report status failed), kill_self_after_s
(die by SIGKILL, as the kernel's OOM killer does), signal (die by this signal, e.g. SEGV),
kill_worker_once_marker (kill the process that launched the workload -- the executor's worker --
only while this file is absent: a lost worker, the infrastructure fault a retry outlives),
hold_until_file (wait until this file exists before the sleep: a test holds a case running for as long
as it needs, and releases it by creating the file, instead of betting that a sleep outlasts a slow machine;
the case timeout still bounds the wait).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from qualify.workloads import phases, protocol


def handler(case: dict[str, Any], log: Any) -> dict[str, Any]:
    params = case.get("params") or {}
    duration = float(params.get("duration_s", 1.0))
    if duration < 0:
        raise protocol.BadCase(f"params.duration_s must be >= 0, got {duration}")
    marker = params.get("kill_worker_once_marker")
    if marker and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getppid(), signal.SIGKILL)
        os._exit(0)
    if params.get("signal"):
        name = str(params["signal"]).upper()
        os.kill(os.getpid(), getattr(signal, name if name.startswith("SIG") else f"SIG{name}"))
    if params.get("kill_self_after_s") is not None:
        time.sleep(float(params["kill_self_after_s"]))
        os.kill(os.getpid(), signal.SIGKILL)
    if params.get("exit_code") is not None:
        log.error("exiting with code %s as asked", params["exit_code"])
        sys.stderr.flush()
        os._exit(int(params["exit_code"]))
    if params.get("hang"):
        time.sleep(10**6)
    if params.get("hold_until_file"):
        while not os.path.exists(str(params["hold_until_file"])):
            time.sleep(0.05)
    protocol.measurement_gate()  # between set-up and measurement (workloads/measure_gate.py)
    phases.enter(phases.MEASURE)  # the sleep is this workload's measurement (the overhead benchmark's unit)
    start = time.monotonic()
    time.sleep(duration)
    wall = time.monotonic() - start
    phases.enter("report")
    if params.get("fail"):
        raise protocol.WorkloadFailure("crash", "asked to fail")
    return {"status": "passed", "metrics": {"wall_s": wall}, "samples": {"wall_s": [wall]},
            "environment": protocol.environment_base()}


if __name__ == "__main__":
    protocol.exit_now(protocol.run_workload("sleep", handler))
