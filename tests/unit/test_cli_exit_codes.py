"""Every CLI command's failure paths end with the exit code the README promises (qualify.errors.ExitCode),
printed as one line, never a traceback. In-process (typer's CliRunner); the rows that need a network
connection run in tests/integration/test_cli_exit_codes_network.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.cli_failures import (
    BAD,
    FAIL,
    FAILURES,
    INFRA,
    OFFLINE,
    _commands,
    check_failure,
    make_env,
    row_id,
)
from support.paths import REPO

from qualify.cli import app
from qualify.errors import BadInput, ExitCode, InfraError, QualifyError, Rejected


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return make_env(tmp_path, monkeypatch)


@pytest.mark.parametrize("argv,code,text", OFFLINE, ids=[row_id(r) for r in OFFLINE])
def test_failure_paths_exit_with_the_documented_code(env: dict[str, str], argv: list[str], code: ExitCode,
                                                     text: str) -> None:
    check_failure(env, argv, code, text)


def test_every_command_has_its_failure_paths_walked() -> None:
    walked = {" ".join(a for a in argv if not a.startswith(("{", "-", "/")) and "/" not in a
                       and not a.isdigit())[:40] for argv, _, _ in FAILURES}
    for command in _commands(app):
        assert any(w.startswith(command) for w in walked), f"no failure path of `qualify {command}` is tested"


def test_error_classes_carry_their_exit_codes() -> None:
    assert (BadInput.exit_code, Rejected.exit_code, InfraError.exit_code) == (BAD, FAIL, INFRA)
    from qualify.build import BuildError, BuilderUnavailable, BuildInputError
    from qualify.manifest.load import ManifestError
    from qualify.promote import PromotionError, PromotionRefused
    from qualify.registry import ImageNotFound, RegistryUnreachable
    from qualify.store.engine import DatabaseError

    expected = {ManifestError: BAD, PromotionError: BAD, ImageNotFound: BAD, BuildInputError: BAD,
                PromotionRefused: FAIL, BuildError: FAIL,
                DatabaseError: INFRA, RegistryUnreachable: INFRA, BuilderUnavailable: INFRA}
    for cls, code in expected.items():
        assert issubclass(cls, QualifyError) and cls.exit_code == code, cls


def test_readme_states_the_exit_codes_the_code_uses() -> None:
    readme = (REPO / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("Exit codes"))
    stated = {int(n): text for n, text in re.findall(r"(\d) ([a-zA-Z/ ]+?)(?:,|\.|$)", line)}
    assert set(stated) == {int(c) for c in ExitCode}, line
    assert "PASS" in stated[0] and "FAIL" in stated[1] and "input" in stated[2] and "infra" in stated[3]


@pytest.mark.parametrize("argv", [["no-such-command"], ["run", "--no-such-option", "x.yaml"], ["gate", "check"],
                                  ["runs", "show", "not-a-number"]])
def test_command_line_mistakes_are_usage_errors_not_infrastructure(argv: list[str]) -> None:
    """typer vendors click (typer._click): its UsageError was reported as an infrastructure error, exit 3."""
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, argv)
    assert result.exit_code == ExitCode.BAD_INPUT, (result.exit_code, result.output)
    assert "infrastructure error" not in result.output
