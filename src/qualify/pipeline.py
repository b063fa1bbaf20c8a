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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from sqlalchemy.orm import Session, sessionmaker

from qualify.build import BuildError, BuildResult, build_candidate
from qualify.errors import BadInput, InfraError, Rejected
from qualify.execution import node_facts
from qualify.execution.paired import PairedBaseline, find_paired_baseline, find_reference
from qualify.execution.ray import run_case_on_ray
from qualify.executors import Executor, LocalExecutor
from qualify.executors.container import ContainerExecutor
from qualify.gate.judging import Evaluation, evaluate_and_commit
from qualify.manifest import ReleaseManifest, Resources, is_reference_case
from qualify.manifest.cases import Case, expand
from qualify.manifest.load import LoadedManifest, load_manifest
from qualify.outcomes import CaseStatus, RunStatus, Verdict
from qualify.progress import Progress
from qualify.promote import PromotionError, PromotionRefused, TargetOutcome, promote_run
from qualify.settings import Settings
from qualify.store.identity import database_data_dir
from qualify.store import repo
from qualify.store.models import Run
from qualify.verify import compare_components, probe_case

HEARTBEAT_S = 10.0


class CandidateFailed(Rejected):
    """The candidate itself failed before any case ran (e.g. its build): exit code 1."""

    label = "FAIL"


@dataclass(frozen=True)
class ImageSide:
    """One of the release's further images (manifest `images:`) as the run has it: its build, the executor its
    cases run with, and the previous release's image of the same name (paired and duet)."""

    build: BuildResult
    executor: Executor
    paired: PairedBaseline | None = None


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
    paired: PairedBaseline | None = None  # gate.regression.baseline: paired (set by obtain_candidate)
    reference: PairedBaseline | None = None  # gate.reference's side (set by obtain_candidate)
    further: dict[str, ImageSide] = field(default_factory=dict)  # the further images, by name (obtain_candidate)
    progress: Progress = field(default_factory=Progress)
    resumed: bool = False
    db_write_attempts: int = 6  # a result write is retried with backoff 1, 2, 4, 8, 16 s (spool.with_retries)
    _stop_heartbeat: threading.Event = field(default_factory=threading.Event)
    _cluster_record: threading.Lock = field(default_factory=threading.Lock)  # the images' builds write it at once

    @property
    def manifest(self) -> ReleaseManifest:
        return self.loaded.release

    def executor_for(self, case: Case) -> Executor | None:
        """The executor of the image the case runs in (its own image's, or the release's)."""
        return self.further[case.image].executor if case.image else self.executor

    def paired_for(self, case: Case) -> PairedBaseline | None:
        """The previous release's side for the case's image (paired and duet)."""
        return self.further[case.image].paired if case.image else self.paired

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

    def merge_cluster(self, **parts: Any) -> None:
        """Set parts of the run's record of the cluster (runs.cluster), one writer at a time (the images' builds
        finish at once). `image_builds` is merged by image name; any other part replaces its earlier value."""
        with self._cluster_record, self.run_row() as (_session, run):
            record = dict(run.cluster or {})
            for key, value in parts.items():
                record[key] = {**record.get(key, {}), **value} if key == "image_builds" else value
            run.cluster = record

    def record_cluster(self, nodes: list[dict[str, float]]) -> None:
        """The alive Ray nodes' CPUs and GPUs at the start of the cases (the report's makespan bound)."""
        self.merge_cluster(nodes=nodes)

    def pull_images(self) -> list[dict[str, Any]]:
        """Before the cases: each node that will run cases pulls the images they run in (each image of the
        release for its own cases, the previous release's for paired and duet cases, gate.reference's), by
        digest, once (execution/pulls.py), recorded with the run (runs.cluster["pulls"]) as the stage `pull`.
        Nothing for an executor that runs no image (local)."""
        from qualify.execution.pulls import PullFailed, pull_on_nodes

        wanted: dict[Any, list[Resources]] = {}
        for case in self.cases:
            other = self.reference if is_reference_case(case) else self.paired_for(case)
            for executor in (self.executor_for(case), other.executor if other else None):
                if hasattr(executor, "pull"):
                    wanted.setdefault(executor, []).append(case.resources)
        if not wanted:
            return []
        pulls: list[dict[str, Any]] = []
        with self.timed_stage("pull"):
            try:
                for executor, resources in wanted.items():
                    pulls += [p.to_dict() for p in pull_on_nodes(executor, resources)]
            except PullFailed as exc:
                pulls += [p.to_dict() for p in exc.pulls]
                raise
            finally:
                self.merge_cluster(pulls=pulls)
        return pulls

    def launch_time_line(self) -> str:
        """Where the cases' launch seconds went and the measurement efficiency (report/efficiency.py), and the
        achieved makespan against its lower bound (report/makespan.py)."""
        from qualify.report.makespan import run_time

        with self.run_row() as (session, run):
            spent, schedule = run_time(run, repo.case_results(session, run.id), self.cases)
        return spent.line() + (f"\n{schedule.line()}" if schedule else "")

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
            run = repo.get_run(session, resume_run_id)
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
                      manifest_dir=manifest_path.resolve().parent,
                      data_dir=database_data_dir(Settings.load().data_dir, sessions),
                      ray_address=ray_address or loaded.release.execution.ray_address, resumed=resume_run_id is not None)


def _whoami() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except Exception:  # noqa: BLE001
        return socket.gethostname()


# --------------------------------------------------------------------------- candidate


def _build(ctx: RunContext, image: str | None = None) -> BuildResult:
    """One image of the release (None: its own) on the driver, or (build.on: cluster) as a Ray task on a builder
    node, recorded in runs.cluster["build"] (a further image's in runs.cluster["image_builds"][name])."""
    manifest = ctx.manifest.for_image(image)
    if manifest.build.on != "cluster":
        return build_candidate(manifest, data_dir=ctx.data_dir, manifest_dir=ctx.manifest_dir)
    from qualify.execution.builds import build_on_cluster

    build, where = build_on_cluster(manifest, data_dir=ctx.data_dir, manifest_dir=ctx.manifest_dir)
    record = where.to_dict() if where else {"on": "driver (fallback)"}
    if image is None:
        ctx.merge_cluster(build=record)
    else:
        ctx.merge_cluster(image_builds={image: record})
    return build


def _build_all(ctx: RunContext) -> dict[str | None, BuildResult]:
    """Every image of the release at once (a thread each: a build is a subprocess or a Ray task). The first
    failure in the manifest's order is the run's, named by its image when it is a further one."""
    names: list[str | None] = [None] + [i.name for i in ctx.manifest.images]
    if len(names) == 1:
        return {None: _build(ctx)}
    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="qualify-build") as pool:
        futures = {name: pool.submit(_build, ctx, name) for name in names}
        done: dict[str | None, BuildResult] = {}
        for name, future in futures.items():
            try:
                done[name] = future.result()
            except BuildError as exc:
                if name is not None:
                    exc.args = (f"image {name}: {exc}",)
                raise
    return done


def obtain_candidate(ctx: RunContext, wait: bool = False, wait_timeout_s: float = 3600) -> BuildResult:
    """Build or resolve the candidate (every image of the release), record the images, and bind the run to their
    digests."""
    try:
        builds = _build_all(ctx)
    except BuildError as exc:
        if isinstance(exc, InfraError):  # not the candidate's fault: one line, the run an infrastructure error
            message = f"{exc}" + (f" (build log: {exc.log_path})" if exc.log_path else "")
            fail_run(ctx, RunStatus.ERROR, message)
            raise type(exc)(message, exc.log_tail, exc.log_path) from None
        tail = (exc.log_tail or "").strip()[-2000:]
        message = f"build failed: {exc}" + (f"\n--- build log tail ---\n{tail}" if tail else "")
        if exc.log_path:
            message += f"\n(full log: {exc.log_path})"
        fail_run(ctx, RunStatus.FAILED, message)
        if exc.exit_code != CandidateFailed.exit_code:  # bad build input, or a missing builder
            raise type(exc)(message, exc.log_tail, exc.log_path) from None
        raise CandidateFailed(message) from None
    build = builds[None]
    deadline = time.monotonic() + wait_timeout_s
    while True:
        with ctx.sessions() as session:
            run = session.get(Run, ctx.run_id)
            assert run is not None
            if ctx.resumed and run.candidate_digest and run.candidate_digest != build.digest:
                raise BadInput(
                    f"--resume {ctx.run_id}: the candidate is now {build.digest}, but the run qualified "
                    f"{run.candidate_digest}; start a new run")
            try:
                for name, result in builds.items():
                    image = repo.get_or_create_image(session, result.repository, result.tag, result.digest,
                                                     builder=result.builder, build_log_path=result.log_path,
                                                     build_log_tail=result.log_tail)
                    if name is None:
                        repo.attach_candidate(session, run, image, stale=driver_gone)
                    else:
                        repo.attach_image(session, run, name, image, stale=driver_gone)
                session.commit()
                break
            except repo.RunConflict as exc:
                session.rollback()
                if not wait or time.monotonic() > deadline:
                    fail_run(ctx, RunStatus.ABORTED, str(exc))
                    raise BadInput(f"{exc} (use --wait to queue behind it)") from None
        time.sleep(5)
    ctx.build = build
    ctx.executor = make_executor(ctx.manifest, build)
    paired = ctx.manifest.gate.regression.baseline in ("paired", "duet") and ctx.manifest.gate.regression.enabled
    if paired:
        ctx.paired = find_paired_baseline(ctx.sessions, ctx.manifest, build)
    for name, result in builds.items():
        if name is not None:
            ctx.further[name] = ImageSide(result, make_executor(ctx.manifest.for_image(name), result),
                                          find_paired_baseline(ctx.sessions, ctx.manifest, result, name)
                                          if paired else None)
    ctx.reference = find_reference(ctx.manifest, ctx.manifest_dir)
    return build


def make_executor(manifest: ReleaseManifest, build: BuildResult) -> Executor:
    """How one image's cases run: the local builder's interpreter, or the container executor on its digest."""
    execution = manifest.execution
    if execution.executor == "local":
        return LocalExecutor(python=build.python or LocalExecutor().python)
    if not build.image_ref:
        raise BadInput("execution.executor 'container' needs a container image: builder "
                             f"{build.builder!r} produced none")
    return ContainerExecutor.from_manifest(manifest, build.image_ref)


# --------------------------------------------------------------------------- verify


def verify_components(ctx: RunContext) -> list[dict[str, Any]]:
    """Run the probe workload inside every image of the release and store one check per component (a further
    image's under its name). Returns every image's checks."""
    checks = _verify_image(ctx, None, ctx.executor)
    for name, side in ctx.further.items():
        checks += _verify_image(ctx, name, side.executor)
    return checks


def _verify_image(ctx: RunContext, image: str | None, executor: Executor | None) -> list[dict[str, Any]]:
    components = list(ctx.manifest.for_image(image).components)
    if not components:
        return []
    assert executor is not None, "obtain_candidate() sets the executors"
    probe = run_case_on_ray(executor, probe_case(components), Resources(cpus=0.5), timeout_s=300)
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
        repo.record_component_checks(session, run, checks, image=image or "")
    return [{**c, "image": image or ""} for c in checks]


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


def promote(ctx: RunContext, log: Callable[[str], None] = lambda _m: None) -> list[TargetOutcome]:
    """Promote this run's candidate to every target; a refusal is reported as outcomes, never hidden."""
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
