"""`/v1/gate` answers by status code: 200 only when the reference may be pushed, so `curl -f ... && push` is safe.

403 when the digest was judged but may not be pushed (FAIL, INCOMPLETE, or not for this reference) and 404 when
it was never judged: both problem details (qualify.service.problems) carrying the gate's own fields, so a client
that reads the body finds `ok`, `verdict` and `reasons` in every answer.
"""

from __future__ import annotations

from typing import Any

from qualify.gate.push_check import PushCheck
from qualify.report.verdict_text import headline
from qualify.service.problems import problem_body

PATH = "/v1/gate"


def gate_answer(result: PushCheck, digest: str) -> dict[str, Any]:
    """The body of the answer; a refusal's carries its `status` (403 or 404), an allowed one has none."""
    fields = result.to_dict()
    if result.ok:
        return fields
    if result.verdict is None:
        return problem_body(404, f"{digest} has never been judged by the gate", PATH, **fields)
    why = "; ".join(result.problems) if result.problems else headline(result.verdict, result.reasons)
    return problem_body(403, f"{result.reference} may not be pushed: {why}", PATH, **fields)
