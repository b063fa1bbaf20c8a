"""Where qualify keeps its data: the data directory and the results database URL."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """QUALIFY_DATA_DIR, default ./.qualify (build logs, reports, the SQLite file)."""
    path = Path(os.environ.get("QUALIFY_DATA_DIR", ".qualify")).expanduser()
    return path


def cache_dir() -> Path:
    """QUALIFY_CACHE_DIR, default ~/.cache/qualify: DeepSpeed op and torch.compile caches, tiny models."""
    return Path(os.environ.get("QUALIFY_CACHE_DIR", "~/.cache/qualify")).expanduser()


def database_url(explicit: str | None = None) -> str:
    """--db, else QUALIFY_DATABASE_URL, else a SQLite file in the data directory."""
    if explicit:
        return explicit
    url = os.environ.get("QUALIFY_DATABASE_URL")
    if url:
        return url
    return f"sqlite:///{(data_dir() / 'qualify.db').resolve()}"


def redact_url(url: str) -> str:
    """A database URL without its password, for messages and logs."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a malformed URL is shown without anything after '@'
        return url.split("@")[-1]
