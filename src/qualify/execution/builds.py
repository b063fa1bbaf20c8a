"""Builds on the cluster (build.on: cluster, issue 28): the candidate's container build as a Ray task on a node that
declares the `builder` resource (a node with buildah or podman: `ray start --resources '{"builder": 1}'`).

The driver plans the build first (plan_build: every path confined and present, so bad input is said on the driver
with its field), packs the files the build reads (the Containerfile, the context, the named extra contexts, the CA
bundle: those inside the manifest's repository, by their place in it; a `build.host_paths` path is the builder
node's own) into one capped archive, and hands it to the task. The task unpacks it under a private folder, runs
the same builder the driver would (build/), which pushes the candidate to the release's registry and resolves its
digest there, and returns the result with its whole log (capped), which the driver writes under its data folder.

- A failed build is the candidate's (exit 1), bad build input is the manifest's (exit 2), and a registry that does
  not answer is infrastructure (exit 3): the task returns the error's class by name, the driver raises the same.
- No builder node: infrastructure (exit 3) naming the resource, or, with build.driver_fallback, the driver builds
  (said in the run's record). A builder node or worker that dies, or a task that does not return in time: infrastructure.
- Registry credentials never travel through Ray: the builder node pushes with its own (its containers auth file or
  QUALIFY_REGISTRY_* environment), as any node pulls with its own.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import socket
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import ray

from qualify.build import BuildResult, build_candidate
from qualify.build.base import BuilderUnavailable, BuildError, BuildInfraError, BuildInputError
from qualify.build.containers import BuildLog, manifest_repository, plan_build
from qualify.errors import InfraError
from qualify.manifest import ReleaseManifest

BUILDER_RESOURCE = "builder"
MAX_ARCHIVE_BYTES = 512 * 2**20  # what a build's files may weigh in the object store (a context is source, not data)
MAX_LOG_CHARS = 2_000_000  # of the build log that comes back to the run
TASK_GRACE_S = 300.0  # beyond build.timeout_s: unpacking, the push's own timeout, the task's start

# The errors a build may end with, by name: the task returns the name, the driver raises the same class.
_ERRORS: dict[str, type[BuildError]] = {cls.__name__: cls for cls in (
    BuildError, BuildInputError, BuildInfraError, BuilderUnavailable)}


class NoBuilderNode(InfraError):
    """build.on: cluster, and no alive node declares the `builder` resource (exit 3)."""


@dataclass(frozen=True)
class ClusterBuild:
    """Where the build ran, for the run's record (runs.cluster["build"])."""

    node_id: str
    host: str
    seconds: float
    archive_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def builder_nodes(nodes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The alive nodes that declare the builder resource."""
    return [n for n in nodes if n.get("Alive") and float((n.get("Resources") or {}).get(BUILDER_RESOURCE, 0)) >= 1]


# --------------------------------------------------------------------------- the files a build reads


def pack_build_inputs(manifest: ReleaseManifest, manifest_dir: Path, log: BuildLog) -> tuple[bytes, str]:
    """(a gzipped tar of the build's files inside the manifest's repository, by their place in it; the manifest's
    folder relative to that root). Raises BuildInputError when the files weigh more than MAX_ARCHIVE_BYTES."""
    plan = plan_build(manifest, manifest_dir, log)  # confined and present, or bad input said here
    root = manifest_repository(manifest_dir)
    wanted = [plan.containerfile, plan.context, *map(Path, plan.contexts.values())]
    if plan.ca_bundle is not None:
        wanted.append(plan.ca_bundle)
    inside = sorted({p for p in wanted if p == root or root in p.parents})
    buffer = io.BytesIO()
    total = 0

    def counted(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        nonlocal total
        if info.isdev():  # device nodes and fifos are no part of a build context
            return None
        total += info.size
        if total > MAX_ARCHIVE_BYTES:
            raise log.fail(f"the build's files weigh more than {MAX_ARCHIVE_BYTES // 2**20} MiB (build.context "
                           f"{plan.context}): a build on the cluster ships them to the builder node; narrow the "
                           "context or build on the driver (build.on: driver)", error=BuildInputError)
        return info

    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for path in inside:
            if path == root:
                for child in sorted(root.iterdir()):
                    if child.name != ".git":
                        tar.add(child, arcname=str(child.relative_to(root)), filter=counted)
            else:
                tar.add(path, arcname=str(path.relative_to(root)), filter=counted)
    return buffer.getvalue(), str(Path(manifest_dir).resolve().relative_to(root))


def _unpack(archive: bytes, into: Path) -> None:
    # The "tar" filter: nothing is written outside `into` (no absolute member, no `..`, nothing through a link that
    # leads out), while a symlink stays the symlink a local build's context would hold (even to an absolute path).
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        tar.extractall(into, filter="tar")
    (into / ".git").mkdir(exist_ok=True)  # the unpacked tree is the manifest's repository (build paths confined)


# --------------------------------------------------------------------------- the task on the builder node


def _build_here(manifest: ReleaseManifest, archive: bytes, manifest_rel: str) -> dict[str, Any]:
    """Runs on the builder node: unpack, build with the manifest's builder (it pushes), return plain data."""
    import time

    import ray as ray_here

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="qualify-cluster-build-"))
    node = {"node_id": ray_here.get_runtime_context().get_node_id(), "host": socket.gethostname()}
    try:
        root = work / "repo"
        root.mkdir()
        try:
            _unpack(archive, root)
        except (tarfile.TarError, OSError) as exc:  # what the repository holds cannot be laid out here
            return {**node, "ok": False, "error": "BuildInputError", "log_tail": "", "log": "",
                    "message": f"the build's files cannot be unpacked on the builder node: {exc}",
                    "seconds": time.monotonic() - started}
        data_dir = work / "data"
        try:
            result = build_candidate(manifest, data_dir=data_dir, manifest_dir=root / manifest_rel)
        except BuildError as exc:
            return {**node, "ok": False, "error": type(exc).__name__ if type(exc).__name__ in _ERRORS else "BuildError",
                    "message": str(exc), "log_tail": exc.log_tail, "log": _read(exc.log_path),
                    "seconds": time.monotonic() - started}
        return {**node, "ok": True, "result": asdict(result), "log": _read(result.log_path),
                "seconds": time.monotonic() - started}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _read(path: str | None) -> str:
    if not path:
        return ""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return text if len(text) <= MAX_LOG_CHARS else "[... the start of the log was cut ...]\n" + text[-MAX_LOG_CHARS:]


# --------------------------------------------------------------------------- the driver's side


def build_on_cluster(manifest: ReleaseManifest, *, data_dir: Path, manifest_dir: Path,
                     nodes: Sequence[Mapping[str, Any]] | None = None) -> tuple[BuildResult, ClusterBuild | None]:
    """Build the candidate on a builder node of the connected Ray cluster (see the module docstring). Returns the
    result, its log written under data_dir/builds, and where it ran (None: built on the driver by fallback)."""
    if not builder_nodes(ray.nodes() if nodes is None else nodes):
        if manifest.build.driver_fallback:  # the run's record says so (runs.cluster["build"], `runs show`)
            return build_candidate(manifest, data_dir=data_dir, manifest_dir=manifest_dir), None
        raise NoBuilderNode(f"build.on: cluster, but no alive node of the Ray cluster declares the "
                            f"'{BUILDER_RESOURCE}' resource (start one where buildah or podman is installed with "
                            f"`ray start ... --resources '{{\"{BUILDER_RESOURCE}\": 1}}'`), and "
                            "build.driver_fallback is off")
    log = BuildLog(data_dir, manifest.release.name)
    archive, manifest_rel = pack_build_inputs(manifest, manifest_dir, log)
    log.write(f"# build on the cluster: {len(archive)} bytes of build files shipped to a '{BUILDER_RESOURCE}' node")
    task = ray.remote(num_cpus=1, max_retries=0, resources={BUILDER_RESOURCE: 1})(_build_here)
    ref = task.remote(manifest, archive, manifest_rel)
    try:
        out = ray.get(ref, timeout=manifest.build.timeout_s + TASK_GRACE_S)
    except Exception as exc:  # noqa: BLE001 - a node, worker or object store that failed: not the candidate's
        with contextlib.suppress(Exception):  # a task already gone cannot be cancelled; nothing else to do
            ray.cancel(ref, force=True)
        message = (f"the build's Ray task on a '{BUILDER_RESOURCE}' node did not return: {type(exc).__name__}: "
                   f"{str(exc).splitlines()[0][:300] if str(exc) else ''}")
        raise log.fail(message, error=BuildInfraError) from None
    log.write(f"# built on node {out['node_id']} ({out['host']}) in {out['seconds']:.1f} s")
    if out.get("log"):
        log.write(out["log"])
    where = ClusterBuild(str(out["node_id"]), str(out["host"]), float(out["seconds"]), len(archive))
    if not out["ok"]:
        error = _ERRORS.get(str(out.get("error")), BuildError)
        raise error(f"{out['message']} (built on {out['host']})", log_tail=log.tail(), log_path=str(log.path))
    result = BuildResult(**{**out["result"], "opt_ins": tuple(out["result"].get("opt_ins") or ())})
    return BuildResult(**{**asdict(result), "opt_ins": result.opt_ins, "log_path": str(log.path),
                          "log_tail": log.tail()}), where


__all__ = ["BUILDER_RESOURCE", "ClusterBuild", "NoBuilderNode", "build_on_cluster", "builder_nodes",
           "pack_build_inputs"]
