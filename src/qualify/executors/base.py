"""The executor contract and the subprocess runner both executors share."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from qualify.executors.proctree import TRACK_VAR, ProcessTracker
from qualify.workloads import protocol
from qualify.workloads.procs import GRACE_S, KILL_WAIT_S, kill_group

TAIL_CHARS = 4000
# How often a tracked workload's descendants are sampled (every POLL_S at first, then less often
# up to POLL_MAX_S: a sample reads /proc/*/stat, a few ms, and must not perturb a benchmark), and
# how long the output of a workload that exited may stay open (held by something it started)
# before that is killed.
POLL_S = 0.25
POLL_MAX_S = 2.0
LINGER_S = 5.0


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
                cwd: str | None = None, on_timeout: Any = None, *, track: bool = True,
                grace_s: float = GRACE_S, kill_wait_s: float = KILL_WAIT_S, linger_s: float = LINGER_S,
                poll_s: float = POLL_S) -> CommandResult:
    """Run argv in its own process group, every wait bounded, nothing of it left behind.

    On timeout: on_timeout() (the container executor removes its container), then SIGTERM to
    the group and to every tracked process, grace_s to write a document and stop its own
    children, then SIGKILL to all of them. With track (the default) the workload's environment carries a
    token and its descendants are sampled while it runs (qualify.executors.proctree), so that a
    launcher that moved to a new session (torchrun, deepspeed) and its ranks are found and
    killed too, on a timeout and after a normal exit alike. Reading the output is bounded as
    well: a descendant that keeps the pipes open after the workload exited gets linger_s, then
    it is killed and the pipes are closed (the output read so far is kept).
    """
    start = time.monotonic()
    deadline = start + timeout_s
    token = uuid.uuid4().hex if track else None
    if token is not None:
        env = dict(os.environ if env is None else env)
        env[TRACK_VAR] = token
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=cwd, start_new_session=True)
    except OSError as exc:
        return CommandResult(None, "", "", False, f"cannot start {argv[0]!r}: {exc.strerror or exc}",
                             time.monotonic() - start)
    tracker = ProcessTracker(proc.pid, token) if track else None
    reader = _Reader(proc, stdin_text)
    timed_out = False
    exited_at: float | None = None
    poll = poll_s
    while not reader.done:
        now = time.monotonic()
        if now >= deadline:
            timed_out = exited_at is None  # a workload that exited in time did not time out
            break
        if exited_at is None and proc.poll() is not None:
            exited_at = now  # its output may still be held open by something it started
        if exited_at is not None and now - exited_at >= linger_s:
            break
        limit = deadline - now if exited_at is None else linger_s - (now - exited_at)
        reader.read(min(poll, limit) if (tracker is not None or exited_at is not None) else limit)
        if tracker is not None and not reader.done:
            tracker.sample()
            poll = min(poll * 1.5, max(poll_s, POLL_MAX_S))
    if timed_out:
        if on_timeout is not None:
            on_timeout()
        if tracker is not None:
            tracker.sample()
            tracker.signal(signal.SIGTERM)
        kill_group(proc, grace_s=grace_s, kill_wait_s=kill_wait_s)
    if tracker is not None:
        tracker.kill_all(wait_s=kill_wait_s)  # what is left of it after a timeout or a normal exit
    if not reader.done:
        reader.read(kill_wait_s)
    reader.close()
    try:
        proc.wait(timeout=kill_wait_s)
    except subprocess.TimeoutExpired:  # unkillable (D state): give up on it, do not hang
        pass
    return CommandResult(proc.returncode, reader.stdout, reader.stderr, timed_out, None, time.monotonic() - start)


class _Reader:
    """proc.communicate() in bounded slices, keeping what was read when it must stop."""

    def __init__(self, proc: subprocess.Popen, stdin_text: str) -> None:
        self.proc = proc
        self.pending: str | None = stdin_text
        self.done = False
        self.stdout = ""
        self.stderr = ""

    def read(self, timeout: float) -> None:
        try:
            out, err = self.proc.communicate(self.pending, timeout=max(0.01, timeout))
            self.stdout, self.stderr, self.done = out or "", err or "", True
        except subprocess.TimeoutExpired as exc:
            self.stdout, self.stderr = _text(exc.stdout), _text(exc.stderr)
        except (OSError, ValueError):  # a pipe closed under it
            self.done = True
        self.pending = None

    def close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass


def _text(data: Any) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)


@dataclass(frozen=True)
class Ending:
    """How the workload's process ended, as the executor saw it: its exit status, the signal that killed it
    (the local executor: a negative return code; a container: the engine's 128+N), and whether the kernel's
    OOM killer ended it by the container's own state (None: not known)."""

    exit_code: int | None
    signal: int | None = None
    oom_killed: bool | None = None

    @classmethod
    def local(cls, returncode: int | None) -> "Ending":
        return cls(returncode, -returncode if returncode is not None and returncode < 0 else None)

    @property
    def clean(self) -> bool:
        return self.exit_code == 0 and self.signal is None and not self.oom_killed

    def failure(self) -> tuple[str, str]:
        """The error class and message of an unclean end."""
        if self.oom_killed:
            return "oom", "killed by the kernel's out-of-memory killer (the container's State.OOMKilled)"
        if self.signal is not None:
            if self.oom_killed is False and self.signal == signal.SIGKILL:
                return "crash", "workload killed by SIGKILL (not by the out-of-memory killer: State.OOMKilled is false)"
            return signal_class(self.signal)
        return "crash", f"workload exited with code {self.exit_code}"


def outcome_from_command(case_doc: dict[str, Any], res: CommandResult, command: list[str],
                         timeout_s: float, not_found_hint: str | None = None,
                         ending: Ending | None = None) -> ExecutionOutcome:
    """Turn a finished command into an outcome with a valid result document.

    Classes: could not start -> infra; timeout -> timeout; killed by SIGKILL without our timeout (the
    kernel's OOM killer) -> oom; killed by another signal (SIGSEGV, SIGABRT, ...) -> crash; non-zero exit
    without a document -> crash (the image's fault, never retried). A passed document followed by a non-zero
    exit or a signal (a crash in teardown, say) is a crash too: how the process ended wins, and the document
    is kept as evidence in the result's environment (`result_before_crash`), never as the figures.
    `ending`: how it ended when the executor knows more than the return code (a container's state).
    """
    stderr_tail = res.stderr[-TAIL_CHARS:]
    ending = ending or Ending.local(res.returncode)

    def synth(status: str, error_class: str, message: str, **extra: Any) -> dict[str, Any]:
        return protocol.make_result(case_doc, status, error_class=error_class, error=message,
                                    log_tail=stderr_tail, duration_s=res.seconds, **extra)

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
            elif doc.get("status") == "passed" and not ending.clean:
                error_class, message = ending.failure()
                doc = synth("error", error_class,
                            f"{message} after it printed a passed result document (kept as evidence in "
                            "environment.result_before_crash)", environment={"result_before_crash": doc})
        except ValueError:
            if ending.oom_killed or ending.signal is not None:
                doc = synth("error", *ending.failure())
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
