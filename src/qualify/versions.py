"""Component version match rules: exact, prefix, public (with local label), min.

Image components are not all PEP 440 (``ACCL-P 1.5.0-9``, ``perf 5.4.30``), so
every rule falls back to a lenient numeric parse when packaging cannot parse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from packaging.version import InvalidVersion, Version

MatchRule = Literal["exact", "prefix", "public", "min"]
MATCH_RULES: tuple[str, ...] = ("exact", "prefix", "public", "min")

_NUM = re.compile(r"\d+")


@dataclass(frozen=True)
class _Parsed:
    release: tuple[int, ...]
    local: str | None
    version: Version | None


def _parse(text: str) -> _Parsed:
    text = text.strip()
    try:
        v = Version(text)
        return _Parsed(v.release, v.local, v)
    except InvalidVersion:
        main, _, local = text.partition("+")
        # Lenient: the leading run of dot-separated numbers ("1.5.0-9" -> (1, 5, 0)).
        head = re.match(r"[vV]?(\d+(?:\.\d+)*)", main)
        release = tuple(int(x) for x in head.group(1).split(".")) if head else ()
        return _Parsed(release, local or None, None)


def is_parseable(text: str) -> bool:
    return bool(_parse(text).release)


def matches(rule: str, expected: str, actual: str | None) -> tuple[bool, str]:
    """Return (ok, reason) for one component check."""
    if actual is None:
        return False, "not found in the image"
    if rule == "exact":
        ok = actual.strip() == expected.strip()
        return ok, "equal" if ok else f"expected exactly {expected!r}, found {actual!r}"
    if rule == "prefix":
        # Prefix on component boundaries: "2.6" matches "2.6.0" but not "2.60".
        a, e = actual.strip(), expected.strip()
        ok = a == e or (a.startswith(e) and not (e[-1].isdigit() and a[len(e)].isdigit()))
        return ok, "prefix matches" if ok else f"expected {expected!r}*, found {actual!r}"
    exp, act = _parse(expected), _parse(actual)
    if not exp.release or not act.release:
        return False, f"cannot compare versions {expected!r} and {actual!r}"
    if rule == "public":
        # The expected release is a prefix of the actual release segments:
        # torch 2.6.0 accepts 2.6.0.7.post1; a local label, when given, must be equal.
        if act.release[: len(exp.release)] != exp.release:
            return False, f"expected version {expected!r}, found {actual!r}"
        if exp.local is not None and act.local != exp.local:
            return False, f"expected local label +{exp.local}, found {('+' + act.local) if act.local else 'none'} in {actual!r}"
        return True, "public version matches"
    if rule == "min":
        if exp.version is not None and act.version is not None:
            ok = act.version >= exp.version
        else:
            ok = act.release >= exp.release
        return ok, f">= {expected}" if ok else f"expected >= {expected!r}, found {actual!r}"
    raise ValueError(f"unknown match rule {rule!r}")
