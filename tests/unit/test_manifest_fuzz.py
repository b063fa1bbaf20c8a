"""Property: no mutation of a manifest makes `qualify validate` crash; it exits 0 or 2, never a traceback."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from qualify.cli import app

REPO = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load((REPO / "releases" / "training-xpu-pytorch-25.05.yaml").read_text())
runner = CliRunner()

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, prefix + (i,))
    return out


PATHS = [p for p in _paths(BASE) if p]


def _mutate(data: Any, path: tuple, action: str, value: Any) -> Any:
    data = copy.deepcopy(data)
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    key = path[-1]
    if action == "replace":
        parent[key] = value
    elif action == "delete":
        del parent[key]
    elif action == "add" and isinstance(parent, dict):
        parent[f"{key}_x"] = value
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), action=st.sampled_from(["replace", "delete", "add"]), value=scalars)
def test_mutated_manifest_never_crashes(tmp_path_factory, path: tuple, action: str, value: Any) -> None:
    mutated = _mutate(BASE, path, action, value)
    target = tmp_path_factory.mktemp("m") / "m.yaml"
    target.write_text(yaml.safe_dump(mutated))
    result = runner.invoke(app, ["validate", str(target)])
    assert result.exit_code in (0, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert str(target) in result.output


# Hostile YAML text, spliced into a real manifest at a random line: anchors and aliases,
# complex keys, tags, nesting, scalars that look like dates or huge numbers, control bytes.
BASE_LINES = (REPO / "releases" / "training-xpu-pytorch-25.05.yaml").read_text().splitlines()
YAML_BITS = st.sampled_from([
    "&a ", "*a", "? ", ": ", "- ", "[", "]", "{", "}", ", ", "<<: ", "!!set ", "!!binary ", "!!timestamp ",
    "!!python/object:os.system ", "!custom ",
    "!!int ", "!!float ", "!!bool ", "!!str ", "!!map ", "!!seq ", "!!omap ", "!!pairs ", "!!null ", "2025-13-45", "2025-02-29", "9" * 5000, "1e400", ".nan", "0x1F",
    "true", "~", "'", '"', "#", "\t", "\n", "  ", "    ", "é", "\x00", "\ufeff", "%YAML 1.1\n", "---\n", "...\n",
    "count: ", "case_timeout_s: ", "expected: ", "preset: ", "model: ",
])
snippets = st.lists(st.one_of(YAML_BITS, st.text(max_size=4)), max_size=24).map("".join)


@settings(max_examples=300, deadline=None)
@given(line=st.integers(0, len(BASE_LINES)), snippet=snippets)
def test_spliced_yaml_never_crashes(line: int, snippet: str) -> None:
    from qualify.manifest.load import LIMITS, ManifestError, load_manifest_text

    text = "\n".join(BASE_LINES[:line] + [snippet] + BASE_LINES[line:]) + "\n"
    try:
        load_manifest_text(text, "m.yaml", check_expiry=False)
    except ManifestError as exc:
        assert exc.problems and all(p.file == "m.yaml" for p in exc.problems)
        assert len(exc.problems) <= LIMITS.max_problems + 1


def test_a_set_tag_spliced_into_a_mapping_is_refused_cleanly() -> None:
    """Found by the fuzz above (`count: !!set ` at line 40): PyYAML's set constructor crashed with a TypeError."""
    from qualify.manifest.load import ManifestError, load_manifest_text

    text = "\n".join(BASE_LINES[:40] + ["count: !!set "] + BASE_LINES[40:]) + "\n"
    with pytest.raises(ManifestError) as info:
        load_manifest_text(text, "m.yaml", check_expiry=False)
    assert info.value.problems[0].file == "m.yaml"
