"""The read-only schema check compares with a constant (no alembic import on every command): it must be alembic's
head, so a new migration cannot leave it behind."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import qualify.store.engine as engine_module
from qualify.store.engine import SCHEMA_HEAD, DatabaseError, head_revision, open_database


def test_the_schema_head_constant_is_the_newest_migration() -> None:
    assert SCHEMA_HEAD == head_revision()


def test_a_database_at_the_head_is_opened_without_a_migration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every `qualify run` opens its database to migrate: at the head, alembic (0.4-0.7 s) is not run at all;
    # a new database, or one behind the head, is migrated as before.
    url = f"sqlite:///{tmp_path / 'q.db'}"
    calls: list[str] = []
    real_upgrade = engine_module.upgrade
    monkeypatch.setattr(engine_module, "upgrade", lambda u: (calls.append(u), real_upgrade(u))[1])
    open_database(url)
    assert calls == [url]
    open_database(url)
    assert calls == [url], "a database at the head was migrated again"
    with sqlite3.connect(tmp_path / "q.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0006'")
    with pytest.raises(DatabaseError, match="0006"):
        open_database(url, migrate=False)
    monkeypatch.setattr(engine_module, "upgrade", lambda u: calls.append(u))
    open_database(url)
    assert calls == [url, url], "a database behind the head was not migrated"


def test_an_unreachable_database_is_still_reported_by_the_migration(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "postgresql://nobody@127.0.0.1:1/none"
    with pytest.raises(DatabaseError, match="cannot migrate"):
        open_database(url)


def test_a_sqlite_path_that_cannot_be_made_is_a_database_error(tmp_path: Path) -> None:
    # The revision is read before any migration now: a folder that cannot be made must still be the database's
    # error (exit 3 with one line), not an OSError from the engine's set-up.
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(DatabaseError, match="cannot migrate"):
        open_database(f"sqlite:///{tmp_path / 'file' / 'q.db'}")
