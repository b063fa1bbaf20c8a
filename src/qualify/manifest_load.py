"""Load a manifest file and turn every problem into one precise line.

A problem names the file, the field path (``inference.models[1].schemes[0]``)
and what is wrong; callers print them and exit 2. No traceback reaches a user.
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from qualify import metrics
from qualify.errors import BadInput
from qualify.imageref import InvalidReference, parse_reference
from qualify.manifest import (
    DEEPSEEK_R1_MAX_MODEL_LEN,
    ENGINE_SCHEMES,
    WAIVER_MAX_MODEL_LEN,
    InferModel,
    InferScheme,
    InferSettings,
    PREQUANTIZED_SCHEMES,
    Release,
)


@dataclass(frozen=True)
class Problem:
    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field or '(top level)'}: {self.message}"


class ManifestError(BadInput):
    """The manifest is not valid; one Problem (file, field path, message) per line."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems

    @property
    def lines(self) -> list[str]:
        return [str(p) for p in self.problems]


@dataclass(frozen=True)
class LoadedManifest:
    path: Path
    release: Release
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def policy_sha256(self) -> str:
        return policy_sha256(self.release)


def policy_sha256(release: Release) -> str:
    """Hash of the gate policy alone: a decision records which policy it applied."""
    import json

    canonical = json.dumps(release.gate.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_manifest(path: str | Path, today: dt.date | None = None) -> LoadedManifest:
    """Read, parse and validate a manifest; raise ManifestError with every problem found."""
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError([Problem(name, "", f"cannot read file: {exc.strerror or exc}")]) from None
    except UnicodeDecodeError:
        raise ManifestError([Problem(name, "", "file is not UTF-8 text")]) from None
    return load_manifest_text(text, name, today=today, path=path)


def load_manifest_text(text: str, name: str = "<manifest>", today: dt.date | None = None,
                       path: Path | None = None, check_expiry: bool = True) -> LoadedManifest:
    """Validate manifest text (e.g. the copy stored with a run). check_expiry=False re-reads
    a stored manifest whose waivers may have expired since (the gate then treats them as expired)."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ManifestError([Problem(name, where, f"YAML syntax error: {problem}")]) from None
    if not isinstance(data, dict):
        raise ManifestError([Problem(name, "", "the manifest must be a YAML mapping")])
    try:
        release = Release.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(_pydantic_problems(name, exc)) from None
    problems = semantic_problems(release, name, today or dt.date.today(), check_expiry=check_expiry)
    if problems:
        raise ManifestError(problems)
    return LoadedManifest(path=path or Path(name), release=release, text=text)


# --------------------------------------------------------------------------- pydantic errors


def format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _field_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    # Union members add tags like "literal['none','all']" or "int" to the location.
    return tuple(p for p in loc if isinstance(p, int) or ("[" not in p and p not in
                 {"int", "float", "str", "bool", "list", "dict", "date"}))


def _pydantic_problems(file: str, exc: ValidationError) -> list[Problem]:
    merged: dict[str, list[str]] = {}
    for err in exc.errors(include_url=False):
        loc = _field_loc(tuple(err["loc"]))
        if err["type"] == "extra_forbidden":
            key = loc[-1] if loc else "?"
            allowed = _allowed_keys(loc[:-1])
            hint = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
            msg = f"unknown key {key!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
            if allowed and not hint:
                msg += f"; allowed: {', '.join(sorted(allowed))}"
        else:
            msg = err["msg"].removeprefix("Value error, ")
            value = err.get("input")
            if isinstance(value, (str, int, float, bool)) and err["type"] not in ("missing",):
                msg += f" (got {value!r})"
        merged.setdefault(format_loc(loc), [])
        if msg not in merged[format_loc(loc)]:
            merged[format_loc(loc)].append(msg)
    return [Problem(file, path, "; or ".join(msgs)) for path, msgs in merged.items()]


def _unwrap(annotation: Any) -> Any:
    """The model class inside Optional[...], list[...], dict[..., ...], Annotated[...]."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list, dict, tuple):
        for arg in typing.get_args(annotation):
            found = _unwrap(arg)
            if isinstance(found, type) and issubclass(found, BaseModel):
                return found
        return None
    return annotation


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    cls: Any = Release
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            return []
        field = cls.model_fields.get(part) or next(
            (f for f in cls.model_fields.values() if f.alias == part), None)
        if field is None:
            return []
        cls = _unwrap(field.annotation)
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return [f.alias or n for n, f in cls.model_fields.items()]
    return []


# --------------------------------------------------------------------------- cross-field rules


def merged_infer_settings(release: Release, model: InferModel, scheme: InferScheme) -> dict[str, Any]:
    """defaults < model < scheme; engine_args and env merge key by key."""
    layers: list[InferSettings] = [release.inference.defaults, model.settings, scheme.settings]  # type: ignore[union-attr]
    merged: dict[str, Any] = {}
    engine_args: dict[str, Any] = {}
    env: dict[str, str] = {}
    for layer in layers:
        for key, value in layer.model_dump(exclude_none=True, exclude={"engine_args", "env"}).items():
            merged[key] = value
        engine_args.update(layer.engine_args)
        env.update(layer.env)
    merged["engine_args"] = engine_args
    merged["env"] = env
    merged.setdefault("engine", "transformers")
    return merged


def is_deepseek_r1(model: InferModel) -> bool:
    text = " ".join(filter(None, [model.family, model.name, model.model])).lower()
    return "deepseek-r1" in text or "deepseek_r1" in text


def semantic_problems(release: Release, file: str, today: dt.date, check_expiry: bool = True) -> list[Problem]:
    problems: list[Problem] = []

    def add(field: str, message: str) -> None:
        problems.append(Problem(file, field, message))

    waivers = release.gate.waivers
    for k, waiver in enumerate(waivers):
        if check_expiry and waiver.expires < today:
            add(f"gate.waivers[{k}].expires",
                f"waiver {waiver.id!r} expired on {waiver.expires.isoformat()} (today is {today.isoformat()})")

    if release.inference is not None:
        for i, model in enumerate(release.inference.models):
            for j, scheme in enumerate(model.schemes):
                where = f"inference.models[{i}].schemes[{j}]"
                settings = merged_infer_settings(release, model, scheme)
                engine = settings["engine"]
                if scheme.scheme not in ENGINE_SCHEMES[engine]:
                    add(f"{where}.scheme",
                        f"scheme {scheme.scheme!r} cannot run on engine {engine!r} "
                        f"(it runs: {', '.join(sorted(ENGINE_SCHEMES[engine]))})")
                if (model.moe and engine == "vllm" and scheme.scheme in PREQUANTIZED_SCHEMES
                        and settings["engine_args"].get("quantization") != "moe_wna16"):
                    add(f"{where}.settings.engine_args.quantization",
                        f"{scheme.scheme} on a MoE model with vLLM 0.8.5 needs quantization: moe_wna16 "
                        "(release note usage notes: --quantization moe_wna16)")
                max_len = settings["engine_args"].get("max_model_len")
                if is_deepseek_r1(model) and isinstance(max_len, int) and max_len >= DEEPSEEK_R1_MAX_MODEL_LEN:
                    case_id = f"infer/{model.name}/{scheme.scheme}"
                    if not any(w.covers(case_id, WAIVER_MAX_MODEL_LEN) and (w.expires >= today or not check_expiry)
                               for w in waivers):
                        add(f"{where}.settings.engine_args.max_model_len",
                            f"max_model_len {max_len} for DeepSeek-R1 must be below "
                            f"{DEEPSEEK_R1_MAX_MODEL_LEN} (release note known issue: OOM), "
                            f"unless a waiver with check {WAIVER_MAX_MODEL_LEN!r} covers {case_id!r}")

    variant_names = {v.name for v in release.training.variants} if release.training else set()
    for k, gain in enumerate(release.gate.variant_gains):
        for attr in ("variant", "baseline"):
            name = getattr(gain, attr)
            if name not in variant_names:
                hint = difflib.get_close_matches(name, sorted(variant_names), n=1)
                add(f"gate.variant_gains[{k}].{attr}",
                    f"no training variant named {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
        if not metrics.is_known(gain.metric):
            add(f"gate.variant_gains[{k}].metric", f"unknown metric {gain.metric!r}")
    for k, threshold in enumerate(release.gate.thresholds):
        if not metrics.is_known(threshold.metric):
            hint = difflib.get_close_matches(threshold.metric, list(metrics.METRICS), n=1)
            add(f"gate.thresholds[{k}].metric",
                f"unknown metric {threshold.metric!r}" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    for kind in release.gate.regression.metrics:
        for metric in release.gate.regression.metrics_for(kind):
            if not metrics.is_known(metric):
                add(f"gate.regression.metrics.{kind}", f"unknown metric {metric!r}")

    for k, target in enumerate(release.promotion.targets):
        for expanded in release.expanded_targets():
            if expanded.name == target.name or expanded.name.startswith(f"{target.name}-"):
                try:
                    ref = parse_reference(expanded.reference)
                    if ref.digest or not ref.tag:
                        raise InvalidReference(f"{expanded.reference!r} must end in a tag")
                except InvalidReference as exc:
                    add(f"promotion.targets[{k}]", f"target {expanded.name!r}: {exc}")
    return problems
