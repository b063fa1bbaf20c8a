"""The workload protocol: one case as JSON in, one result document as JSON out.

This module runs INSIDE the candidate image, so it imports only the standard
library (see docs/ARCHITECTURE.md). The orchestrator imports it too, to build
case documents and to check result documents: both sides share one definition.

Case document (input)::

    {"protocol": 1, "case_id": "train/tiny-llama/base", "kind": "train",
     "params": {...kind specific...}, "env": {"NAME": "value"}, "timeout_s": 600}

Result document (output, the LAST line of stdout)::

    {"protocol": 1, "case_id": ..., "kind": ..., "status": "passed|failed|error",
     "error_class": null|"oom"|..., "error": null|"message",
     "metrics": {name: number|null}, "samples": {name: [number, ...]},
     "probes": {name: {"status": "passed|failed|skipped|error", "detail": str,
                       "by_setting": true (only on a skip an explicit setting asked for)}},
     "environment": {...}, "log_tail": str, "duration_s": float}
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import logging
import math
import os
import enum
import sys
import time
import traceback
from typing import Any, Callable, Iterable, NoReturn

from qualify.workloads import measure_gate, phases
from qualify.workloads.procs import die_with_parent
from qualify.workloads.settings import WorkloadSettings

PROTOCOL_VERSION = 1

STATUSES = ("passed", "failed", "error")
ERROR_CLASSES = (
    "oom",
    "nan_loss",
    "crash",
    "timeout",
    "bad_case",
    "load_failed",
    "garbled",
    "degenerate",
    "low_agreement",
    # A quantized case whose weights did not shrink as its scheme must (inference workload).
    "quantization_not_applied",
    # Raised by the orchestrator side, never by a workload: the executor could not
    # start the workload, the worker was lost, or the result could not be read.
    "infra",
)
# A probe never decides its case's status: "failed" is its finding, "skipped" that it did not run
# (with "by_setting": true when an explicit setting turned it off), "error" that it raised.
PROBE_STATUSES = ("passed", "failed", "skipped", "error")


class CaseStatus(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"


ErrorClass = enum.StrEnum("ErrorClass", {name.upper(): name for name in ERROR_CLASSES})
assert tuple(CaseStatus) == STATUSES

# Marks the result line so that a caller can find it even if a library prints to stdout.
RESULT_PREFIX = ""

LOG = logging.getLogger("qualify.workload")


class BadCase(ValueError):
    """The case document asks for something this workload cannot do."""


def measurement_gate() -> None:
    """Wait at the measurement gate when the case has one (workloads/measure_gate.py): a workload calls this
    between its set-up and its measurement (a second call does nothing). No word from the driver in time is a
    timeout (run_workload's document)."""
    measure_gate.wait()


class WorkloadFailure(Exception):
    """The workload ran and the check failed (status 'failed', with an error class)."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


def make_case(case_id: str, kind: str, params: dict[str, Any], env: dict[str, str] | None = None,
              timeout_s: float | None = None) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "case_id": case_id,
        "kind": kind,
        "params": params,
        "env": dict(env or {}),
        "timeout_s": timeout_s,
    }


def make_result(case: dict[str, Any], status: str, *, error_class: str | None = None,
                error: str | None = None, metrics: dict[str, Any] | None = None,
                samples: dict[str, list[float]] | None = None,
                probes: dict[str, dict[str, Any]] | None = None,
                environment: dict[str, Any] | None = None, log_tail: str = "",
                duration_s: float | None = None) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "case_id": case.get("case_id"),
        "kind": case.get("kind"),
        "status": status,
        "error_class": error_class,
        "error": error,
        "metrics": _finite_or_none(metrics or {}),
        "samples": {k: [float(x) for x in v] for k, v in (samples or {}).items()},
        "probes": probes or {},
        "environment": environment or {},
        "log_tail": log_tail,
        "duration_s": duration_s,
    }


def _finite_or_none(metrics: dict[str, Any]) -> dict[str, Any]:
    # JSON has no NaN/inf; a non-finite figure is reported as null, never as a number.
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, float) and not math.isfinite(value):
            out[key] = None
        else:
            out[key] = value
    return out


def validate_result(doc: Any) -> list[str]:
    """Return the problems of a result document (empty when it is well formed)."""
    problems: list[str] = []
    if not isinstance(doc, dict):
        return ["result is not a JSON object"]
    if doc.get("protocol") != PROTOCOL_VERSION:
        problems.append(f"protocol: expected {PROTOCOL_VERSION}, got {doc.get('protocol')!r}")
    if doc.get("status") not in STATUSES:
        problems.append(f"status: {doc.get('status')!r} is not one of {STATUSES}")
    ec = doc.get("error_class")
    if ec is not None and ec not in ERROR_CLASSES:
        problems.append(f"error_class: {ec!r} is not one of {ERROR_CLASSES}")
    if doc.get("status") in ("failed", "error") and ec is None:
        problems.append("error_class: required when status is failed or error")
    for key, kind in (("metrics", dict), ("samples", dict), ("probes", dict), ("environment", dict)):
        if not isinstance(doc.get(key), kind):
            problems.append(f"{key}: expected an object")
    for name, value in (doc.get("metrics") or {}).items():
        if value is not None and not isinstance(value, (int, float)):
            problems.append(f"metrics.{name}: expected a number or null, got {value!r}")
    for name, values in (doc.get("samples") or {}).items():
        if not isinstance(values, list) or not all(isinstance(v, (int, float)) for v in values):
            problems.append(f"samples.{name}: expected a list of numbers")
    for name, probe in (doc.get("probes") or {}).items():
        if not isinstance(probe, dict) or probe.get("status") not in PROBE_STATUSES:
            problems.append(f"probes.{name}: expected an object with status in {PROBE_STATUSES}")
    return problems


def parse_result_output(stdout: str) -> dict[str, Any]:
    """Find the result document: the last stdout line that parses as a JSON object."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(doc, dict) and "status" in doc:
                return doc
    raise ValueError("no JSON result document on the last lines of stdout")


class _TailHandler(logging.Handler):
    """Keeps the last lines logged, for the result document's log_tail."""

    def __init__(self, max_lines: int = 60) -> None:
        super().__init__()
        self.lines: collections.deque[str] = collections.deque(maxlen=max_lines)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def text(self) -> str:
        return "\n".join(self.lines)


def read_case(argv: list[str] | None = None, description: str = "") -> tuple[dict[str, Any], argparse.Namespace]:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--case", help="case document (JSON file); '-' or absent reads stdin")
    args, _ = parser.parse_known_args(argv)
    if args.case and args.case != "-":
        with open(args.case, encoding="utf-8") as fh:
            text = fh.read()
    else:
        text = sys.stdin.read()
    try:
        case = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadCase(f"case is not valid JSON: {exc}") from exc
    if not isinstance(case, dict) or not isinstance(case.get("params", {}), dict):
        raise BadCase("case must be a JSON object with a 'params' object")
    if case.get("protocol", PROTOCOL_VERSION) != PROTOCOL_VERSION:
        raise BadCase(f"case protocol {case.get('protocol')!r} is not {PROTOCOL_VERSION}")
    return case, args


def emit(doc: dict[str, Any], stream: io.TextIOBase | None = None) -> None:
    stream = stream or sys.stdout
    stream.write("\n" + json.dumps(doc, sort_keys=True, allow_nan=False) + "\n")
    stream.flush()


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(s in text for s in ("out of memory", "outofmemory", "can't allocate memory",
                                    "cannot allocate memory", "defaultcpuallocator"))


def run_workload(kind: str, handler: Callable[[dict[str, Any], logging.Logger], dict[str, Any]],
                 argv: list[str] | None = None, *, result_path: str | None = None,
                 failure_exit_code: int | None = None) -> int:
    """Run a workload: read the case, call handler, print exactly one result document.

    handler(case, log) returns the result fields (status, metrics, ...). Exceptions
    become result documents with an error class; exit code is non-zero only when
    not even that could be written, or, with failure_exit_code, when the status is not
    "passed" (a rank of a multi-process case: its launcher then stops the peers).
    result_path: also write the document there (atomically), e.g. a rank's own file.
    """
    # A workload (and each rank a launcher starts) dies with the process that started it: a
    # killed executor or launcher leaves no orphan holding devices, ports or files. A launched
    # rank whose launcher is gone already (reparented to init) stops at once.
    try:
        launched = WorkloadSettings.from_env().launched
    except ValueError:  # a malformed RANK: the handler reports it in a document
        launched = False
    die_with_parent(orphaned_if_init=launched)
    tail = _TailHandler()
    tail.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    stderr_handler = logging.StreamHandler(sys.stderr)
    stderr_handler.setFormatter(tail.formatter)
    root.addHandler(stderr_handler)
    root.addHandler(tail)

    start = time.monotonic()
    phases.CLOCK.start(phases.process_age_s())
    case: dict[str, Any] = {"case_id": None, "kind": kind}
    try:
        case, _ = read_case(argv, description=f"qualify {kind} workload")
        case.setdefault("kind", kind)
        try:
            measure_gate.arm(case)
        except ValueError as exc:
            raise BadCase(str(exc)) from None
        global _LATER_LAUNCH
        _LATER_LAUNCH = later_launch(case)
        for name, value in (case.get("env") or {}).items():
            os.environ[str(name)] = str(value)
        fields = handler(case, LOG)
        phases.enter("report")
        doc = make_result(case, fields.pop("status", "passed"), log_tail=tail.text(),
                          duration_s=time.monotonic() - start, **fields)
    except BadCase as exc:
        LOG.error("bad case: %s", exc)
        doc = make_result(case, "error", error_class="bad_case", error=str(exc),
                          log_tail=tail.text(), duration_s=time.monotonic() - start)
    except WorkloadFailure as exc:
        LOG.error("%s: %s", exc.error_class, exc)
        doc = make_result(case, "failed", error_class=exc.error_class, error=str(exc),
                          log_tail=tail.text(), duration_s=time.monotonic() - start)
    except measure_gate.GateTimeout as exc:
        LOG.error("timeout: %s", exc)
        doc = make_result(case, "error", error_class="timeout", error=str(exc),
                          log_tail=tail.text(), duration_s=time.monotonic() - start)
    except BaseException as exc:  # noqa: BLE001 - every failure must end as a document
        if isinstance(exc, KeyboardInterrupt):
            error_class = "timeout"
        else:
            error_class = "oom" if is_oom(exc) else "crash"
        LOG.error("%s: %s\n%s", error_class, exc, traceback.format_exc(limit=8))
        doc = make_result(case, "error", error_class=error_class,
                          error=f"{type(exc).__name__}: {exc}"[:2000],
                          log_tail=tail.text(), duration_s=time.monotonic() - start)
    doc["environment"].setdefault("phases", phases.CLOCK.finish())
    if measure_gate.RECORD is not None:  # when it waited at the measurement gate (execution/setup_overlap.py)
        doc["environment"].setdefault(measure_gate.SECTION, measure_gate.RECORD)
    try:
        emit(doc)
        if result_path:
            tmp = f"{result_path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(doc, fh, sort_keys=True, allow_nan=False)
            os.replace(tmp, result_path)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 70
    if failure_exit_code is not None and doc.get("status") != "passed":
        return failure_exit_code
    return 0


# Set by run_workload: this process is a later launch of its case (launch index >= 1), see exit_now.
_LATER_LAUNCH = False


def later_launch(case: dict[str, Any]) -> bool:
    launch = case.get("launch")
    index = launch.get("index") if isinstance(launch, dict) else None
    return isinstance(index, int) and not isinstance(index, bool) and index >= 1


def exit_now(code: int) -> NoReturn:
    """End a workload process whose document is written: a later launch of its case skips the interpreter's
    teardown, the case's first launch (or a lone one) exits as any Python process does.

    With torch, DeepSpeed and transformers loaded, the normal exit (atexit handlers, module teardown, the
    collection of a large heap) took 0.7 to 1.1 s a launch here, after the measurement was over. But a crash in
    that teardown (a C++ destructor, a driver's atexit handler) is a defect of the image, judged a crash even
    after a passed document (issue 24): the first launch of every case (and of each side of a paired or duet
    case) still runs it, so such a crash is seen once per case; the later launches, which only repeat the
    measurement, skip it. What must survive is flushed first (the log handlers, stdout with the document,
    stderr); children the workload started are already reaped (a launcher waits for its ranks) or end with it
    (procs.die_with_parent, inductor's compile workers on their closed pipe).
    """
    if not _LATER_LAUNCH:
        sys.exit(code)
    try:
        logging.shutdown()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def environment_base() -> dict[str, Any]:
    """Host facts every workload reports."""
    import platform

    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "visible_devices": WorkloadSettings.from_env().visible_devices,
    }


def percentile(values: Iterable[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
