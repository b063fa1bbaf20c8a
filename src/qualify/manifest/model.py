"""The release manifest: one YAML file that says what a release must prove.

Pydantic v2 models with ``extra="forbid"`` everywhere so that a typo is an error,
plus cross-field rules taken from the release note (stage3 prefetch bucket,
DeepSeek-R1 max model length, engine/scheme support, waiver expiry).
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import functools
import re
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, PrivateAttr, ConfigDict, Field, ValidationInfo, field_validator,
                      model_validator)

from qualify import container_policy
from qualify import metrics as metric_info
from qualify.imageref import TAG_PATTERN, InvalidReference, parse_reference
from qualify.versions import MatchRule, is_parseable
from qualify.workloads.infer.params import (  # noqa: F401 - ENGINE_SCHEMES, PREQUANTIZED_SCHEMES: re-exported
    ENGINE_SCHEMES,
    ENGINES,
    PREQUANTIZED_SCHEMES,
    PROBES,
    SCHEMES,
)
from qualify.workloads.train.params import prefetch_bucket_problem

__all__ = [
    "NAME_RE",
    "Name",
    "Engine",
    "Scheme",
    "Probe",
    "DEEPSEEK_R1_MAX_MODEL_LEN",
    "WAIVER_MAX_MODEL_LEN",
    "WAIVABLE_CHECKS",
    "WAIVABLE_FAMILIES",
    "waiver_check_problem",
    "Strict",
    "training_presets",
    "inference_model_names",
    "is_model_path",
    "ReleaseInfo",
    "HostPath",
    "BuildSpec",
    "ContainerOptIn",
    "ContainerOptions",
    "CaseKind",
    "DEFAULT_LAUNCHES",
    "MAX_LAUNCHES",
    "ExecutionSpec",
    "Component",
    "Resources",
    "TrainSettings",
    "TrainModel",
    "TrainVariant",
    "TrainingMatrix",
    "InferSettings",
    "InferScheme",
    "InferModel",
    "InferenceMatrix",
    "CustomCase",
    "Threshold",
    "RegressionPolicy",
    "VariantGain",
    "Waiver",
    "GatePolicy",
    "PromotionTarget",
    "InsecureRegistryOptIn",
    "PromotionSpec",
    "ExpandedTarget",
    "ReleaseManifest",
]

NAME_RE = r"^[a-z0-9][a-z0-9+._-]*$"
Name = Annotated[str, Field(pattern=NAME_RE, max_length=64)]

# Engines, quantization schemes (and which engine can run them) and probes are defined once,
# by the inference workload (standard library): transformers applies torchao on the fly;
# vLLM loads pre-quantized checkpoints (AWQ/GPTQ, compressed-tensors W8A8) as the release
# note lists them for vLLM 0.8.5.
Engine = Literal[ENGINES]  # type: ignore[valid-type]
Scheme = Literal[SCHEMES]  # type: ignore[valid-type]
Probe = Literal[PROBES]  # type: ignore[valid-type]
# Release note, known issues: DeepSeek-R1 with --max-model-len of 80k or more may OOM.
DEEPSEEK_R1_MAX_MODEL_LEN = 80_000
WAIVER_MAX_MODEL_LEN = "max_model_len_limit"
# What a waiver may name (issue 24.3): one check, or one family of checks written out (`threshold:*`), never a
# pattern that covers more (`*`, `?`, `[...]` would turn every FAIL into WAIVED). The gate's WAIVABLE_PREFIXES
# are built from these.
WAIVABLE_CHECKS = ("regression", "variant_gain", "agreement")
WAIVABLE_FAMILIES = ("component", "threshold", "probe")
_PATTERN_CHARS = frozenset("*?[]")


def waiver_check_problem(check: str) -> str | None:
    """Why a waiver's `check` is refused, or None."""
    if check in WAIVABLE_CHECKS or check == WAIVER_MAX_MODEL_LEN:
        return None
    family, sep, name = check.partition(":")
    if sep and family in WAIVABLE_FAMILIES and (name == "*" or (
            name.strip() == name and name and not _PATTERN_CHARS & set(name))):
        return None
    return (f"{check!r} is not one check or one family of checks: name one of "
            f"{', '.join(WAIVABLE_CHECKS + (WAIVER_MAX_MODEL_LEN,))}, "
            f"{', '.join(f'{f}:<name>' for f in WAIVABLE_FAMILIES)}, or one family written out "
            f"({', '.join(f'{f}:*' for f in WAIVABLE_FAMILIES)}); a pattern (*, ?, [...]) that covers more "
            "checks is refused, and completeness cannot be waived")


class Strict(BaseModel):
    """Base of every manifest model: unknown keys are errors, and a boolean is never a
    number (pydantic's lax mode reads ``case_timeout_s: true`` as 1 and ``zero_stage: true``
    as stage 1; even strict mode lets True through a Literal[0, 1, 2, 3])."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        where = _boolean_for_number(field.annotation, value) if field is not None else None
        if where is not None:
            raise ValueError(f"expected a number, not a boolean{where}")
        return value


def _takes_bool(annotation: Any) -> bool:
    """Whether a value of this type may be True/False (bool, Any, a Literal of booleans)."""
    if annotation is bool or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _takes_bool(typing.get_args(annotation)[0])
    if origin is Literal:
        return any(isinstance(v, bool) for v in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return any(_takes_bool(a) for a in typing.get_args(annotation))
    return False


def _takes_number(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _takes_number(typing.get_args(annotation)[0])
    if origin is Literal:
        return any(isinstance(v, (int, float)) for v in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return any(_takes_number(a) for a in typing.get_args(annotation))
    return False


def _boolean_for_number(annotation: Any, value: Any) -> str | None:
    """None when fine; else where a boolean stands for a number ("" for the value itself,
    " (at key 'x')" inside a dict or list of numbers). Nested models check their own fields."""
    if isinstance(value, bool):
        return "" if _takes_number(annotation) and not _takes_bool(annotation) else None
    origin = typing.get_origin(annotation)
    if origin is Annotated or origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation)[:1] if origin is Annotated else typing.get_args(annotation):
            found = _boolean_for_number(arg, value)
            if found is not None:
                return found
        return None
    if origin is dict and isinstance(value, dict):
        item_type = typing.get_args(annotation)[1]
        for key, item in value.items():
            found = _boolean_for_number(item_type, item)
            if found is not None:
                return found or f" (at key {key!r})"
    if origin is list and isinstance(value, list):
        item_type = typing.get_args(annotation)[0]
        for index, item in enumerate(value):
            found = _boolean_for_number(item_type, item)
            if found is not None:
                return found or f" (at index {index})"
    return None


# The workloads' model tables (standard library modules), read in this one place.
@functools.lru_cache(maxsize=1)
def training_presets() -> frozenset[str]:
    from qualify.workloads.train import models as train_models

    return frozenset(train_models.PRESETS)


@functools.lru_cache(maxsize=1)
def inference_model_names() -> frozenset[str]:
    """Tiny presets and real-model names (the workload's catalog, standard library only)."""
    from qualify.workloads.infer import catalog

    return frozenset(catalog.TINY_PRESETS) | frozenset(catalog.REAL_MODELS)


def is_model_path(name: str) -> bool:
    """A model given as a directory or a hub id (``/models/x``, ``./x``, ``Qwen/Qwen3-8B``)
    rather than a bare preset or real-model name; only bare names can be checked here."""
    return "/" in name or name.startswith((".", "~")) or "\\" in name


# --------------------------------------------------------------------------- release


class ReleaseInfo(Strict):
    name: Name = Field(description="product name, e.g. training-xpu-pytorch")
    repository: str = Field(description="image repository the release is published from")
    tag: str = Field(description="release tag, e.g. 25.05")
    candidate_tag: str = Field(description="tag of the candidate to qualify, e.g. 25.05-rc1")
    previous_tag: str | None = Field(default=None, description="previous release to compare with")
    description: str = ""

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str) -> str:
        ref = _check_reference(value)
        if ref.tag or ref.digest:
            raise ValueError(f"{value!r} must be a repository without tag or digest")
        return value

    @field_validator("tag", "candidate_tag", "previous_tag")
    @classmethod
    def _tag(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(TAG_PATTERN, value):
            raise ValueError(f"{value!r} is not a valid image tag")
        return value


def _check_reference(value: str):
    try:
        return parse_reference(value)
    except InvalidReference as exc:
        raise ValueError(str(exc)) from None


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
        if self.builder == "prebuilt":
            if not self.reference:
                raise ValueError("builder 'prebuilt' needs 'reference'")
            _check_reference(self.reference)
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
        _no_duplicates([o.what for o in value], "opt_ins")
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


CaseKind = Literal["train", "infer", "sleep", "synthetic"]
# Throughput cases run 3 launches (the least that gives the gate a test, see gate.stats); the sleep
# workload measures the orchestrator's own overhead, where one launch is the measurement.
DEFAULT_LAUNCHES: dict[str, int] = {"train": 3, "infer": 3, "synthetic": 3, "sleep": 1}
MAX_LAUNCHES = 20


class ExecutionSpec(Strict):
    executor: Literal["local", "container"] = "local"
    ray_address: str | None = None
    case_timeout_s: int = Field(default=1800, gt=0)
    infra_retries: int = Field(default=1, ge=0, le=5)
    # A timed-out case is not retried unless asked: a slow candidate must not get a second chance.
    retry_timeouts: bool = False
    container: ContainerOptions = Field(default_factory=ContainerOptions)
    # Independent process launches per case, by case kind (one number: every kind). Run-to-run variance
    # is only sampled by starting the workload again; the gate tests one figure per launch
    # (qualify.launches, gate.stats). case_timeout_s bounds each launch.
    launches: dict[CaseKind, int] = Field(default_factory=lambda: dict(DEFAULT_LAUNCHES))
    # The kinds whose launches the manifest gave (a number gives every kind): a default may be raised to the
    # gate's first look (ReleaseManifest._launches_cover_first_look), a given count never is.
    _given_launches: frozenset[str] = PrivateAttr(default=frozenset())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_given_launches(cls, data: Any, handler: Any) -> "ExecutionSpec":
        spec = handler(data)
        given = data.get("launches") if isinstance(data, dict) else None
        if isinstance(given, int) and not isinstance(given, bool):
            spec._given_launches = frozenset(DEFAULT_LAUNCHES)
        elif isinstance(given, dict):
            spec._given_launches = frozenset(str(k) for k in given)
        return spec

    def launches_given(self, kind: str) -> bool:
        return kind in self._given_launches

    @field_validator("launches", mode="before")
    @classmethod
    def _launches(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("give a number of launches (1..20), or one per case kind")
        if isinstance(value, int):
            return {kind: value for kind in DEFAULT_LAUNCHES}
        if isinstance(value, dict):
            return {**DEFAULT_LAUNCHES, **value}
        return value

    @field_validator("launches")
    @classmethod
    def _launch_range(cls, value: dict[str, int]) -> dict[str, int]:
        bad = {k: v for k, v in value.items() if not 1 <= v <= MAX_LAUNCHES}
        if bad:
            raise ValueError(f"launches must be 1..{MAX_LAUNCHES} per case kind, got {bad}")
        return value

    def launches_for(self, kind: str) -> int:
        return self.launches.get(kind, 1)  # type: ignore[call-overload]


# --------------------------------------------------------------------------- components


class Component(Strict):
    name: Name
    expected: str
    match: MatchRule = "exact"
    source: Literal["package", "os", "python", "cuda", "driver", "command", "env"] = "package"
    # package: the distribution name when it differs from `name`.
    package: str | None = None
    # command: argv run inside the image and a regex whose first group is the version.
    command: list[str] | None = None
    regex: str | None = None
    # env: the variable holding the version.
    env: str | None = None
    optional: bool = False

    @field_validator("expected")
    @classmethod
    def _expected(cls, value: str) -> str:
        # An empty prefix matches every version, and versions.matches fails on it at run time.
        if not value.strip():
            raise ValueError("is empty: give the version to expect")
        return value

    @model_validator(mode="after")
    def _comparable(self) -> "Component":
        if self.match in ("public", "min") and not is_parseable(self.expected):
            raise ValueError(f"expected {self.expected!r} has no version number, which match "
                             f"{self.match!r} compares (use match 'exact' or 'prefix' for text)")
        return self

    @model_validator(mode="after")
    def _source_fields(self) -> "Component":
        if self.source == "command":
            if not self.command:
                raise ValueError("source 'command' needs 'command' (argv list)")
            if self.regex:
                try:
                    if re.compile(self.regex).groups < 1:
                        raise ValueError("regex needs one capture group for the version")
                except re.error as exc:
                    raise ValueError(f"regex {self.regex!r} is invalid: {exc}") from None
        if self.source == "env" and not self.env:
            raise ValueError("source 'env' needs 'env' (variable name)")
        return self


# --------------------------------------------------------------------------- resources


class Resources(Strict):
    cpus: float = Field(default=1, ge=0)
    gpus: float = Field(default=0, ge=0)
    nodes: int = Field(default=1, ge=1)
    memory_gb: float | None = Field(default=None, gt=0)
    accelerator_type: str | None = None
    custom: dict[str, float] = Field(default_factory=dict)


# --------------------------------------------------------------------------- training


class TrainSettings(Strict):
    seq_len: int | None = Field(default=None, gt=0)
    micro_batch: int | None = Field(default=None, gt=0)
    grad_accum: int | None = Field(default=None, gt=0)
    steps: int | None = Field(default=None, gt=0)
    warmup_steps: int | None = Field(default=None, ge=0)
    repeats: int | None = Field(default=None, gt=0)
    dtype: Literal["bf16", "fp32"] | None = None
    zero_stage: Literal[0, 1, 2, 3] | None = None
    num_threads: int | None = Field(default=None, gt=0)
    data: Literal["synthetic", "memorize"] | None = None
    peak_flops_per_device: float | None = Field(default=None, gt=0)
    # Where that peak comes from (a datasheet, a vendor note): required with it, shown in the verdict.
    peak_flops_source: str | None = Field(default=None, min_length=3)
    launcher: Literal["auto", "none", "deepspeed", "torchrun"] | None = None
    deepspeed_config: dict[str, Any] | None = None
    resources: Resources | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # Tests and benchmarks only: every timed step slower by this fraction (a regression on demand).
    slowdown: float | None = Field(default=None, ge=0, lt=10)

    @model_validator(mode="after")
    def _peak_has_a_source(self) -> "TrainSettings":
        if self.peak_flops_per_device is not None and not self.peak_flops_source:
            raise ValueError("peak_flops_per_device needs peak_flops_source: where the figure comes from "
                             "(an MFU is only as good as its peak)")
        return self

    @field_validator("deepspeed_config")
    @classmethod
    def _prefetch_bucket(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # The release note's rule, as the training workload applies it (one definition).
        problem = prefetch_bucket_problem(value or {})
        if problem:
            raise ValueError(problem)
        return value


class TrainModel(Strict):
    name: Name
    preset: str | None = None
    config_path: str | None = None
    settings: TrainSettings = Field(default_factory=TrainSettings)


class TrainVariant(Strict):
    name: Name
    description: str = ""
    compile: bool = False
    activation_checkpointing: Literal["none", "all"] | int = "none"
    zero_stage: Literal[0, 1, 2, 3] | None = None
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("activation_checkpointing")
    @classmethod
    def _ckpt(cls, value: Any) -> Any:
        if isinstance(value, int) and value < 1:
            raise ValueError("activation_checkpointing as a layer count must be >= 1")
        return value


class TrainingMatrix(Strict):
    defaults: TrainSettings = Field(default_factory=TrainSettings)
    models: list[TrainModel] = Field(min_length=1)
    variants: list[TrainVariant] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "TrainingMatrix":
        _no_duplicates([m.name for m in self.models], "models")
        _no_duplicates([v.name for v in self.variants], "variants")
        return self


# --------------------------------------------------------------------------- inference


class InferSettings(Strict):
    engine: Engine | None = None
    num_prompts: int | None = Field(default=None, gt=0)
    prompt_len: int | None = Field(default=None, gt=0)
    max_new_tokens: int | None = Field(default=None, gt=0)
    eval_tokens: int | None = Field(default=None, gt=0)
    # Evaluation windows of eval_tokens positions (default: enough for 10,000 positions).
    eval_sequences: int | None = Field(default=None, gt=0)
    repeats: int | None = Field(default=None, gt=0)
    num_threads: int | None = Field(default=None, gt=0)
    train_steps: int | None = Field(default=None, ge=0)
    min_token_agreement: float | None = Field(default=None, ge=0, le=1)
    # Shipped AWQ/GPTQ/W8A8 checkpoints keep lm_head in float; opt in to quantize it too.
    quantize_lm_head: bool | None = None
    probes: list[Probe] | None = None
    engine_args: dict[str, Any] = Field(default_factory=dict)
    resources: Resources | None = None
    env: dict[str, str] = Field(default_factory=dict)


class InferScheme(Strict):
    scheme: Scheme
    # Pre-quantized checkpoint (AWQ/GPTQ/W8A8 on vLLM); defaults to the model's own.
    model: str | None = None
    settings: InferSettings = Field(default_factory=InferSettings)


class InferModel(Strict):
    name: Name
    model: str = Field(description="preset name or path to a Hugging Face model directory")
    reference_model: str | None = None
    family: str | None = Field(default=None, description="e.g. deepseek-r1, qwen3 (for known issues)")
    moe: bool = False
    schemes: list[InferScheme] = Field(min_length=1)
    settings: InferSettings = Field(default_factory=InferSettings)

    @model_validator(mode="after")
    def _unique(self) -> "InferModel":
        _no_duplicates([s.scheme for s in self.schemes], "schemes")
        return self


class InferenceMatrix(Strict):
    defaults: InferSettings = Field(default_factory=InferSettings)
    models: list[InferModel] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "InferenceMatrix":
        _no_duplicates([m.name for m in self.models], "models")
        return self


class CustomCase(Strict):
    """Extra cases of a plain kind: `sleep` (the overhead benchmark, fault tests) or `synthetic` (reports the
    samples it is given: gate scenarios end to end in seconds). Case id: <kind>/<name>."""

    name: Name
    kind: Literal["sleep", "synthetic"]
    params: dict[str, Any] = Field(default_factory=dict)
    resources: Resources | None = None
    # No upper bound here: the total over the manifest is capped (manifest_load.LIMITS.max_cases).
    count: int = Field(default=1, ge=1)


# --------------------------------------------------------------------------- gate policy


class Threshold(Strict):
    cases: str = Field(default="*", description="glob over case ids")
    metric: str
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _bound(self) -> "Threshold":
        if self.min is None and self.max is None:
            raise ValueError("a threshold needs 'min' or 'max'")
        return self


class RegressionPolicy(Strict):
    # metrics compared per case kind (one name or a list); each in its own direction (qualify.metrics).
    metrics: dict[str, str | list[str]] = Field(default_factory=lambda: {
        "train": "tokens_per_s", "infer": "output_tokens_per_s", "sleep": "wall_s", "synthetic": "tokens_per_s"})
    # history: compare with the previous release's stored results, which must exist when previous_tag is
    # set (a missing or unusable baseline is INCOMPLETE); optional: the same, but a missing baseline is
    # only reported (a first release); paired: re-measure the previous image beside the candidate; duet: run the
    # previous image at the same time as the candidate, each on its own cores, step by step (execution.duet).
    baseline: Literal["history", "optional", "paired", "duet"] = "history"

    def metrics_for(self, kind: str) -> list[str]:
        named = self.metrics.get(kind) or []
        return [named] if isinstance(named, str) else list(named)
    # Defaults and why: qualify.metrics; the rule: qualify.gate.noninferiority (PASS = non-inferiority
    # shown, FAIL = a regression beyond max_regression shown, else more launches, then INCOMPLETE).
    max_regression: float = Field(default=metric_info.RECOMMENDED_MAX_REGRESSION, gt=0, lt=1)
    # One-sided error probability of each of a false PASS and a false FAIL, over all looks (confidence 1 - alpha).
    alpha: float = Field(default=metric_info.RECOMMENDED_ALPHA, gt=0, lt=0.5)
    # The first look: launches (pairs) before the first decision. Must not exceed the planned launches of a
    # kind that is compared (refused at validation, never a silent fallback).
    min_samples: int = Field(default=metric_info.RECOMMENDED_MIN_SAMPLES, ge=2, le=20)
    # The budget: an undecided comparison gets more launches (pairs) up to this many, then is INCOMPLETE.
    max_launches: int = Field(default=metric_info.RECOMMENDED_MAX_LAUNCHES, ge=2, le=20)
    enabled: bool = True

    @model_validator(mode="before")
    @classmethod
    def _gone(cls, value: Any) -> Any:
        if isinstance(value, dict) and "noise_floor" in value:
            raise ValueError("noise_floor is gone: a ratio against a noise floor is no longer a way to PASS "
                             "(the gate shows non-inferiority or takes more launches, up to max_launches); remove it")
        return value

    @model_validator(mode="after")
    def _budget(self) -> "RegressionPolicy":
        if self.max_launches < self.min_samples:
            raise ValueError(f"max_launches ({self.max_launches}) is below min_samples ({self.min_samples}): "
                             "the budget must allow the first look")
        return self


class VariantGain(Strict):
    variant: Name
    baseline: Name = "base"
    min_gain: float = Field(description="required relative gain, e.g. 0.2 for +20%, -0.1 tolerates -10%")
    metric: str = "tokens_per_s"
    enforce: bool = True


class Waiver(Strict):
    id: str
    cases: str = Field(default="*", description="glob over case ids")
    check: str = Field(description="probe:<name>, threshold:<metric>, regression, variant_gain, "
                                   "component:<name>, or max_model_len_limit")
    reason: str = Field(min_length=3)
    expires: dt.date

    @field_validator("check")
    @classmethod
    def _one_check(cls, value: str) -> str:
        problem = waiver_check_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    def covers_check(self, check: str) -> bool:
        """The check itself, or a member of the family written out as `family:*` (never a glob)."""
        if self.check.endswith(":*"):
            return check.startswith(self.check[:-1]) and len(check) > len(self.check) - 1
        return check == self.check

    def covers(self, case_id: str, check: str) -> bool:
        return fnmatch.fnmatchcase(case_id, self.cases) and self.covers_check(check)


class GatePolicy(Strict):
    thresholds: list[Threshold] = Field(default_factory=list)
    regression: RegressionPolicy = Field(default_factory=RegressionPolicy)
    variant_gains: list[VariantGain] = Field(default_factory=list)
    agreement: dict[Scheme, float] = Field(default_factory=dict,
                                           description="minimum token agreement per scheme")
    # The most the token agreement may drop from the previous release's on the same positions (absolute):
    # the paired check shows a smaller drop to PASS (gate/agreement.py).
    agreement_max_drop: float = Field(default=0.01, ge=0, lt=1)
    probes_required: bool = True
    waivers: list[Waiver] = Field(default_factory=list)

    @field_validator("agreement")
    @classmethod
    def _agreement_range(cls, value: dict[str, float]) -> dict[str, float]:
        for scheme, minimum in value.items():
            if not 0 <= minimum <= 1:
                raise ValueError(f"agreement for {scheme!r} must be in [0, 1], got {minimum}")
        return value


# --------------------------------------------------------------------------- promotion


class PromotionTarget(Strict):
    name: Name
    reference: str | None = None
    template: str | None = Field(default=None, description="e.g. acs-registry-vpc.{region-id}.cr.aliyuncs.com/egslingjun/{image:tag}")
    regions: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_of(self) -> "PromotionTarget":
        if bool(self.reference) == bool(self.template):
            raise ValueError("give exactly one of 'reference' or 'template'")
        if self.template and "{region-id}" in self.template and not self.regions:
            raise ValueError("a template with {region-id} needs 'regions'")
        return self

    @field_validator("reference")
    @classmethod
    def _reference(cls, value: str | None) -> str | None:
        if value is not None:
            ref = _check_reference(value)
            if ref.digest or not ref.tag:
                raise ValueError(f"{value!r}: a promotion target must end in a tag (not a digest)")
        return value


class InsecureRegistryOptIn(Strict):
    """Plain HTTP to a registry that is not on loopback, and why."""

    registry: str = Field(description="host[:port] as listed in insecure_registries")
    reason: Reason


class PromotionSpec(Strict):
    on_pass: bool = Field(default=False, description="promote automatically at the end of a PASS run")
    targets: list[PromotionTarget] = Field(default_factory=list)
    # Declared before insecure_registries, which checks against it.
    opt_ins: list[InsecureRegistryOptIn] = Field(default_factory=list)
    # Plain HTTP (no TLS): loopback registries freely; any other only with an opt-in above.
    insecure_registries: list[str] = Field(default_factory=list,
                                           description="registries reached over plain HTTP (loopback tests)")

    @field_validator("insecure_registries")
    @classmethod
    def _insecure_needs_opt_in(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if not value:
            return value
        from qualify.registry.transport import is_loopback  # httpx and rich only when needed

        granted = {o.registry.strip().rstrip("/") for o in info.data.get("opt_ins") or []}
        for i, registry in enumerate(value):
            name = registry.strip().rstrip("/")
            if not name or "/" in name or any(c.isspace() for c in name):
                raise ValueError(f"[{i}]: {registry!r} is not a host[:port]")
            if not is_loopback(name) and name not in granted:
                raise ValueError(f"[{i}]: {registry!r} is not on loopback: plain HTTP (TLS off, credentials "
                                 f"in the clear) needs the opt-in promotion.opt_ins: "
                                 f"[{{registry: {name}, reason: ...}}] (the report shows it)")
        return value

    @model_validator(mode="after")
    def _unique(self) -> "PromotionSpec":
        _no_duplicates([t.name for t in self.targets], "targets")
        listed = {r.strip().rstrip("/") for r in self.insecure_registries}
        for i, opt in enumerate(self.opt_ins):
            if opt.registry.strip().rstrip("/") not in listed:
                raise ValueError(f"opt_ins[{i}]: {opt.registry!r} is not in insecure_registries: remove it")
        return self

    def opt_in_notes(self) -> list[str]:
        return [f"promotion: plain HTTP to {o.registry} ({o.reason})" for o in self.opt_ins]


class ExpandedTarget(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    reference: str


# --------------------------------------------------------------------------- root


class ReleaseManifest(Strict):
    api_version: Literal["qualify/v1"] = Field(alias="apiVersion", default="qualify/v1")
    release: ReleaseInfo
    build: BuildSpec = Field(default_factory=BuildSpec)
    execution: ExecutionSpec = Field(default_factory=ExecutionSpec)
    components: list[Component] = Field(default_factory=list)
    training: TrainingMatrix | None = None
    inference: InferenceMatrix | None = None
    custom_cases: list[CustomCase] = Field(default_factory=list)
    gate: GatePolicy = Field(default_factory=GatePolicy)
    promotion: PromotionSpec = Field(default_factory=PromotionSpec)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _matrix(self) -> "ReleaseManifest":
        if self.training is None and self.inference is None and not self.custom_cases:
            raise ValueError("the test matrix is empty: give 'training', 'inference' or 'custom_cases'")
        seen: set[tuple[str, str]] = set()
        for custom in self.custom_cases:
            if (custom.kind, custom.name) in seen:
                raise ValueError(f"custom_cases: two cases named {custom.name!r} of kind {custom.kind!r} "
                                 "would share one case id: give each its own name")
            seen.add((custom.kind, custom.name))
        _no_duplicates([c.name for c in self.components], "components")
        if self.gate.regression.baseline == "paired" and self.gate.regression.enabled and not self.release.previous_tag:
            raise ValueError("gate.regression.baseline 'paired' re-measures the previous release beside the "
                             "candidate: name it in release.previous_tag")
        self._launches_cover_first_look()
        return self

    def _launches_cover_first_look(self) -> None:
        """min_samples above a compared kind's planned launches: a default launch count rises to min_samples,
        a count the manifest gave is refused (never a silent fallback to a weaker rule)."""
        reg = self.gate.regression
        if not (reg.enabled and self.release.previous_tag):
            return
        kinds = ({"train"} if self.training else set()) | ({"infer"} if self.inference else set()) | {
            c.kind for c in self.custom_cases}
        for kind in sorted(kinds):
            planned = self.execution.launches_for(kind)
            if reg.metrics_for(kind) and planned < reg.min_samples and not self.execution.launches_given(kind):
                # A default (the manifest named no count for this kind) rises to the first look; a count the
                # manifest gave is refused below, never raised behind its back.
                self.execution.launches[kind] = reg.min_samples  # type: ignore[index]
                planned = reg.min_samples
            if reg.metrics_for(kind) and planned < reg.min_samples:
                raise ValueError(f"gate.regression.min_samples: {reg.min_samples} is above execution.launches for "
                                 f"{kind} ({planned}): the first decision needs {reg.min_samples} launches; raise "
                                 f"execution.launches.{kind} to {reg.min_samples} or lower min_samples")
            if reg.metrics_for(kind) and planned > reg.max_launches:
                raise ValueError(f"gate.regression.max_launches: {reg.max_launches} is below execution.launches for "
                                 f"{kind} ({planned}): raise max_launches or lower the launches")

    def case_counts(self) -> dict[str, int]:
        """How many cases each part of the matrix expands to, by field path, computed
        without expanding anything (the case cap is checked on this, in microseconds)."""
        counts: dict[str, int] = {}
        if self.training is not None:
            counts["training"] = len(self.training.models) * len(self.training.variants)
        if self.inference is not None:
            counts["inference"] = sum(len(m.schemes) for m in self.inference.models)
        for k, custom in enumerate(self.custom_cases):
            counts[f"custom_cases[{k}].count"] = custom.count
        return counts

    @property
    def candidate_reference(self) -> str:
        return f"{self.release.repository}:{self.release.candidate_tag}"

    def expanded_targets(self) -> list[ExpandedTarget]:
        """Promotion targets with the VPC template expanded over its regions."""
        image_tag = f"{self.release.repository.rsplit('/', 1)[-1]}:{self.release.tag}"
        out: list[ExpandedTarget] = []
        for target in self.promotion.targets:
            if target.reference:
                out.append(ExpandedTarget(name=target.name, reference=target.reference))
                continue
            assert target.template is not None
            for region in target.regions or [None]:
                ref = target.template.replace("{image:tag}", image_tag)
                if region is not None:
                    ref = ref.replace("{region-id}", region)
                out.append(ExpandedTarget(name=f"{target.name}-{region}" if region else target.name,
                                          reference=ref))
        return out


def _no_duplicates(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate {what} name {name!r}")
        seen.add(name)
