"""`qualify gate evaluate|show|check`: judge runs, show decisions, and answer CI's push gate.

`gate check` takes the LATEST decision about the digest: a later FAIL (e.g. a re-evaluation after
a waiver expired, or a stricter policy) overrides an earlier PASS, so a digest that was once good
but has since been judged bad is not pushed. Exit 0 only for PASS; 1 for no decision, FAIL or
INCOMPLETE; 2 for a bad or unknown reference; 3 when the registry or database cannot answer.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Optional

import typer

from qualify.cli.common import DbOption, InsecureOption, JsonOption, examples, exit_with, new_app, open_db, say
from qualify.errors import BadInput, ExitCode
from qualify.outcomes import Verdict
from qualify.report.verdict_text import reason_lines
from qualify.gate import check_answer
from qualify.gate.judged import judged_note
from qualify.gate.push_check import check_push
from qualify.imageref import ImageRef, parse_reference
from qualify.store import repo

gate_app = new_app(help="Judge runs against their gate policy; check digests.")


VerboseOption = typer.Option(False, "--verbose", "-v", help="list every check, the passed ones too")


def _print_reasons(reasons: list[dict[str, Any]], verbose: bool = False) -> None:
    """What failed or could not be judged first; the passed checks as a count unless --verbose."""
    for line in reason_lines(reasons, verbose):  # the stored message starts with its case id when it has one
        say(f"  {line}")


def _verdict_exit(verdict: str | None) -> ExitCode:
    return ExitCode.OK if verdict == Verdict.PASS else ExitCode.FAIL


@gate_app.command("evaluate", epilog=examples("qualify gate evaluate 12 --verbose"))
def gate_evaluate(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
                  dry_run: bool = typer.Option(False, "--dry-run", help="judge and print; record nothing"),
                  today: Optional[str] = typer.Option(None, "--today", metavar="YYYY-MM-DD",
                                                      help="with --dry-run: judge waiver expiry as of this date"),
                  as_json: bool = typer.Option(False, "--json", help="print the decision as JSON"),
                  verbose: bool = VerboseOption) -> None:
    """Evaluate a run again and record a new decision (exit 0 PASS, 1 FAIL or INCOMPLETE).

    Decisions are judged as of today; another date only in a dry evaluation, which is never stored
    (so it can never be the PASS that `gate check` or `promote` trusts)."""
    day = None
    if today:
        try:
            day = dt.date.fromisoformat(today)
        except ValueError:
            raise BadInput(f"--today {today!r} is not a date (YYYY-MM-DD)") from None
        if not dry_run and day != dt.date.today():
            raise BadInput(f"--today {today}: a decision judged as of another day than today is never recorded; "
                           "add --dry-run to see what that date would give")
    from qualify.gate.judging import decision_dict, evaluate_and_commit  # the checks: not for `gate check`

    evaluation = evaluate_and_commit(open_db(db), run_id, today=day, record=not dry_run)
    judgement = evaluation.judgement
    if as_json:
        body = (decision_dict(evaluation.decision) if evaluation.decision is not None else
                {"run": run_id, "dry_run": True, "verdict": judgement.verdict, "judged_on": str(day or dt.date.today()),
                 "reasons": judgement.reason_dicts()})
        print(json.dumps(body, indent=2, default=str))
    else:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(judgement.counts().items()))
        what = (f"decision {evaluation.decision.id}" if evaluation.decision is not None else
                f"dry run as of {day or dt.date.today()}, not recorded")
        say(f"run {run_id}: {judgement.verdict} ({what}, {counts}; "
            f"baseline run {evaluation.baseline_run_id or 'none'})")
        _print_reasons(judgement.reason_dicts(), verbose)
    exit_with(_verdict_exit(judgement.verdict))


@gate_app.command("show")
def gate_show(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
              show_all: bool = typer.Option(False, "--all", help="every decision, not only the latest"),
              as_json: bool = JsonOption, verbose: bool = VerboseOption) -> None:
    """The run's decisions (the latest, or all with --all); exit 0 when shown."""
    from qualify.gate.judging import decision_dict

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
        _print_reasons(d["reasons"], verbose)


def _resolve_tag(ref: ImageRef, insecure: list[str]) -> str:
    from qualify.registry import RegistryClient, RegistryError  # only a tag is resolved: a digest check needs no HTTP

    try:
        with RegistryClient(insecure) as client:
            return client.resolve(ref.with_tag(ref.tag or "latest"))
    except RegistryError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. an URL httpx refuses: the reference is at fault
        raise BadInput(f"cannot resolve {ref}: {type(exc).__name__}: {exc}") from None


@gate_app.command("check", epilog=examples(
    "qualify gate check 127.0.0.1:5000/qualify/training-xpu-pytorch:25.05 && podman push ...",
    "qualify gate check registry.example.com/team/img@sha256:... --json"))
def gate_check(image_ref: str = typer.Argument(..., metavar="IMAGE_REF"), db: Optional[str] = DbOption,
               insecure_registry: Optional[list[str]] = InsecureOption,
               release: Optional[str] = typer.Option(None, "--release", metavar="NAME",
                                                     help="also require the decision to be about this release"),
               policy: Optional[str] = typer.Option(None, "--policy", metavar="SHA256",
                                                    help="also require this gate policy hash (a prefix)"),
               attestation: bool = typer.Option(False, "--attestation",
                                                help="answer from the registry's signed attestation, not the database"),
               key: Optional[Path] = typer.Option(None, "--key", metavar="PUB",
                                                  help="with --attestation: the public key (PEM)"),
               as_json: bool = JsonOption) -> None:
    """Exit 0 only when the reference may be pushed: its digest's latest decision is PASS, its repository is
    the qualified one (or a promotion target), and its tag (if any) resolves to that digest."""
    if attestation or key is not None:  # CI without a database: the same rules, read from the attestation
        if not (attestation and key is not None):
            raise BadInput("--attestation and --key PUB go together")
        from qualify.cli.attest import report, verify_reference

        report(verify_reference(image_ref, key, insecure_registry or [], policy_digest=policy, release=release),
               image_ref, as_json)
    ref = parse_reference(image_ref)
    tag_digest = _resolve_tag(ref, insecure_registry or []) if ref.tag else None
    digest = ref.digest or tag_digest
    assert digest is not None
    with open_db(db, migrate=False)() as session:
        result = check_push(session, ref, digest, tag_digest=tag_digest, release_name=release, policy_sha256=policy)
    note = judged_note(ref, digest)  # the tag form judged what the tag points to now
    if as_json:
        print(check_answer.as_json(result, note))
    else:
        for line in check_answer.lines(result, image_ref, digest, note):
            say(line)
    exit_with(check_answer.exit_code(result))
