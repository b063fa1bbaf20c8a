"""Expand a ReleaseManifest into its test cases: frozen values with stable, readable ids.

The same manifest always gives the same ids in the same order: training
(models x variants), then inference (models x schemes), then custom cases, each
in manifest order, then the cases gate.reference re-measures beside the reference image
(``reference/<case id>``). Ids look like ``train/llama3-8b/compile+ckpt`` and
``infer/qwen3-8b/gptq-w4a16``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from qualify.manifest.model import (REFERENCE_PREFIX, ReleaseManifest, Resources, TrainModel, TrainVariant,
                                   custom_case_id, infer_case_id, train_case_id)
from qualify.manifest.load import ManifestError, case_count_problem, merged_infer_settings
from qualify.workloads import protocol
from qualify.workloads.merge import deep_merge

# The case document's key for how many launches start at once (execution/setup_overlap.py).
SETUP_OVERLAP = "setup_overlap"


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Case:
    case_id: str
    kind: str  # "train" | "infer" | "sleep"
    model: str | None
    variant: str | None  # training variant, inference scheme, or custom case name
    params: Mapping[str, Any]
    env: Mapping[str, str]
    resources: Resources
    timeout_s: int
    tags: tuple[str, ...] = field(default=())
    launches: int = 1  # independent process launches (qualify.launches); timeout_s bounds each
    image: str | None = None  # the release image it runs in (manifest `images:`); None: the release's own
    # Launches started at once, each measured alone (execution/setup_overlap.py); 1: one after the other. How the
    # launches are run, not what a case is: not in to_dict (the result's fingerprint says whether it was used).
    setup_overlap: int = 1

    @classmethod
    def build(cls, case_id: str, kind: str, model: str | None, variant: str | None,
              params: dict[str, Any], env: dict[str, str], resources: Resources, timeout_s: int,
              launches: int = 1, image: str | None = None) -> "Case":
        return cls(case_id, kind, model, variant, _freeze(params), _freeze(env), resources, timeout_s,
                   launches=launches, image=image)

    def document(self) -> dict[str, Any]:
        """The workload protocol's case document, with the number of launches for the Ray task."""
        doc = protocol.make_case(self.case_id, self.kind, thaw(self.params), thaw(self.env), self.timeout_s)
        doc["launches"] = self.launches
        if self.setup_overlap > 1:
            doc[SETUP_OVERLAP] = self.setup_overlap
        return doc

    def to_dict(self) -> dict[str, Any]:
        # "image" only when the case names one: the fingerprints of cases in the release's own image stay as
        # they were (their history compares across releases).
        return ({"image": self.image} if self.image else {}) | {
            "case_id": self.case_id,
            "kind": self.kind,
            "model": self.model,
            "variant": self.variant,
            "params": thaw(self.params),
            "env": thaw(self.env),
            "resources": self.resources.model_dump(),
            "timeout_s": self.timeout_s,
            "launches": self.launches,
        }

    def fingerprint(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def expand(release: ReleaseManifest, name: str = "<manifest>") -> list[Case]:
    """The cases of a release; ManifestError when there would be more than the case cap
    (load_manifest refuses such a manifest already; this guards a ReleaseManifest built otherwise)."""
    too_many = case_count_problem(release, name)
    if too_many is not None:
        raise ManifestError([too_many])
    cases: list[Case] = []
    timeout = release.execution.case_timeout_s
    if release.training is not None:
        for model in release.training.models:
            for variant in release.training.variants:
                cases.append(replace(_train_case(release, model, variant, timeout), image=_image(release, model.image)))
    if release.inference is not None:
        for model in release.inference.models:
            for scheme in model.schemes:
                settings = merged_infer_settings(release, model, scheme)
                env = settings.pop("env")
                resources = settings.pop("resources", None)
                params: dict[str, Any] = {
                    "model": scheme.model or model.model,
                    "scheme": scheme.scheme,
                    **settings,
                }
                reference = model.reference_model or (model.model if scheme.model else None)
                if reference:
                    params["reference_model"] = reference
                if scheme.scheme in release.gate.agreement:
                    params["min_token_agreement"] = release.gate.agreement[scheme.scheme]
                cases.append(Case.build(
                    infer_case_id(model.name, scheme.scheme), "infer", model.name, scheme.scheme,
                    params, env, Resources.model_validate(resources) if resources else Resources(), timeout,
                    launches=release.execution.launches_for("infer"), image=_image(release, model.image)))
    for custom in release.custom_cases:
        for k in range(custom.count):
            case_id = custom_case_id(custom.kind, custom.name, k, custom.count)
            cases.append(Case.build(case_id, custom.kind, None, custom.name, dict(custom.params), {},
                                    custom.resources or Resources(), timeout,
                                    launches=release.execution.launches_for(custom.kind),
                                    image=_image(release, custom.image)))
    cases = [replace(c, setup_overlap=setup_overlap(release, c)) for c in cases]
    compared = set(release.reference_case_ids())
    # gate.reference: each case it names again, the candidate beside the reference image (the same case document:
    # what differs is the other side, chosen by the id's prefix in execution.attempts and gate.regression_for).
    cases += [replace(c, case_id=REFERENCE_PREFIX + c.case_id, tags=("reference",)) for c in list(cases)
              if c.case_id in compared]
    duplicates = sorted(i for i, n in Counter(c.case_id for c in cases).items() if n > 1)
    assert not duplicates, f"case ids must be unique, these repeat: {duplicates}"  # validation prevents it
    return cases


def setup_overlap(release: ReleaseManifest, case: Case) -> int:
    """How many of a case's launches start at once (execution/setup_overlap.py), with execution.overlap_setup: a
    single-node case with no GPU that holds at least 2 whole CPUs, twice as many as those CPUs, at most its
    launches. A set-up is mostly one thread that also waits on the disk, so two per core keep the case's cores busy
    (measured on the smoke's base case, 2 CPUs: 3 at once took 0.66 of the sequential wall, 2 at once 0.79:
    benchmarks/setup_overlap.py); they run on the case's own cores only, since nothing of the case is measured
    meanwhile. A 1-CPU case shares its node with a neighbour whose measurement a second set-up would disturb: none.
    Never for a GPU case (every launch's set-up would hold the device's memory at once) nor for the vLLM engine
    (each engine reserves host memory for its KV cache)."""
    r = case.resources
    if (not release.execution.overlap_setup or r.gpus or r.nodes > 1 or case.launches < 2 or int(r.cpus) < 2
            or (case.kind == "infer" and case.params.get("engine") == "vllm")):
        return 1
    return min(case.launches, 2 * int(r.cpus))


def _image(release: ReleaseManifest, name: str | None) -> str | None:
    """A case's image as the case records it: None for the release's own (named or not)."""
    return None if name in (None, release.release.name) else name


def devices_per_node(resources: Resources) -> int:
    """Processes the training workload starts on each node: resources.gpus is the case's total
    over its nodes (the Ray fan-out divides it by nodes the same way), so gpus 16 on 2 nodes
    is 8 per node, 16 ranks in all. At least 1 (a CPU case runs one process)."""
    if not resources.gpus:
        return 1
    return max(1, int(resources.gpus / max(1, resources.nodes)))


def _train_case(release: ReleaseManifest, model: TrainModel, variant: TrainVariant, timeout: int) -> Case:
    assert release.training is not None
    settings: dict[str, Any] = {}
    env: dict[str, str] = {}
    ds_config: dict[str, Any] = {}
    resources = Resources()
    for layer in (release.training.defaults, model.settings):
        settings.update(layer.model_dump(exclude_none=True, exclude={"env", "deepspeed_config", "resources",
                                                                     "peak_flops_source"}))
        env.update(layer.env)
        if layer.deepspeed_config:
            ds_config = deep_merge(ds_config, layer.deepspeed_config)
        if layer.resources is not None:
            resources = layer.resources
    env.update(variant.env)
    params: dict[str, Any] = {"model": model.preset or model.name, **settings}
    if model.config_path:
        params["model_config_path"] = model.config_path
    params["compile"] = variant.compile
    params["activation_checkpointing"] = variant.activation_checkpointing
    if variant.zero_stage is not None:
        params["zero_stage"] = variant.zero_stage
    if ds_config:
        params["deepspeed_config"] = ds_config
    params["devices"] = devices_per_node(resources)
    params["nodes"] = resources.nodes
    return Case.build(train_case_id(model.name, variant.name), "train", model.name, variant.name,
                      params, env, resources, timeout, launches=release.execution.launches_for("train"))
