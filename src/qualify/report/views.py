"""Plain-data views of runs for the CLI (`runs list/show`, `report`), the HTML report and the Prefect artifacts."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from sqlalchemy.orm import Session

from qualify.numbers import fmt_number
from qualify.report.makespan import run_time
from qualify.store import repo
from qualify.store.models import CaseResult, Run
from qualify.timestamps import iso

KEY_METRICS = {
    "train": ("tokens_per_s", "tflops_per_device", "mfu", "step_time_s_median"),
    "infer": ("output_tokens_per_s", "token_agreement", "kl_div_mean", "perplexity_delta"),
    "sleep": ("wall_s",),
}


def key_metrics(result: CaseResult) -> str:
    names = KEY_METRICS.get(result.kind, ())
    return ", ".join(f"{n}={fmt_number(result.metrics.get(n))}" for n in names if n in (result.metrics or {}))


def run_summary(session: Session, run: Run) -> dict[str, Any]:
    results = repo.case_results(session, run.id)
    decision = repo.latest_decision(session, run.id)
    return {
        "run": run.id,
        "release": f"{run.release.name}:{run.release.tag}",
        "status": run.status,
        "stage": run.stage,
        "verdict": decision.verdict if decision else None,
        "cases_total": len(results),
        "cases_passed": sum(r.status == "passed" for r in results),
        "digest": run.candidate_digest,
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
    }


def manifest_cases(run: Run) -> list[Any]:
    """The run's cases as its stored manifest expands them (empty when it cannot be read back)."""
    from qualify.manifest.cases import expand
    from qualify.manifest.load import ManifestError

    try:
        return expand(repo.run_manifest(run).release)
    except ManifestError:
        return []


def manifest_order(run: Run) -> dict[str, int]:
    """Case id -> position in the run's manifest, so reports list cases as the matrix does."""
    return {case.case_id: k for k, case in enumerate(manifest_cases(run))}


def images_view(run: Run, cases: Sequence[Any]) -> list[dict[str, Any]]:
    """Every image of the run (the release's own first, named release.name, then its further images) and the
    cases that ran in each: the report and `runs show` say which image each case used."""
    rows: list[dict[str, Any]] = []
    if run.image is not None:
        rows.append({"name": run.release.name, "repository": run.image.repository, "tag": run.image.tag,
                     "digest": run.image.digest, "builder": run.image.builder})
    rows += [{"name": r.name, "repository": r.image.repository, "tag": r.image.tag, "digest": r.digest,
              "builder": r.image.builder} for r in run.further_images]
    for row in rows:
        own = row["name"] == run.release.name
        row["cases"] = [c.case_id for c in cases if (c.image is None if own else c.image == row["name"])]
    return rows


def pull_line(pulls: Sequence[Mapping[str, Any]]) -> str | None:
    """`pulls: <image> on N node(s): a 12.3 s, b 0.4 s` for the run views; None when nothing was pulled."""
    if not pulls:
        return None
    images = sorted({str(p.get("image")) for p in pulls})
    each = ", ".join(f"{p.get('address')} {float(p.get('seconds') or 0.0):.1f} s" for p in pulls)
    return f"pulls: {', '.join(images)} on {len(pulls)} node(s) before the cases: {each}"


def build_line(build: Mapping[str, Any] | None) -> str | None:
    """`build: on the cluster, node <host> (<id>), 41.2 s, 1.2 MB of build files` (build.on: cluster); None else."""
    if not build:
        return None
    if "node_id" not in build:
        return f"build: {build.get('on') or 'on the driver'}"
    return (f"build: on the cluster, node {build.get('host')} ({str(build.get('node_id'))[:12]}), "
            f"{float(build.get('seconds') or 0.0):.1f} s, {int(build.get('archive_bytes') or 0) / 1e6:.1f} MB of "
            "build files shipped")


def run_detail(session: Session, run_id: int) -> dict[str, Any] | None:
    run = repo.get_run(session, run_id)
    if run is None:
        return None
    cases = manifest_cases(run)
    order = {case.case_id: k for k, case in enumerate(cases)}
    detail = run_summary(session, run)
    results = repo.case_results(session, run.id)
    spent, schedule = run_time(run, results, cases)
    image_of = {case.case_id: case.image or run.release.name for case in cases}
    detail.update({
        "repository": run.release.repository,
        "tag": run.release.tag,
        "image": ({"repository": run.image.repository, "tag": run.image.tag, "digest": run.image.digest,
                   "builder": run.image.builder} if run.image else None),
        "images": images_view(run, cases),
        "error": run.error,
        "triggered_by": run.triggered_by,
        "manifest_path": run.manifest_path,
        "manifest_sha256": run.manifest_sha256,
        "flow_run_id": run.flow_run_id,
        "stage_seconds": run.stage_seconds or {},
        "launch_time": {**spent.as_dict(), "line": spent.line()},
        "schedule": schedule.as_dict() if schedule else None,
        "pulls": pull_line((run.cluster or {}).get("pulls") or []),
        "build_where": build_line((run.cluster or {}).get("build")),
        "components": [
            {"name": c.name, "rule": c.rule, "expected": c.expected, "actual": c.actual, "ok": c.ok,
             "optional": c.optional, "detail": c.detail, "image": c.image or run.release.name}
            for c in repo.component_checks(session, run.id)
        ],
        "cases": [
            {"case_id": r.case_id, "kind": r.kind, "model": r.model, "variant": r.variant, "status": r.status,
             "error_class": r.error_class, "error": r.error, "metrics": r.metrics, "probes": r.probes,
             "samples": r.samples, "environment": r.environment, "log_tail": r.log_tail,
             "key_metrics": key_metrics(r), "attempts": r.attempts, "queue_wait_s": r.queue_wait_s,
             "exec_s": r.exec_s, "node": r.node, "image": image_of.get(r.case_id, run.release.name)}
            for r in sorted(results,
                            key=lambda r: (order.get(r.case_id, len(order)), r.case_id))
        ],
        "decisions": [
            {"id": d.id, "verdict": d.verdict, "reasons": d.reasons, "policy_sha256": d.policy_sha256,
             "baseline_run_id": d.baseline_run_id, "decided_at": iso(d.decided_at)}
            for d in repo.decisions(session, run.id)
        ],
        "promotions": [
            {"target_name": p.target_name, "target_ref": p.target_ref, "source_digest": p.source_digest,
             "outcome": p.outcome, "forced": p.forced, "reason": p.reason, "detail": p.detail,
             "created_at": iso(p.created_at)}
            for p in repo.promotions(session, run.id)
        ],
    })
    return detail


# --------------------------------------------------------------------------- dashboard views


def artifact_key(release_name: str, tag: str, what: str) -> str:
    """Dashboard keys version per release: qualify-<name>-<tag>-<what> (lowercase, digits, dashes)."""
    import re

    slug = re.sub(r"[^a-z0-9]+", "-", f"qualify-{release_name}-{tag}-{what}".lower()).strip("-")
    return slug[:100]


def results_table(detail: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per case with its key figures ("n/a" where absent: the old Prefect UI draws "-" as a bullet)."""
    rows = []
    for c in detail["cases"]:
        m = c["metrics"] or {}
        rows.append({
            "case": c["case_id"], "status": c["status"], "error class": c["error_class"] or "n/a",
            "tokens/s": fmt_number(m.get("tokens_per_s", m.get("output_tokens_per_s"))),
            "TFLOP/s per device": fmt_number(m.get("tflops_per_device")), "MFU": fmt_number(m.get("mfu")),
            "agreement": fmt_number(m.get("token_agreement")), "KL": fmt_number(m.get("kl_div_mean")),
            "attempts": c["attempts"], "exec s": fmt_number(c["exec_s"]),
        })
    return rows


def summary_markdown(detail: dict[str, Any], report_link: str) -> str:
    """The verdict, then what failed or is incomplete (first, where the eye lands), what was waived, the
    components that differ, the link to the HTML report (qualify.report.links), and only then the checks that
    passed."""
    decision = detail["decisions"][-1] if detail["decisions"] else None
    verdict = decision["verdict"] if decision else "no decision"
    lines = [f"# {detail['release']} run {detail['run']}: **{verdict}**", "",
             f"candidate `{detail['digest'] or 'n/a'}`, {len(detail['cases'])} cases, "
             f"{sum(c['status'] == 'passed' for c in detail['cases'])} passed", ""]
    lines += [f"HTML report (tables and charts): [{report_link}]({report_link})", ""]

    def table(reasons: list[dict[str, Any]]) -> list[str]:
        return (["| status | check | reason |", "|---|---|---|"]
                + [f"| {r['status']} | {r['check']} | {r['message'].replace('|', '/')} |" for r in reasons] + [""])

    groups = reasons_by_status(decision["reasons"]) if decision else {}
    attention = (groups.get("FAIL") or []) + (groups.get("INCOMPLETE") or [])
    if decision:
        if attention:
            lines += [f"## Needs attention: {len(groups.get('FAIL') or [])} failed, "
                      f"{len(groups.get('INCOMPLETE') or [])} incomplete", ""] + table(attention)
        else:
            lines += ["No check failed and none is incomplete.", ""]
        if groups.get("WAIVED"):
            lines += [f"## Waived ({len(groups['WAIVED'])})", ""] + table(groups["WAIVED"])
        if groups.get("NO-BASELINE"):
            lines += ["## Not compared with a baseline", ""] + table(groups["NO-BASELINE"])
        if groups.get("NOTE"):
            lines += [f"## Notes, not checks ({len(groups['NOTE'])})", ""] + table(groups["NOTE"])
    bad = [c for c in detail["components"] if not c["ok"]]
    lines += [f"components: {len(detail['components']) - len(bad)}/{len(detail['components'])} as expected"]
    lines += [f"- {c['name']}: expected {c['expected']} ({c['rule']}), found {c['actual'] or 'nothing'}" for c in bad]
    lines.append("")
    if detail.get("stage_seconds"):
        lines += ["stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in detail["stage_seconds"].items()), ""]
    if detail.get("launch_time"):
        lines += [detail["launch_time"]["line"], ""]
    if detail.get("schedule"):
        lines += [detail["schedule"]["line"], ""]
    if detail.get("build_where"):
        lines += [detail["build_where"], ""]
    if detail.get("pulls"):
        lines += [detail["pulls"], ""]
    if groups.get("PASS"):
        lines += [f"## Passed checks ({len(groups['PASS'])})", ""] + table(groups["PASS"])
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------- the HTML report's view


STATUS_ORDER = ("FAIL", "INCOMPLETE", "WAIVED", "NO-BASELINE", "PASS", "NOTE")


def policy_view(run: Run) -> dict[str, Any] | None:
    """The gate policy stored with the run (None when its manifest cannot be read back)."""
    from qualify.manifest.load import ManifestError

    try:
        manifest = repo.run_manifest(run).release
    except ManifestError:
        return None
    gate = manifest.gate.model_dump(mode="json")
    gate["previous_tag"] = manifest.release.previous_tag
    gate["repository"] = manifest.release.repository
    return gate


def calibrations_view(session: Session, run_id: int) -> list[dict[str, Any]]:
    """What `qualify calibrate` measured for the fingerprints of this run's results (per case and metric)."""
    import dataclasses

    from qualify.comparison import calibration_views
    from qualify.gate.calibration import key

    out: list[dict[str, Any]] = []
    for row in repo.case_results(session, run_id):
        if not row.fingerprint:
            continue
        for view in calibration_views(session, [key(row.fingerprint)], "*"):
            out.append({"case_id": row.case_id, **dataclasses.asdict(view), "line": view.line()})
    return out


def report_view(session: Session, run_id: int) -> dict[str, Any] | None:
    """Everything the HTML report shows: the run's detail, its stored policy, and the comparison with the
    baseline run the gate used (per case and metric, with the gate's rule: qualify.comparison)."""
    from qualify.comparison import compare_runs, describe_run

    detail = run_detail(session, run_id)
    if detail is None:
        return None
    run = repo.get_run(session, run_id)
    assert run is not None
    detail["policy"] = policy_view(run)
    detail["earlier_runs"] = earlier_runs(session, run)
    detail["calibrations"] = calibrations_view(session, run_id)
    decision = detail["decisions"][-1] if detail["decisions"] else None
    detail["baseline"] = None
    detail["baseline_note"] = None
    base_id = decision["baseline_run_id"] if decision else None
    base_run = repo.get_run(session, base_id) if base_id else None
    detail["baseline_components"] = ({"run": base_run.id, "release": f"{base_run.release.name}:{base_run.release.tag}",
                                      "actual": {c.name: c.actual for c in repo.component_checks(session, base_run.id)}}
                                     if base_run is not None else None)
    mode = detail["policy"].get("regression", {}).get("baseline")
    if mode in ("paired", "duet"):
        # The baseline was measured beside the candidate (paired) or at the same time (duet): the gate's own figures
        # are the comparison; the stored results of another run are not what it judged.
        detail[mode] = [{"case_id": r.get("case_id"), "status": r["status"], "message": r["message"],
                         **(r.get("figures") or {})}
                        for r in (decision["reasons"] if decision else []) if r["check"] == "regression"]
        if not decision:
            detail["baseline_note"] = "the run has no gate decision yet"
    elif base_run is not None:
        comparison = compare_runs(session, describe_run(session, base_run, "the baseline run the gate used"),
                                  describe_run(session, run, "this run"))
        view = comparison.to_dict()
        gate_status = {(r.get("case_id"), (r.get("figures") or {}).get("metric")): r["status"]
                       for r in decision["reasons"] if r["check"] == "regression"} if decision else {}
        for row in view["rows"]:
            row["gate_status"] = gate_status.get((row["case_id"], row["metric"]))
        detail["baseline"] = view
    elif decision:
        notes = [r["message"] for r in decision["reasons"] if r["check"] == "regression" and not r.get("case_id")]
        detail["baseline_note"] = notes[0] if notes else "the gate compared with no baseline run"
    else:
        detail["baseline_note"] = "the run has no gate decision yet"
    return detail


def earlier_runs(session: Session, run: Run, limit: int = 10) -> list[dict[str, Any]]:
    """The other runs (earlier or later) of the same candidate digest or release tag, newest first, with verdicts:
    what a release manager asks first (was this image judged before, and how?)."""
    seen: dict[int, Run] = {}
    if run.candidate_digest:
        seen.update({r.id: r for r in repo.find_runs(session, digest=run.candidate_digest, limit=limit + 1)})
    seen.update({r.id: r for r in repo.find_runs(session, release=run.release.name, tag=run.release.tag,
                                                 limit=limit + 1)})
    others = sorted((r for r in seen.values() if r.id != run.id), key=lambda r: r.id, reverse=True)[:limit]
    rows = []
    for other in others:
        decision = repo.latest_decision(session, other.id)
        rows.append({"run": other.id, "release": f"{other.release.name}:{other.release.tag}",
                     "digest": other.candidate_digest, "same_digest": other.candidate_digest == run.candidate_digest,
                     "status": other.status, "verdict": decision.verdict if decision else None,
                     "started_at": iso(other.started_at)})
    return rows


def reasons_by_status(reasons: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Reasons grouped FAIL, INCOMPLETE, WAIVED, NO-BASELINE, PASS, NOTE (what needs attention first)."""
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in STATUS_ORDER}
    for reason in reasons:
        out.setdefault(reason["status"], []).append(reason)
    return out
