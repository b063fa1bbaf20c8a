"""`qualify gate evaluate|show|check` and `qualify promote` through the real entry point."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
from support.cli import run_cli
from support.gate import good_doc, manifest_text, seed_run

from qualify.manifest.cases import expand
from qualify.gate.judging import evaluate_and_commit
from qualify.manifest.load import load_manifest_text


def invoke(*args: str):
    """In-process run of the same commands (typer's CliRunner), for the cheap cases; the exit
    codes that CI relies on go through the real entry point (run_cli, a subprocess)."""
    from typer.testing import CliRunner

    from qualify.cli import app

    return CliRunner().invoke(app, list(args))


def _no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout


def _seed(sessions, text: str, digest: str, *, broken: bool = False) -> int:
    docs = None
    if broken:
        docs = {c.case_id: good_doc(c) for c in expand(load_manifest_text(text, check_expiry=False).release)}
        docs["infer/tq/w8a8"]["probes"]["prefix_cache"] = {"status": "failed", "detail": "garbled"}
    with sessions() as s:
        run_id = seed_run(s, text, digest=digest, docs=docs).id
        s.commit()
    return run_id


def _waiver(days: int) -> dict:
    expires = (dt.date.today() + dt.timedelta(days=days)).isoformat()
    return {"waivers": [{"id": "KI-pc", "cases": "infer/*", "check": "probe:prefix_cache", "reason": "known issue",
                         "expires": expires}]}


FIRST = {"previous_tag": None}  # a first release: no baseline to compare with


def test_evaluate_and_show(db_url, sessions):
    text = manifest_text(release_extra=FIRST, gate_extra=_waiver(14))
    run_id = _seed(sessions, text, "sha256:" + "1" * 64, broken=True)

    ok = run_cli("gate", "evaluate", str(run_id), "--db", db_url)
    assert ok.returncode == 0, ok.stderr
    assert f"run {run_id}: PASS" in ok.stdout and "WAIVED" in ok.stdout and "KI-pc" in ok.stdout

    later = (dt.date.today() + dt.timedelta(days=30)).isoformat()
    dry = run_cli("gate", "evaluate", str(run_id), "--db", db_url, "--today", later, "--dry-run", "--json")
    assert dry.returncode == 1, dry.stderr
    judged = json.loads(dry.stdout)
    assert judged["verdict"] == "FAIL" and judged["dry_run"] and judged["judged_on"] == later
    assert any(r["status"] == "FAIL" and "expired on" in r["message"] for r in judged["reasons"])
    stored = invoke("gate", "evaluate", str(run_id), "--db", db_url, "--today", later)
    assert stored.exit_code == 2 and "--dry-run" in stored.output  # another day's verdict is never recorded

    again = run_cli("gate", "evaluate", str(run_id), "--db", db_url, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["verdict"] == "PASS"
    shown = invoke("gate", "show", str(run_id), "--db", db_url, "--all")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.count("decision ") == 2 and ": FAIL" not in shown.stdout  # the dry run left no trace
    latest = invoke("gate", "show", str(run_id), "--db", db_url, "--json")
    assert [d["verdict"] for d in json.loads(latest.stdout)["decisions"]] == ["PASS"]

    missing = invoke("gate", "evaluate", "9999", "--db", db_url)
    assert missing.exit_code == 2 and "error: no run 9999" in missing.output
    bad_date = invoke("gate", "evaluate", str(run_id), "--db", db_url, "--today", "June")
    assert bad_date.exit_code == 2 and "not a date" in bad_date.output
    for proc in (ok, dry, again):
        _no_traceback(proc)


@pytest.mark.registry
def test_gate_check_binds_digest_repository_and_tag(db_url, sessions, registry, registry_factory, make_image):
    ns = "c" + uuid.uuid4().hex[:8]
    repository = registry.ref(f"{ns}/demo")
    target = registry.ref(f"{ns}/public/demo", "1.1")
    digest = make_image(registry, f"{ns}/demo", "1.1-rc1")
    make_image(registry, f"{ns}/demo", "other")  # a tag of the same repository at another digest
    text = manifest_text(release_extra={"repository": repository, **FIRST}, gate_extra=_waiver(14),
                         promotion={"targets": [{"name": "public", "reference": target}],
                                    "insecure_registries": [registry.host]})
    run_id = _seed(sessions, text, digest, broken=True)
    assert evaluate_and_commit(sessions, run_id).judgement.verdict == "PASS"
    tag_ref = registry.ref(f"{ns}/demo", "1.1-rc1")
    insecure = ("--insecure-registry", registry.host)

    passed = run_cli("gate", "check", tag_ref, *insecure, "--db", db_url)
    assert passed.returncode == 0, passed.stderr
    assert passed.stdout.startswith("PASS:") and f"run {run_id}" in passed.stdout and "release demo:1.1" in passed.stdout

    # a digest reference of the qualified repository (or a promotion target) needs no registry call
    by_digest = invoke("gate", "check", f"{repository}@{digest}", "--db", db_url, "--json")
    assert by_digest.exit_code == 0 and json.loads(by_digest.stdout)["ok"], by_digest.output
    at_target = invoke("gate", "check", f"{registry.host}/{ns}/public/demo@{digest}", "--db", db_url)
    assert at_target.exit_code == 0, at_target.output
    # ... but the digest does not qualify another repository, nor a tag that points elsewhere
    elsewhere = invoke("gate", "check", f"evil.example.com/other/thing@{digest}", "--db", db_url)
    assert elsewhere.exit_code == 1 and "is not where" in elsewhere.stdout
    moved = run_cli("gate", "check", f"{registry.ref(f'{ns}/demo', 'other')}@{digest}", *insecure, "--db", db_url)
    assert moved.returncode == 1 and "resolves to" in moved.stdout
    no_tag = run_cli("gate", "check", f"{registry.ref(f'{ns}/demo', 'no-such-tag')}@{digest}", *insecure,
                     "--db", db_url)
    assert no_tag.returncode == 2 and "not found" in no_tag.stderr.lower()
    # CI can pin the release and the policy
    assert invoke("gate", "check", f"{repository}@{digest}", "--db", db_url, "--release", "demo").exit_code == 0
    assert invoke("gate", "check", f"{repository}@{digest}", "--db", db_url, "--release", "other").exit_code == 1
    assert invoke("gate", "check", f"{repository}@{digest}", "--db", db_url, "--policy", "0" * 12).exit_code == 1

    unknown = invoke("gate", "check", f"{repository}@sha256:{'e' * 64}", "--db", db_url)
    assert unknown.exit_code == 1 and "NO DECISION" in unknown.stdout

    # a later FAIL of the same digest (another run, no waiver) overrides the earlier PASS
    strict = manifest_text(release_extra={"repository": repository, **FIRST})
    rerun = _seed(sessions, strict, digest, broken=True)
    assert evaluate_and_commit(sessions, rerun).judgement.verdict == "FAIL"
    failed = run_cli("gate", "check", f"{repository}@{digest}", "--db", db_url)
    assert failed.returncode == 1 and failed.stdout.startswith("FAIL:")
    assert "overridden" in failed.stdout and "probe:prefix_cache" in failed.stdout

    invalid = invoke("gate", "check", "Not/A Ref", "--db", db_url)
    assert invalid.exit_code == 2 and "not a valid image reference" in invalid.output

    down = registry_factory()
    down.stop()
    unreachable = run_cli("gate", "check", down.ref("x/y", "1"), "--insecure-registry", down.host, "--db", db_url)
    assert unreachable.returncode == 3 and "unreachable" in unreachable.stderr  # infrastructure, not input
    assert len(unreachable.stderr.strip().splitlines()) == 1
    for proc in (passed, failed, unreachable, moved):
        _no_traceback(proc)


@pytest.mark.registry
def test_promote_cli(db_url, sessions, registry, make_image):
    from support.registry import skopeo_digest

    ns = "p" + uuid.uuid4().hex[:8]
    target = registry.ref(f"{ns}/public/demo", "1.1")
    text = manifest_text(release_extra={"repository": registry.ref(f"{ns}/demo"), **FIRST},
                         promotion={"targets": [{"name": "public", "reference": target}],
                                    "insecure_registries": [registry.host]})
    digest = make_image(registry, f"{ns}/demo", "1.1-rc1")
    run_id = _seed(sessions, text, digest)

    refused = invoke("promote", str(run_id), "--db", db_url)  # not evaluated yet
    assert refused.exit_code == 1 and "refused:" in refused.output and "no gate decision" in refused.output

    assert evaluate_and_commit(sessions, run_id).judgement.verdict == "PASS"
    plan = invoke("promote", str(run_id), "--db", db_url, "--dry-run")
    assert plan.exit_code == 0, plan.output
    assert f"@{digest}" in plan.stdout and "copy" in plan.stdout and target in plan.stdout
    assert skopeo_digest(target) is None

    done = run_cli("promote", str(run_id), "--db", db_url, "--json")  # the real entry point
    assert done.returncode == 0, done.stderr
    assert [t["outcome"] for t in json.loads(done.stdout)["targets"]] == ["promoted"]
    assert skopeo_digest(target) == digest

    no_reason = invoke("promote", str(run_id), "--db", db_url, "--force")
    assert no_reason.exit_code == 2 and "--reason" in no_reason.output
    again = invoke("promote", str(run_id), "--db", db_url)
    assert again.exit_code == 0 and "skipped" in again.stdout

    # A later FAIL of the same digest (another run of it) stops promote, as it stops gate check.
    rerun = _seed(sessions, text, digest, broken=True)
    assert evaluate_and_commit(sessions, rerun).judgement.verdict == "FAIL"
    stopped = invoke("promote", str(run_id), "--db", db_url)
    assert stopped.exit_code == 1 and "is FAIL, not PASS" in stopped.output
    for proc in (done,):
        _no_traceback(proc)
