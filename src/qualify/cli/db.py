"""`qualify db upgrade`: create or migrate the results database."""

from __future__ import annotations

from typing import Optional

from qualify.cli.common import DbOption, new_app, say, settings
from qualify.settings import redact_url
from qualify.store.engine import upgrade

db_app = new_app(help="The results database.")


@db_app.command("upgrade")
def db_upgrade(db: Optional[str] = DbOption) -> None:
    """Create or migrate the results database to the latest schema."""
    url = settings(db).database_url
    upgrade(url)
    say(f"database at head: {redact_url(url)}")
