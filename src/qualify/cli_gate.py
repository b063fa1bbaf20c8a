"""`qualify gate evaluate|show|check` and `qualify promote`.

Exit codes (qualify.exitcodes): evaluate 0 PASS, 1 FAIL/INCOMPLETE; check 0 when the digest's
latest decision is PASS, 1 when it has none or the latest is FAIL/INCOMPLETE, 2 for a bad
reference or a registry that cannot resolve it; promote 0 when every target is promoted or
already there, 1 when refused, 3 when a registry failed; 2 for bad input; 3 for the database.

`gate check` takes the LATEST decision about the digest: a later FAIL (e.g. a re-evaluation
after a waiver expired, or a stricter policy) overrides an earlier PASS, so a digest that was
once good but has since been judged bad is not pushed.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Optional

import typer

from qualify import exitcodes

gate_app = typer.Typer(no_args_is_help=True, help="Judge runs against their gate policy; check digests.")

DbOption = typer.Option(None, "--db", help="database URL (default: QUALIFY_DATABASE_URL or SQLite in the data dir)")
InsecureOption = typer.Option(None, "--insecure-registry", metavar="HOST:PORT",
                              help="registry reached over plain HTTP (repeatable; loopback tests)")


def _cli():  # type: ignore[no-untyped-def]
    from qualify import cli

    return cli


def _say(text: str) -> None:
    """One line on stdout, never wrapped (CI logs grep these)."""
    _cli().out.print(text, markup=False, highlight=False, soft_wrap=True)


def _fail(code: int, *lines: str) -> typer.Exit:
    """Like cli.fail, one unwrapped line per problem on stderr."""
    for line in lines:
        _cli().err.print(line, markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _print_reasons(reasons: list[dict[str, Any]]) -> None:
    for reason in reasons:  # the stored message starts with its case id when it has one
        _say(f"  {reason['status']:<11} {reason['check']}: {reason['message']}")


def _db_guard(exc: Exception) -> typer.Exit:
    return _fail(exitcodes.INFRA, f"error: database: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")


@gate_app.command("evaluate")
def gate_evaluate(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
                  today: Optional[str] = typer.Option(None, "--today", metavar="YYYY-MM-DD",
                                                      help="judge waiver expiry as of this date (default: today)"),
                  as_json: bool = typer.Option(False, "--json", help="print the decision as JSON")) -> None:
    """Evaluate a run again and record a new decision (exit 0 PASS, 1 FAIL or INCOMPLETE)."""
    from sqlalchemy.exc import SQLAlchemyError

    from qualify.gate.service import GateError, evaluate_and_commit

    cli = _cli()
    day = None
    if today:
        try:
            day = dt.date.fromisoformat(today)
        except ValueError:
            raise _fail(exitcodes.BAD_INPUT, f"error: --today {today!r} is not a date (YYYY-MM-DD)") from None
    _, sessions = cli.open_db(db)
    try:
        evaluation = evaluate_and_commit(sessions, run_id, today=day)
    except GateError as exc:
        raise _fail(exitcodes.BAD_INPUT, f"error: {exc}") from None
    except SQLAlchemyError as exc:
        raise _db_guard(exc) from None
    decision, verdict = evaluation.decision, evaluation.verdict
    if as_json:
        from qualify.gate.service import decision_dict

        print(json.dumps(decision_dict(decision), indent=2, default=str))
    else:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(verdict.counts().items()))
        _say(f"run {run_id}: {verdict.verdict} (decision {decision.id}, {counts}; "
             f"baseline run {evaluation.baseline_run_id or 'none'})")
        _print_reasons(decision.reasons)
    raise typer.Exit(exitcodes.OK if verdict.verdict == "PASS" else exitcodes.FAIL)


@gate_app.command("show")
def gate_show(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
              show_all: bool = typer.Option(False, "--all", help="every decision, not only the latest"),
              as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """The run's decisions (the latest, or all with --all); exit 0 when shown."""
    from sqlalchemy.exc import SQLAlchemyError

    from qualify.gate.service import decision_dict
    from qualify.store import repo

    cli = _cli()
    _, sessions = cli.open_db(db)
    try:
        with sessions() as session:
            run = repo.get_run(session, run_id)
            if run is None:
                raise _fail(exitcodes.BAD_INPUT, f"error: no run {run_id}")
            rows = [decision_dict(d) for d in repo.decisions(session, run_id)]
            label = f"{run.release.name}:{run.release.tag}"
    except SQLAlchemyError as exc:
        raise _db_guard(exc) from None
    shown = rows if show_all else rows[-1:]
    if as_json:
        print(json.dumps({"run": run_id, "release": label, "decisions": shown}, indent=2, default=str))
        return
    if not rows:
        _say(f"run {run_id} ({label}) has no gate decision yet: qualify gate evaluate {run_id}")
        return
    if not show_all and len(rows) > 1:
        _say(f"run {run_id} ({label}): {len(rows)} decisions, the latest:")
    for d in shown:
        _say(f"decision {d['id']} at {str(d['decided_at'])[:19]}: {d['verdict']} "
             f"digest={d['digest'] or 'n/a'} policy={d['policy_sha256'][:12]} "
             f"baseline run={d['baseline_run_id'] or 'none'}")
        _print_reasons(d["reasons"])


@gate_app.command("check")
def gate_check(image_ref: str = typer.Argument(..., metavar="IMAGE_REF"), db: Optional[str] = DbOption,
               insecure_registry: Optional[list[str]] = InsecureOption,
               as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Exit 0 only when the image's digest has a PASS as its latest decision (for CI push gates)."""
    from sqlalchemy.exc import SQLAlchemyError

    from qualify.imageref import InvalidReference, parse_reference
    from qualify.registry import RegistryClient, RegistryError
    from qualify.store import repo

    cli = _cli()
    try:
        ref = parse_reference(image_ref)
    except InvalidReference as exc:
        raise _fail(exitcodes.BAD_INPUT, f"error: {exc}") from None
    digest = ref.digest
    if digest is None:  # a digest reference needs no registry call
        try:
            with RegistryClient(insecure_registry or ()) as client:
                digest = client.resolve(ref)
        except RegistryError as exc:
            raise _fail(exitcodes.BAD_INPUT, f"error: cannot resolve {image_ref}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - e.g. an URL httpx refuses; one line, no traceback
            raise _fail(exitcodes.BAD_INPUT, f"error: cannot resolve {image_ref}: {type(exc).__name__}: {exc}") from None
    _, sessions = cli.open_db(db)
    try:
        with sessions() as session:
            latest = repo.latest_decision_for_digest(session, digest)
            earlier_pass = repo.latest_pass_for_digest(session, digest) if latest and latest.verdict != "PASS" else None
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
    except SQLAlchemyError as exc:
        raise _db_guard(exc) from None
    ok = info["verdict"] == "PASS"
    if as_json:
        print(json.dumps(info, indent=2, default=str))
        raise typer.Exit(exitcodes.OK if ok else exitcodes.FAIL)
    if info["verdict"] is None:
        _say(f"NO DECISION: {image_ref} ({digest}) has never been judged by the gate")
        raise typer.Exit(exitcodes.FAIL)
    head = (f"{info['verdict']}: {image_ref} ({digest}) run {info['run']} release {info['release']} "
            f"decision {info['decision']} at {info['decided_at'][:19]}")
    _say(head)
    if not ok:
        if earlier_pass is not None:
            _say(f"  (an earlier PASS, decision {info['overrides_pass_decision']}, is overridden: "
                 "the latest decision wins)")
        _print_reasons(info["reasons"])
    raise typer.Exit(exitcodes.OK if ok else exitcodes.FAIL)


def promote(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
            dry_run: bool = typer.Option(False, "--dry-run", help="print the plan; change nothing (nothing is recorded)"),
            target: Optional[str] = typer.Option(None, "--target", metavar="NAME",
                                                 help="only this target (a template name selects all its regions)"),
            force: bool = typer.Option(False, "--force", help="move a destination tag that points elsewhere"),
            reason: Optional[str] = typer.Option(None, "--reason", metavar="TEXT", help="why --force (recorded)"),
            insecure_registry: Optional[list[str]] = InsecureOption,
            as_json: bool = typer.Option(False, "--json", help="print the outcomes as JSON")) -> None:
    """Copy a PASS run's candidate, by digest, to its promotion targets; record each target."""
    from sqlalchemy.exc import SQLAlchemyError

    from qualify.promote import PromotionError, PromotionRefused, exit_code, promote_run

    cli = _cli()
    _, sessions = cli.open_db(db)
    try:
        outcomes = promote_run(sessions, run_id, dry_run=dry_run, target=target, force=force, reason=reason,
                               insecure=insecure_registry or ())
        code = exit_code(outcomes)
        refused_message = None
    except PromotionError as exc:
        raise _fail(exitcodes.BAD_INPUT, f"error: {exc}") from None
    except PromotionRefused as exc:
        outcomes, code, refused_message = exc.outcomes, exitcodes.FAIL, str(exc)
    except SQLAlchemyError as exc:
        raise _db_guard(exc) from None
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        raise _fail(exitcodes.INFRA, f"error: promotion of run {run_id} stopped: {type(exc).__name__}: {exc}") from None
    if as_json:
        print(json.dumps({"run": run_id, "dry_run": dry_run, "refused": refused_message,
                          "targets": [o.to_dict() for o in outcomes]}, indent=2, default=str))
        raise typer.Exit(code)
    if refused_message:
        _cli().err.print(f"refused: {refused_message}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(code)
    if outcomes:
        first = outcomes[0]
        _say(f"{'plan' if dry_run else 'promotion'} of run {run_id}: {first.source_ref}@{first.source_digest}")
    for o in outcomes:
        label = o.planned if dry_run else o.outcome
        _say(f"  {label:<10} {o.target}: {o.target_ref}" + (f" ({o.detail})" if o.detail else ""))
    for o in outcomes:
        if o.outcome in ("failed", "refused"):
            _cli().err.print(f"error: {o.target} {o.outcome}: {o.detail}", markup=False, highlight=False,
                             soft_wrap=True)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.add_typer(gate_app, name="gate")
    app.command("promote")(promote)
