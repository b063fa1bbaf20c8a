"""Engine set-up for SQLite (default) and PostgreSQL, and schema migration."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from qualify.settings import redact_url
from qualify.errors import InfraError

# Shipped as package data, so an installed (non-editable) qualify can migrate its database.
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


class DatabaseError(InfraError):
    """The database cannot be reached or is not at the expected schema."""


def make_engine(url: str, busy_timeout_s: float = 30.0) -> Engine:
    """busy_timeout_s: how long a SQLite statement waits for another writer's lock before it fails
    (the driver then retries the write: qualify.execution.spool.with_retries)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": busy_timeout_s})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            # WAL lets readers (CI `gate check`) run beside the writing driver; foreign keys
            # are off by default in SQLite.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
        url = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return create_engine(url, pool_pre_ping=True)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    try:
        command.upgrade(alembic_config(url), revision)
    except Exception as exc:  # noqa: BLE001 - reported with the (redacted) URL
        raise DatabaseError(f"cannot migrate {redact_url(url)}: {type(exc).__name__}: {exc}") from exc


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    assert head is not None, f"no migrations in {MIGRATIONS_DIR}"
    return head


def open_database(url: str, migrate: bool = True) -> tuple[Engine, sessionmaker[Session]]:
    """Connect, migrate to head when asked (idempotent), and return a session factory.

    Without migrate (read-only commands) the schema is checked, never changed: a database that is
    not at the head revision is refused with what to run.
    """
    if migrate:
        upgrade(url)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            if "runs" not in inspect(conn).get_table_names():
                raise DatabaseError(f"{redact_url(url)} has no qualify schema: run `qualify db upgrade`")
            if not migrate:
                from alembic.runtime.migration import MigrationContext

                current = MigrationContext.configure(conn).get_current_revision()
                if current != head_revision():
                    raise DatabaseError(f"{redact_url(url)} is at schema revision {current}, this qualify needs "
                                        f"{head_revision()}: run `qualify db upgrade`")
    except DatabaseError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise DatabaseError(f"cannot connect to {redact_url(url)}: {type(exc).__name__}: {exc}") from exc
    return engine, session_factory(engine)
