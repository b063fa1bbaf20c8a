"""What every manifest model shares: strict models (unknown keys and booleans-for-numbers are errors), the name
and engine/scheme/probe types, and the catalogs of training presets and inference model names."""

from __future__ import annotations

import functools
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from qualify.imageref import InvalidReference, parse_reference
from qualify.workloads.infer.params import ENGINES, PROBES, SCHEMES


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


def check_reference(value: str):
    try:
        return parse_reference(value)
    except InvalidReference as exc:
        raise ValueError(str(exc)) from None


def no_duplicates(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate {what} name {name!r}")
        seen.add(name)


def repository_only(value: str) -> str:
    """An image repository, without tag or digest (ValueError otherwise): a release's, or one of its images'."""
    ref = check_reference(value)
    if ref.tag or ref.digest:
        raise ValueError(f"{value!r} must be a repository without tag or digest")
    return value
