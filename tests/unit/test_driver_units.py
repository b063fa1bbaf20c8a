"""Unit tests of the driver's pure pieces: Ray options and feasibility, executor outcome classification,
the retry loop of execution.attempts.run_case (with a fake runner, no Ray), reporting views, component comparison.
No subprocess, no Ray, no Prefect, no network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.flows import sleep_manifest

from qualify import pipeline
from qualify.execution import attempts
from qualify.executors import LocalExecutor
from qualify.executors.base import CommandResult, outcome_from_command
from qualify.manifest import Component, Resources
from qualify.outcomes import CaseStatus, ErrorClass
from qualify.execution.ray import infeasible_reason, ray_options
from qualify.execution.result import CaseRunResult
from qualify.report.views import artifact_key, results_table, summary_markdown
from qualify.store.engine import open_database
from qualify.verify import compare_components, probe_case
from qualify.workloads import protocol

CASE = protocol.make_case("sleep/nap-0", "sleep", {"duration_s": 0})


# --------------------------------------------------------------------------- Ray options


def test_ray_options_split_a_multi_node_case_per_node() -> None:
    opts = ray_options(Resources(cpus=8, gpus=16, nodes=2, memory_gb=4, custom={"ppu": 4}, accelerator_type="H200"))
    assert opts["num_cpus"] == 4 and opts["num_gpus"] == 8 and opts["resources"] == {"ppu": 2}
    assert opts["memory"] == 2 * 2**30 and opts["accelerator_type"] == "H200" and opts["max_retries"] == 0


def _node(ip: str, **resources: float) -> dict[str, Any]:
    return {"Alive": True, "NodeManagerAddress": ip, "Resources": resources}


def test_infeasible_reason_names_what_is_missing() -> None:
    nodes = [_node("10.0.0.1", CPU=8.0, GPU=0.0), _node("10.0.0.2", CPU=8.0, GPU=8.0)]
    assert infeasible_reason(Resources(cpus=2, gpus=8), nodes) is None
    why = infeasible_reason(Resources(cpus=2, gpus=16), nodes)
    assert why and "GPU=16" in why and "10.0.0.2" in why
    assert infeasible_reason(Resources(cpus=2, gpus=8, nodes=2), nodes) is not None  # one node has GPUs
    assert "no nodes" in (infeasible_reason(Resources(cpus=1), []) or "")


# --------------------------------------------------------------------------- executor outcomes


def _res(returncode: int | None, stdout: str = "", *, timed_out: bool = False,
         start_error: str | None = None) -> CommandResult:
    return CommandResult(returncode, stdout, "line one\nlast words", timed_out, start_error, 1.5)


def test_outcome_classification() -> None:
    good = protocol.make_result(CASE, "passed", metrics={"wall_s": 0.1})
    cases = {
        "good": (_res(0, protocol.RESULT_PREFIX + __import__("json").dumps(good)), "passed", None),
        "cannot start": (_res(None, start_error="cannot start 'x'"), "error", "infra"),
        "timeout": (_res(-9, timed_out=True), "error", "timeout"),
        "no document": (_res(1), "error", "crash"),
        "malformed": (_res(0, '{"protocol": 1}'), "error", "crash"),
    }
    for name, (res, status, error_class) in cases.items():
        doc = outcome_from_command(CASE, res, ["python"], 5.0).doc
        assert (doc["status"], doc["error_class"]) == (status, error_class), name
        assert protocol.validate_result(doc) == [], name
    crashed = outcome_from_command(CASE, _res(1), ["python"], 5.0)
    assert "last words" in crashed.doc["error"] and not crashed.retryable


# --------------------------------------------------------------------------- execution.attempts.run_case retries


class FakeRunner:
    """Stands in for the Ray backend: returns the scripted error classes, then a pass."""

    def __init__(self, *error_classes: str | None) -> None:
        self.script = list(error_classes)
        self.calls = 0

    def __call__(self, executor: Any, case_doc: dict[str, Any], resources: Any, timeout_s: float) -> CaseRunResult:
        self.calls += 1
        ec = self.script.pop(0) if self.script else None
        doc = (protocol.make_result(case_doc, "passed", metrics={"wall_s": 0.0}) if ec is None else
               protocol.make_result(case_doc, "failed" if ec == "low_agreement" else "error", error_class=ec,
                                    error=f"scripted {ec}"))
        return CaseRunResult(doc=doc, exit_code=0, exec_s=0.1, queue_wait_s=0.0, node="fake", node_id="n",
                             retryable=ec == "infra")


@pytest.fixture
def ctx(tmp_path: Path) -> pipeline.RunContext:
    _, sessions = open_database(f"sqlite:///{tmp_path / 'q.db'}")
    manifest = sleep_manifest(tmp_path / "m.yaml", [{"name": "nap", "kind": "sleep", "count": 1}], retries=2)
    context = pipeline.open_run(sessions, manifest)
    context.executor = LocalExecutor()
    return context


def _run(ctx: pipeline.RunContext, runner: FakeRunner, logs: list[str]):  # type: ignore[no-untyped-def]
    return attempts.run_case(ctx, ctx.cases[0], logs.append, runner=runner, infeasible=lambda _r: None)


def test_infrastructure_failures_are_retried_up_to_the_limit(ctx: pipeline.RunContext) -> None:
    logs: list[str] = []
    outcome = _run(ctx, FakeRunner("infra", "infra"), logs)
    assert outcome.status == CaseStatus.PASSED and outcome.attempts == 3 and len(logs) == 2
    assert ctx.progress.done == 1 and ctx.progress.failed == 0


def test_retries_stop_at_the_limit(ctx: pipeline.RunContext) -> None:
    runner = FakeRunner("infra", "infra", "infra", "infra")
    outcome = _run(ctx, runner, [])
    assert runner.calls == 3 and outcome.error_class == ErrorClass.INFRA and not outcome.passed


def test_a_timeout_is_retried_only_when_the_manifest_asks(tmp_path: Path, ctx: pipeline.RunContext) -> None:
    assert _run(ctx, FakeRunner("timeout", "timeout"), []).attempts == 1
    manifest = sleep_manifest(tmp_path / "retry.yaml", [{"name": "nap", "kind": "sleep", "count": 1}], retries=2,
                              extra={"execution": {"executor": "local", "case_timeout_s": 60, "infra_retries": 2,
                                                   "retry_timeouts": True}})
    again = pipeline.open_run(ctx.sessions, manifest)
    again.executor = LocalExecutor()
    outcome = _run(again, FakeRunner("timeout", "timeout"), [])
    assert outcome.attempts == 3 and outcome.passed


def test_a_failed_test_is_never_retried(ctx: pipeline.RunContext) -> None:
    runner = FakeRunner("low_agreement")
    outcome = _run(ctx, runner, [])
    assert runner.calls == 1 and outcome.status == CaseStatus.FAILED and outcome.attempts == 1
    assert ctx.progress.failed == 1


def test_the_result_is_recorded_once(ctx: pipeline.RunContext) -> None:
    logs: list[str] = []
    _run(ctx, FakeRunner(), logs)
    _run(ctx, FakeRunner("crash"), logs)  # a second result for the same case is refused, the first kept
    assert any("already recorded" in line for line in logs)
    assert attempts.pending_cases(ctx) == []


def test_an_infeasible_case_is_an_infra_result_without_running(ctx: pipeline.RunContext) -> None:
    runner = FakeRunner()
    outcome = attempts.run_case(ctx, ctx.cases[0], runner=runner, infeasible=lambda _r: "no GPU anywhere")
    assert runner.calls == 0 and outcome.error_class == ErrorClass.INFRA and "no GPU" in (outcome.error or "")


def test_a_case_releases_the_next_submission_once_whatever_happens(ctx: pipeline.RunContext) -> None:
    """The flow hands cases to Ray one at a time: a case that never reaches Ray (infeasible, or a runner that
    raises) must still release the next one, exactly once."""
    handed: list[str] = []
    attempts.run_case(ctx, ctx.cases[0], runner=FakeRunner(), infeasible=lambda _r: "no GPU anywhere",
                      on_submitted=lambda: handed.append("infeasible"))

    def broken(*_a, **_k):  # type: ignore[no-untyped-def]
        raise RuntimeError("Ray is gone")

    with pytest.raises(RuntimeError):
        attempts.run_case(ctx, ctx.cases[0], runner=broken, infeasible=lambda _r: None,
                          on_submitted=lambda: handed.append("raised"))
    assert handed == ["infeasible", "raised"]


# --------------------------------------------------------------------------- reporting and verify


DETAIL = {
    "run": 7, "release": "demo:1.0", "digest": "sha256:" + "a" * 64, "stage_seconds": {"cases": 12.5},
    "cases": [{"case_id": "train/x/base", "status": "passed", "error_class": None, "attempts": 1, "exec_s": 3.25,
               "metrics": {"tokens_per_s": 1234.5, "mfu": None}},
              {"case_id": "infer/x/w8a8", "status": "failed", "error_class": "low_agreement", "attempts": 1,
               "exec_s": None, "metrics": {}}],
    "decisions": [{"verdict": "FAIL", "reasons": [{"status": "FAIL", "check": "agreement", "message": "a | b"}]}],
    "components": [{"name": "torch", "ok": False, "expected": "2.6", "rule": "prefix", "actual": None}],
}


def test_results_table_and_summary() -> None:
    rows = results_table(DETAIL)
    assert rows[0]["tokens/s"] == "1234" or rows[0]["tokens/s"].startswith("1.23")
    assert rows[0]["MFU"] == "n/a" and rows[1]["error class"] == "low_agreement" and rows[1]["exec s"] == "n/a"
    text = summary_markdown(DETAIL, "https://q.example/v1/runs/7/report")
    assert "**FAIL**" in text and "a / b" in text and "torch: expected 2.6" in text and "(https://q.example/v1/runs/7/report)" in text


def test_artifact_keys_are_slugs() -> None:
    assert artifact_key("Training XPU", "25.05", "results") == "qualify-training-xpu-25-05-results"
    assert len(artifact_key("x" * 200, "1", "summary")) <= 100


def test_compare_components() -> None:
    comps = [Component(name="python", source="python", expected="3.11", match="prefix"),
             Component(name="torch", source="package", expected="2.13.0"),
             Component(name="extra", source="package", expected="1.0", optional=True)]
    checks = {c["name"]: c for c in compare_components(comps, {"python": "3.11.7", "packages": {"torch": "2.6.0"}})}
    assert checks["python"]["ok"] and not checks["torch"]["ok"] and checks["extra"]["ok"]
    assert "2.6.0" == checks["torch"]["actual"] and "optional" in checks["extra"]["detail"]


def test_the_probe_imports_torch_only_for_the_cuda_runtime() -> None:
    # Importing torch was 2.5 s of every run's verify stage; only a `cuda` component reads what it gives.
    python = Component(name="python", source="python", expected="3.11", match="prefix")
    torch = Component(name="torch", source="package", expected="2.13", match="prefix")
    cuda = Component(name="cuda", source="cuda", expected="12.4", match="prefix")
    assert probe_case([python, torch])["params"]["torch"] is False
    assert probe_case([python, cuda])["params"]["torch"] is True
    # Without the import the package's version is still found (from its metadata), and a `cuda` component
    # checked against facts without torch's is missing, never matched by accident.
    from qualify.workloads import probe

    facts = probe.handler(probe_case([python, torch]), None)["environment"]["facts"]
    assert "torch" not in facts and "torch_cuda" not in facts
    checks = {c["name"]: c for c in compare_components([python, torch, cuda], facts)}
    assert checks["torch"]["ok"] and checks["torch"]["actual"].startswith("2.13"), checks["torch"]
    assert checks["cuda"]["actual"] is None and not checks["cuda"]["ok"]


# --------------------------------------------------------------------------- no lost results


def _locked_ctx(tmp_path: Path) -> pipeline.RunContext:
    """A run whose database gives up on a lock after 0.2 s (the default waits 30 s)."""
    from qualify.store.engine import make_engine, session_factory

    url = f"sqlite:///{tmp_path / 'q.db'}"
    open_database(url)
    manifest = sleep_manifest(tmp_path / "m.yaml", [{"name": "nap", "kind": "sleep", "count": 1}], retries=0)
    context = pipeline.open_run(session_factory(make_engine(url, busy_timeout_s=0.2)), manifest)
    context.executor = LocalExecutor()
    context.data_dir = tmp_path / "data"
    return context


def _hold_write_lock(path: Path, seconds: float):  # type: ignore[no-untyped-def]
    import sqlite3
    import threading

    ready = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, timeout=5, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        ready.set()
        __import__("time").sleep(seconds)
        conn.execute("COMMIT")
        conn.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    ready.wait(5)
    return thread


def test_a_result_survives_a_database_locked_across_the_case_finish(tmp_path: Path) -> None:
    ctx = _locked_ctx(tmp_path)
    holder = _hold_write_lock(tmp_path / "q.db", 1.0)  # longer than the busy timeout: the first write fails
    logs: list[str] = []
    outcome = _run(ctx, FakeRunner(), logs)
    holder.join()
    assert outcome.passed and any("retrying" in line for line in logs), logs
    assert attempts.pending_cases(ctx) == []  # recorded once the lock was released
    assert not list((tmp_path / "data" / "spool").rglob("*.json"))  # and the spool emptied


def test_a_result_the_database_refused_is_recorded_on_resume(tmp_path: Path) -> None:
    from qualify.errors import InfraError

    ctx = _locked_ctx(tmp_path)
    ctx.db_write_attempts = 1
    holder = _hold_write_lock(tmp_path / "q.db", 0.8)
    with pytest.raises(InfraError, match="--resume"):
        _run(ctx, FakeRunner(), [])
    holder.join()
    spooled = list((tmp_path / "data" / "spool").rglob("*.json"))
    assert len(spooled) == 1
    logs: list[str] = []
    assert attempts.pending_cases(ctx, logs.append) == []  # recorded from the spool, not run again
    assert any("spooled by an earlier driver" in line for line in logs) and not spooled[0].exists()


def test_with_retries_backs_off_and_gives_up() -> None:
    from sqlalchemy.exc import OperationalError

    from qualify.execution import spool

    calls, sleeps = [], []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("INSERT", {}, Exception("database is locked"))
        return "ok"

    assert spool.with_retries(flaky, attempts=5, sleep=sleeps.append) == "ok" and sleeps == [1.0, 2.0]
    def always_locked() -> str:
        raise OperationalError("INSERT", {}, Exception("database is locked"))

    with pytest.raises(OperationalError):
        spool.with_retries(always_locked, attempts=2, sleep=lambda _s: None)


def test_a_stale_running_run_is_aborted_by_the_next_run_of_its_digest(tmp_path: Path) -> None:
    _, sessions = open_database(f"sqlite:///{tmp_path / 'q.db'}")
    manifest = sleep_manifest(tmp_path / "m.yaml", [{"name": "nap", "kind": "sleep", "count": 1}])
    from qualify.store import repo
    from qualify.store.models import Run

    first = pipeline.open_run(sessions, manifest)
    with sessions() as s:
        image = repo.get_or_create_image(s, "r/x", "1", "sha256:" + "9" * 64)
        repo.attach_candidate(s, s.get(Run, first.run_id), image)
        run = s.get(Run, first.run_id)
        run.driver_pid = 2**22 + 12345  # a pid that does not exist: the driver was killed
        s.commit()
        assert pipeline.driver_gone(run) and "is gone" in pipeline.driver_gone(run)
    second = pipeline.open_run(sessions, manifest)
    with sessions() as s:
        image = repo.get_or_create_image(s, "r/x", "1", "sha256:" + "9" * 64)  # insert-or-select: same row
        repo.attach_candidate(s, s.get(Run, second.run_id), image, stale=pipeline.driver_gone)
        s.commit()
        old = s.get(Run, first.run_id)
        assert old.status == "aborted" and f"aborted by run {second.run_id}" in old.error
        assert s.get(Run, second.run_id).candidate_digest == "sha256:" + "9" * 64


def test_a_live_run_still_blocks_its_digest(tmp_path: Path) -> None:
    _, sessions = open_database(f"sqlite:///{tmp_path / 'q.db'}")
    manifest = sleep_manifest(tmp_path / "m.yaml", [{"name": "nap", "kind": "sleep", "count": 1}])
    from qualify.store import repo
    from qualify.store.models import Run

    first = pipeline.open_run(sessions, manifest)  # driven by this (live) process
    second = pipeline.open_run(sessions, manifest)
    with sessions() as s:
        image = repo.get_or_create_image(s, "r/x", "1", "sha256:" + "8" * 64)
        repo.attach_candidate(s, s.get(Run, first.run_id), image, stale=pipeline.driver_gone)
        with pytest.raises(repo.RunConflict, match="still running"):
            repo.attach_candidate(s, s.get(Run, second.run_id), image, stale=pipeline.driver_gone)


def test_a_ray_handle_shuts_down_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flow shuts Ray down right after its cases and again on its way out: the second call must not close the
    driver's gate again (that asks Ray for its session while the owner thread shuts it down) nor hand Ray back."""
    from qualify.execution import early_ray
    from qualify.execution import ray as qray

    calls: list[str] = []
    monkeypatch.setattr(qray.DRIVER_CALLS, "close", lambda: calls.append("close"))
    monkeypatch.setattr(early_ray, "hand_back", lambda: calls.append("hand_back"))
    handle = qray.RayHandle(None, started_here=True, early=True)
    handle.shutdown()
    handle.shutdown()
    assert calls == ["close", "hand_back"] and handle.shut_down
