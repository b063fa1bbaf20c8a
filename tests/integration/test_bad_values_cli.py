"""Bad values through the real `qualify` entry point and the service (issues 24.10-24.12): exit 2 with one line
naming the value (4xx in the service), read-only commands create nothing, a closed pipe ends quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from support.cli import run_cli
from support.paths import REPO

from qualify.service import create_app
from qualify.settings import Settings

HUGE = "99999999999999999999"
DIGEST = "sha256:" + "a" * 64


def _env(tmp: Path) -> dict[str, str]:
    return {"QUALIFY_DATA_DIR": str(tmp / "data"), "QUALIFY_DATABASE_URL": ""}


def _one_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    assert run_cli("db", "upgrade", "--db", url).returncode == 0
    return url


def test_bad_values_are_exit_2_naming_the_value(tmp_path: Path, db: str) -> None:
    existing = tmp_path / "report.html"
    existing.write_text("keep me")
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump({"release": {"name": "r", "repository": "127.0.0.1:5000/q/r", "tag": "ṫäg٣",
                                                    "candidate_tag": "1-rc1", "previous_tag": "0"},
                                        "custom_cases": [{"name": "nap", "kind": "sleep"}]}, allow_unicode=True))
    cases = {
        "runs show huge": (["runs", "show", HUGE, "--db", db], HUGE),
        "gate show huge": (["gate", "show", HUGE, "--db", db], HUGE),
        "gate evaluate huge": (["gate", "evaluate", HUGE, "--db", db], HUGE),
        "promote huge": (["promote", HUGE, "--db", db], HUGE),
        "report huge": (["report", HUGE, "--db", db], HUGE),
        "compare huge": (["compare", f"run:{HUGE}", "run:1", "--db", db], HUGE),
        "report --out file": (["report", "1", "--db", db, "--out", str(existing)], str(existing)),
        "history --png dir": (["history", "sleep/nap", "--db", db, "--png", str(tmp_path)], str(tmp_path)),
        "history --png under a file": (["history", "sleep/nap", "--db", db, "--png", f"{existing}/c.png"],
                                       str(existing)),
        "--db foo": (["runs", "list", "--db", "foo"], "'foo'"),
        "--db mysql": (["runs", "list", "--db", "mysql://u@127.0.0.1/db"], "mysql"),
        "db upgrade --db mysql": (["db", "upgrade", "--db", "mysql://u@127.0.0.1/db"], "mysql"),
        "unicode tag manifest": (["validate", str(manifest)], "release.tag"),
        "unicode tag gate check": (["gate", "check", "127.0.0.1:5000/q/r:ṫäg٣", "--db", db], "ṫäg٣"),
    }
    for name, (args, named) in cases.items():
        res = run_cli(*args, env=_env(tmp_path), timeout=120)
        assert res.returncode == 2, (name, res.stdout, res.stderr)
        line = _one_line(res)
        assert named in line and "infrastructure" not in line, (name, line)
    assert existing.read_text() == "keep me"


def test_the_service_answers_bad_values_with_4xx(sessions) -> None:
    api = TestClient(create_app(Settings.load(env={}, service_token="t"), sessions))
    assert api.get(f"/v1/runs/{HUGE}").status_code == 404
    assert api.get(f"/v1/runs/-{HUGE}").status_code == 404
    assert api.get("/v1/gate", params={"ref": "127.0.0.1:5000/q/r:ṫäg٣"}).status_code == 400
    assert api.get("/v1/gate", params={"ref": f"127.0.0.1:5000/q/r@{DIGEST}"}).status_code == 404


def test_read_only_commands_create_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for args in (["runs", "list"], ["runs", "show", "1"], ["gate", "show", "1"],
                 ["gate", "check", f"127.0.0.1:5000/q/r@{DIGEST}"], ["history", "sleep/nap"],
                 ["compare", "run:1", "run:2"], ["report", "1"]):
        res = run_cli(*args, env=_env(tmp_path), timeout=120)
        assert res.returncode == 3, (args, res.stdout, res.stderr)
        assert "no results database" in _one_line(res) and "db upgrade" in res.stderr
        assert not data.exists(), (args, list(data.rglob("*")))


@pytest.mark.parametrize("args,code", [(["cases", str(REPO / "releases" / "cpu-smoke.yaml"), "--json"], 0),
                                       (["gate", "check", f"127.0.0.1:5000/q/r@{DIGEST}", "--json"], 1)])
def test_a_closed_pipe_ends_quietly_with_the_command_s_own_code(tmp_path: Path, db: str, args: list[str],
                                                                code: int) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "qualify", *args, "--db", db] if args[0] == "gate"
                            else [sys.executable, "-m", "qualify", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, **_env(tmp_path)})
    proc.stdout.close()  # the reader is gone before the command writes (`| head` that already exited)
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == code, err
    assert err.strip() == "" or ("infrastructure" not in err and "BrokenPipe" not in err), err
