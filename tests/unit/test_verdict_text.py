"""The verdict in words, attention first (qualify.report.verdict_text), the links to a run's report and flow run
(qualify.report.links, the public base URL settings), and the CLI's outcome that leads with what decided."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from qualify.cli.run import _print_outcome
from qualify.errors import BadInput
from qualify.outcomes import RunOutcome, RunStatus, Verdict
from qualify.report.links import flow_run_url, report_url
from qualify.report.verdict_text import counts, headline, reason_lines
from qualify.settings import Settings


def _reason(status: str, check: str, message: str) -> dict[str, str]:
    return {"status": status, "check": check, "message": message}


# 41 passes around the one check that decided, as in the run the issue quotes (the INCOMPLETE was line 33 of 43)
REASONS = ([_reason("PASS", "case_status", f"case {k} passed") for k in range(32)]
           + [_reason("INCOMPLETE", "regression", "no baseline run of 0.9")]
           + [_reason("PASS", "agreement", f"scheme {k} agrees") for k in range(9)]
           + [_reason("WAIVED", "probe:oom", "waived by W-1")])


def test_attention_first_and_the_passes_folded() -> None:
    lines = reason_lines(REASONS)
    assert lines[0].startswith("INCOMPLETE") and "no baseline run of 0.9" in lines[0]
    assert lines[1].startswith("WAIVED")
    assert lines[-1] == "41 passed (--verbose lists them)" and len(lines) == 3
    every = reason_lines(REASONS, verbose=True)
    assert len(every) == len(REASONS) and every[0].startswith("INCOMPLETE") and every[-1].startswith("PASS")
    assert [line.split()[0] for line in reason_lines([_reason("PASS", "x", "y"), _reason("FAIL", "z", "w"),
                                                      _reason("INCOMPLETE", "v", "u")], verbose=True)] == [
        "FAIL", "INCOMPLETE", "PASS"]


def test_a_note_is_folded_and_counted_apart_from_the_passes() -> None:
    notes = [_reason("NOTE", "mfu", "MFU not computed: no peak FLOP/s for cpu/fp32")] * 2
    lines = reason_lines(REASONS + notes)
    assert lines[-1] == "41 passed, 2 notes (--verbose lists them)" and len(lines) == 3
    assert reason_lines(REASONS + notes, verbose=True)[-1].startswith("NOTE")
    assert counts(REASONS + notes) == "1 INCOMPLETE, 1 WAIVED, 41 PASS, 2 NOTE"


def test_headline_names_the_first_deciding_reason() -> None:
    assert headline("INCOMPLETE", REASONS) == "INCOMPLETE: regression: no baseline run of 0.9"
    two = [_reason("FAIL", "case_status", "a crashed"), _reason("FAIL", "agreement", "b disagrees")]
    assert headline("FAIL", two) == "FAIL: case_status: a crashed (+1 more)"
    assert headline("PASS", [_reason("PASS", "x", "y")] * 3) == "PASS: 3 PASS"
    assert counts(REASONS) == "1 INCOMPLETE, 1 WAIVED, 41 PASS"


def test_the_cli_outcome_leads_with_what_decided() -> None:
    outcome = RunOutcome(run_id=7, verdict=Verdict.INCOMPLETE, status=RunStatus.INCOMPLETE,
                         digest="sha256:" + "a" * 64, reasons=REASONS, report="/r/run-7.html")
    for verbose, expected in ((False, 5), (True, 2 + len(REASONS))):
        buffer = io.StringIO()
        _print_outcome(Console(file=buffer, width=200), outcome, verbose)
        lines = buffer.getvalue().splitlines()
        assert lines[0].startswith("run 7: INCOMPLETE") and "INCOMPLETE  regression" in lines[1], lines[:3]
        assert len(lines) == expected, lines


def test_report_and_flow_run_links(tmp_path: Path) -> None:
    assert report_url("https://q.example", 7, tmp_path / "run-7.html") == "https://q.example/v1/runs/7/report"
    assert report_url(None, 7, tmp_path / "run-7.html") == (tmp_path / "run-7.html").as_uri()
    assert flow_run_url("http://127.0.0.1:4200/", "abc") == "http://127.0.0.1:4200/flow-runs/flow-run/abc"
    assert flow_run_url(None, "abc") is None and flow_run_url("http://x", None) is None


def test_public_base_urls_are_settings() -> None:
    settings = Settings.load(env={"QUALIFY_PUBLIC_URL": "https://q.example/base/",
                                  "QUALIFY_PREFECT_UI_URL": "http://127.0.0.1:4200"})
    assert (settings.public_url, settings.prefect_ui_url) == ("https://q.example/base", "http://127.0.0.1:4200")
    for bad in ("q.example", "ftp://q.example", "https://q.example/?x=1"):
        with pytest.raises(BadInput, match="QUALIFY_PUBLIC_URL"):
            Settings.load(env={"QUALIFY_PUBLIC_URL": bad})


def test_progress_names_what_is_on_ray_and_reads_the_clock_now() -> None:
    from qualify.cli.run import ProgressSink, progress_text
    from qualify.progress import Progress

    progress = Progress(total=8)
    sink = ProgressSink()
    assert sink.text == "starting"
    progress.listeners.append(sink)
    for case in ("train/a", "train/b", "infer/c"):
        progress.start_case(case)
    # handed to Ray is not running: only a case whose Ray task said it started is
    assert progress.running == 0 and progress.queued_cases == ["train/a", "train/b", "infer/c"]
    progress.case_started("train/a")
    progress.case_started("train/b")
    progress.finish_case(False, "train/b")
    assert progress.submitted == ["train/a", "infer/c"] and progress.running == 1
    assert progress.running_cases == ["train/a"] and progress.queued_cases == ["infer/c"]
    text = sink.text
    assert text.startswith("cases 1/8 done, 1 failed; running: train/a; queued: 1; elapsed "), text
    assert "left" not in text  # no expected durations: no estimate
    progress.started_at -= 100  # the elapsed time is read when the line is drawn, not when a case moved
    assert sink.text.endswith("elapsed 100 s") or sink.text.endswith("elapsed 101 s")
    crowded = Progress(total=40, submitted=[f"train/model-{k}/variant" for k in range(30)],
                       started={f"train/model-{k}/variant": 0.0 for k in range(30)})
    line = progress_text(crowded)
    assert "train/model-0/variant" in line and "+2" in line and len(line) < 140


def test_the_end_is_estimated_from_expected_durations_over_the_cases_running_at_once() -> None:
    from qualify.cli.run import progress_text
    from qualify.progress import Progress

    progress = Progress(total=3, expected_s={"a": 100.0, "b": 100.0, "c": 60.0})
    for case in ("a", "b", "c"):
        progress.start_case(case)
    assert progress.remaining_s() is None  # nothing runs yet: no rate to spread the work over
    progress.case_started("a")
    progress.case_started("b")
    now = progress.started["a"] + 40
    # left: a 60, b 60 (both ran 40 of 100), c 60 queued = 180 over 2 running at once = 90
    assert progress.remaining_s(now) == pytest.approx(90.0, abs=0.5)
    progress.started["a"] -= 200  # overran its estimate: never a negative or zero remainder (10% of it)
    assert progress.remaining_s(now) >= 10.0
    assert "s left" in progress_text(progress)
    unknown = Progress(total=2, expected_s={"a": 10.0})
    unknown.start_case("a"), unknown.start_case("b"), unknown.case_started("a")
    assert unknown.remaining_s() is None  # b has no estimate: none shown rather than a wrong one
