"""What Prefect logs about a failed case's task run: the state with its result's repr, in the UI's log lines."""

from __future__ import annotations

import pytest

from qualify.outcomes import CaseOutcome, CaseStatus, ErrorClass

pytestmark = pytest.mark.unit


def test_a_case_outcome_reads_as_one_short_line() -> None:
    outcome = CaseOutcome(case_id="synthetic/broken", status=CaseStatus.FAILED, error_class=ErrorClass.NAN_LOSS,
                          error="asked to fail as nan_loss", attempts=1, exec_s=0.10845885999970051,
                          queue_wait_s=0.2251112461090088, node="vm")
    assert repr(outcome) == "CaseOutcome(synthetic/broken: failed (nan_loss), 1 attempt(s), 0.1 s on vm)"
    bare = CaseOutcome(case_id="c", status=CaseStatus.PASSED, error_class=None, error=None, attempts=2, exec_s=None,
                       queue_wait_s=None, node=None)
    assert repr(bare) == "CaseOutcome(c: passed, 2 attempt(s))"
