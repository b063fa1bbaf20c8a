"""Alembic environment: the URL comes from the caller (qualify db upgrade) or QUALIFY_DATABASE_URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from qualify.settings import Settings
from qualify.store.engine import make_engine
from qualify.store.models import Base

MIGRATION_LOCK_KEY = 0x7175616C  # "qual": the advisory lock of qualify's migrations on PostgreSQL
config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return config.attributes.get("url") or config.get_main_option("sqlalchemy.url") or Settings.load().database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True,
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(_url())
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=connection.dialect.name == "sqlite")
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                # One migration at a time (two runs opening a fresh database together would both create the
                # tables): the second waits here, then reads the revision the first committed.
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
