"""The executor contract and the subprocess runner both executors share."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from qualify.workloads import protocol
from qualify.workloads.procs import kill_group

TAIL_CHARS = 4000


@dataclass
class ExecutionOutcome:
    doc: dict[str, Any]  # a valid result document, always (synthesised when the workload gave none)
    exit_code: int | None
    exec_s: float
    stderr_tail: str = ""
    command: list[str] = field(default_factory=list)

    @property
    def retryable(self) -> bool:
        """Only infrastructure failures (the executor could not start it, a worker or node was lost) may be
        retried; a test failure, a crash or an out-of-memory never is. Timeouts only when the manifest
        asks (execution.retry_timeouts, decided by the pipeline)."""
        return self.doc.get("error_class") == "infra"


class Executor(Protocol):
    def run(self, case_doc: dict[str, Any], *, timeout_s: float, gpu_ids: Sequence[str] = ()) -> ExecutionOutcome:
        ...

    def describe(self) -> str:
        ...


@dataclass
class CommandResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    start_error: str | None
    seconds: float


def run_command(argv: list[str], stdin_text: str, timeout_s: float, env: dict[str, str] | None = None,
                cwd: str | None = None, on_timeout: Any = None) -> CommandResult:
    """Run argv in its own process group; on timeout stop the whole group (workers, compilers):
    SIGTERM, a few seconds to write a document and stop its own children, then SIGKILL."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=cwd, start_new_session=True)
    except OSError as exc:
        return CommandResult(None, "", "", False, f"cannot start {argv[0]!r}: {exc.strerror or exc}",
                             time.monotonic() - start)
    try:
        stdout, stderr = proc.communicate(stdin_text, timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        if on_timeout is not None:
            on_timeout()
        kill_group(proc)
        stdout, stderr = proc.communicate()
    return CommandResult(proc.returncode, stdout or "", stderr or "", timed_out, None, time.monotonic() - start)


def outcome_from_command(case_doc: dict[str, Any], res: CommandResult, command: list[str],
                         timeout_s: float, not_found_hint: str | None = None) -> ExecutionOutcome:
    """Turn a finished command into an outcome with a valid result document.

    Classes: could not start -> infra; timeout -> timeout; killed by SIGKILL without our timeout (the
    kernel's OOM killer) -> oom; killed by another signal (SIGSEGV, SIGABRT, ...) -> crash; non-zero exit
    without a document -> crash (the image's fault, never retried).
    """
    stderr_tail = res.stderr[-TAIL_CHARS:]

    def synth(status: str, error_class: str, message: str) -> dict[str, Any]:
        return protocol.make_result(case_doc, status, error_class=error_class, error=message,
                                    log_tail=stderr_tail, duration_s=res.seconds)

    if res.start_error:
        doc = synth("error", "infra", res.start_error)
    elif res.timed_out:
        doc = synth("error", "timeout", f"case exceeded its timeout of {timeout_s:g} s and was killed")
    else:
        try:
            doc = protocol.parse_result_output(res.stdout)
            problems = protocol.validate_result(doc)
            if problems:
                doc = synth("error", "crash", "malformed result document: " + "; ".join(problems))
        except ValueError:
            if res.returncode is not None and res.returncode < 0:
                doc = synth("error", *signal_class(-res.returncode))
            elif not_found_hint and res.returncode == 127:
                doc = synth("error", "crash", not_found_hint)
            else:
                last = stderr_tail.strip().splitlines()[-1:] or ["no output"]
                doc = synth("error", "crash",
                            f"workload exited with code {res.returncode} without a result: {last[0][:300]}")
    return ExecutionOutcome(doc=doc, exit_code=res.returncode, exec_s=res.seconds, stderr_tail=stderr_tail,
                            command=command)


def signal_class(signum: int) -> tuple[str, str]:
    """The error class and message of a workload killed by a signal (not by our timeout)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if signum == signal.SIGKILL:
        return "oom", f"workload killed by {name} (the kernel's out-of-memory killer, or another process)"
    return "crash", f"workload killed by {name}"


def case_json(case_doc: dict[str, Any]) -> str:
    return json.dumps(case_doc, sort_keys=True)
