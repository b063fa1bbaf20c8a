"""The read-only schema check compares with a constant (no alembic import on every command): it must be alembic's
head, so a new migration cannot leave it behind."""

from __future__ import annotations

from qualify.store.engine import SCHEMA_HEAD, head_revision


def test_the_schema_head_constant_is_the_newest_migration() -> None:
    assert SCHEMA_HEAD == head_revision()
