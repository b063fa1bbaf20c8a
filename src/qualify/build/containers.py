"""Container builders (buildah, podman, docker) and the prebuilt resolver.

Each builder is ``(release, data_dir, manifest_dir) -> BuildResult``. A build:

1. resolves the manifest's Containerfile and context (relative to the manifest's folder, taken
   literally: no variable or ``~`` expansion) and confines them to the manifest's repository (the
   git work tree holding the manifest, else its folder; symlinks resolved), except for the host
   paths the manifest names with a reason (``build.host_paths``); ``build.ca_bundle`` is a host
   file by design, but must be a PEM bundle of certificates;
2. runs ``buildah build`` / ``podman build`` with ``--layers`` caching in qualify's container
   store (``<QUALIFY_CACHE_DIR>/containers/{root,runroot}``, shared with the container
   executor so that builds and runs see the same images), with the build arguments
   (``build.build_args``; exact/public component pins as ``<NAME>_VERSION``) and the extra
   CA bundle (``build.ca_bundle``) mounted into RUN steps only, never baked in; RUN steps get
   no network (``--network none``) unless the manifest says ``build.network: host`` (a package
   index), which the build log and the BuildResult record;
3. tags the candidate ``{manifest.repository}:{candidate_tag}`` and pushes it there (plain
   HTTP only for loopback registries and ``promotion.insecure_registries``);
4. records the digest the registry reports (``--digestfile``), checked with ``skopeo inspect``.

The image is identified by ``repository@digest`` from then on. Every command's output goes to
``<data_dir>/builds/<timestamp>-<name>.log``; a failure raises BuildError with its tail.

Build arguments named ``context:<name>`` are named build contexts, not arguments:
``{"context:wheels": "/opt/wheels"}`` becomes ``--build-context wheels=/opt/wheels`` (a
Containerfile uses it as ``RUN --mount=type=bind,from=wheels,target=/wheels``), so that large
local files (the torch CPU wheel) enter RUN steps without a COPY layer.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from qualify.build.base import (
    BuildError,
    BuildInfraError,
    BuilderUnavailable,
    BuildInputError,
    BuildResult,
)
from qualify.imageref import InvalidReference, parse_reference
from qualify.manifest import ReleaseManifest
from qualify.registry import ImageNotFound, RegistryClient, RegistryError
from qualify.registry.transport import plain_http
from qualify.settings import Settings
from qualify.workloads.procs import kill_group

TAIL_CHARS = 4000
CONTEXT_ARG_PREFIX = "context:"
# Where the builder mounts build.ca_bundle in RUN steps (Debian's system bundle path, which
# OpenSSL, pip's truststore and requests all read) and what PIP_CERT then points to.
CA_TARGET = "/etc/ssl/certs/ca-certificates.crt"

# --------------------------------------------------------------------------- the container store


@dataclass(frozen=True)
class ContainerStore:
    """qualify's own container storage: buildah and podman both point at it."""

    root: str
    runroot: str
    conf: str

    @property
    def tmpdir(self) -> str:
        return str(Path(self.runroot) / "libpod")

    def global_args(self, tool: str) -> list[str]:
        """Global options placing buildah/podman on this store (docker has no such thing)."""
        if tool in ("buildah", "podman"):
            args = ["--root", self.root, "--runroot", self.runroot]
            if tool == "podman":
                args += ["--tmpdir", self.tmpdir]
            return args
        return []

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["CONTAINERS_CONF"] = self.conf
        return env


def containers_conf(store_dir: Path) -> str:
    # What worked on these machines (docs/IMAGES.md): runc, because crun fails on hybrid
    # cgroups; cgroupfs without systemd; a file events log (no journald); sane ulimits.
    # scripts/base-image.sh writes the same file when it runs first.
    runroot = store_dir / "runroot"
    return (
        "# Written by qualify (qualify.build.containers / scripts/base-image.sh); rewritten when it differs.\n"
        "[containers]\n"
        'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
        "\n"
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'tmp_dir = "{runroot / "libpod"}"\n'
    )


def container_store(cache: Path | None = None) -> ContainerStore:
    """The store in ``<cache>/containers`` (created, with its containers.conf, on first use)."""
    store_dir = Path(cache or Settings.load().cache_dir).expanduser().resolve() / "containers"
    root, runroot = store_dir / "root", store_dir / "runroot"
    for path in (root, runroot, runroot / "libpod"):
        path.mkdir(parents=True, exist_ok=True)
    conf = store_dir / "containers.conf"
    text = containers_conf(store_dir)
    try:
        current = conf.read_text()
    except OSError:
        current = None
    if current != text:
        with tempfile.NamedTemporaryFile("w", dir=store_dir, delete=False, suffix=".tmp") as fh:
            fh.write(text)
        os.replace(fh.name, conf)
    return ContainerStore(str(root), str(runroot), str(conf))


def registry_of(reference: str) -> str:
    try:
        return parse_reference(reference).registry
    except InvalidReference:
        return reference.split("/", 1)[0]


def is_insecure(reference: str, insecure_registries: Iterable[str] = ()) -> bool:
    """Plain HTTP only for registries listed as insecure (the one rule: qualify.registry.transport)."""
    return plain_http(registry_of(reference), insecure_registries)


def tls_args(reference: str, insecure_registries: Iterable[str] = ()) -> list[str]:
    return ["--tls-verify=false"] if is_insecure(reference, insecure_registries) else []


def engine_available(tool: str) -> str | None:
    """None when the tool can be used; else why not."""
    if shutil.which(tool) is None:
        return f"{tool} is not installed"
    if tool == "docker":
        try:
            res = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                                 text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"`docker info` failed: {exc}"
        if res.returncode != 0 or not res.stdout.strip():
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            return f"no Docker engine answers `docker info` ({last[:200]})"
    return None


# --------------------------------------------------------------------------- the build log


class BuildLog:
    """One file per build; every command and its output appended to it."""

    def __init__(self, data_dir: Path, name: str) -> None:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        folder = Path(data_dir) / "builds"
        folder.mkdir(parents=True, exist_ok=True)
        # A release's images build at once, each to its own file: never two builds in one log.
        for k in range(1, 1000):
            self.path = folder / (f"{stamp}-{name}.log" if k == 1 else f"{stamp}-{name}-{k}.log")
            try:
                self.path.open("x").close()
                break
            except FileExistsError:
                continue

    def write(self, text: str) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(text if text.endswith("\n") else text + "\n")

    def tail(self, chars: int = TAIL_CHARS) -> str:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - chars * 4))
                data = fh.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return data[-chars:]

    def fail(self, message: str, error: type[BuildError] = BuildError) -> BuildError:
        self.write(f"qualify: error: {message}")
        return error(message, log_tail=self.tail(), log_path=str(self.path))

    def run(self, argv: Sequence[str], *, env: dict[str, str] | None, timeout_s: float,
            what: str, deadline: float | None = None) -> str:
        """Run argv with its output appended to the log; returns the output, raises BuildError."""
        if deadline is not None:
            timeout_s = min(timeout_s, max(1.0, deadline - time.monotonic()))
        self.write(f"$ {_quote(argv)}")
        start = time.monotonic()
        with open(self.path, "a", encoding="utf-8") as fh, tempfile.TemporaryFile("w+") as capture:
            try:
                proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, env=env, text=True, errors="replace",
                                        start_new_session=True)
            except OSError as exc:
                raise self.fail(f"{what}: cannot start {argv[0]!r}: {exc.strerror or exc}",
                                error=BuilderUnavailable) from None
            timed_out = _pump(proc, (fh, capture), timeout_s)
            capture.seek(0)
            output = capture.read()
        seconds = time.monotonic() - start
        if timed_out:
            raise self.fail(f"{what} exceeded its timeout of {timeout_s:g} s and was killed")
        self.write(f"# exit {proc.returncode} after {seconds:.1f} s")
        if proc.returncode != 0:
            raise self.fail(f"{what} failed (exit code {proc.returncode}); log: {self.path}")
        return output


def _pump(proc: subprocess.Popen[str], sinks: tuple, timeout_s: float) -> bool:
    """Copy proc's output to the sinks until it exits; past the timeout kill its process group.

    Returns True when it had to be killed.
    """
    import threading

    assert proc.stdout is not None
    fired = threading.Event()

    def expire() -> None:
        fired.set()
        kill_group(proc)

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    try:
        for line in proc.stdout:
            for sink in sinks:
                sink.write(line)
            sinks[0].flush()
        proc.wait()
    finally:
        timer.cancel()
    return fired.is_set()


def _quote(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


# --------------------------------------------------------------------------- build settings


NETWORK_FLAG = {"isolated": "none", "host": "host"}  # build.network -> the engine's --network
CA_BUNDLE_MAX_BYTES = 16 * 2**20


@dataclass(frozen=True)
class BuildPlan:
    containerfile: Path
    context: Path
    build_args: dict[str, str]
    contexts: dict[str, str]
    ca_bundle: Path | None
    target: str  # repository:candidate_tag
    network: str = "isolated"  # build.network
    opt_ins: tuple[str, ...] = ()

    @property
    def network_flag(self) -> str:
        return NETWORK_FLAG[self.network]


def manifest_repository(manifest_dir: Path) -> Path:
    """The manifest's repository: the git work tree holding its folder, else the folder itself."""
    folder = Path(manifest_dir).resolve()
    for candidate in (folder, *folder.parents):
        if (candidate / ".git").exists():  # a folder, or a file in a linked work tree
            return candidate
    return folder


def _resolve(manifest_dir: Path, value: str) -> Path:
    """A manifest path, taken literally (no $VARIABLE or ~ expansion), symlinks resolved."""
    path = Path(value)
    return (path if path.is_absolute() else (Path(manifest_dir) / path)).resolve()


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


class _Confinement:
    """Build paths must stay in the manifest's repository or a host path the manifest names."""

    def __init__(self, manifest: ReleaseManifest, manifest_dir: Path, log: "BuildLog") -> None:
        self.manifest_dir = Path(manifest_dir)
        self.root = manifest_repository(manifest_dir)
        self.log = log
        self.allowed: list[Path] = []
        for i, host in enumerate(manifest.build.host_paths):
            resolved = Path(host.path).resolve()
            if resolved == Path(resolved.anchor):
                raise log.fail(f"build.host_paths[{i}] {host.path!r} resolves to {resolved}: the whole file "
                               "system is never a build path", error=BuildInputError)
            self.allowed.append(resolved)

    def path(self, value: str, field: str) -> Path:
        if "$" in value or value.startswith("~"):
            raise self.log.fail(f"{field} {value!r}: paths are taken literally (no $VARIABLE or ~ expansion)",
                                error=BuildInputError)
        path = _resolve(self.manifest_dir, value)
        if _inside(path, self.root) or any(_inside(path, a) for a in self.allowed):
            return path
        raise self.log.fail(
            f"{field} {value!r} resolves to {path}, outside the manifest's repository {self.root}: build paths "
            "stay inside it (symlinks resolved); name a host path outside it under build.host_paths with a "
            "reason", error=BuildInputError)


def check_ca_bundle(path: Path) -> str | None:
    """Why build.ca_bundle is refused (it is mounted into RUN steps); None for a PEM certificate bundle."""
    try:
        if path.stat().st_size > CA_BUNDLE_MAX_BYTES:
            return f"is larger than {CA_BUNDLE_MAX_BYTES // 2**20} MiB"
        text = path.read_bytes().decode("ascii", "replace")
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if "-----BEGIN CERTIFICATE-----" not in text:
        return "holds no PEM certificate (-----BEGIN CERTIFICATE-----): it must be a CA bundle"
    if "PRIVATE KEY" in text:
        return "holds a private key: a CA bundle holds certificates only"
    return None


def pin_arg_name(component_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", component_name).strip("_").upper() + "_VERSION"


def component_pins(manifest: ReleaseManifest) -> dict[str, str]:
    """Exact/public package pins of the manifest as build arguments (TORCH_VERSION=2.13.0)."""
    pins: dict[str, str] = {}
    for component in manifest.components:
        if component.source == "package" and component.match in ("exact", "public"):
            pins[pin_arg_name(component.name)] = component.expected
    return pins


def plan_build(manifest: ReleaseManifest, manifest_dir: Path, log: BuildLog) -> BuildPlan:
    spec = manifest.build
    if not spec.containerfile:
        raise log.fail(f"builder {spec.builder!r} needs build.containerfile", error=BuildInputError)
    confine = _Confinement(manifest, manifest_dir, log)
    containerfile = confine.path(spec.containerfile, "build.containerfile")
    if not containerfile.is_file():
        raise log.fail(f"Containerfile {containerfile} not found (build.containerfile "
                       f"{spec.containerfile!r}, relative to {manifest_dir})", error=BuildInputError)
    context = confine.path(spec.context, "build.context") if spec.context else containerfile.parent
    if not context.is_dir():
        raise log.fail(f"build context {context} is not a directory (build.context {spec.context!r})", error=BuildInputError)
    args = component_pins(manifest)
    contexts: dict[str, str] = {}
    for name, value in spec.build_args.items():
        if name.startswith(CONTEXT_ARG_PREFIX):
            ctx_name = name[len(CONTEXT_ARG_PREFIX):]
            path = confine.path(value, f"build.build_args[{name!r}]")
            if not path.exists():
                raise log.fail(f"build context {ctx_name!r}: {path} does not exist (build.build_args {name!r})", error=BuildInputError)
            contexts[ctx_name] = str(path)
        else:
            args[name] = value
    if spec.base_image:
        args["BASE_IMAGE"] = spec.base_image
    ca_bundle = None
    if spec.ca_bundle:
        if "$" in spec.ca_bundle or spec.ca_bundle.startswith("~"):
            raise log.fail(f"build.ca_bundle {spec.ca_bundle!r}: paths are taken literally (no $VARIABLE or ~ "
                           "expansion)", error=BuildInputError)
        ca_bundle = _resolve(manifest_dir, spec.ca_bundle)
        if not ca_bundle.is_file():
            raise log.fail(f"build.ca_bundle {ca_bundle} is not a file", error=BuildInputError)
        problem = check_ca_bundle(ca_bundle)
        if problem:
            raise log.fail(f"build.ca_bundle {ca_bundle} {problem}", error=BuildInputError)
    return BuildPlan(containerfile, context, args, contexts, ca_bundle, manifest.candidate_reference,
                     network=spec.network, opt_ins=tuple(spec.opt_in_notes()))


def _build_argv(tool: str, store: ContainerStore, plan: BuildPlan, iidfile: Path) -> list[str]:
    # --force-rm: buildah keeps a failed build's working container by default, with its overlay mounted, on the
    # build node for good (two a test run here, found mounted in the store after CI).
    argv = [tool, *store.global_args(tool), "build", "--layers", "--force-rm", "--network", plan.network_flag,
            "--pull=false",
            "--file", str(plan.containerfile), "--tag", plan.target, "--iidfile", str(iidfile)]
    if tool == "buildah":
        argv += ["--isolation", "oci", "--runtime", "runc"]
    for name, value in plan.build_args.items():
        argv += ["--build-arg", f"{name}={value}"]
    for name, path in plan.contexts.items():
        argv += ["--build-context", f"{name}={path}"]
    if plan.ca_bundle is not None:
        argv += ["--volume", f"{plan.ca_bundle}:{CA_TARGET}:ro", "--build-arg", f"PIP_CERT={CA_TARGET}"]
    argv.append(str(plan.context))
    return argv


def local_base_images(plan: BuildPlan) -> list[str]:
    """The FROM images named localhost/... (never pulled: they must be in the store already)."""
    args: dict[str, str] = {}
    images: list[str] = []
    stages: set[str] = set()
    for raw in plan.containerfile.read_text(errors="replace").splitlines():
        line = raw.strip()
        m = re.match(r"(?i)^ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?", line)
        if m and not images:
            args[m.group(1)] = plan.build_args.get(m.group(1), (m.group(2) or "").strip("\"'"))
            continue
        m = re.match(r"(?i)^FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", line)
        if m:
            ref = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
                         lambda g: args.get(g.group(1), plan.build_args.get(g.group(1), "")), m.group(1))
            if ref.startswith("localhost/") and ref not in stages:
                images.append(ref)
            if m.group(2):
                stages.add(m.group(2))
    return images


def _check_local_bases(tool: str, store: ContainerStore, plan: BuildPlan, log: BuildLog) -> None:
    for image in local_base_images(plan):
        argv = ([tool, *store.global_args(tool), "image", "exists", image] if tool == "podman"
                else [tool, *store.global_args(tool), "inspect", "--type", "image", "--format", "{{.FromImageID}}",
                      image])
        try:
            res = subprocess.run(argv, capture_output=True, text=True, env=store.env(), timeout=120)
        except (OSError, subprocess.SubprocessError):
            continue
        if res.returncode != 0:
            raise log.fail(f"the local base image {image} is not in qualify's container store {store.root}: "
                           "create it with scripts/base-image.sh (with the same QUALIFY_CACHE_DIR)", error=BuildInputError)


# --------------------------------------------------------------------------- builders


def _oci_build(tool: str, manifest: ReleaseManifest, data_dir: Path, manifest_dir: Path) -> BuildResult:
    log = BuildLog(data_dir, manifest.release.name)
    plan = plan_build(manifest, manifest_dir, log)
    why = engine_available(tool)
    if why:
        raise log.fail(f"builder {tool!r} cannot run: {why}", error=BuilderUnavailable)
    store = container_store()
    env = store.env()
    _check_local_bases(tool, store, plan, log)
    deadline = time.monotonic() + manifest.build.timeout_s
    insecure = allowed_insecure(manifest)
    _log_network(log, plan)
    with tempfile.TemporaryDirectory(prefix="qualify-build-") as tmp:
        iidfile, digestfile = Path(tmp) / "iid", Path(tmp) / "digest"
        log.run(_build_argv(tool, store, plan, iidfile), env=env, timeout_s=manifest.build.timeout_s,
                what=f"{tool} build of {plan.containerfile}", deadline=deadline)
        image_id = iidfile.read_text().strip() if iidfile.exists() else ""
        log.write(f"# image id {image_id}")
        push = [tool, *store.global_args(tool), "push", "--digestfile", str(digestfile),
                *tls_args(plan.target, insecure), plan.target, f"docker://{plan.target}"]
        try:
            log.run(push, env=env, timeout_s=manifest.build.timeout_s, what=f"push to {plan.target}",
                    deadline=deadline)
        except BuildError:
            unreachable = _unreachable_registry(plan.target)
            if unreachable:  # the registry's part, not the candidate's (issue 24.8)
                raise log.fail(f"push to {plan.target}: {unreachable}", error=BuildInfraError) from None
            raise
        pushed = digestfile.read_text().strip() if digestfile.exists() else ""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", pushed):
        raise log.fail(f"push to {plan.target} reported no digest (got {pushed!r})")
    reported = registry_digest(plan.target, log, insecure=insecure)
    if reported != pushed:
        raise log.fail(f"the registry reports {reported} for {plan.target}, but the push wrote {pushed}")
    repository = manifest.release.repository
    log.write(f"# candidate {repository}@{pushed}")
    return BuildResult(repository=repository, tag=manifest.release.candidate_tag, digest=pushed,
                       builder=tool, image_ref=f"{repository}@{pushed}", log_path=str(log.path),
                       log_tail=log.tail(), network=plan.network, opt_ins=plan.opt_ins)


def _log_network(log: BuildLog, plan: BuildPlan) -> None:
    if plan.network == "host":
        log.write("# build network: host (build.network: host): RUN steps share this machine's network, "
                  "loopback services included")
    else:
        log.write("# build network: isolated (--network none): RUN steps have no network")
    for note in plan.opt_ins:
        log.write(f"# opt-in: {note}")


def allowed_insecure(manifest: ReleaseManifest) -> list[str]:
    """promotion.insecure_registries that may really be reached over plain HTTP: loopback ones, and
    others only with their opt-in (the manifest's validation says the same; checked again here)."""
    from qualify.registry.transport import is_loopback

    granted = {o.registry.strip().rstrip("/") for o in manifest.promotion.opt_ins}
    return [r for r in manifest.promotion.insecure_registries
            if is_loopback(r.strip().rstrip("/")) or r.strip().rstrip("/") in granted]


def _unreachable_registry(reference: str, timeout_s: float = 10.0) -> str | None:
    """Why the reference's registry takes no connection, or None when it does."""
    import socket

    from qualify.imageref import parse_reference

    registry = parse_reference(reference).registry
    host, _, port = registry.rpartition(":") if registry.rsplit(":", 1)[-1].isdigit() else (registry, "", "443")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        return f"registry {registry} is unreachable: {exc.strerror or exc}"
    return None


def registry_digest(reference: str, log: BuildLog, *, insecure: Iterable[str] = ()) -> str:
    """The manifest digest the registry reports for a reference (the one resolver: RegistryClient)."""
    try:
        with RegistryClient(insecure) as client:
            return client.resolve(reference)
    except ImageNotFound as exc:
        raise log.fail(f"cannot resolve {reference}: {exc}", error=BuildInputError) from None
    except RegistryError as exc:  # unreachable, unauthorized: the registry's part, not the candidate's
        raise log.fail(f"cannot resolve {reference}: {exc}", error=BuildInfraError) from None


def build_buildah(manifest: ReleaseManifest, data_dir: Path, manifest_dir: Path) -> BuildResult:
    return _oci_build("buildah", manifest, data_dir, manifest_dir)


def build_podman(manifest: ReleaseManifest, data_dir: Path, manifest_dir: Path) -> BuildResult:
    return _oci_build("podman", manifest, data_dir, manifest_dir)


def build_docker(manifest: ReleaseManifest, data_dir: Path, manifest_dir: Path) -> BuildResult:
    """docker build (BuildKit) + docker push, only where a Docker engine answers."""
    log = BuildLog(data_dir, manifest.release.name)
    why = engine_available("docker")
    if why:
        raise log.fail(f"builder 'docker' cannot run: {why}. Use builder 'buildah' or 'podman' "
                       "(daemonless), or start a Docker engine.", error=BuilderUnavailable)
    plan = plan_build(manifest, manifest_dir, log)
    deadline = time.monotonic() + manifest.build.timeout_s
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    _log_network(log, plan)
    argv = ["docker", "build", "--network", plan.network_flag, "--file", str(plan.containerfile), "--tag",
            plan.target]
    for name, value in plan.build_args.items():
        argv += ["--build-arg", f"{name}={value}"]
    for name, path in plan.contexts.items():
        argv += ["--build-context", f"{name}={path}"]
    if plan.ca_bundle is not None:
        # docker build has no --volume: the bundle is a BuildKit secret (never stored in a layer);
        # a Containerfile reads it with RUN --mount=type=secret,id=ca_bundle.
        argv += ["--secret", f"id=ca_bundle,src={plan.ca_bundle}", "--build-arg", "PIP_CERT=/run/secrets/ca_bundle"]
    argv.append(str(plan.context))
    log.run(argv, env=env, timeout_s=manifest.build.timeout_s, what=f"docker build of {plan.containerfile}",
            deadline=deadline)
    output = log.run(["docker", "push", plan.target], env=env, timeout_s=manifest.build.timeout_s,
                     what=f"docker push {plan.target}", deadline=deadline)
    m = re.findall(r"digest: (sha256:[0-9a-f]{64})", output)
    insecure = allowed_insecure(manifest)
    reported = registry_digest(plan.target, log, insecure=insecure)
    if m and m[-1] != reported:
        raise log.fail(f"the registry reports {reported} for {plan.target}, but docker push printed {m[-1]}")
    repository = manifest.release.repository
    return BuildResult(repository=repository, tag=manifest.release.candidate_tag, digest=reported,
                       builder="docker", image_ref=f"{repository}@{reported}", log_path=str(log.path),
                       log_tail=log.tail(), network=plan.network, opt_ins=plan.opt_ins)


def build_prebuilt(manifest: ReleaseManifest, data_dir: Path, manifest_dir: Path) -> BuildResult:
    """Nothing is built: resolve build.reference to the digest its registry reports."""
    log = BuildLog(data_dir, manifest.release.name)
    reference = manifest.build.reference
    if not reference:
        raise log.fail("builder 'prebuilt' needs build.reference", error=BuildInputError)
    try:
        ref = parse_reference(reference)
    except InvalidReference as exc:
        raise log.fail(str(exc)) from None
    digest = registry_digest(reference, log, insecure=allowed_insecure(manifest))
    if ref.digest and ref.digest != digest:
        raise log.fail(f"{reference}: the registry reports digest {digest}")
    log.write(f"# prebuilt {ref.name}@{digest}")
    return BuildResult(repository=ref.name, tag=ref.tag, digest=digest, builder="prebuilt",
                       image_ref=f"{ref.name}@{digest}", log_path=str(log.path), log_tail=log.tail())


BUILDERS = {
    "buildah": build_buildah,
    "podman": build_podman,
    "docker": build_docker,
    "prebuilt": build_prebuilt,
}

