"""A workload that reports the samples it is given: exercises the gate end to end in seconds.

params:
  samples: {metric: [values, ...]}   each metric's figure is the median of its samples; samples stored
  launch_samples: [{metric: [...]}, ...]
                                      launch k of the case reports entry k (modulo the list) instead of
                                      `samples`: launch-to-launch variation on demand. In a paired case k is
                                      the launch's slot in the whole counterbalanced sequence (`launch.slot`),
                                      so the two sides of a pair report different entries: pairs with spread
  slowdown: f                         fractional extra work per step (0.10 = 10% more compute), the same name
                                      and meaning as the training workload's: a higher-is-better figure (a
                                      rate, `*_per_s*`) is divided by 1 + f, a time (`*_s`, `*_s_p90`)
                                      multiplied by it, anything else left alone. A slower candidate on
                                      demand (the baseline side of a paired case never gets it); a
                                      negative f does less work: a faster candidate (a reference to beat)
  steps: n                            also run n timed steps of real work (pure-Python arithmetic, `step_work`
                                      iterations a step, default 200000; with slowdown f, (1 + f) times that
                                      work): samples step_time_s, metric steps_per_s. With a duet section in
                                      the case (gate.regression.baseline: duet) the process is pinned to its
                                      cpu set and both sides start each step together (workloads/duet.py).
  setup_work: n                       n iterations of the steps' pure-Python work before the measurement gate (a
                                      set-up of known cost, as a real workload's imports and model build:
                                      execution/setup_overlap.py's tests); the gate comes before the samples
                                      and the timed steps either way (workloads/measure_gate.py)
  fail: <error class>                 report a failed result of that class (e.g. low_agreement, nan_loss)
  signal: SEGV                        die by that signal (a crash the executor must classify)
  after_result: SEGV | <int>          print the (passed) document, then die by that signal or exit with that
                                      code at interpreter exit (a crash in teardown, after the figures)
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import statistics
import sys
import time
from typing import Any

from qualify.workloads import duet, phases, protocol


def _slowed(metric: str, value: float, slowdown: float) -> float:
    """The figure of a run that does 1 + slowdown times the work: rates (`*_per_s*`) fall, times (`*_s`,
    `*_s_p90`, ...) grow, anything else stays. By name: the workload runs in the image and cannot import
    qualify.metrics (tests/unit/test_workload_boundary.py)."""
    if "_per_s" in metric:
        return value / (1 + slowdown)
    if re.search(r"_s(_|$)", metric):
        return value * (1 + slowdown)
    return value


def _signal(value: Any, field: str) -> int:
    name = str(value).upper()
    signum = getattr(signal, name if name.startswith("SIG") else f"SIG{name}", None)
    if not isinstance(signum, int):
        raise protocol.BadCase(f"params.{field}: {value!r} is not a signal name")
    return signum


def _end_after_result(value: Any) -> None:
    """At interpreter exit (after the document was printed): die by a signal or exit with a code."""
    if isinstance(value, int) and not isinstance(value, bool):
        atexit.register(os._exit, value)
        return
    signum = _signal(value, "after_result")
    atexit.register(lambda: (sys.stdout.flush(), os.kill(os.getpid(), signum)))


def handler(case: dict[str, Any], log: Any) -> dict[str, Any]:
    params = case.get("params") or {}
    if params.get("signal"):
        signum = _signal(params["signal"], "signal")
        sys.stderr.flush()
        os.kill(os.getpid(), signum)
    if params.get("after_result") is not None:
        _end_after_result(params["after_result"])
    samples = params.get("samples") or {}
    by_launch = params.get("launch_samples")
    if by_launch is not None:
        if not isinstance(by_launch, list) or not by_launch:
            raise protocol.BadCase("params.launch_samples must be a non-empty list of sample maps")
        launch = case.get("launch") or {}
        index = launch.get("slot", launch.get("index", 0)) if isinstance(launch, dict) else 0
        samples = by_launch[(index if isinstance(index, int) else 0) % len(by_launch)]
    if not isinstance(samples, dict) or not all(
            isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
            for v in samples.values()):
        raise protocol.BadCase("params.samples must map metric names to non-empty lists of numbers")
    slowdown = params.get("slowdown", 0.0)
    if isinstance(slowdown, bool) or not isinstance(slowdown, (int, float)) or not -0.9 <= slowdown < 10:
        raise protocol.BadCase(f"params.slowdown: a fraction in [-0.9, 10), got {slowdown!r}")
    setup_work = params.get("setup_work", 0)
    if isinstance(setup_work, bool) or not isinstance(setup_work, int) or setup_work < 0:
        raise protocol.BadCase(f"params.setup_work: a non-negative integer, got {setup_work!r}")
    if setup_work:
        phases.enter("model_build")
        _work(setup_work)
    protocol.measurement_gate()  # between set-up and measurement (workloads/measure_gate.py)
    series = {name: [_slowed(name, float(x), slowdown) for x in values] for name, values in samples.items()}
    metrics = {name: statistics.median(values) for name, values in series.items()}
    environment = protocol.environment_base()
    if params.get("steps") is not None:
        step_times, duet_env = _timed_steps(case, params, slowdown)
        series["step_time_s"] = step_times
        metrics["steps_per_s"] = 1.0 / statistics.median(step_times)
        metrics["step_time_s_median"] = statistics.median(step_times)
        if duet_env:
            environment["duet"] = duet_env
    if params.get("fail"):
        error_class = str(params["fail"])
        if error_class not in protocol.ERROR_CLASSES:
            raise protocol.BadCase(f"params.fail: {error_class!r} is not one of {protocol.ERROR_CLASSES}")
        return {"status": "failed", "error_class": error_class, "error": f"asked to fail as {error_class}",
                "metrics": metrics, "samples": series, "environment": environment}
    return {"status": "passed", "metrics": metrics, "samples": series, "environment": environment}


FILLER_ITERATIONS = 10_000  # about a millisecond here: the barrier's poll interval while a side waits


def _work(iterations: int) -> float:
    """One unit of real CPU work (no sleep): a pure-Python arithmetic loop."""
    acc = 0.0
    for i in range(iterations):
        acc += (i % 7) * 0.5
    return acc


def _timed_steps(case: dict[str, Any], params: dict[str, Any], slowdown: float) -> tuple[list[float], dict | None]:
    steps, work = params.get("steps"), params.get("step_work", 200_000)
    for name, value in (("steps", steps), ("step_work", work)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise protocol.BadCase(f"params.{name}: a positive integer, got {value!r}")
    try:
        barrier = duet.enter(case, trade_cores=True)
    except (ValueError, OSError) as exc:
        raise protocol.BadCase(f"duet: {exc}") from None
    iterations = int(round(work * (1 + slowdown)))
    times: list[float] = []

    def filler() -> None:  # a busy wait at the barrier: the same loop as a step, about a millisecond of it
        _work(FILLER_ITERATIONS)

    try:
        phases.enter("warmup")
        _work(iterations)  # warm-up, untimed
        phases.enter(phases.MEASURE)
        for _ in range(steps):
            if barrier is not None:
                barrier.wait(filler)
            start = time.perf_counter()
            _work(iterations)
            times.append(time.perf_counter() - start)
            if barrier is not None:
                barrier.done()
    finally:
        phases.enter("report")
        if barrier is not None:
            barrier.close()
    return times, (barrier.report() if barrier is not None else None)


if __name__ == "__main__":
    protocol.exit_now(protocol.run_workload("synthetic", handler))
