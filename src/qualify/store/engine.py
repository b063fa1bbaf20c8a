"""Engine set-up for SQLite (default) and PostgreSQL, and schema migration."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from qualify.settings import redact_url
from qualify.store.schema_head import SCHEMA_HEAD
from qualify.errors import BadInput, InfraError

# Shipped as package data, so an installed (non-editable) qualify can migrate its database.
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


class DatabaseError(InfraError):
    """The database cannot be reached or is not at the expected schema."""


BACKENDS = ("sqlite", "postgresql")


def check_url(url: str) -> URL:
    """The database URL parsed, or BadInput naming it (issue 24.10): `foo`, `mysql://...`, a driver that is
    not installed are the user's to fix, not an infrastructure failure."""
    shown = redact_url(url)
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - sqlalchemy's ArgumentError, ValueError: not a URL at all
        raise BadInput(f"database URL {shown!r} is not a URL: give sqlite:///PATH or "
                       "postgresql://USER@HOST[:PORT]/DB") from None
    if parsed.get_backend_name() not in BACKENDS:
        raise BadInput(f"database URL {shown!r}: {parsed.get_backend_name()!r} is not supported "
                       f"(sqlite:///PATH or postgresql://USER@HOST[:PORT]/DB)")
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, ""):
        raise BadInput(f"database URL {shown!r} names no file: give sqlite:///PATH")
    return parsed


def make_engine(url: str, busy_timeout_s: float = 30.0, *, create: bool = True) -> Engine:
    """busy_timeout_s: how long a SQLite statement waits for another writer's lock before it fails
    (the driver then retries the write: qualify.execution.spool.with_retries)."""
    parsed = check_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            if not create and not Path(parsed.database).is_file():
                # A read-only command never creates the file (or its folders) to find it empty (issue 24.11).
                raise DatabaseError(f"no results database at {parsed.database}: `qualify db upgrade` creates it "
                                    "(`qualify run` does too)")
            if create:
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


T = TypeVar("T")


def hot_read_engine(engine: Engine) -> Engine:
    """An engine for a service's hot, idempotent reads: each statement outside a transaction (no BEGIN and
    ROLLBACK round trips) and, on PostgreSQL, its own pool without pre-ping, which sent a `SELECT 1` before every
    checkout: half the round trips of a gate answer. A connection the server dropped is found when the statement
    fails instead, and idempotent_read runs the read again on a new one. Disposed by whoever made it."""
    if engine.dialect.name != "postgresql":  # SQLite: no ping, no server; the same pool
        return engine.execution_options(isolation_level="AUTOCOMMIT")
    return create_engine(engine.url, pool_pre_ping=False, isolation_level="AUTOCOMMIT")


def idempotent_read(engine: Engine, read: Callable[[Connection], T]) -> T:
    """read(connection), run once more on a new connection when the first one turned out dropped (a database
    restart, an idle connection a proxy cut): SQLAlchemy then invalidates the pool's older connections, so one
    retry suffices. Any other error, or a second drop, is raised."""
    try:
        with engine.connect() as conn:
            return read(conn)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
    with engine.connect() as conn:
        return read(conn)


def _first_line(exc: BaseException) -> str:
    """One line of a driver's message (psycopg's run over several, with a hint and a link)."""
    return (str(exc).strip().splitlines() or [""])[0][:300]


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["url"] = url
    return cfg


@contextlib.contextmanager
def _sqlite_migration_lock(url: str) -> Iterator[None]:
    """One migration at a time on a SQLite file: two runs (a worker's deployment runs, CI jobs) that open a fresh
    database together would both read "no revision" and both create the tables ("table ... already exists").
    A lock file beside the database serialises them; the second then finds the schema at head. (PostgreSQL
    takes an advisory lock in the migration's own transaction: migrations/env.py.)"""
    parsed = make_url(url)
    path = parsed.database
    if not parsed.drivername.startswith("sqlite") or not path or path == ":memory:" or path.startswith("file:"):
        yield
        return
    import fcntl

    lock_path = Path(path).expanduser().with_name(Path(path).name + ".migrate-lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    check_url(url)
    try:
        with _sqlite_migration_lock(url):
            command.upgrade(alembic_config(url), revision)
    except Exception as exc:  # noqa: BLE001 - reported with the (redacted) URL
        raise _cannot_migrate(url, exc) from exc


def _cannot_migrate(url: str, exc: BaseException) -> DatabaseError:
    return DatabaseError(f"cannot migrate {redact_url(url)}: {type(exc).__name__}: {_first_line(exc)}")


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    assert head is not None, f"no migrations in {MIGRATIONS_DIR}"
    return head


def _revision(conn: Connection) -> str | None:
    """The database's schema revision (alembic's table), None before the first migration."""
    if "alembic_version" not in inspect(conn).get_table_names():
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def _current_revision(url: str, engine: Engine) -> str | None:
    """The revision before a migration. A database that cannot be read cannot be migrated either: said at once, not
    after alembic has waited for the same unreachable host a second time."""
    try:
        with engine.connect() as conn:
            return _revision(conn)
    except Exception as exc:  # noqa: BLE001 - reported with the (redacted) URL
        raise _cannot_migrate(url, exc) from exc


def open_database(url: str, migrate: bool = True) -> tuple[Engine, sessionmaker[Session]]:
    """Connect, migrate to head when asked (idempotent), and return a session factory.

    Without migrate (read-only commands) the schema is checked, never changed: a database that is
    not at the head revision is refused with what to run.
    """
    check_url(url)
    try:
        engine = make_engine(url, create=migrate)
    except OSError as exc:  # only when creating: the SQLite file's folder cannot be made (a file in its path)
        if not migrate:
            raise
        raise _cannot_migrate(url, exc) from exc
    # At the head already (every run but a database's first): nothing to migrate, and alembic's import and
    # script scan (0.4-0.7 s of each `qualify run` on a 2-core machine) are skipped. Any other revision goes
    # through alembic, which migrates or says what is wrong.
    if migrate and _current_revision(url, engine) != SCHEMA_HEAD:
        upgrade(url)
    try:
        with engine.connect() as conn:
            if "runs" not in inspect(conn).get_table_names():
                raise DatabaseError(f"{redact_url(url)} has no qualify schema: run `qualify db upgrade`")
            if not migrate:
                current = _revision(conn)
                if current != SCHEMA_HEAD:
                    raise DatabaseError(f"{redact_url(url)} is at schema revision {current}, this qualify needs "
                                        f"{SCHEMA_HEAD}: run `qualify db upgrade`")
    except DatabaseError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise DatabaseError(f"cannot connect to {redact_url(url)}: {type(exc).__name__}: {_first_line(exc)}") from exc
    return engine, session_factory(engine)
