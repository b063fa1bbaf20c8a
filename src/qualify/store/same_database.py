"""Is the results database still the one the run opened? (issue 24.6)

A SQLite file removed during a run keeps answering through the connections already open (the inode lives on
until they close): results, decision and "PASS" would all go to a ghost and be lost. A database replaced by
another one (a restored file, a dropped and re-created PostgreSQL database) may hold a run with the same id.
So the identity is taken when the run opens -- the run row's own facts (when it started, which driver owns
it, the manifest's sha256) and, for SQLite, the file's device and inode -- and confirmed before the verdict
through a fresh connection. A mismatch is an infrastructure error; the results stay in the spool for
`qualify run --resume RUN` against the right database.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sqlalchemy import create_engine, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from qualify.errors import InfraError
from qualify.store.models import Run


class DatabaseReplaced(InfraError):
    """The results database vanished or is another one than the run opened (exit 3). Nothing more may be
    written to it: a run of the same id there is not this run."""


@dataclass(frozen=True)
class DatabaseIdentity:
    run_id: int
    row: tuple[object, ...]  # the run row's facts that a replacement would not share
    sqlite_file: str | None = None
    file_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the SQLite file


def _row_facts(run: Run) -> tuple[object, ...]:
    started = run.started_at.replace(tzinfo=None) if run.started_at is not None else None
    return (started, run.driver_host, run.driver_pid, run.manifest_sha256)


def _sqlite_file(engine: Engine) -> str | None:
    url = engine.url
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return os.path.abspath(url.database)


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def capture(sessions: sessionmaker[Session], run_id: int) -> DatabaseIdentity:
    """The identity of the database as the run sees it now (right after it opened the run)."""
    engine = sessions.kw["bind"]
    with sessions() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise DatabaseReplaced(f"run {run_id} is not in the results database it was just written to")
        row = _row_facts(run)
    path = _sqlite_file(engine)
    return DatabaseIdentity(run_id, row, path, _file_id(path) if path else None)


def confirm(sessions: sessionmaker[Session], identity: DatabaseIdentity) -> None:
    """Raise DatabaseReplaced unless the database is still the one `identity` was taken from."""
    engine: Engine = sessions.kw["bind"]
    where = engine.url.render_as_string(hide_password=True)
    resume = (f"its results stay in the spool: `qualify run --resume {identity.run_id}` against the run's "
              "database records them")
    if identity.sqlite_file is not None:
        now = _file_id(identity.sqlite_file)
        if now is None:
            raise DatabaseReplaced(f"the results database {identity.sqlite_file} vanished during run "
                                   f"{identity.run_id}; {resume}")
        if now != identity.file_id:
            raise DatabaseReplaced(f"the results database {identity.sqlite_file} was replaced during run "
                                   f"{identity.run_id}; {resume}")
    # A fresh connection: the pool's connections may still hold what was replaced.
    fresh = create_engine(engine.url, poolclass=NullPool)
    try:
        with Session(fresh) as session:
            run = session.scalar(select(Run).where(Run.id == identity.run_id))
            facts = _row_facts(run) if run is not None else None
    except SQLAlchemyError as exc:
        first = (str(exc).splitlines() or [""])[0][:200]
        raise DatabaseReplaced(f"the results database {where} cannot be read back before the verdict of run "
                               f"{identity.run_id} ({type(exc).__name__}: {first}); {resume}") from None
    finally:
        fresh.dispose()
    if facts != identity.row:
        raise DatabaseReplaced(f"the results database {where} is not the one run {identity.run_id} opened "
                               f"(its run {identity.run_id} is another run or missing); {resume}")
