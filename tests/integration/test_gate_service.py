"""gate.service against a real database (SQLite and PostgreSQL): decisions are appended."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
from support.gate import good_doc, manifest_text, seed_run

from qualify.manifest.cases import expand
from qualify.gate.judging import GateError, evaluate_and_commit, evaluate_run
from qualify.manifest.load import load_manifest_text, policy_sha256
from qualify.store import repo


def fake_digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


PREVIOUS = dict(release_extra={"tag": "1.0", "candidate_tag": "1.0-rc1", "previous_tag": None})


def test_first_release_passes_without_baseline_and_records_the_decision(sessions):
    text = manifest_text(release_extra={"previous_tag": None})
    with sessions() as s:
        run = seed_run(s, text, digest=fake_digest("a"))
        s.commit()
        run_id = run.id
    ev = evaluate_and_commit(sessions, run_id)
    assert ev.judgement.verdict == "PASS" and ev.baseline_run_id is None
    with sessions() as s:
        decision = repo.latest_decision(s, run_id)
        assert decision.verdict == "PASS" and decision.digest == fake_digest("a")
        assert decision.policy_sha256 == policy_sha256(load_manifest_text(text, check_expiry=False).release)
        statuses = {r["check"]: r["status"] for r in decision.reasons if r["case_id"] is None}
        assert statuses["regression"] == "NO-BASELINE"
        assert repo.latest_pass_for_digest(s, fake_digest("a")).id == decision.id


def test_re_evaluation_appends_and_a_dry_later_date_is_never_stored(sessions):
    docs_changed = {}
    expires = dt.date.today() + dt.timedelta(days=14)
    text = manifest_text(release_extra={"previous_tag": None},
                         gate_extra={"waivers": [{"id": "KI-pc", "cases": "infer/*", "check": "probe:prefix_cache",
                                                  "reason": "known vLLM issue", "expires": expires.isoformat()}]})
    cases = {c.case_id: c for c in expand(load_manifest_text(text, check_expiry=False).release)}
    for cid, case in cases.items():
        doc = good_doc(case)
        if cid == "infer/tq/w8a8":
            doc["probes"]["prefix_cache"] = {"status": "failed", "detail": "garbled with cache"}
        docs_changed[cid] = doc
    with sessions() as s:
        run_id = seed_run(s, text, digest=fake_digest("b"), docs=docs_changed).id
        s.commit()
    first = evaluate_and_commit(sessions, run_id)
    later = dt.date.today() + dt.timedelta(days=30)
    dry = evaluate_and_commit(sessions, run_id, today=later, record=False)
    second = evaluate_and_commit(sessions, run_id)
    assert first.judgement.verdict == "PASS" and second.judgement.verdict == "PASS"
    assert dry.judgement.verdict == "FAIL" and dry.decision is None
    assert any(f"KI-pc expired on {expires}" in r.message for r in dry.judgement.by_status("FAIL"))
    with pytest.raises(GateError, match="cannot be recorded"):
        evaluate_and_commit(sessions, run_id, today=later)  # another day's verdict is never stored
    with sessions() as s:
        rows = repo.decisions(s, run_id)
        assert [d.verdict for d in rows] == ["PASS", "PASS"]  # appended; the dry one left no trace
        assert rows[0].id == first.decision.id  # the first decision is untouched
        assert any(r["status"] == "WAIVED" for r in rows[0].reasons)


def test_regression_against_the_previous_release(sessions):
    with sessions() as s:
        base_run = seed_run(s, manifest_text(**PREVIOUS), digest=fake_digest("old"))
        s.commit()
        base_id = base_run.id
    assert evaluate_and_commit(sessions, base_id).judgement.verdict == "PASS"

    text = manifest_text()
    cases = {c.case_id: c for c in expand(load_manifest_text(text, check_expiry=False).release)}
    docs = {cid: good_doc(c, seed=9, scale=0.85 if cid == "train/tiny/base" else 1.0) for cid, c in cases.items()}
    with sessions() as s:
        run_id = seed_run(s, text, digest=fake_digest("new"), docs=docs).id
        s.commit()
    ev = evaluate_and_commit(sessions, run_id)
    assert ev.judgement.verdict == "FAIL" and ev.baseline_run_id == base_id
    with sessions() as s:
        decision = repo.latest_decision(s, run_id)
        assert decision.baseline_run_id == base_id
        [reg] = [r for r in decision.reasons if r["check"] == "regression" and r["case_id"] == "train/tiny/base"]
        assert reg["status"] == "FAIL" and reg["figures"]["p_value"] < 0.05
        others = [r for r in decision.reasons if r["check"] == "regression" and r["case_id"] != "train/tiny/base"]
        assert others and all(r["status"] == "PASS" for r in others)


def test_missing_and_infra_results_are_incomplete(sessions):
    text = manifest_text()
    cases = {c.case_id: c for c in expand(load_manifest_text(text, check_expiry=False).release)}
    docs = {cid: good_doc(c) for cid, c in cases.items() if cid != "infer/tq/none"}
    docs["train/tiny/compile"] = {**docs["train/tiny/compile"], "status": "error", "error_class": "infra",
                                  "error": "ray worker died"}
    with sessions() as s:
        run_id = seed_run(s, text, digest=fake_digest("c"), docs=docs, finish=None).id
        s.commit()
    ev = evaluate_and_commit(sessions, run_id)
    assert ev.judgement.verdict == "INCOMPLETE"
    incomplete = {r.case_id for r in ev.judgement.by_status("INCOMPLETE")}
    assert {"infer/tq/none", "train/tiny/compile"} <= incomplete


def test_unknown_run_is_a_gate_error(sessions):
    with sessions() as s, pytest.raises(GateError, match="no run 999"):
        evaluate_run(s, 999)
