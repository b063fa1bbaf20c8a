"""The release manifest: one YAML file that says what a release must prove.

Pydantic v2 models with ``extra="forbid"`` everywhere so that a typo is an error,
plus cross-field rules taken from the release note (stage3 prefetch bucket,
DeepSeek-R1 max model length, engine/scheme support, waiver expiry).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from qualify.imageref import TAG_PATTERN
# The parts of the manifest, re-exported: `from qualify.manifest import X` (and `.model`) keeps working.
from qualify.manifest.base import (  # noqa: F401
    DEEPSEEK_R1_MAX_MODEL_LEN, NAME_RE, Engine, Name, Probe, Scheme, Strict, check_reference, inference_model_names,
    is_model_path, no_duplicates, repository_only, training_presets)
from qualify.manifest.build import BuildSpec, ContainerOptIn, ContainerOptions, HostPath, Reason  # noqa: F401
from qualify.manifest.images import ImageSpec  # noqa: F401
from qualify.manifest.matrix import (  # noqa: F401
    DEFAULT_LAUNCHES, MAX_LAUNCHES, CaseKind, Component, CustomCase, ExecutionSpec, InferenceMatrix, InferModel,
    InferScheme, InferSettings, Resources, TrainingMatrix, TrainModel, TrainSettings, TrainVariant)
from qualify.manifest.policy import (  # noqa: F401
    REFERENCE_PREFIX, WAIVABLE_CHECKS, WAIVABLE_FAMILIES, WAIVER_MAX_MODEL_LEN, GatePolicy, ReferenceImage,
    RegressionPolicy, Threshold, VariantGain, Waiver, is_reference_case, waiver_check_problem)
from qualify.manifest.promotion import (  # noqa: F401
    ExpandedTarget, InsecureRegistryOptIn, PromotionSpec, PromotionTarget)
from qualify.workloads.infer.params import ENGINE_SCHEMES, PREQUANTIZED_SCHEMES  # noqa: F401 - re-exported


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
    "ReferenceImage",
    "REFERENCE_PREFIX",
    "is_reference_case",
    "train_case_id",
    "infer_case_id",
    "custom_case_id",
    "PromotionTarget",
    "InsecureRegistryOptIn",
    "PromotionSpec",
    "ExpandedTarget",
    "ImageSpec",
    "ReleaseManifest",
]

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
        return repository_only(value)

    @field_validator("tag", "candidate_tag", "previous_tag")
    @classmethod
    def _tag(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(TAG_PATTERN, value):
            raise ValueError(f"{value!r} is not a valid image tag")
        return value


# --------------------------------------------------------------------------- root

def train_case_id(model: str, variant: str) -> str:
    """The one spelling of each kind of case id (cases.expand builds them, the manifest counts and matches them)."""
    return f"train/{model}/{variant}"


def infer_case_id(model: str, scheme: str) -> str:
    return f"infer/{model}/{scheme}"


def custom_case_id(kind: str, name: str, index: int, count: int) -> str:
    return f"{kind}/{name}" + (f"/{index:04d}" if count > 1 else "")


_ENUMERABLE = 100_000  # case ids listed to match gate.reference.cases only below this many (the cap is far lower)


class ReleaseManifest(Strict):
    api_version: Literal["qualify/v1"] = Field(alias="apiVersion", default="qualify/v1")
    release: ReleaseInfo
    build: BuildSpec = Field(default_factory=BuildSpec)
    # Further images of the release (the release's own is the first and the default): manifest/images.py.
    images: list[ImageSpec] = Field(default_factory=list)
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
        no_duplicates([c.name for c in self.components], "components")
        if self.gate.regression.baseline == "paired" and self.gate.regression.enabled and not self.release.previous_tag:
            raise ValueError("gate.regression.baseline 'paired' re-measures the previous release beside the "
                             "candidate: name it in release.previous_tag")
        self._images_named()
        self._launches_cover_first_look()
        self._reference_usable()
        return self

    def _images_named(self) -> None:
        """Image names unique (the release's own is release.name), one repository each, and every case's
        `image:` one of them."""
        names = [self.release.name] + [i.name for i in self.images]
        for k, spec in enumerate(self.images):
            if spec.name in names[:k + 1]:  # the release's own, or an earlier image
                raise ValueError(f"images[{k}].name: {spec.name!r} names two images (the release's own image is "
                                 f"called {self.release.name!r}, its release.name)")
        repositories = [self.release.repository] + [i.repository for i in self.images]
        for k, spec in enumerate(self.images):
            if repositories.count(spec.repository) > 1:
                raise ValueError(f"images[{k}].repository: {spec.repository!r} is another image's repository: "
                                 "each image of a release has its own (their tags would overwrite each other)")
        for field_path, image in self._case_images():
            if image is not None and image not in names:
                raise ValueError(f"{field_path}.image: {image!r} is not an image of the release "
                                 f"({', '.join(names)})")

    def _case_images(self) -> list[tuple[str, str | None]]:
        out: list[tuple[str, str | None]] = []
        if self.training is not None:
            out += [(f"training.models[{k}]", m.image) for k, m in enumerate(self.training.models)]
        if self.inference is not None:
            out += [(f"inference.models[{k}]", m.image) for k, m in enumerate(self.inference.models)]
        out += [(f"custom_cases[{k}]", c.image) for k, c in enumerate(self.custom_cases)]
        return out

    @property
    def image_names(self) -> list[str]:
        """Every image of the release, the release's own first (it is called release.name)."""
        return [self.release.name] + [i.name for i in self.images]

    def image_spec(self, name: str) -> ImageSpec | None:
        return next((i for i in self.images if i.name == name), None)

    def for_image(self, name: str | None) -> "ReleaseManifest":
        """The manifest as one image sees it: its repository, tags, build, components and promotion targets in
        the release's places (the rest shared), so that building, verifying, pairing with the previous release
        and promoting an image go through the code that does it for the release's own. `None` or release.name:
        this manifest."""
        if name is None or name == self.release.name:
            return self
        spec = self.image_spec(name)
        if spec is None:
            raise KeyError(name)
        release = self.release.model_copy(update={
            "repository": spec.repository, "candidate_tag": spec.candidate_tag or self.release.candidate_tag})
        return self.model_copy(update={"release": release, "build": spec.build, "components": spec.components,
                                       "promotion": self.promotion.model_copy(update={"targets": spec.targets}),
                                       "images": []})

    def _reference_usable(self) -> None:
        ref = self.gate.reference
        if ref is None:
            return
        if self.execution.executor == "local" and not ref.python:
            raise ValueError("gate.reference.python: the local executor runs the reference in an interpreter on this "
                             "machine whose package set has the reference's digest; name it (or use the container "
                             "executor, which runs the image by digest)")
        if ref.variant and (self.training is None or ref.variant not in {v.name for v in self.training.variants}):
            known = ", ".join(v.name for v in self.training.variants) if self.training else "no training matrix"
            raise ValueError(f"gate.reference.variant: {ref.variant!r} is not a training variant ({known})")
        if sum(self._base_counts().values()) <= _ENUMERABLE and not self.reference_case_ids():
            compared = sorted({k for k in self.gate.regression.metrics if self.gate.regression.metrics_for(k)})
            raise ValueError(f"gate.reference.cases: {ref.cases!r} matches no case whose kind has a compared metric "
                             f"({', '.join(compared)}; gate.regression.metrics)")

    def base_case_ids(self) -> list[tuple[str, str]]:
        """(case id, kind) of every case but the reference ones, without building a case (bounded by the case
        cap, checked before)."""
        ids: list[tuple[str, str]] = []
        if self.training is not None:
            ids += [(train_case_id(m.name, v.name), "train") for m in self.training.models
                    for v in self.training.variants]
        if self.inference is not None:
            ids += [(infer_case_id(m.name, s.scheme), "infer") for m in self.inference.models for s in m.schemes]
        for custom in self.custom_cases:
            ids += [(custom_case_id(custom.kind, custom.name, k, custom.count), custom.kind)
                    for k in range(custom.count)]
        return ids

    def reference_case_ids(self) -> list[str]:
        """The cases re-measured against gate.reference: those its glob names whose kind has a compared metric."""
        ref = self.gate.reference
        if ref is None:
            return []
        return [case_id for case_id, kind in self.base_case_ids()
                if self.gate.regression.metrics_for(kind) and ref.covers(case_id)]

    def _launches_cover_first_look(self) -> None:
        """min_samples above a compared kind's planned launches: a default launch count rises to min_samples,
        a count the manifest gave is refused (never a silent fallback to a weaker rule)."""
        reg = self.gate.regression
        if not ((reg.enabled and self.release.previous_tag) or self.gate.reference):
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
        counts = self._base_counts()
        if self.gate.reference is not None:
            # At most one more case per case; counted exactly only when the rest can be enumerated cheaply (a
            # hostile matrix is refused by the cap on the upper bound, never enumerated).
            rest = sum(counts.values())
            counts["gate.reference"] = len(self.reference_case_ids()) if rest <= _ENUMERABLE else rest
        return counts

    def _base_counts(self) -> dict[str, int]:
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
