"""The lean `gate check` (issue 27: CI's question after every build in about a tenth of a second): the same answer
as the full command, word for word and exit code for exit code, on SQLite and PostgreSQL; and every case it does
not answer is handed to the full command, never answered differently."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run_cli
from support.gate import good_doc, manifest_text, seed_run
from support.paths import REPO

from qualify.cli.lean_check import answer
from qualify.gate.judging import evaluate_and_commit
from qualify.manifest.cases import expand
from qualify.manifest.load import load_manifest_text

REPOSITORY = "127.0.0.1:5000/qualify/demo"
FIRST = {"previous_tag": None, "repository": REPOSITORY}
TARGET = "127.0.0.1:5000/pub/demo:1.1"


def full(*args: str):
    from typer.testing import CliRunner

    from qualify.cli import app

    return CliRunner().invoke(app, ["gate", "check", *args])


def lean(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int | None, str]:
    capsys.readouterr()
    code = answer(list(args))
    return code, capsys.readouterr().out


def _seed(sessions, digest: str, *, broken: bool = False, waiver: bool = False, further: dict | None = None,
          **release: str | None) -> int:
    gate_extra = {}
    if waiver:
        expires = (dt.date.today() + dt.timedelta(days=7)).isoformat()
        gate_extra = {"waivers": [{"id": "KI-1", "cases": "infer/*", "check": "probe:prefix_cache",
                                   "reason": "a known issue :x: of the note", "expires": expires}]}
    extra = {}
    if further:
        extra["images"] = [{"name": "serving", "repository": f"{REPOSITORY}-serving",
                            "build": {"builder": "buildah", "containerfile": "serving/Containerfile"}}]
    text = manifest_text(release_extra={**FIRST, **release}, gate_extra=gate_extra,
                         promotion={"targets": [{"name": "public", "reference": TARGET}], "insecure_registries": []},
                         **extra)
    docs = {c.case_id: good_doc(c) for c in expand(load_manifest_text(text, check_expiry=False).release)}
    if broken:
        docs["infer/tq/w8a8"]["probes"]["prefix_cache"] = {"status": "failed", "detail": "garbled"}
    with sessions() as s:
        run_id = seed_run(s, text, digest=digest, docs=docs, further=further).id
        s.commit()
    evaluate_and_commit(sessions, run_id)
    return run_id


def test_the_lean_answer_is_the_full_commands_answer(db_url, sessions, capsys) -> None:
    passed, failed, serving = "sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "3" * 64
    _seed(sessions, passed, waiver=True, broken=True, further={"serving": serving})  # PASS under a waiver
    _seed(sessions, failed, waiver=True)  # PASS first ...
    _seed(sessions, failed, broken=True)  # ... then a FAIL of the same digest overrides it
    asks = [
        [f"{REPOSITORY}@{passed}"], [f"{REPOSITORY}@{passed}", "--json"],
        [f"127.0.0.1:5000/pub/demo@{passed}"],  # a promotion target: the stored manifest is read
        [f"evil.example.com/x/y@{passed}"],  # not where it was qualified
        [f"{REPOSITORY}@{failed}"], [f"{REPOSITORY}@{failed}", "--json"],
        [f"{REPOSITORY}-serving@{serving}"], [f"{REPOSITORY}@{serving}"],  # a further image, in its own repository only
        [f"{REPOSITORY}@sha256:{'9' * 64}"], [f"{REPOSITORY}@sha256:{'9' * 64}", "--json"],  # never judged
        [f"{REPOSITORY}@{passed}", "--release", "demo"], [f"{REPOSITORY}@{passed}", "--release=other"],
        [f"{REPOSITORY}@{passed}", "--policy", "0" * 12], ["--json", f"{REPOSITORY}@{failed}", "--release", "demo"],
    ]
    answered = 0
    for ask in asks:
        args = [*ask, "--db", db_url]
        code, out = lean(capsys, *args)
        reference = full(*args)
        assert code is not None, ask  # the lean path answered it ...
        assert (code, out) == (reference.exit_code, reference.stdout), ask  # ... as the full command does
        answered += 1
    assert answered == len(asks)
    code, out = lean(capsys, f"{REPOSITORY}@{passed}", "--db", db_url)
    assert code == 0 and out.startswith("PASS:")
    code, out = lean(capsys, f"{REPOSITORY}@{failed}", "--db", db_url)
    assert code == 1 and out.startswith("FAIL:") and "overridden" in out and "probe:prefix_cache" in out


def test_what_the_lean_path_does_not_answer_goes_to_the_full_command(db_url, sessions, capsys, tmp_path) -> None:
    digest = "sha256:" + "4" * 64
    _seed(sessions, digest)
    ref = f"{REPOSITORY}@{digest}"
    handed_on = [
        [f"{REPOSITORY}:1.1", "--db", db_url],  # a tag: the registry says what it points to now
        [f"{REPOSITORY}:1.1@{digest}", "--db", db_url],  # a tag and a digest: the tag must be resolved
        [ref, "--db", db_url, "--attestation", "--key", "k.pem"],
        [ref, "--db", db_url, "--insecure-registry", "h:1"], [ref, "--help"], [ref, "--db"], [ref, ref],
        [ref, "--db", db_url, "--db", db_url], [ref, "--frobnicate"], ["Not/A Ref", "--db", db_url], [],
        [ref, "--db", f"sqlite:///{tmp_path / 'none.db'}"],  # no such file: the full command's message
        [ref, "--db", "mysql://x/y"], [ref, "--db", "sqlite://"],
    ]
    for args in handed_on:
        code, out = lean(capsys, *args)
        assert (code, out) == (None, ""), args


def test_a_database_at_another_schema_revision_is_left_to_the_full_command(tmp_path, capsys) -> None:
    import sqlite3

    from qualify.store.engine import upgrade

    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url)
    with sqlite3.connect(tmp_path / "old.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0001'")
    args = [f"{REPOSITORY}@sha256:{'5' * 64}", "--db", url]
    assert lean(capsys, *args) == (None, "")
    reference = full(*args)
    assert reference.exit_code == 3 and "schema revision 0001" in reference.output


def test_the_console_script_answers_a_check_without_sqlalchemy_or_typer(db_url, sessions) -> None:
    digest = "sha256:" + "6" * 64
    _seed(sessions, digest)
    heavy = ["sqlalchemy", "typer", "rich", "click", "qualify.store.models", "qualify.cli.commands"]
    code = ("import sys, runpy\n"
            f"sys.argv = ['qualify', 'gate', 'check', {REPOSITORY + '@' + digest!r}, '--db', {db_url!r}]\n"
            "try:\n    runpy.run_module('qualify', run_name='__main__')\nexcept SystemExit as exc:\n    code = exc.code\n"
            f"print('LOADED', sorted(m for m in {heavy!r} if m in sys.modules), 'EXIT', code, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(Path(REPO) / "src")})
    assert "LOADED [] EXIT 0" in out.stderr, out.stdout + out.stderr[-3000:]
    assert out.stdout.startswith("PASS:")
    # The real entry point, as CI calls it: same answer; and an error is still the full command's.
    assert run_cli("gate", "check", f"{REPOSITORY}@{digest}", "--db", db_url).stdout == out.stdout
    broken = run_cli("gate", "check", f"{REPOSITORY}@{digest}", "--db", "sqlite:///" + str(REPO / "no" / "such.db"))
    assert broken.returncode == 3 and "no results database" in broken.stderr and "Traceback" not in broken.stderr
