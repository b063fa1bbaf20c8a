"""The PostgreSQL the tests use (QUALIFY_TEST_PG_URL, default: the local server, trust auth)."""

from __future__ import annotations

import os

from sqlalchemy.engine import make_url

PG_ADMIN_URL = os.environ.get("QUALIFY_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def psycopg_dsn(url: str = PG_ADMIN_URL) -> str:
    """The admin URL in psycopg's key=value form."""
    u = make_url(url)
    return f"host={u.host or '127.0.0.1'} port={u.port or 5432} user={u.username or 'postgres'} dbname={u.database}"
