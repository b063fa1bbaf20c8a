"""Files under one data directory are keyed by the database they belong to (issue 25): two databases' run 1
reports never overwrite each other, one database named by two URLs keeps one folder, and spool file names are
injective."""

from __future__ import annotations

import os
from pathlib import Path

from support.cli import run_cli
from support.reports import seed_release_line

from qualify.execution import spool
from qualify.store.engine import open_database
from qualify.store.identity import database_data_dir


def test_two_databases_sharing_a_data_dir_keep_their_own_reports(tmp_path: Path) -> None:
    data = tmp_path / "data"
    reports = {}
    for name in ("a", "b"):
        url = f"sqlite:///{tmp_path / name}.db"
        engine, sessions = open_database(url)
        seed_release_line(sessions)
        engine.dispose()
        out = run_cli("report", "1", "--db", url, env={"QUALIFY_DATA_DIR": str(data)})
        assert out.returncode == 0, out.stdout + out.stderr
        reports[name] = Path(out.stdout.strip().rsplit(": ", 1)[1])
    assert reports["a"] != reports["b"] and reports["a"].name == reports["b"].name == "run-1.html"
    assert reports["a"].exists() and reports["b"].exists()
    # the same database through another URL (a relative path): the same folder
    engine, sessions = open_database(f"sqlite:///{tmp_path / 'a.db'}")
    alias_engine, alias = open_database(f"sqlite:///{os.path.relpath(tmp_path / 'a.db')}?timeout=30")
    try:
        assert database_data_dir(data, sessions) == database_data_dir(data, alias) == reports["a"].parents[1]
    finally:
        engine.dispose()
        alias_engine.dispose()


def test_spool_file_names_are_injective(tmp_path: Path) -> None:
    ids = ["a+b", "a_b", "a/b", "a b", "a%2Bb", "A+b", ".hidden", "x" * 300, "x" * 301]
    for k, case_id in enumerate(ids):
        spool.write(tmp_path, 1, spool.SpooledResult(case_id, {"k": k}, 1, None, None, None, {}))
    found = {result.case_id: result.doc["k"] for _, result in spool.pending(tmp_path, 1)}
    assert found == {case_id: k for k, case_id in enumerate(ids)}
