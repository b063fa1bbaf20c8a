"""The build section: how the candidate is built (builders, paths confined to the repository, taken literally),
and what the container engine may be asked (container_policy: allow-listed options, reasoned opt-ins)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from qualify import container_policy
from qualify.manifest.base import Strict, check_reference, no_duplicates


# --------------------------------------------------------------------------- build


def _reason(value: str) -> str:
    problem = container_policy.reason_problem(value)
    if problem:
        raise ValueError(problem)
    return value.strip()


# Why a privilege or an exception was granted: a real sentence (container_policy.reason_problem), stripped.
Reason = Annotated[str, AfterValidator(_reason)]


def _literal_path(value: str | None) -> str | None:
    """Build paths are taken literally: no $VARIABLE or ~ expansion (a secret in a variable would
    land in errors, logs and the database)."""
    if value is not None and ("$" in value or value.startswith("~")):
        raise ValueError(f"{value!r}: paths are taken literally (no $VARIABLE or ~ expansion); "
                         "write the path itself")
    return value


class HostPath(Strict):
    """A host path outside the manifest's repository that the build may read, and why."""

    path: str = Field(description="absolute path of a directory or file, e.g. /opt/wheels")
    reason: Reason

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        _literal_path(value)
        if not value.startswith("/") or ".." in value.split("/") or value.rstrip("/") in ("", "/"):
            raise ValueError(f"{value!r} must be an absolute path other than '/', without '..'")
        return value


class BuildSpec(Strict):
    builder: Literal["local", "prebuilt", "buildah", "podman", "docker"] = "local"
    # Paths are relative to the manifest's folder and must stay inside the manifest's repository
    # (the git work tree holding it, else its folder), symlinks resolved; see host_paths.
    containerfile: str | None = None
    context: str | None = None
    base_image: str | None = None
    build_args: dict[str, str] = Field(default_factory=dict)
    # prebuilt: an existing reference whose digest is resolved, nothing built.
    reference: str | None = None
    # local: the Python interpreter that stands for the image (default: the running one).
    python: str | None = None
    # Extra CA bundle mounted into build steps (corporate TLS proxies); never baked in. A host
    # file by design (absolute paths allowed), but it must be a PEM bundle of certificates.
    ca_bundle: str | None = None
    timeout_s: int = Field(default=3600, gt=0)
    # RUN steps get no network unless the manifest asks for the host's (a package index or
    # mirror): host networking also reaches every loopback service of the build machine
    # (PostgreSQL, the Prefect API, Ray). The build result and its log record the mode.
    network: Literal["isolated", "host"] = "isolated"
    # Host paths outside the manifest's repository that containerfile/context/context:NAME may
    # name, each with a reason (shown with the build result).
    host_paths: list[HostPath] = Field(default_factory=list)
    # Where a container build runs: on the driver, or as a Ray task on a node that declares the `builder`
    # resource (execution/builds.py: the files the build reads travel with it; it pushes the candidate and
    # returns the digest; the driver needs no container tool).
    on: Literal["driver", "cluster"] = "driver"
    # build.on: cluster and no node declares `builder`: build on the driver instead (said in the run's record),
    # rather than an infrastructure error (exit 3).
    driver_fallback: bool = False

    @field_validator("containerfile", "context", "ca_bundle")
    @classmethod
    def _no_expansion(cls, value: str | None) -> str | None:
        return _literal_path(value)

    @field_validator("build_args")
    @classmethod
    def _context_paths(cls, value: dict[str, str]) -> dict[str, str]:
        for name, path in value.items():
            if name.startswith("context:"):
                try:
                    _literal_path(path)
                except ValueError as exc:
                    raise ValueError(f"{name!r}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _needs(self) -> "BuildSpec":
        if self.builder in ("buildah", "podman", "docker") and not self.containerfile:
            raise ValueError(f"builder {self.builder!r} needs 'containerfile'")
        if self.on == "cluster" and self.builder not in ("buildah", "podman", "docker"):
            raise ValueError(f"on: cluster builds an image on a builder node; builder {self.builder!r} builds none "
                             "(use buildah, podman or docker, or on: driver)")
        if self.builder == "prebuilt":
            if not self.reference:
                raise ValueError("builder 'prebuilt' needs 'reference'")
            check_reference(self.reference)
        return self

    def opt_in_notes(self) -> list[str]:
        """What this build section widens, one line each, for the report."""
        notes = []
        if self.network == "host":
            notes.append("build.network: host (RUN steps share the build machine's network, loopback "
                         "services included)")
        notes += [f"build.host_paths: {h.path} ({h.reason})" for h in self.host_paths]
        return notes


class ContainerOptIn(Strict):
    """An explicit, reasoned widening of the container's privileges (qualify.container_policy)."""

    what: Literal[container_policy.OPT_INS]  # type: ignore[valid-type]
    reason: Reason


class ContainerOptions(Strict):
    # Declared first: the fields below check their widening against it (qualify.container_policy).
    opt_ins: list[ContainerOptIn] = Field(default_factory=list)
    runtime: Literal["podman", "docker"] = "podman"
    network: Literal["none", "host", "default"] = "none"
    ipc_host: bool = False
    privileged: bool = False
    # Accelerator device nodes for non-NVIDIA devices (e.g. the PPU), restricted per case.
    device_template: str | None = Field(default=None, description="e.g. /dev/ppu{index}")
    gpu_mode: Literal["cdi", "gpus-flag", "none"] = "cdi"
    # An allow-list: resource limits and options that narrow privileges (qualify.container_policy).
    extra_args: list[str] = Field(default_factory=list)
    shm_size: str | None = None

    @field_validator("opt_ins")
    @classmethod
    def _unique_opt_ins(cls, value: list[ContainerOptIn]) -> list[ContainerOptIn]:
        no_duplicates([o.what for o in value], "opt_ins")
        return value

    @field_validator("network", "ipc_host", "privileged")
    @classmethod
    def _widening(cls, value: Any, info: ValidationInfo) -> Any:
        need = container_policy.required_opt_ins(
            privileged=info.field_name == "privileged" and bool(value),
            network=value if info.field_name == "network" else "none",
            ipc_host=info.field_name == "ipc_host" and bool(value), extra_args=())
        granted = {o.what for o in info.data.get("opt_ins") or []}
        for what in need:
            if what not in granted:
                raise ValueError(f"{value!r} widens the container's privileges: it needs the opt-in "
                                 f"execution.container.opt_ins: [{{what: {what}, reason: ...}}] (the report shows it)")
        return value

    @field_validator("device_template")
    @classmethod
    def _device_template(cls, value: str | None) -> str | None:
        problem = container_policy.device_template_problem(value) if value is not None else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("extra_args")
    @classmethod
    def _extra_args(cls, value: list[str], info: ValidationInfo) -> list[str]:
        granted = {o.what for o in info.data.get("opt_ins") or []}
        problems = container_policy.extra_args_problems(value, "host-mounts" in granted)
        if problems:
            raise ValueError("; ".join(p.removeprefix("extra_args") for p in problems))
        return value

    @field_validator("shm_size")
    @classmethod
    def _shm_size(cls, value: str | None) -> str | None:
        if value is not None and container_policy.extra_args_problems(["--shm-size", value], False):
            raise ValueError(f"{value!r} is not a size (e.g. 8g)")
        return value

    @model_validator(mode="after")
    def _unused_opt_ins(self) -> "ContainerOptions":
        need = container_policy.required_opt_ins(privileged=self.privileged, network=self.network,
                                                 ipc_host=self.ipc_host, extra_args=self.extra_args)
        for i, opt in enumerate(self.opt_ins):
            if opt.what not in need:
                raise ValueError(f"opt_ins[{i}]: {opt.what!r} is not used by these options: remove it "
                                 "(an opt-in the report shows must be one that takes effect)")
        return self

    def opt_in_notes(self) -> list[str]:
        """The widenings these options were granted, one line each, for the report."""
        return [f"execution.container: {o.what} ({o.reason})" for o in self.opt_ins]
