"""Timestamps as people and programs read them: ISO 8601 with a time zone, everywhere (API, JSON, reports).

Stored times are UTC (qualify.store.models.utcnow); SQLite hands them back without their zone, PostgreSQL with
it, so a naive value is UTC by construction and is labelled so here.
"""

from __future__ import annotations

import datetime as dt


def iso(value: dt.datetime | None) -> str | None:
    """'2026-12-01T10:00:00.123456+00:00' (None stays None)."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.isoformat()
