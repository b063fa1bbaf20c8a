"""`qualify gate evaluate|show|check`: judge runs, show decisions, and answer CI's push gate.

`gate check` takes the LATEST decision about the digest: a later FAIL (e.g. a re-evaluation after
a waiver expired, or a stricter policy) overrides an earlier PASS, so a digest that was once good
but has since been judged bad is not pushed. Exit 0 only for PASS; 1 for no decision, FAIL or
INCOMPLETE; 2 for a bad or unknown reference; 3 when the registry or database cannot answer.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Optional

import typer

from qualify.cli.common import DbOption, InsecureOption, JsonOption, exit_with, new_app, open_db, say
from qualify.errors import BadInput, ExitCode
from qualify.gate.service import decision_dict, evaluate_and_commit
from qualify.outcomes import Verdict
from qualify.imageref import parse_reference
from qualify.registry import RegistryClient, RegistryError
from qualify.store import repo

gate_app = new_app(help="Judge runs against their gate policy; check digests.")


def _print_reasons(reasons: list[dict[str, Any]]) -> None:
    for reason in reasons:  # the stored message starts with its case id when it has one
        say(f"  {reason['status']:<11} {reason['check']}: {reason['message']}")


def _verdict_exit(verdict: str | None) -> ExitCode:
    return ExitCode.OK if verdict == Verdict.PASS else ExitCode.FAIL


@gate_app.command("evaluate")
def gate_evaluate(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
                  today: Optional[str] = typer.Option(None, "--today", metavar="YYYY-MM-DD",
                                                      help="judge waiver expiry as of this date (default: today)"),
                  as_json: bool = typer.Option(False, "--json", help="print the decision as JSON")) -> None:
    """Evaluate a run again and record a new decision (exit 0 PASS, 1 FAIL or INCOMPLETE)."""
    day = None
    if today:
        try:
            day = dt.date.fromisoformat(today)
        except ValueError:
            raise BadInput(f"--today {today!r} is not a date (YYYY-MM-DD)") from None
    evaluation = evaluate_and_commit(open_db(db), run_id, today=day)
    decision, verdict = evaluation.decision, evaluation.judgement
    if as_json:
        print(json.dumps(decision_dict(decision), indent=2, default=str))
    else:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(verdict.counts().items()))
        say(f"run {run_id}: {verdict.verdict} (decision {decision.id}, {counts}; "
            f"baseline run {evaluation.baseline_run_id or 'none'})")
        _print_reasons(decision.reasons)
    exit_with(_verdict_exit(verdict.verdict))


@gate_app.command("show")
def gate_show(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
              show_all: bool = typer.Option(False, "--all", help="every decision, not only the latest"),
              as_json: bool = JsonOption) -> None:
    """The run's decisions (the latest, or all with --all); exit 0 when shown."""
    with open_db(db, migrate=False)() as session:
        run = repo.get_run(session, run_id)
        if run is None:
            raise BadInput(f"no run {run_id}")
        rows = [decision_dict(d) for d in repo.decisions(session, run_id)]
        label = f"{run.release.name}:{run.release.tag}"
    shown = rows if show_all else rows[-1:]
    if as_json:
        print(json.dumps({"run": run_id, "release": label, "decisions": shown}, indent=2, default=str))
        return
    if not rows:
        say(f"run {run_id} ({label}) has no gate decision yet: qualify gate evaluate {run_id}")
        return
    if not show_all and len(rows) > 1:
        say(f"run {run_id} ({label}): {len(rows)} decisions, the latest:")
    for d in shown:
        say(f"decision {d['id']} at {str(d['decided_at'])[:19]}: {d['verdict']} "
            f"digest={d['digest'] or 'n/a'} policy={d['policy_sha256'][:12]} "
            f"baseline run={d['baseline_run_id'] or 'none'}")
        _print_reasons(d["reasons"])


def _resolve_digest(image_ref: str, insecure: list[str]) -> str:
    ref = parse_reference(image_ref)
    if ref.digest is not None:  # a digest reference needs no registry call
        return ref.digest
    try:
        with RegistryClient(insecure) as client:
            return client.resolve(ref)
    except RegistryError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. an URL httpx refuses: the reference is at fault
        raise BadInput(f"cannot resolve {image_ref}: {type(exc).__name__}: {exc}") from None


@gate_app.command("check")
def gate_check(image_ref: str = typer.Argument(..., metavar="IMAGE_REF"), db: Optional[str] = DbOption,
               insecure_registry: Optional[list[str]] = InsecureOption,
               as_json: bool = JsonOption) -> None:
    """Exit 0 only when the image's digest has a PASS as its latest decision (for CI push gates)."""
    digest = _resolve_digest(image_ref, insecure_registry or [])
    with open_db(db, migrate=False)() as session:
        latest = repo.latest_decision_for_digest(session, digest)
        earlier_pass = (repo.latest_pass_for_digest(session, digest)
                        if latest and latest.verdict != Verdict.PASS else None)
        run = repo.get_run(session, latest.run_id) if latest else None
        info: dict[str, Any] = {"reference": image_ref, "digest": digest,
                                "verdict": latest.verdict if latest else None,
                                "decision": latest.id if latest else None,
                                "run": latest.run_id if latest else None,
                                "release": f"{run.release.name}:{run.release.tag}" if run else None,
                                "decided_at": latest.decided_at.isoformat() if latest else None,
                                "overrides_pass_decision": earlier_pass.id if earlier_pass else None,
                                "reasons": [r for r in (latest.reasons if latest else [])
                                            if r.get("status") in ("FAIL", "INCOMPLETE")]}
    code = _verdict_exit(info["verdict"])
    if as_json:
        print(json.dumps(info, indent=2, default=str))
        exit_with(code)
    if info["verdict"] is None:
        say(f"NO DECISION: {image_ref} ({digest}) has never been judged by the gate")
        exit_with(code)
    say(f"{info['verdict']}: {image_ref} ({digest}) run {info['run']} release {info['release']} "
        f"decision {info['decision']} at {info['decided_at'][:19]}")
    if code != ExitCode.OK:
        if earlier_pass is not None:
            say(f"  (an earlier PASS, decision {info['overrides_pass_decision']}, is overridden: "
                "the latest decision wins)")
        _print_reasons(info["reasons"])
    exit_with(code)
