"""A release line seeded straight into the database for the report, compare and history tests (no tests here).

`seed_release_line(sessions)`: run A of demo:1.0 (good results, PASS) and run B of demo:1.1 whose
train/tiny/base is 15% slower (a regression), infer/tq/none 10% faster (an improvement), infer/tq/w8a8's
prefix-cache probe failed under a waiver in force, and train/tiny/compile needed two attempts. B's
verdict is FAIL (the regression).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from qualify.manifest.cases import expand
from qualify.gate.judging import evaluate_and_commit
from qualify.manifest.load import load_manifest_text
from qualify.store.models import CaseResult
from support.gate import good_doc, manifest_text, seed_run

REPOSITORY = "127.0.0.1:5000/qualify/demo"


@dataclass
class Line:
    run_a: int
    run_b: int
    digest_a: str
    digest_b: str


def waiver(days: int = 14) -> dict:
    expires = (dt.date.today() + dt.timedelta(days=days)).isoformat()
    return {"waivers": [{"id": "KI-prefix-cache", "cases": "infer/*", "check": "probe:prefix_cache",
                         "reason": "known issue in the release note", "expires": expires}]}


def seed_release_line(sessions, *, digest_a: str = "sha256:" + "a" * 64, digest_b: str = "sha256:" + "b" * 64,
                      slow: float = 0.85) -> Line:
    text_a = manifest_text(release_extra={"tag": "1.0", "candidate_tag": "1.0-rc1", "previous_tag": None})
    text_b = manifest_text(gate_extra=waiver())
    cases_b = {c.case_id: c for c in expand(load_manifest_text(text_b, check_expiry=False).release)}
    docs_b = {cid: good_doc(c, seed=7) for cid, c in cases_b.items()}
    docs_b["train/tiny/base"] = good_doc(cases_b["train/tiny/base"], scale=slow, seed=7)
    docs_b["infer/tq/none"] = good_doc(cases_b["infer/tq/none"], scale=1.1, seed=7)
    docs_b["infer/tq/w8a8"]["probes"]["prefix_cache"] = {"status": "failed", "detail": "outputs differ with the cache"}
    with sessions() as s:
        run_a = seed_run(s, text_a, digest=digest_a, tag="1.0-rc1").id
        s.commit()
    evaluate_and_commit(sessions, run_a)
    with sessions() as s:
        run_b = seed_run(s, text_b, digest=digest_b, docs=docs_b, finish="failed").id
        row = s.query(CaseResult).filter_by(run_id=run_b, case_id="train/tiny/compile").one()
        row.attempts = 2
        s.commit()
    evaluate_and_commit(sessions, run_b)
    return Line(run_a, run_b, digest_a, digest_b)
