"""`qualify run`: the qualification flow from the command line."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    return None
