"""The newest migration's revision, for the read-only check of every command (reading it with alembic costs a CLI
call ~0.1 s; the lean `gate check` reads it without SQLAlchemy). tests/unit: equal to alembic's head, so a new
migration cannot forget it."""

SCHEMA_HEAD = "0007"
