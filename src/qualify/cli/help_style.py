"""How `--help` names arguments and values: the conventions people read in every other CLI.

Typer 0.29 (pinned in constraints.txt) writes a required argument as `{manifest}` in the usage line and gives
every flag a value type (`--json <bool>`), which reads as if the flag took a value. Here: arguments in capitals
(`MANIFEST`, `[RUN]` when optional), flags with no value column, and value types as words (`TEXT`, `INTEGER`,
`PATH`). Applied once, at import of qualify.cli; tests/unit/test_cli_help.py fails when a Typer upgrade moves
these hooks, so the pin and this module change together.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperOption

_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH", "file": "FILE", "directory": "DIR",
          "datetime": "DATETIME", "bool": "BOOLEAN"}


def _word(display: str | None) -> str | None:
    """`<str>` -> TEXT, `<list[str]>` -> TEXT..., an explicit metavar unchanged."""
    if display is None or not (display.startswith("<") and display.endswith(">")):
        return display
    inner = display[1:-1]
    many = inner.startswith("list[") and inner.endswith("]")
    inner = inner[5:-1] if many else inner
    word = _WORDS.get(inner.lower(), inner.upper())
    return f"{word}..." if many else word


def _option_type(original: Any) -> Any:
    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        if self.is_flag or self.count:
            return None  # a flag takes no value
        return _word(original(self, ctx))

    return display_type_rich


def _argument_display_name(self: TyperArgument) -> str:
    return self.metavar if self.metavar is not None else (self.name or "").upper()


def _argument_usage(self: TyperArgument) -> str:
    name = self.display_name_raw
    name = name if self.required else f"[{name}]"
    return name + ("..." if self.nargs != 1 else "")


def apply() -> None:
    if getattr(TyperOption, "_qualify_help_style", False):
        return
    TyperOption.display_type_rich = _option_type(TyperOption.display_type_rich)  # type: ignore[method-assign]
    TyperArgument._usage_display_name = _argument_usage  # type: ignore[method-assign]
    TyperArgument.display_name_raw = property(_argument_display_name)  # type: ignore[method-assign,assignment]
    TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]  # the name says it
    TyperOption._qualify_help_style = True  # type: ignore[attr-defined]
