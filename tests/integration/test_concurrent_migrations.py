"""Two runs that open a fresh database together (a Prefect worker's deployment runs did) both migrate it: the
migrations are serialised (a lock file beside a SQLite database, an advisory lock on PostgreSQL), so every one
succeeds and the schema is created once. Real processes, real databases."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support.paths import REPO

PARALLEL = 4


def _upgrade_together(url: str) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen([sys.executable, "-m", "qualify", "db", "upgrade", "--db", url], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(PARALLEL)]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return out


def test_fresh_sqlite_database_migrated_by_several_processes_at_once(tmp_path: Path) -> None:
    results = _upgrade_together(f"sqlite:///{tmp_path / 'q.db'}")
    assert all(r.returncode == 0 for r in results), [r.stderr[-1500:] for r in results if r.returncode]


@pytest.mark.postgres
def test_fresh_postgres_database_migrated_by_several_processes_at_once() -> None:
    psycopg = pytest.importorskip("psycopg")
    admin = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
    name = f"qualify_mig_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL does not answer on 127.0.0.1:5432: {exc}")
    try:
        results = _upgrade_together(f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}")
        assert all(r.returncode == 0 for r in results), [r.stderr[-1500:] for r in results if r.returncode]
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
