"""How a workload's process ended decides, not only what it printed (issues 24.2 and 24.9).

A passed document followed by a non-zero exit or a signal is a crash, the document kept as evidence; a
container's 137 is an OOM kill only when its own state says so (State.OOMKilled)."""

from __future__ import annotations

import json
import signal

import pytest

from qualify.executors.base import CommandResult, Ending, outcome_from_command
from qualify.workloads import protocol

CASE = {"case_id": "synthetic/x", "kind": "synthetic", "params": {}}


def _doc(status: str = "passed", error_class: str | None = None) -> str:
    return json.dumps(protocol.make_result(CASE, status, error_class=error_class,
                                           error=None if status == "passed" else "it failed",
                                           metrics={"tokens_per_s": 100.0}, samples={"tokens_per_s": [100.0]}))


def _outcome(stdout: str, returncode: int | None, ending: Ending | None = None) -> dict:
    res = CommandResult(returncode, stdout, "teardown went wrong\n", False, None, 1.0)
    return outcome_from_command(CASE, res, ["x"], 60.0, ending=ending).doc


@pytest.mark.parametrize("returncode", [-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS, 1, 2, 70, 255])
def test_a_passed_document_then_a_bad_end_is_a_crash_with_the_document_kept(returncode: int) -> None:
    doc = _outcome(_doc(), returncode)
    assert (doc["status"], doc["error_class"]) == ("error", "crash")
    assert "after it printed a passed result document" in doc["error"]
    assert doc["metrics"] == {} and doc["samples"] == {}  # the figures are not the result's
    kept = doc["environment"]["result_before_crash"]
    assert kept["status"] == "passed" and kept["metrics"] == {"tokens_per_s": 100.0}


def test_a_passed_document_then_sigkill_is_oom_as_without_a_document() -> None:
    doc = _outcome(_doc(), -signal.SIGKILL)
    assert doc["error_class"] == "oom" and "result_before_crash" in doc["environment"]


def test_a_clean_end_keeps_the_document() -> None:
    doc = _outcome(_doc(), 0)
    assert doc["status"] == "passed" and doc["metrics"] == {"tokens_per_s": 100.0}


@pytest.mark.parametrize("returncode", [1, -signal.SIGSEGV])
def test_a_failed_document_explains_its_own_end(returncode: int) -> None:
    # a rank that reports nan_loss exits 1 on purpose: its class stays
    doc = _outcome(_doc("failed", "nan_loss"), returncode)
    assert (doc["status"], doc["error_class"]) == ("failed", "nan_loss")


# --------------------------------------------------------------------------- containers (podman's 128+N)


def test_a_container_oom_kill_is_oom_by_its_state() -> None:
    doc = _outcome("", 137, Ending(137, signal.SIGKILL, oom_killed=True))
    assert doc["error_class"] == "oom" and "OOMKilled" in doc["error"]


def test_a_container_sigkill_that_was_no_oom_kill_is_a_crash() -> None:
    doc = _outcome("", 137, Ending(137, signal.SIGKILL, oom_killed=False))
    assert doc["error_class"] == "crash" and "SIGKILL" in doc["error"]


def test_a_container_segfault_is_named() -> None:
    doc = _outcome("", 139, Ending(139, signal.SIGSEGV, oom_killed=False))
    assert doc["error_class"] == "crash" and "SIGSEGV" in doc["error"]


def test_a_container_oom_kill_after_a_passed_document_is_oom() -> None:
    doc = _outcome(_doc(), 137, Ending(137, signal.SIGKILL, oom_killed=True))
    assert doc["error_class"] == "oom" and doc["environment"]["result_before_crash"]["status"] == "passed"


def test_an_oom_killed_container_that_exited_otherwise_is_still_oom() -> None:
    # the OOM killer took a child; the workload exited 1 without a document
    doc = _outcome("", 1, Ending(1, None, oom_killed=True))
    assert doc["error_class"] == "oom"


class _Inspected:
    """ContainerExecutor.ending with the engine's answer to `inspect` given (the engine cannot run in a unit
    test; tests/integration/test_container_executor.py runs the real one)."""

    @staticmethod
    def executor(state: bool | None):
        from qualify.executors.container import ContainerExecutor

        class Answered(ContainerExecutor):
            def oom_killed(self, name: str) -> bool | None:
                return state

        return Answered(image="127.0.0.1:5000/q/x@sha256:" + "0" * 64)


@pytest.mark.parametrize("returncode,state,expected", [
    (137, True, "oom"), (137, False, "crash"), (137, None, "oom"), (139, False, "crash"), (1, True, "oom"),
    (3, False, "crash")])
def test_a_container_ending_is_read_from_its_state(returncode: int, state: bool | None, expected: str) -> None:
    ex = _Inspected.executor(state)
    res = CommandResult(returncode, "", "", False, None, 1.0)
    ending = ex.ending("qualify-x", res)
    assert ending.exit_code == returncode and ending.oom_killed is state
    assert ending.signal == (returncode - 128 if returncode > 128 else None)
    assert ex._outcome(CASE, res, ["podman"], 60.0, ending).doc["error_class"] == expected


def test_the_container_is_kept_until_its_state_was_read() -> None:
    argv = _Inspected.executor(None).run_argv(CASE, "qualify-x")
    assert "--rm" not in argv  # removed by name after `inspect` (ContainerExecutor.run)
