"""`qualify gate ...` and `qualify promote` (filled in by the gate/promotion work)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    return None
