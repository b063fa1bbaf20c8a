"""The verdict in words, attention first: shared by the CLI, the flow run's logs and final state, and the service.

What decided a verdict is what failed or could not be judged; people look there first. Passed checks are
folded into a count unless all are asked for (`--verbose`).
"""

from __future__ import annotations

from typing import Any, Sequence

# The order a reader needs: what decided (FAIL, INCOMPLETE), what was excused (WAIVED), what was not compared
# (NO-BASELINE), then what passed, and last what is disclosed without being a check (NOTE).
ATTENTION = ("FAIL", "INCOMPLETE")
ORDER = ("FAIL", "INCOMPLETE", "WAIVED", "NO-BASELINE", "PASS", "NOTE")
FOLDED = ("PASS", "NOTE")  # counted, not listed, unless --verbose


def ordered(reasons: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Reasons in ORDER of their status (a stable sort: check order is kept inside one status)."""
    rank = {status: k for k, status in enumerate(ORDER)}
    return sorted(reasons, key=lambda reason: rank.get(reason["status"], len(ORDER)))


def deciding(verdict: str, reasons: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reasons that gave the verdict: the FAILs of a FAIL, the INCOMPLETEs of an INCOMPLETE (none for PASS)."""
    return [reason for reason in reasons if reason["status"] == verdict and verdict in ATTENTION]


def reason_line(reason: dict[str, Any]) -> str:
    return f"{reason['status']:<11} {reason['check']}: {reason['message']}"


def reason_lines(reasons: Sequence[dict[str, Any]], verbose: bool = False,
                 where_passes: str = "--verbose lists them") -> list[str]:
    """One line per reason that is neither a PASS nor a NOTE, attention first; the passes and notes as counts
    (saying where they are listed), or each with verbose."""
    shown = [reason for reason in ordered(reasons) if verbose or reason["status"] not in FOLDED]
    lines = [reason_line(reason) for reason in shown]
    passed = sum(reason["status"] == "PASS" for reason in reasons)
    notes = sum(reason["status"] == "NOTE" for reason in reasons)
    if (passed or notes) and not verbose:
        folded = ", ".join(part for part in (f"{passed} passed" if passed else "",
                                             f"{notes} note{'s' * (notes != 1)}" if notes else "") if part)
        lines.append(f"{folded} ({where_passes})")
    return lines


def counts(reasons: Sequence[dict[str, Any]]) -> str:
    """'2 FAIL, 1 INCOMPLETE, 41 PASS' in ORDER, statuses that occur only."""
    tally = {status: sum(reason["status"] == status for reason in reasons) for status in ORDER}
    return ", ".join(f"{n} {status}" for status, n in tally.items() if n)


def headline(verdict: str, reasons: Sequence[dict[str, Any]]) -> str:
    """A one-line answer: the verdict and its first deciding reason (a Prefect state's message)."""
    first = deciding(verdict, reasons)
    if not first:
        return f"{verdict}: {counts(reasons) or 'no checks'}"
    more = f" (+{len(first) - 1} more)" if len(first) > 1 else ""
    return f"{verdict}: {first[0]['check']}: {first[0]['message']}{more}"
