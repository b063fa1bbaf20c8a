"""What runs: execution settings (launches per kind), components to verify, resources, the training and inference
matrices, and custom cases."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from qualify.manifest.base import Engine, Name, Probe, Scheme, Strict, no_duplicates
from qualify.manifest.build import ContainerOptions
from qualify.versions import MatchRule, is_parseable
from qualify.workloads.train.params import prefetch_bucket_problem


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
    # The launches of a single-node CPU case holding 2 CPUs or more start together (twice as many as its CPUs at
    # most), each waits after its set-up and they are measured one at a time (execution/setup_overlap.py): the
    # set-up seconds overlap, a measurement never runs beside another launch's set-up. false: one after the other.
    overlap_setup: bool = True
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
    # The image its cases run in (a name from `images:`); absent: the release's own image.
    image: Name | None = None


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
        no_duplicates([m.name for m in self.models], "models")
        no_duplicates([v.name for v in self.variants], "variants")
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
    image: Name | None = None  # as TrainModel.image

    @model_validator(mode="after")
    def _unique(self) -> "InferModel":
        no_duplicates([s.scheme for s in self.schemes], "schemes")
        return self


class InferenceMatrix(Strict):
    defaults: InferSettings = Field(default_factory=InferSettings)
    models: list[InferModel] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "InferenceMatrix":
        no_duplicates([m.name for m in self.models], "models")
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
    image: Name | None = None  # as TrainModel.image
