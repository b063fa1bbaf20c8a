"""The verdict where Prefect shows it: the flow run's final state and its log lines.

PASS ends `Completed` named "PASS"; FAIL and INCOMPLETE end `Failed`, named "FAIL" or "INCOMPLETE", with the
first deciding reason as the state's message. So the runs list (colour and state name), the API (`state_type`,
`state_name`) and automations (a trigger on the flow-run state named "INCOMPLETE", say) tell the three apart.
INCOMPLETE is a Failed state, not a Completed one: a run that could not be judged must not look green.
"""

from __future__ import annotations

from typing import Any

from prefect.states import Completed, Failed, State

from qualify.outcomes import RunOutcome, Verdict
from qualify.report.verdict_text import headline, reason_lines


def final_state(outcome: RunOutcome) -> State:
    message = headline(outcome.verdict, outcome.reasons)
    if outcome.verdict == Verdict.PASS:
        return Completed(name=Verdict.PASS.value, message=message, data=outcome)
    return Failed(name=Verdict(outcome.verdict).value, message=message, data=outcome)


def log_verdict(logger: Any, outcome: RunOutcome, report_link: str) -> None:
    """The verdict and what decided it, on the flow run's log (passed checks as a count), and the report."""
    logger.info("verdict of run %s: %s", outcome.run_id, headline(outcome.verdict, outcome.reasons))
    for line in reason_lines(outcome.reasons, where_passes="the report lists them"):
        logger.info("  %s", line)
    logger.info("report: %s", report_link)
