"""Every CLI command's failure paths and the exit code each must end with (the README's table).

Run in-process with typer's CliRunner: OFFLINE rows by the unit tests, NETWORK rows (a refused connection to
a loopback port, a database that does not answer) by the integration tests.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import socket
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qualify.cli import app
from qualify.errors import ExitCode
from support.gate import manifest_text, seed_run
from support.paths import REPO

BAD, FAIL, INFRA = ExitCode.BAD_INPUT, ExitCode.FAIL, ExitCode.INFRA


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


@functools.cache
def _template() -> tuple[Path, int]:
    """A migrated database with one unjudged run, and a key pair, made once per test process: migrating and
    seeding took 0.13-0.16 s, once for each of the 43 rows (make_env copies them)."""
    folder = Path(tempfile.mkdtemp(prefix="qualify-cli-failures-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    from qualify.store.engine import open_database

    engine, sessions = open_database(f"sqlite:///{folder / 'q.db'}")
    with sessions() as s:
        unjudged = seed_run(s, manifest_text(), digest="sha256:" + "2" * 64).id
        s.commit()
    engine.dispose()  # the last connection closed: the file holds every row (no write-ahead log left beside it)
    from support.attest import key_pair

    key_pair(folder / "keys")
    return folder, unjudged


def make_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A database with one unjudged run, a bad manifest, and addresses where nothing answers: each test's own
    copy of the template, so that a command that writes changes nothing another test sees."""
    template, unjudged = _template()
    shutil.copyfile(template / "q.db", tmp_path / "q.db")
    shutil.copytree(template / "keys", tmp_path / "keys")
    db = f"sqlite:///{tmp_path / 'q.db'}"
    monkeypatch.setenv("QUALIFY_DATABASE_URL", db)
    monkeypatch.setenv("QUALIFY_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("QUALIFY_SERVICE_TOKEN", raising=False)  # `serve --host 0.0.0.0` must refuse, not start
    for var in ("QUALIFY_ATTEST_KEY", "QUALIFY_ATTEST_KEY_FILE"):  # `attest` without a key must refuse
        monkeypatch.delenv(var, raising=False)
    bad = tmp_path / "bad.yaml"
    bad.write_text("release: {name: x}\n")
    good = tmp_path / "good.yaml"
    good.write_text(manifest_text(build={"builder": "local"}, training=None, inference=None,
                                  custom_cases=[{"name": "s", "kind": "synthetic",
                                                 "params": {"samples": {"tokens_per_s": [1.0]}}}],
                                  gate={"regression": {"min_samples": 3}}))
    (tmp_path / "unmigrated.db").touch()
    pub = tmp_path / "keys" / "qualify.pub"
    return {"db": db, "bad": str(bad), "pub": str(pub), "good": str(good), "manifest": str(REPO / "releases" / "cpu-smoke.yaml"),
            "unmigrated": f"sqlite:///{tmp_path / 'unmigrated.db'}",
            "down": f"postgresql://postgres@127.0.0.1:{closed_port()}/none", "unjudged": str(unjudged),
            "port": str(closed_port())}


# (argv with {placeholders}, expected exit code, text the one-line message must contain)
FAILURES = [  # OFFLINE + NETWORK
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
    (["plan", "{manifest}", "--nodes", "1", "--gpus-per-node", "0", "--cpus-per-node", "0.5"], BAD,
     "cannot be placed"),
    (["plan", "{manifest}", "--nodes", "0", "--cpus-per-node", "8"], BAD, "--nodes"),
    (["calibrate", "{bad}"], BAD, "bad.yaml"),
    (["calibrate", "{good}", "--runs", "2"], BAD, "--runs"),
    (["calibrate", "{good}", "--slowdown", "1.5"], BAD, "--slowdown"),
    (["calibrate", "{good}", "--case", "nope/*"], BAD, "matches no"),
    (["serve", "--host", "0.0.0.0"], BAD, "not loopback"),
    (["serve", "--enforce", "maybe"], BAD, "off, revert, delete"),
    (["serve", "--db", "{down}"], INFRA, "cannot connect"),
    (["attest", "{unjudged}"], BAD, "no signing key configured"),
    (["verify", "x/y:1", "--key", "/no/such.pub"], BAD, "--key /no/such.pub"),
    (["verify", "x/y:1", "--key", "{bad}"], BAD, "not a PEM public key"),
    (["verify", "x/y@sha256:" + "e" * 64, "--key", "{pub}", "--max-age", "soon"], BAD, "--max-age 'soon'"),
    (["verify", "127.0.0.1:{port}/x/y:1", "--key", "{pub}", "--insecure-registry", "127.0.0.1:{port}"], INFRA,
     "unreachable"),
    (["gate", "check", "x/y:1", "--attestation"], BAD, "go together"),
]


NETWORK = [row for row in FAILURES if any("{down}" in a or "{port}" in a for a in row[0])]
OFFLINE = [row for row in FAILURES if row not in NETWORK]


def row_id(row: tuple[list[str], ExitCode, str]) -> str:
    return " ".join(row[0][:3])


def check_failure(env: dict[str, str], argv: list[str], code: ExitCode, text: str) -> None:
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
