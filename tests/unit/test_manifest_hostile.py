"""Hostile manifests, loaded directly: each is refused quickly with the file and the field or the cap named,
and a bounded list of problems. The inputs are in tests/support/hostile.py; the CLI runs them, as a user
would, in tests/integration/test_manifest_hostile_cli.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.hostile import (
    FIXTURES,
    GENERATED,
    HOSTILE,
    MINIMAL,
    NAP,
    SMOKE,
    expectations,
    limits,
    many_problems,
)
from support.paths import REPO

import qualify.manifest.load as manifest_load
from qualify.manifest.load import ManifestError, load_manifest, load_manifest_text

XPU = REPO / "releases" / "training-xpu-pytorch-25.05.yaml"

# --------------------------------------------------------------------------- the loader, directly


def refusal(path: Path | str, max_s: float = 2.0) -> str:
    """Load a manifest that must be refused, quickly; every problem line, joined.

    "Quickly" is this thread's CPU time (the machine is shared: wall time measures the neighbours too); a
    generous wall-clock bound still catches a refusal that blocks (a FIFO, a device) instead of computing."""
    start, cpu_start = time.monotonic(), time.thread_time()
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert time.thread_time() - cpu_start < max_s
    assert time.monotonic() - start < max(30.0, 10 * max_s)
    problems = info.value.problems
    assert problems and all(p.file == str(path) for p in problems)
    return "\n".join(str(p) for p in problems)


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_loader_refuses_fixture(fixture: Path) -> None:
    text = refusal(fixture)
    for fragment in expectations(fixture):
        assert fragment in text, text


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_loader_refuses_generated(tmp_path: Path, name: str) -> None:
    if name in ("fifo", "dev_zero", "symlink_to_dev_zero") and not Path("/dev/zero").exists():
        pytest.skip("needs a POSIX system")
    build, expect = GENERATED[name]
    path = build(tmp_path)
    text = refusal(path, max_s=5.0)  # 10 MiB of writing and 200,000 pydantic errors included
    for fragment in expect(limits()):
        assert fragment in text, text
    assert len(text.splitlines()) <= limits().max_problems + 1


def _nested_lists(levels: int) -> str:
    # Root mapping, custom_cases list, its item, params: 4 levels before the lists.
    return (MINIMAL + "custom_cases:\n  - {name: nap, kind: sleep, params: {deep: "
            + "[" * levels + "]" * levels + "}}\n")


def test_depth_cap_boundary() -> None:
    cap = limits().max_depth
    assert load_manifest_text(_nested_lists(cap - 4), "m.yaml").release.custom_cases[0].params["deep"]
    with pytest.raises(ManifestError) as info:
        load_manifest_text(_nested_lists(cap - 3), "m.yaml")
    assert f"max_depth={cap}" in str(info.value)


def test_case_cap_boundary_and_speed() -> None:
    from qualify.manifest.cases import expand

    cap = limits().max_cases
    exact = MINIMAL + f"custom_cases:\n  - {{name: nap, kind: sleep, count: {cap}}}\n"
    assert len(expand(load_manifest_text(exact, "m.yaml").release)) == cap
    start = time.thread_time()  # this thread's CPU: a shared machine's neighbours stretch wall time, not this
    with pytest.raises(ManifestError) as info:
        load_manifest_text(exact.replace(f"count: {cap}", "count: 1000000000"), "m.yaml")
    assert time.thread_time() - start < 0.5  # refused by counting, never by building a billion cases
    assert [p.field for p in info.value.problems] == ["custom_cases[0].count"]
    assert f"1,000,000,000 cases, over the cap of {cap:,}" in str(info.value)


def test_expand_refuses_a_release_that_skipped_the_loader() -> None:
    from qualify.manifest.cases import expand
    from qualify.manifest import ReleaseManifest

    data = yaml.safe_load(MINIMAL)
    data["custom_cases"] = [{"name": "nap", "kind": "sleep", "count": 10**6}]
    release = ReleaseManifest.model_validate(data)  # pydantic alone: no semantic rules, no case cap
    start = time.thread_time()
    with pytest.raises(ManifestError, match="max_cases"):
        expand(release)
    assert time.thread_time() - start < 0.5


def test_problem_list_is_capped() -> None:
    cap = limits().max_problems
    exc = ManifestError([manifest_load.Problem("m.yaml", f"f{k}", "bad") for k in range(cap + 7)])
    assert exc.total == cap + 7
    assert len(exc.problems) == cap + 1
    assert "and 7 more problems" in str(exc.problems[-1])
    assert len(ManifestError([manifest_load.Problem("m.yaml", "f", "bad")] * cap).problems) == cap


def test_problem_count_is_exact_for_many_pydantic_errors(tmp_path: Path) -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest(many_problems(tmp_path))
    assert info.value.total == 200_000


def test_size_cap_applies_to_text_too() -> None:
    text = MINIMAL + "custom_cases:\n" + NAP + "# " + "x" * limits().max_bytes + "\n"
    with pytest.raises(ManifestError, match="max_bytes"):
        load_manifest_text(text, "stored")


def test_file_reading_keeps_read_text_newlines(tmp_path: Path) -> None:
    path = tmp_path / "crlf.yaml"
    path.write_bytes(SMOKE.read_bytes().replace(b"\n", b"\r\n"))
    assert manifest_load.read_manifest_text(path) == path.read_text()
    assert load_manifest(path).text == SMOKE.read_text()


def test_missing_file_still_reported(tmp_path: Path) -> None:
    assert "cannot read file" in refusal(tmp_path / "nope.yaml")


# --------------------------------------------------------------------------- booleans are not numbers


def _smoke() -> dict[str, Any]:
    return yaml.safe_load(SMOKE.read_text())


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    parts = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    node: Any = data
    for part in parts[:-1]:
        node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
    node[parts[-1]] = value
    return data


def _load(data: dict[str, Any]):
    return load_manifest_text(yaml.safe_dump(data, sort_keys=False), "m.yaml")


@pytest.mark.parametrize("field, shown", [
    ("execution.case_timeout_s", "execution.case_timeout_s"),
    ("execution.infra_retries", "execution.infra_retries"),
    ("build.timeout_s", "build.timeout_s"),
    ("training.defaults.zero_stage", "training.defaults.zero_stage"),
    ("training.defaults.peak_flops_per_device", "training.defaults.peak_flops_per_device"),
    ("training.defaults.resources.cpus", "training.defaults.resources.cpus"),
    ("training.variants.3.activation_checkpointing", "training.variants[3].activation_checkpointing"),
    ("training.variants.0.zero_stage", "training.variants[0].zero_stage"),
    ("inference.defaults.min_token_agreement", "inference.defaults.min_token_agreement"),
    ("inference.defaults.resources.custom", "inference.defaults.resources.custom"),
    ("gate.thresholds.0.min", "gate.thresholds[0].min"),
    ("gate.regression.max_regression", "gate.regression.max_regression"),
    ("gate.regression.min_samples", "gate.regression.min_samples"),
    ("gate.variant_gains.0.min_gain", "gate.variant_gains[0].min_gain"),
    ("gate.agreement", "gate.agreement"),
])
def test_boolean_is_not_a_number(field: str, shown: str) -> None:
    value: Any = True
    if field.endswith(("resources.custom", "gate.agreement")):
        value = {"none": False} if field == "gate.agreement" else {"ppu": True}
    with pytest.raises(ManifestError) as info:
        _load(_set(_smoke(), field, value))
    assert [p.field for p in info.value.problems] == [shown]
    assert "not a boolean" in info.value.problems[0].message


def test_custom_case_count_boolean() -> None:
    data = yaml.safe_load(MINIMAL)
    data["custom_cases"] = [{"name": "nap", "kind": "sleep", "count": True}]
    with pytest.raises(ManifestError, match=r"custom_cases\[0\].count: expected a number, not a boolean"):
        _load(data)


def test_booleans_still_accepted_where_they_belong() -> None:
    data = _smoke()
    data["training"]["variants"][0].update(compile=True)
    data["components"][0]["optional"] = True
    data["gate"]["regression"]["enabled"] = False
    data["gate"]["probes_required"] = False
    data["inference"]["defaults"]["engine_args"] = {"enforce_eager": True}  # Any: the engine's own flags
    data["training"]["defaults"]["deepspeed_config"] = {"zero_optimization": {"overlap_comm": True}}
    data["custom_cases"] = [{"name": "nap", "kind": "sleep", "params": {"fail": True}}]
    release = _load(data).release
    assert release.training.variants[0].compile is True
    # Numbers are still numbers, ints still feed floats.
    assert release.execution.case_timeout_s == 900 and release.gate.agreement["none"] == 0.99


# --------------------------------------------------------------------------- components, names


@pytest.mark.parametrize("match", ["exact", "prefix", "public", "min"])
@pytest.mark.parametrize("expected", ["", "  "])
def test_empty_expected_refused(match: str, expected: str) -> None:
    data = _smoke()
    data["components"][1].update(expected=expected, match=match)
    with pytest.raises(ManifestError) as info:
        _load(data)
    assert [p.field for p in info.value.problems] == ["components[1].expected"]
    assert "is empty" in str(info.value)


@pytest.mark.parametrize("match", ["public", "min"])
def test_version_rule_needs_a_version(match: str) -> None:
    data = _smoke()
    data["components"][1].update(expected="latest", match=match)
    with pytest.raises(ManifestError, match=f"components\\[1\\].*'latest' has no version number.*'{match}'"):
        _load(data)
    data["components"][1].update(match="prefix")
    assert _load(data).release.components[1].expected == "latest"


def test_training_name_is_the_preset_when_none_given() -> None:
    data = _smoke()
    data["training"]["models"] = [{"name": "tiny-llama"}, {"name": "tiny-lama"}]
    with pytest.raises(ManifestError) as info:
        _load(data)
    assert [p.field for p in info.value.problems] == ["training.models[1].name"]
    assert "did you mean 'tiny-llama'" in str(info.value)


def test_training_config_path_makes_any_label_valid() -> None:
    data = _smoke()
    data["training"]["models"] = [{"name": "mine", "preset": "my-label", "config_path": "/cfg/config.json"}]
    assert _load(data).release.training.models[0].preset == "my-label"


def test_inference_paths_hub_ids_and_real_models_pass() -> None:
    data = _smoke()
    model = data["inference"]["models"][0]
    model["reference_model"] = "./local-dir"
    model["schemes"][1]["model"] = "/models/Qwen3-8B-int8"
    data["inference"]["models"].append({"name": "real", "model": "qwen3-8b", "schemes": [{"scheme": "none"}]})
    data["inference"]["models"].append({"name": "hub", "model": "Qwen/Qwen3-8B", "schemes": [{"scheme": "none"}]})
    assert len(_load(data).release.inference.models) == 3


def test_inference_reference_model_checked() -> None:
    data = _smoke()
    data["inference"]["models"][0]["reference_model"] = "qwen3-9b"
    with pytest.raises(ManifestError) as info:
        _load(data)
    assert [p.field for p in info.value.problems] == ["inference.models[0].reference_model"]
    assert "did you mean 'qwen3-8b'" in str(info.value)


def test_stored_manifest_is_not_rejudged_by_todays_model_tables() -> None:
    text = (HOSTILE / "unknown_preset.yaml").read_text()
    with pytest.raises(ManifestError):
        load_manifest_text(text, "stored")
    assert load_manifest_text(text, "stored", check_expiry=False).release.training.models[0].preset == "tiny-lama"


# --------------------------------------------------------------------------- messages stay short


def test_long_values_and_keys_are_shortened() -> None:
    data = _smoke()
    data["execution"]["case_timeout_s"] = "x" * 50_000
    data["execution"]["k" * 50_000] = 1
    data["release"]["tag"] = "t" * 50_000
    with pytest.raises(ManifestError) as info:
        _load(data)
    lines = [str(p) for p in info.value.problems]
    assert len(lines) == 3 and all(len(line) <= 1000 for line in lines), [len(x) for x in lines]
