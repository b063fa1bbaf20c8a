"""Files under the data directory belong to one database: <data dir>/db-<uuid>/ (reports, spool, build logs).

The key is the UUID stored in the database itself (table database_identity, made by migration 0004), not its
URL: two URLs naming one database (an alias, another host name, new credentials) share the folder, and two
databases never do, even when one data directory serves both.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from qualify.store.models import DatabaseIdentity


def database_uuid(session: Session) -> str:
    value = session.scalar(select(DatabaseIdentity.uuid).where(DatabaseIdentity.id == 1))
    assert value, "database_identity has no row: the schema was not made by qualify's migrations"
    return value


def database_data_dir(data_dir: Path, sessions: sessionmaker[Session]) -> Path:
    """This database's own folder under the data directory."""
    with sessions() as session:
        return Path(data_dir) / f"db-{database_uuid(session)}"
