"""Container executor: run one workload case inside the candidate image (podman or docker).

``podman run --rm -i --name qualify-<uuid> ... IMAGE python3 -m qualify.workloads.<kind>`` with
the case document on stdin and the result document on stdout, as the local executor does.

- The workload package is mounted read-only (``qualify/__init__.py`` and ``qualify/workloads``
  only, at ``/opt/qualify``, ``PYTHONPATH=/opt/qualify``) unless the image bakes it in: inside
  the image the workloads can import nothing of the rest of qualify, which is the boundary.
- A host cache folder is mounted for the DeepSpeed op build (``TORCH_EXTENSIONS_DIR``), the
  inductor cache and ``QUALIFY_CACHE_DIR``, so that the op build happens once per machine.
- Least privilege: ``--network none`` unless the manifest asks for another network; ``--ipc
  host``, ``--privileged``, host mounts and the other widenings only with the manifest's
  reasoned opt-in, ``extra_args`` from an allow-list (qualify.container_policy). The manifest's
  validation says so first; ``run_argv`` refuses again (a bad_case document, never a run).
- Environment: qualify's own values (PYTHONPATH, caches, devices) are ``--env K=V``; the case's
  and the manifest's values never go on the command line (it is recorded and visible in ``ps``):
  ``--env NAME`` takes them from the engine's own environment, where they are put. Names that
  configure the engine itself (PATH, LD_PRELOAD, HOME, TMPDIR, CONTAINERS_*, ...) go through an
  ``--env-file`` (mode 0600, removed after the run) instead. The engine's environment is the
  driver's without qualify's secrets (qualify.executors.environment).
- Accelerators: only the devices Ray assigned to the case (CDI ``--device nvidia.com/gpu=<id>``,
  ``--gpus "device=<ids>"`` or a device template such as ``/dev/ppu{index}``), with
  ``CUDA_VISIBLE_DEVICES`` set inside.
- The per-case timeout kills the container (``rm -f`` by name) and the client's process group;
  the container is removed by name whatever happens.
- An image without python3 gives a result document (status error) naming the image, never an
  exception; the engine failing to start the container (exit 125: pull failed, bad option) is
  an infrastructure error.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from qualify import container_policy
from qualify.settings import Settings
from qualify.executors.base import (TAIL_CHARS, CommandResult, Ending, ExecutionOutcome, case_json,
                                    outcome_from_command, run_command)
from qualify.executors.environment import engine_environment
from qualify.workloads import measure_gate, protocol

# The directory that holds the `qualify` package (src/): its workloads are mounted into the image.
WORKLOAD_ROOT = str(Path(__file__).resolve().parents[2])
IN_IMAGE_ROOT = "/opt/qualify"
IN_IMAGE_CACHE = "/var/cache/qualify"
NAME_PREFIX = "qualify-"
# Exit codes of `podman run` / `docker run` themselves (not of the workload).
ENGINE_ERROR = 125
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # podman would expand a '*' from its own environment
# Variables the engine (a Go program, its conmon and OCI runtime) reads for itself: a case value
# for one of them must not replace the engine's own, so it travels in an --env-file.
_ENGINE_OWN = re.compile(r"^(PATH|HOME|USER|LOGNAME|SHELL|TMPDIR|TMP|TEMP|LANG|LC_[A-Z]+|TZ|TERM|PWD"
                         r"|LD_[A-Z_]+|XDG_[A-Z_]+|GO[A-Z0-9_]*|CGO_[A-Z_]+|CONTAINERS?_[A-Z_]+|PODMAN_[A-Z_]+"
                         r"|DOCKER_[A-Z_]+|BUILDAH_[A-Z_]+|STORAGE_[A-Z_]+|REGISTRIES_CONFIG_PATH|REGISTRY_AUTH_FILE"
                         r"|SSL_CERT_(FILE|DIR)|NOTIFY_SOCKET|DBUS_[A-Z_]+|(?i:https?_proxy|no_proxy|all_proxy))$")


@dataclass(frozen=True)
class ContainerExecutor:
    image: str  # repository@sha256:... (a tag works, but a digest is what was qualified)
    runtime: str = "podman"  # podman | docker (or a path to one of them)
    network: str = "none"  # none | host | default
    ipc_host: bool = False
    privileged: bool = False
    gpu_mode: str = "cdi"  # cdi | gpus-flag | none
    device_template: str | None = None  # e.g. /dev/ppu{index}
    extra_args: tuple[str, ...] = ()
    shm_size: str | None = None
    # The folder holding the `qualify` package to mount; None when the image bakes it in.
    workload_root: str | None = WORKLOAD_ROOT
    # Host folder mounted as the in-container cache (DeepSpeed ops, inductor, tiny models).
    cache_root: str | None = None
    # Plain HTTP for pulls (loopback and manifest-listed insecure registries).
    tls_verify: bool = True
    # podman storage shared with the builders (qualify.build.containers.ContainerStore).
    storage_root: str | None = None
    storage_runroot: str | None = None
    containers_conf: str | None = None
    extra_env: tuple[tuple[str, str], ...] = ()
    rm_timeout_s: float = 60.0
    # The manifest's opt-ins (execution.container.opt_ins[].what): the widenings allowed above.
    opt_ins: tuple[str, ...] = ()

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_manifest(cls, release: Any, image_ref: str, **overrides: Any) -> "ContainerExecutor":
        """The executor for a release's candidate, from execution.container."""
        from qualify.build.containers import allowed_insecure, container_store, is_insecure

        opts = release.execution.container
        values: dict[str, Any] = dict(
            image=image_ref,
            runtime=opts.runtime,
            network=opts.network,
            ipc_host=opts.ipc_host,
            privileged=opts.privileged,
            gpu_mode=opts.gpu_mode,
            device_template=opts.device_template,
            extra_args=tuple(opts.extra_args),
            shm_size=opts.shm_size,
            cache_root=str(Settings.load().cache_dir / "container-cache"),
            tls_verify=not is_insecure(image_ref, allowed_insecure(release)),
            opt_ins=tuple(o.what for o in opts.opt_ins),
        )
        if _tool_name(opts.runtime) == "podman":
            store = container_store()
            values.update(storage_root=store.root, storage_runroot=store.runroot, containers_conf=store.conf)
        values.update(overrides)
        return cls(**values)

    def describe(self) -> str:
        extras = [f"network {self.network}"]
        if self.ipc_host:
            extras.append("ipc host")
        if self.privileged:
            extras.append("privileged")
        if self.opt_ins:
            extras.append("opt-ins: " + ", ".join(self.opt_ins))
        return f"{_tool_name(self.runtime)} run {self.image} ({', '.join(extras)})"

    def policy_problems(self) -> list[str]:
        """What these options widen without an opt-in, or what qualify never allows (the manifest's
        rule, qualify.container_policy, checked again right before a run)."""
        return container_policy.container_problems(
            privileged=self.privileged, network=self.network, ipc_host=self.ipc_host,
            extra_args=self.extra_args, device_template=self.device_template, opt_ins=self.opt_ins)

    # ------------------------------------------------------------------ command lines

    @property
    def _podman(self) -> bool:
        return _tool_name(self.runtime) == "podman"

    def engine_argv(self) -> list[str]:
        """The engine with its global options (qualify's store for podman)."""
        argv = [self.runtime]
        if self._podman and self.storage_root:
            argv += ["--root", self.storage_root]
            if self.storage_runroot:
                argv += ["--runroot", self.storage_runroot, "--tmpdir", str(Path(self.storage_runroot) / "libpod")]
        return argv

    def engine_env(self, values: dict[str, str] | None = None) -> dict[str, str]:
        """The engine's own environment: the driver's without qualify's secrets, plus the values
        that `--env NAME` arguments take from it."""
        env = engine_environment()
        if self._podman and self.containers_conf:
            env["CONTAINERS_CONF"] = self.containers_conf
        env.update(values or {})
        return env

    def fixed_env(self, gpu_ids: Sequence[str]) -> list[tuple[str, str]]:
        """qualify's own variables (never secret): `--env K=V` on the command line."""
        env: list[tuple[str, str]] = [("PYTHONUNBUFFERED", "1"), ("PYTHONDONTWRITEBYTECODE", "1")]
        if self.workload_root:
            env.append(("PYTHONPATH", IN_IMAGE_ROOT))
        if self.cache_root:
            env += [("QUALIFY_CACHE_DIR", IN_IMAGE_CACHE),
                    ("TORCH_EXTENSIONS_DIR", f"{IN_IMAGE_CACHE}/torch_extensions"),
                    ("TORCHINDUCTOR_CACHE_DIR", f"{IN_IMAGE_CACHE}/inductor")]
        if gpu_ids:
            # Restricted to the assigned devices, the container numbers them from 0; with all
            # devices visible (gpu_mode none, no template) the host ids select them.
            restricted = self.gpu_mode in ("cdi", "gpus-flag") or bool(self.device_template)
            visible = [str(i) for i in range(len(gpu_ids))] if restricted else [str(g) for g in gpu_ids]
            env += [("CUDA_VISIBLE_DEVICES", ",".join(visible)),
                    ("QUALIFY_ASSIGNED_DEVICES", ",".join(str(g) for g in gpu_ids))]
        return env

    def passed_env(self, case_doc: dict[str, Any]) -> list[tuple[str, str]]:
        """The executor's extra_env and the case's env (the manifest's values): never on argv."""
        env = [(str(k), str(v)) for k, v in self.extra_env]
        env += [(str(k), str(v)) for k, v in (case_doc.get("env") or {}).items()]
        for name, value in env:
            if not ENV_NAME.match(name):
                raise ValueError(f"environment variable name {name!r} is not a plain name (letters, digits, _)")
            if "\0" in value or "\n" in value:
                raise ValueError(f"environment variable {name}: the value holds a newline or NUL byte")
        return env

    def container_env(self, case_doc: dict[str, Any], gpu_ids: Sequence[str]) -> list[tuple[str, str]]:
        """Every variable the container gets, in order (later ones win)."""
        return self.fixed_env(gpu_ids) + self.passed_env(case_doc)

    def device_args(self, gpu_ids: Sequence[str]) -> list[str]:
        args: list[str] = []
        if not gpu_ids:
            return args
        if self.device_template:
            for gpu in gpu_ids:
                args += ["--device", container_policy.device_for(self.device_template, gpu)]
        if self.gpu_mode == "cdi":
            for gpu in gpu_ids:
                args += ["--device", f"nvidia.com/gpu={gpu}"]
        elif self.gpu_mode == "gpus-flag":
            # The value is parsed as CSV: a list of devices must be quoted inside it.
            args += ["--gpus", f'"device={",".join(str(g) for g in gpu_ids)}"']
        return args

    def run_argv(self, case_doc: dict[str, Any], name: str, gpu_ids: Sequence[str] = (),
                 env_file: str | None = None) -> list[str]:
        """The engine's command line (ValueError when the case or the options are refused).

        The values of the case's variables are not in it: see run_plan."""
        return self.run_plan(case_doc, name, gpu_ids, env_file=env_file)[0]

    def run_plan(self, case_doc: dict[str, Any], name: str, gpu_ids: Sequence[str] = (),
                 env_file: str | None = None) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """(argv, values for the engine's environment, values for the env file).

        Without env_file, the values that must travel in one are left out of argv (a dry view)."""
        kind = case_doc["kind"]
        if not re.fullmatch(r"[a-z][a-z0-9_]*", str(kind)):
            raise ValueError(f"case kind {kind!r} is not a workload module name")
        problems = self.policy_problems()
        if problems:
            raise ValueError("execution.container refused: " + "; ".join(problems))
        # No --rm: the container is removed by name after its state was read (State.OOMKilled, issue 24.9).
        argv = [*self.engine_argv(), "run", "-i", "--name", name, "--network", self.network]
        if self._podman:
            argv += ["--pull", "missing"]
            if not self.tls_verify:
                argv.append("--tls-verify=false")
        if self.ipc_host:
            argv.append("--ipc=host")
        if self.privileged:
            argv.append("--privileged")
        if self.shm_size:
            argv += ["--shm-size", self.shm_size]
        if self.workload_root:
            pkg = Path(self.workload_root) / "qualify"
            argv += ["--volume", f"{pkg / '__init__.py'}:{IN_IMAGE_ROOT}/qualify/__init__.py:ro",
                     "--volume", f"{pkg / 'workloads'}:{IN_IMAGE_ROOT}/qualify/workloads:ro"]
        if self.cache_root:
            argv += ["--volume", f"{self.cache_root}:{IN_IMAGE_CACHE}"]
        duet_dir = duet_barrier_dir(case_doc)
        if duet_dir:  # a duet side: the barrier's FIFOs at the same path inside (execution/duet.py makes the folder)
            argv += ["--volume", f"{duet_dir}:{duet_dir}"]
        gate_dir = measure_gate_dir(case_doc)
        if gate_dir:  # a launch of a batch: its measurement gate's FIFOs at the same path (execution/setup_overlap.py)
            argv += ["--volume", f"{gate_dir}:{gate_dir}"]
        argv += self.device_args(gpu_ids)
        for key, value in self.fixed_env(gpu_ids):
            argv += ["--env", f"{key}={value}"]
        via_engine: dict[str, str] = {}
        via_file: dict[str, str] = {}
        for key, value in self.passed_env(case_doc):
            if _ENGINE_OWN.match(key):
                via_file[key] = value
                via_engine.pop(key, None)
            else:
                via_engine[key] = value
                via_file.pop(key, None)
        if via_file and env_file:
            argv += ["--env-file", env_file]
        for key in via_engine:
            argv += ["--env", key]  # the value comes from the engine's environment
        argv += list(self.extra_args)
        argv += [self.image, "python3", "-m", f"qualify.workloads.{kind}"]
        return argv, via_engine, via_file

    def pull_argv(self) -> list[str]:
        """The engine's pull of this image by digest into the node's store (qualify's store for podman)."""
        argv = [*self.engine_argv(), "pull"]
        if self._podman:
            argv.append("--quiet")
            if not self.tls_verify:
                argv.append("--tls-verify=false")
        return [*argv, self.image]

    # ------------------------------------------------------------------ running

    def pull(self, timeout_s: float) -> CommandResult:
        """Pull the image on this node (execution/pulls.py: once per node, before the cases, so that no case's
        timeout pays it). Every wait is bounded by timeout_s."""
        return run_command(self.pull_argv(), "", timeout_s, env=self.engine_env(), track=False)

    def remove(self, name: str) -> None:
        """Remove the container by name, killing it first; quiet when it is already gone."""
        argv = [*self.engine_argv(), "rm", "--force"]
        if self._podman:
            argv += ["--time", "0", "--ignore"]
        argv.append(name)
        try:
            subprocess.run(argv, capture_output=True, text=True, env=self.engine_env(), timeout=self.rm_timeout_s)
        except (OSError, subprocess.SubprocessError):
            pass

    def run(self, case_doc: dict[str, Any], *, timeout_s: float, gpu_ids: Sequence[str] = ()) -> ExecutionOutcome:
        name = f"{NAME_PREFIX}{uuid.uuid4().hex[:16]}"
        gpu_ids = [str(g) for g in gpu_ids]
        private = tempfile.mkdtemp(prefix="qualify-env-")  # mode 0700
        try:
            env_file = str(Path(private) / "env")
            try:
                argv, via_engine, via_file = self.run_plan(case_doc, name, gpu_ids, env_file=env_file)
            except ValueError as exc:
                doc = protocol.make_result(case_doc, "error", error_class="bad_case", error=str(exc))
                return ExecutionOutcome(doc=doc, exit_code=None, exec_s=0.0)
            if via_file:
                fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.writelines(f"{k}={v}\n" for k, v in via_file.items())
            if self.cache_root:
                try:
                    Path(self.cache_root).mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    doc = protocol.make_result(case_doc, "error", error_class="infra",
                                               error=f"cannot create the cache folder {self.cache_root}: {exc}")
                    return ExecutionOutcome(doc=doc, exit_code=None, exec_s=0.0, command=argv)
            try:
                # Not tracked: the workload lives in the container (removed by name), and the engine's
                # own helpers (conmon, its cleanup) must outlive the client to remove it.
                res = run_command(argv, case_json(case_doc), timeout_s, env=self.engine_env(via_engine),
                                  on_timeout=lambda: self.remove(name), track=False)
                ending = self.ending(name, res)
            finally:
                self.remove(name)
        finally:
            shutil.rmtree(private, ignore_errors=True)
        return self._outcome(case_doc, res, argv, timeout_s, ending)

    def ending(self, name: str, res: CommandResult) -> Ending:
        """How the container ended. The engine reports a signal as the exit code 128+N, and a kernel OOM kill
        as an ordinary 137: only the container's own state (State.OOMKilled) tells them apart."""
        rc = res.returncode
        if rc is None or rc == 0 or res.timed_out or res.start_error:
            return Ending.local(rc)
        signum = rc - 128 if 128 < rc < 128 + 65 else None
        return Ending(rc, signum, self.oom_killed(name))

    def oom_killed(self, name: str) -> bool | None:
        """The container's State.OOMKilled (None when the engine cannot say)."""
        argv = [*self.engine_argv(), "inspect", "--format", "{{.State.OOMKilled}}", name]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, env=self.engine_env(),
                                 timeout=self.rm_timeout_s)
        except (OSError, subprocess.SubprocessError):
            return None
        answer = res.stdout.strip().lower() if res.returncode == 0 else ""
        return {"true": True, "false": False}.get(answer)

    def _outcome(self, case_doc: dict[str, Any], res: CommandResult, argv: list[str],
                 timeout_s: float, ending: Ending | None = None) -> ExecutionOutcome:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1][:500]
        engine_failed = (not res.timed_out and not res.start_error and res.returncode == ENGINE_ERROR
                         and not _has_document(res.stdout))
        if engine_failed:
            # The engine itself failed (pull, storage, bad option): infrastructure, retryable.
            stderr_tail = res.stderr[-TAIL_CHARS:]
            doc = protocol.make_result(case_doc, "error", error_class="infra",
                                       error=f"{_tool_name(self.runtime)} could not run image {self.image}: {last}",
                                       log_tail=stderr_tail, duration_s=res.seconds)
            return ExecutionOutcome(doc=doc, exit_code=res.returncode, exec_s=res.seconds,
                                    stderr_tail=stderr_tail, command=argv)
        hint = (f"image {self.image} cannot run `python3 -m qualify.workloads.{case_doc.get('kind')}`: "
                f"python3 is not on the image's PATH (the container executor needs an image with "
                f"Python 3): {last}")
        return outcome_from_command(case_doc, res, argv, timeout_s, not_found_hint=hint, ending=ending)


DUET_DIR_PREFIX = "qualify-duet-"  # execution/duet.run_pair's tempfile prefix
GATE_DIR_PREFIX = "qualify-gate-"  # execution/setup_overlap.run_batch's tempfile prefix


def duet_barrier_dir(case_doc: dict[str, Any]) -> str | None:
    """The duet barrier folder a side's case document names (None when it is no duet side). Only a folder the duet
    runner makes is mounted: an absolute path whose last part carries its prefix, with no character that would
    change the meaning of --volume; anything else is refused (ValueError), never mounted."""
    return _runner_folder(case_doc, "duet", DUET_DIR_PREFIX, "a duet barrier folder")


def measure_gate_dir(case_doc: dict[str, Any]) -> str | None:
    """The measurement gate's folder a launch's case document names (None without a gate), checked as the duet
    folder is: only a folder execution/setup_overlap.py makes is ever mounted."""
    return _runner_folder(case_doc, measure_gate.SECTION, GATE_DIR_PREFIX, "a measurement gate folder")


def _runner_folder(case_doc: dict[str, Any], section_name: str, prefix: str, what: str) -> str | None:
    section = case_doc.get(section_name)
    if not isinstance(section, dict) or section.get("dir") is None:
        return None
    folder = section["dir"]
    if not (isinstance(folder, str) and os.path.isabs(folder) and Path(folder).name.startswith(prefix)
            and re.fullmatch(r"[A-Za-z0-9_./-]+", folder) and ".." not in Path(folder).parts):
        raise ValueError(f"{section_name}.dir {folder!r} is not {what} ({prefix}* under a temp dir)")
    return os.path.normpath(folder)


def _has_document(stdout: str) -> bool:
    try:
        protocol.parse_result_output(stdout)
        return True
    except ValueError:
        return False


def _tool_name(runtime: str) -> str:
    return Path(runtime).name


def leftover_containers(executor: ContainerExecutor, names: Sequence[str] | None = None, *,
                        repository: str | None = None) -> list[str]:
    """Names of qualify-* containers the engine still knows (for tests and cleanup); with `names`, only those; with
    `repository` (`host/path`), only those run from an image of it (by tag or digest).

    The engine's store is the node's: without either the answer includes the containers of whatever else runs
    on the node now (another run, another test), so only a caller that has the node to itself may ask that."""
    argv = [*executor.engine_argv(), "ps", "--all", "--format", "{{.Names}} {{.Image}}"]
    res = subprocess.run(argv, capture_output=True, text=True, env=executor.engine_env(), timeout=60)
    return qualify_containers(res.stdout, names, repository)


def qualify_containers(listing: str, names: Sequence[str] | None = None, repository: str | None = None) -> list[str]:
    """The qualify-* names in an engine's `ps --format '{{.Names}} {{.Image}}'` listing (the image as the container
    was run: a tag or a digest reference); with `names`, only those; with `repository`, only those of its images."""
    out = []
    for line in listing.splitlines():
        name, _, image = line.strip().partition(" ")
        if not name.startswith(NAME_PREFIX) or (names is not None and name not in names):
            continue
        if repository is not None and not _of_repository(image.strip(), repository):
            continue
        out.append(name)
    return out


def _of_repository(image: str, repository: str) -> bool:
    """Is `image` (`host/path[:tag][@digest]`) an image of `repository` (`host/path`)? A longer path that merely
    starts with it (`host/path-other`) is not."""
    return image == repository or image.startswith((f"{repository}:", f"{repository}@"))


def container_name(command: Sequence[str]) -> str | None:
    """The container's name in an engine command line (`--name NAME`, as run_plan writes it)."""
    for flag, value in zip(command, command[1:]):
        if flag == "--name":
            return value
    return None
