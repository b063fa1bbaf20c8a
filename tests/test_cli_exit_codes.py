"""Every CLI command's failure paths end with the exit code the README promises (qualify.errors.ExitCode),
printed as one line, never a traceback. In-process (typer's CliRunner): no subprocess, no network."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qualify.cli import app
from qualify.errors import BadInput, ExitCode, InfraError, QualifyError, Rejected
from test_gate_support import manifest_text, seed_run

REPO = Path(__file__).resolve().parents[1]
BAD, FAIL, INFRA = ExitCode.BAD_INPUT, ExitCode.FAIL, ExitCode.INFRA


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    monkeypatch.setenv("QUALIFY_DATABASE_URL", db)
    monkeypatch.setenv("QUALIFY_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("QUALIFY_SERVICE_TOKEN", raising=False)  # `serve --host 0.0.0.0` must refuse, not start
    bad = tmp_path / "bad.yaml"
    bad.write_text("release: {name: x}\n")
    (tmp_path / "unmigrated.db").touch()
    from qualify.store.engine import open_database

    _, sessions = open_database(db)
    with sessions() as s:
        unjudged = seed_run(s, manifest_text(), digest="sha256:" + "2" * 64).id
        s.commit()
    return {"db": db, "bad": str(bad), "unmigrated": f"sqlite:///{tmp_path / 'unmigrated.db'}",
            "down": f"postgresql://postgres@127.0.0.1:{closed_port()}/none", "unjudged": str(unjudged),
            "port": str(closed_port())}


# (argv with {placeholders}, expected exit code, text the one-line message must contain)
FAILURES = [
    (["validate", "{bad}"], BAD, "bad.yaml"),
    (["validate", "/no/such/manifest.yaml"], BAD, "manifest.yaml"),
    (["cases", "{bad}"], BAD, "bad.yaml"),
    (["run", "{bad}"], BAD, "bad.yaml"),
    (["db", "upgrade", "--db", "{down}"], INFRA, "cannot migrate"),
    (["runs", "list", "--db", "{unmigrated}"], INFRA, "qualify db upgrade"),
    (["runs", "list", "--db", "{down}"], INFRA, "cannot connect"),
    (["runs", "show", "424242"], BAD, "no run 424242"),
    (["gate", "evaluate", "424242"], BAD, "no run 424242"),
    (["gate", "evaluate", "1", "--today", "June"], BAD, "not a date"),
    (["gate", "show", "424242"], BAD, "no run 424242"),
    (["gate", "check", "Not/A Ref"], BAD, "not a valid image reference"),
    (["gate", "check", "127.0.0.1:{port}/x/y:1", "--insecure-registry", "127.0.0.1:{port}"], INFRA, "unreachable"),
    (["gate", "check", "x/y@sha256:" + "e" * 64], FAIL, "NO DECISION"),
    (["gate", "check", "x/y@sha256:" + "e" * 64, "--db", "{down}"], INFRA, "cannot connect"),
    (["runs", "abort", "424242", "--reason", "stuck"], BAD, "no run 424242"),
    (["runs", "abort", "{unjudged}", "--reason", "stuck"], BAD, "already passed"),
    (["runs", "abort", "{unjudged}", "--reason", " "], BAD, "must say why"),
    (["promote", "424242"], BAD, "no run 424242"),
    (["promote", "{unjudged}", "--force"], BAD, "--reason"),
    (["promote", "{unjudged}"], FAIL, "refused"),
    (["report", "424242"], BAD, "no run 424242"),
    (["report", "1", "--db", "{down}"], INFRA, "cannot connect"),
    (["compare", "9.9", "1.1"], BAD, "no release is tagged '9.9'"),
    (["compare", "run:x", "1.1"], BAD, "run:<number>"),
    (["compare", "run:424242", "1.1"], BAD, "no run 424242"),
    (["history", "train/nope/base"], BAD, "no result for case"),
    (["history", "train/tiny/base", "--metric", "furlongs"], BAD, "unknown metric"),
    (["serve", "--host", "0.0.0.0"], BAD, "not loopback"),
    (["serve", "--enforce", "maybe"], BAD, "off, revert, delete"),
    (["serve", "--db", "{down}"], INFRA, "cannot connect"),
]


@pytest.mark.parametrize("argv,code,text", FAILURES, ids=[" ".join(a[:3]) for a, _, _ in FAILURES])
def test_failure_paths_exit_with_the_documented_code(env: dict[str, str], argv: list[str], code: ExitCode,
                                                     text: str) -> None:
    result = CliRunner().invoke(app, [a.format(**env) for a in argv])
    output = result.output
    assert result.exit_code == code, output
    assert text in output, output
    assert "Traceback" not in output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), output


def _commands(group, prefix=()):  # type: ignore[no-untyped-def]
    import typer.main

    click_group = typer.main.get_command(group) if not hasattr(group, "commands") else group
    for name, command in click_group.commands.items():
        if hasattr(command, "commands"):
            yield from _commands(command, (*prefix, name))
        else:
            yield " ".join((*prefix, name))


def test_every_command_has_its_failure_paths_walked() -> None:
    walked = {" ".join(a for a in argv if not a.startswith(("{", "-", "/")) and "/" not in a
                       and not a.isdigit())[:40] for argv, _, _ in FAILURES}
    for command in _commands(app):
        assert any(w.startswith(command) for w in walked), f"no failure path of `qualify {command}` is tested"


def test_error_classes_carry_their_exit_codes() -> None:
    assert (BadInput.exit_code, Rejected.exit_code, InfraError.exit_code) == (BAD, FAIL, INFRA)
    from qualify.build import BuilderUnavailable, BuildError, BuildInputError
    from qualify.manifest_load import ManifestError
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
