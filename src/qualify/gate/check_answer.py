"""`gate check`'s answer as people and CI read it: the lines (or the JSON) and the exit code, from a PushCheck.

One rendering for both ways a check is answered (the full command line, qualify.cli.gate, and the lean path,
qualify.cli.lean_check), so they cannot drift. CI greps the first line: the verdict comes first, the tag form's
note after it. Standard library only.
"""

from __future__ import annotations

import json

from qualify.errors import ExitCode
from qualify.gate.push_check import PushCheck
from qualify.outcomes import Verdict
from qualify.report.verdict_text import reason_lines


def exit_code(result: PushCheck) -> ExitCode:
    return ExitCode.OK if result.ok else ExitCode.FAIL


def as_json(result: PushCheck, note: str | None) -> str:
    return json.dumps({**result.to_dict(), **({"judged": note} if note else {})}, indent=2, default=str)


def lines(result: PushCheck, image_ref: str, digest: str, note: str | None) -> list[str]:
    """The text answer, one line each (never wrapped)."""
    out: list[str] = []
    if result.verdict is None:
        out.append(f"NO DECISION: {image_ref} ({digest}) has never been judged by the gate")
        if note:
            out.append(f"note: {note}")
        out += [f"  refused: {problem}" for problem in result.problems]
        return out
    label = result.verdict if not result.problems else f"REFUSED ({result.verdict} but not for this reference)"
    out.append(f"{label}: {image_ref} ({digest}) run {result.run} release {result.release} "
               f"decision {result.decision} at {str(result.decided_at)[:19]}")
    if note:
        out.append(f"note: {note}")
    out += [f"  refused: {problem}" for problem in result.problems]
    if result.verdict != Verdict.PASS:
        if result.overrides_pass_decision is not None:
            out.append(f"  (an earlier PASS, decision {result.overrides_pass_decision}, is overridden: "
                       "the latest decision wins)")
        out += [f"  {line}" for line in reason_lines(result.reasons, False)]
    return out
