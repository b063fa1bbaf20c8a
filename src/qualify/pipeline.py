"""The steps of one qualification run, as plain functions (no Prefect here).

tasks/ wraps each step as a Prefect task and flows/ composes them; the CLI (through driver/)
and the Prefect deployment both go through the flow. Every result is written the moment it
arrives, so a crash loses at most the cases in flight.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from qualify import fingerprint, spool
from qualify.build import BuildError, BuildResult, build_candidate
from qualify.cases import Case, expand
from qualify.errors import BadInput, InfraError, Rejected
from qualify.executors import Executor, LocalExecutor
from qualify.gate.service import Evaluation, evaluate_and_commit
from qualify.manifest import ReleaseManifest
from qualify.manifest_load import LoadedManifest, load_manifest
from qualify.outcomes import CaseOutcome, CaseStatus, ErrorClass, RunStatus, Verdict
from qualify.settings import Settings
from qualify.store import repo
from qualify.store.models import Run
from qualify.verify import compare_components, probe_case
from qualify.workloads import protocol

if TYPE_CHECKING:
    from qualify.promote import TargetOutcome
    from qualify.ray_backend import RayCaseResult

HEARTBEAT_S = 10.0


class CandidateFailed(Rejected):
    """The candidate itself failed before any case ran (e.g. its build): exit code 1."""

    label = "FAIL"


@dataclass
class Progress:
    """Thread-safe live counters for the CLI and the Prefect progress artifact."""

    total: int = 0
    done: int = 0
    failed: int = 0
    running: int = 0
    started_at: float = field(default_factory=time.monotonic)
    listeners: list[Callable[["Progress"], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start_case(self) -> None:
        with self._lock:
            self.running += 1
        self._notify()

    def finish_case(self, passed: bool) -> None:
        with self._lock:
            self.running = max(0, self.running - 1)
            self.done += 1
            self.failed += 0 if passed else 1
        self._notify()

    def _notify(self) -> None:
        for listener in list(self.listeners):
            try:
                listener(self)
            except Exception:  # noqa: BLE001 - a display problem never stops a run
                pass

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_at


@dataclass
class RunContext:
    sessions: sessionmaker[Session]
    loaded: LoadedManifest
    run_id: int
    cases: list[Case]
    manifest_dir: Path
    data_dir: Path
    ray_address: str | None = None
    build: BuildResult | None = None
    executor: Executor | None = None
    paired: "PairedBaseline | None" = None  # gate.regression.baseline: paired (set by obtain_candidate)
    progress: Progress = field(default_factory=Progress)
    resumed: bool = False
    db_write_attempts: int = 6  # a result write is retried with backoff 1, 2, 4, 8, 16 s (spool.with_retries)
    _stop_heartbeat: threading.Event = field(default_factory=threading.Event)

    @property
    def manifest(self) -> ReleaseManifest:
        return self.loaded.release

    @contextlib.contextmanager
    def run_row(self) -> Iterator[tuple[Session, Run]]:
        """A session and this run's row; commits when the block ends without an exception."""
        with self.sessions() as session:
            run = session.get(Run, self.run_id)
            assert run is not None, f"run {self.run_id} vanished from the database"
            yield session, run
            session.commit()

    def stage(self, name: str, seconds: float | None = None) -> None:
        with self.run_row() as (session, run):
            repo.set_stage(session, run, name, seconds)

    @contextlib.contextmanager
    def timed_stage(self, name: str) -> Iterator[None]:
        """Mark the run as in stage `name` and record how long the block took (also when it fails)."""
        start = time.monotonic()
        self.stage(name)
        try:
            yield
        finally:
            self.stage(name, time.monotonic() - start)

    def stage_seconds(self) -> dict[str, float]:
        with self.run_row() as (_session, run):
            return dict(run.stage_seconds or {})

    def bind_flow_run(self, flow_run_id: str | None) -> None:
        """Remember the orchestrator's id for this run (the Prefect UI links to it)."""
        with self.run_row() as (_session, run):
            run.flow_run_id = flow_run_id

    def start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop_heartbeat.wait(HEARTBEAT_S):
                try:
                    with self.sessions() as session:
                        run = session.get(Run, self.run_id)
                        if run is not None:
                            repo.heartbeat(session, run)
                            session.commit()
                except Exception:  # noqa: BLE001 - a missed heartbeat is not fatal
                    pass

        threading.Thread(target=beat, name=f"qualify-heartbeat-{self.run_id}", daemon=True).start()

    def stop_heartbeat(self) -> None:
        self._stop_heartbeat.set()


# --------------------------------------------------------------------------- open / resume


STALE_HEARTBEAT_S = 120.0  # a driver beats every HEARTBEAT_S; this much silence means it is gone


def driver_gone(run: Run) -> str | None:
    """Why the run's driver is certainly gone (None when it may still be driving the run).

    Same host: its pid is not running (or the pid lives but the run's heartbeat stopped long ago: the pid
    was reused). Another host: no heartbeat for STALE_HEARTBEAT_S (tolerates that much clock skew)."""
    age = None
    if run.heartbeat_at is not None:
        beat = run.heartbeat_at if run.heartbeat_at.tzinfo else run.heartbeat_at.replace(tzinfo=dt.timezone.utc)
        age = (dt.datetime.now(dt.timezone.utc) - beat).total_seconds()
    silent = age is None or age > STALE_HEARTBEAT_S
    heard = "never" if age is None else f"{age:.0f} s ago"
    if run.driver_host == socket.gethostname() and run.driver_pid:
        if run.driver_pid == os.getpid():
            return None
        try:
            os.kill(run.driver_pid, 0)
        except ProcessLookupError:
            return f"its driver (pid {run.driver_pid} on {run.driver_host}) is gone; last heartbeat {heard}"
        except PermissionError:
            pass
        return f"pid {run.driver_pid} lives but the run's last heartbeat was {heard}" if silent else None
    return f"no heartbeat from its driver on {run.driver_host or 'an unknown host'} since {heard}" if silent else None


def open_run(sessions: sessionmaker[Session], manifest_path: str | Path, *, resume_run_id: int | None = None,
             ray_address: str | None = None, triggered_by: str | None = None) -> RunContext:
    """Validate the manifest and create the run (or take over the run to resume)."""
    manifest_path = Path(manifest_path)
    loaded = load_manifest(manifest_path)
    with sessions() as session:
        if resume_run_id is not None:
            run = session.get(Run, resume_run_id)
            if run is None:
                raise BadInput(f"--resume {resume_run_id}: no such run")
            if run.manifest_sha256 != loaded.sha256:
                raise BadInput(f"--resume {resume_run_id}: {manifest_path} differs from the manifest the run "
                               f"started with (sha256 {run.manifest_sha256[:12]}…); resume with the same file, or "
                               f"`qualify runs abort {resume_run_id} --reason ...` and start a new run")
            if run.status == RunStatus.RUNNING and driver_gone(run) is None and run.driver_pid != os.getpid():
                raise BadInput(f"--resume {resume_run_id}: the run is still being driven by pid "
                               f"{run.driver_pid} on {run.driver_host} (stop it, or `qualify runs abort "
                               f"{resume_run_id} --reason ...` if it is stuck)")
            # The stored copy is what the run qualifies, even if waivers have expired since.
            loaded = repo.run_manifest(run, path=manifest_path)
            run.status = "running"
            run.finished_at = None
            run.error = None
        else:
            info = loaded.release.release
            release = repo.get_or_create_release(session, info.name, info.repository, info.tag, info.previous_tag)
            run = repo.create_run(session, release, manifest_path=str(manifest_path), manifest_sha256=loaded.sha256,
                                  manifest_text=loaded.text, triggered_by=triggered_by or _whoami())
        run.driver_host = socket.gethostname()
        run.driver_pid = os.getpid()
        run.heartbeat_at = repo.utcnow()
        session.commit()
        run_id = run.id
    return RunContext(sessions=sessions, loaded=loaded, run_id=run_id, cases=expand(loaded.release),
                      manifest_dir=manifest_path.resolve().parent, data_dir=Settings.load().data_dir,
                      ray_address=ray_address or loaded.release.execution.ray_address, resumed=resume_run_id is not None)


def _whoami() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except Exception:  # noqa: BLE001
        return socket.gethostname()


# --------------------------------------------------------------------------- candidate


def obtain_candidate(ctx: RunContext, wait: bool = False, wait_timeout_s: float = 3600) -> BuildResult:
    """Build or resolve the candidate, record its image, and bind the run to its digest."""
    try:
        build = build_candidate(ctx.manifest, data_dir=ctx.data_dir, manifest_dir=ctx.manifest_dir)
    except BuildError as exc:
        tail = (exc.log_tail or "").strip()[-2000:]
        message = f"build failed: {exc}" + (f"\n--- build log tail ---\n{tail}" if tail else "")
        if exc.log_path:
            message += f"\n(full log: {exc.log_path})"
        fail_run(ctx, RunStatus.FAILED, message)
        if exc.exit_code != CandidateFailed.exit_code:  # bad build input, or a missing builder
            raise type(exc)(message, exc.log_tail, exc.log_path) from None
        raise CandidateFailed(message) from None
    deadline = time.monotonic() + wait_timeout_s
    while True:
        with ctx.sessions() as session:
            run = session.get(Run, ctx.run_id)
            assert run is not None
            if ctx.resumed and run.candidate_digest and run.candidate_digest != build.digest:
                raise BadInput(
                    f"--resume {ctx.run_id}: the candidate is now {build.digest}, but the run qualified "
                    f"{run.candidate_digest}; start a new run")
            image = repo.get_or_create_image(session, build.repository, build.tag, build.digest,
                                             builder=build.builder, build_log_path=build.log_path,
                                             build_log_tail=build.log_tail)
            try:
                repo.attach_candidate(session, run, image, stale=driver_gone)
                session.commit()
                break
            except repo.RunConflict as exc:
                session.rollback()
                if not wait or time.monotonic() > deadline:
                    fail_run(ctx, RunStatus.ABORTED, str(exc))
                    raise BadInput(f"{exc} (use --wait to queue behind it)") from None
        time.sleep(5)
    ctx.build = build
    ctx.executor = make_executor(ctx, build)
    if ctx.manifest.gate.regression.baseline in ("paired", "duet") and ctx.manifest.gate.regression.enabled:
        ctx.paired = paired_baseline(ctx)
    return build


def make_executor(ctx: RunContext, build: BuildResult) -> Executor:
    execution = ctx.manifest.execution
    if execution.executor == "local":
        return LocalExecutor(python=build.python or LocalExecutor().python)
    from qualify.executors.container import ContainerExecutor

    if not build.image_ref:
        raise BadInput("execution.executor 'container' needs a container image: builder "
                             f"{build.builder!r} produced none")
    return ContainerExecutor.from_manifest(ctx.manifest, build.image_ref)


@dataclass(frozen=True)
class PairedBaseline:
    """The previous release's image (or environment) that paired cases re-measure beside the candidate;
    executor None when it cannot be had, with the reason (the gate then says INCOMPLETE for those cases)."""

    executor: Executor | None
    label: str | None
    reason: str | None = None


def paired_baseline(ctx: RunContext) -> PairedBaseline:
    """Find the previous release's image: the digest of its baseline run (the newest run whose latest
    decision is PASS). Container executor: that image by digest. Local executor: an interpreter on this
    machine whose environment has exactly that digest (the local builder's digest is its package set),
    else pairing is refused with the reason."""
    info = ctx.manifest.release
    if not info.previous_tag:
        return PairedBaseline(None, None, "no previous release named (release.previous_tag)")
    with ctx.sessions() as session:
        base_run = repo.baseline_run(session, info.repository, info.previous_tag)
        if base_run is None or base_run.image is None:
            return PairedBaseline(None, f"{info.repository}:{info.previous_tag}",
                                  f"the previous release {info.previous_tag} has no run whose latest decision is "
                                  "PASS: no image to re-measure")
        digest, repository = base_run.image.digest, base_run.image.repository
        label = f"{repository}:{info.previous_tag}@{digest}"
        stored_python = _stored_build_python(base_run)
    if ctx.manifest.execution.executor == "container":
        assert ctx.build is not None
        from qualify.executors.container import ContainerExecutor

        return PairedBaseline(ContainerExecutor.from_manifest(ctx.manifest, f"{repository}@{digest}"), label)
    from qualify.build.local import environment_digest

    tried: list[str] = []
    for python in dict.fromkeys(p for p in (stored_python, ctx.build.python if ctx.build else None) if p):
        tried.append(python)
        try:
            if environment_digest(python)[0] == digest:
                return PairedBaseline(LocalExecutor(python=python), f"{label} (local interpreter {python})")
        except BuildError:
            continue
    return PairedBaseline(None, label, f"the previous release's environment ({digest[:19]}…) is not on this "
                                       f"machine: no interpreter with that package set (tried {', '.join(tried)})")


def _stored_build_python(run: Any) -> str | None:
    """The interpreter a local-builder run used, from its stored manifest (build.python, else the driver's)."""
    import sys

    try:
        loaded = repo.run_manifest(run)
    except Exception:  # noqa: BLE001 - an old manifest that no longer validates: no interpreter known
        return None
    python = loaded.release.build.python
    if python and not Path(python).is_absolute() and run.manifest_path:
        python = str((Path(run.manifest_path).resolve().parent / python).resolve())
    return python or sys.executable


def baseline_document(case: Case) -> dict[str, Any]:
    """The case as the baseline side runs it: the same document, without the tests' slowdown switch
    (params.slowdown stands for a slower candidate, never for a slower baseline)."""
    doc = case.document()
    doc["params"] = {k: v for k, v in doc["params"].items() if k != "slowdown"}
    return doc


def _duet_choice(ctx: RunContext, case: Case, infeasible: Callable[[Any], str | None]) -> Any:
    """gate.regression.baseline: duet -- the case's duet policy, or why it is measured paired (qualify.duet)."""
    reg = ctx.manifest.gate.regression
    if reg.baseline != "duet":
        return None
    from qualify import duet

    return duet.driver_choice(case.kind, ctx.manifest.execution.executor, case.resources, case.document(),
                              reg.max_regression, reg.alpha, infeasible)


def _paired_case(ctx: RunContext, case: Case) -> bool:
    return ctx.paired is not None and bool(ctx.manifest.gate.regression.metrics_for(case.kind))


# --------------------------------------------------------------------------- verify


def verify_components(ctx: RunContext) -> list[dict[str, Any]]:
    """Run the probe workload inside the candidate and store one check per component."""
    from qualify import node_facts
    from qualify.manifest import Resources
    from qualify.ray_backend import run_case_on_ray

    components = list(ctx.manifest.components)
    if not components:
        return []
    assert ctx.executor is not None, "obtain_candidate() sets the executor"
    probe = run_case_on_ray(ctx.executor, probe_case(components), Resources(cpus=0.5), timeout_s=300)
    doc = probe.doc
    if doc.get("status") != CaseStatus.PASSED:
        checks = compare_components(components, {})
        for check in checks:
            check["detail"] = f"probe failed ({doc.get('error_class')}): {doc.get('error')}"
            check["ok"] = check["ok"] and check["optional"]
    else:
        # The driver is the node's: read on the host side of the node the probe ran on, not in the image.
        node = node_facts.facts_of_node(probe.node_id) if any(c.source == "driver" for c in components) else None
        checks = compare_components(components, doc["environment"].get("facts", {}), node)
    with ctx.run_row() as (session, run):
        repo.record_component_checks(session, run, checks)
    return checks


# --------------------------------------------------------------------------- cases


def pending_cases(ctx: RunContext, log: Callable[[str], None] = lambda _m: None) -> list[Case]:
    """Cases without a final result (all of them for a new run), after recording what a previous driver of
    this run spooled to disk but could not write to the database."""
    for path, result in spool.pending(ctx.data_dir, ctx.run_id):
        if _commit_result(ctx, result, log):
            log(f"{result.case_id}: recorded the result spooled by an earlier driver ({path})")
        path.unlink(missing_ok=True)
    with ctx.sessions() as session:
        done = repo.final_case_ids(session, ctx.run_id)
    return [c for c in ctx.cases if c.case_id not in done]


def _commit_result(ctx: RunContext, result: spool.SpooledResult, log: Callable[[str], None]) -> bool:
    """Insert one final result (retried while the database is busy); False when one was already there."""
    case = next(c for c in ctx.cases if c.case_id == result.case_id)

    def write_once() -> bool:
        with ctx.sessions() as session:
            try:
                repo.record_case_result(session, ctx.run_id, case_id=case.case_id, kind=case.kind,
                                        model=case.model, variant=case.variant, doc=result.doc,
                                        attempts=result.attempts, queue_wait_s=result.queue_wait_s,
                                        exec_s=result.exec_s, node=result.node, fingerprint=result.fingerprint)
                session.commit()
                return True
            except repo.DuplicateResult:
                session.rollback()
                return False

    return spool.with_retries(write_once, attempts=ctx.db_write_attempts, on_retry=lambda n, exc: log(
        f"{case.case_id}: database write {n} failed ({type(exc).__name__}); retrying"))


CaseRunner = Callable[[Executor, dict[str, Any], Any, float], "RayCaseResult"]


def run_case(ctx: RunContext, case: Case, log: Callable[[str], None] = lambda _m: None, *,
             runner: CaseRunner | None = None,
             infeasible: Callable[[Any], str | None] | None = None) -> CaseOutcome:
    """Run one case on Ray, retrying infrastructure failures only, and record the final result at once.

    `runner` and `infeasible` default to the Ray backend; tests pass fakes to exercise the retry loop.
    """
    from qualify import ray_backend

    runner = runner or ray_backend.run_case_on_ray
    infeasible = infeasible or ray_backend.infeasible_reason
    assert ctx.executor is not None, "obtain_candidate() sets the executor"
    ctx.progress.start_case()
    attempts = 0
    retries = ctx.manifest.execution.infra_retries
    reason = infeasible(case.resources)
    if reason:
        out = ray_backend.RayCaseResult.failed(
            protocol.make_result(case.document(), "error", error_class="infra", error=reason), retryable=False)
        attempts = 1
    else:
        while True:
            attempts += 1
            if _paired_case(ctx, case) and ctx.paired.executor is not None and case.resources.nodes == 1:  # type: ignore[union-attr]
                duet_policy = _duet_choice(ctx, case, infeasible)
                extra = {} if duet_policy is None or isinstance(duet_policy, str) else {"duet": duet_policy}
                out = runner(ctx.executor, case.document(), case.resources, case.timeout_s,
                             baseline=ctx.paired.executor, baseline_doc=baseline_document(case), **extra)  # type: ignore[union-attr]
                if isinstance(duet_policy, str):
                    from qualify.duet import fell_back

                    fell_back(out.doc, ctx.paired.label, duet_policy)  # type: ignore[union-attr]
            else:
                out = runner(ctx.executor, case.document(), case.resources, case.timeout_s)
            timed_out = out.doc.get("error_class") == ErrorClass.TIMEOUT
            retryable = out.retryable or (timed_out and ctx.manifest.execution.retry_timeouts)
            if not retryable or attempts > retries:
                break
            log(f"{case.case_id}: attempt {attempts} ended with {out.doc.get('error_class')} "
                f"({out.doc.get('error')}); retrying ({attempts}/{retries})")
    doc = out.doc
    if _paired_case(ctx, case) and "paired" not in (doc.get("environment") or {}):
        from qualify.launches import unpaired

        assert ctx.paired is not None
        why = ctx.paired.reason or ("a multi-node case is not re-measured in pairs" if case.resources.nodes > 1
                                    else "the case ran without its baseline")
        doc = unpaired(doc, ctx.paired.label, why)
    result = spool.SpooledResult(case_id=case.case_id, doc=doc, attempts=attempts, queue_wait_s=out.queue_wait_s,
                                 exec_s=out.exec_s, node=out.node,
                                 fingerprint=fingerprint.of_case(case, doc.get("environment") or {}))
    spooled = spool.write(ctx.data_dir, ctx.run_id, result)  # on disk before the database is tried
    try:
        if not _commit_result(ctx, result, log):
            log(f"{case.case_id}: a result was already recorded; keeping the first")
    except OperationalError as exc:
        raise InfraError(f"{case.case_id}: the database refused the result ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200]}); it is kept in {spooled}: "
                         f"`qualify run --resume {ctx.run_id}` records it without running the case again") from exc
    spooled.unlink(missing_ok=True)
    outcome = CaseOutcome(case_id=case.case_id, status=CaseStatus(doc.get("status")),
                          error_class=ErrorClass(doc["error_class"]) if doc.get("error_class") else None,
                          error=doc.get("error"), attempts=attempts, exec_s=out.exec_s,
                          queue_wait_s=out.queue_wait_s, node=out.node, gpu_ids=tuple(out.gpu_ids))
    ctx.progress.finish_case(outcome.passed)
    return outcome


# --------------------------------------------------------------------------- end of run


def fail_run(ctx: RunContext, status: RunStatus, error: str) -> None:
    with ctx.sessions() as session:
        run = session.get(Run, ctx.run_id)
        if run is not None and run.finished_at is None:
            repo.finish_run(session, run, status, error)
            session.commit()


def finish_run(ctx: RunContext, verdict: Verdict) -> RunStatus:
    status = RunStatus.for_verdict(verdict)
    with ctx.run_row() as (session, run):
        repo.finish_run(session, run, status)
    return status


# --------------------------------------------------------------------------- gate, promotion


def judge(ctx: RunContext) -> Evaluation:
    """The gate's decision about this run, recorded (append-only)."""
    return evaluate_and_commit(ctx.sessions, ctx.run_id)


def wants_promotion(ctx: RunContext, verdict: Verdict, override: bool | None) -> bool:
    """Promote only a PASS, only when asked (flag, else the manifest), and only when there are targets."""
    asked = ctx.manifest.promotion.on_pass if override is None else override
    return verdict == Verdict.PASS and asked and bool(ctx.manifest.promotion.targets)


def promote(ctx: RunContext, log: Callable[[str], None] = lambda _m: None) -> list["TargetOutcome"]:
    """Promote this run's candidate to every target; a refusal is reported as outcomes, never hidden."""
    from qualify.promote import PromotionError, PromotionRefused, TargetOutcome, promote_run

    try:
        return promote_run(ctx.sessions, ctx.run_id, insecure=list(ctx.manifest.promotion.insecure_registries),
                           actor="qualify-flow")
    except PromotionRefused as exc:
        log(f"promotion refused: {exc}")
        return exc.outcomes
    except PromotionError as exc:
        log(f"promotion not possible: {exc}")
        return [TargetOutcome(target="*", target_ref="", source_ref="", source_digest=ctx.build.digest
                              if ctx.build else "", outcome="refused", detail=str(exc))]
