"""`qualify promote`: copy a PASS run's candidate, by digest, to its promotion targets.

Exit 0 when every target is promoted or already there, 1 when refused, 3 when a registry failed,
2 for bad input (unknown run or target, --force without --reason).
"""

from __future__ import annotations

import json
from typing import Optional

import typer

from qualify.cli.common import DbOption, InsecureOption, exit_with, open_db, say, warn
from qualify.promote import PromotionRefused, TargetOutcome, exit_code, promote_run


def promote(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
            dry_run: bool = typer.Option(False, "--dry-run", help="print the plan; change nothing (nothing is recorded)"),
            target: Optional[str] = typer.Option(None, "--target", metavar="NAME",
                                                 help="only this target (a template name selects all its regions)"),
            force: bool = typer.Option(False, "--force", help="move a destination tag that points elsewhere"),
            reason: Optional[str] = typer.Option(None, "--reason", metavar="TEXT", help="why --force (recorded)"),
            insecure_registry: Optional[list[str]] = InsecureOption,
            as_json: bool = typer.Option(False, "--json", help="print the outcomes as JSON")) -> None:
    """Copy a PASS run's candidate, by digest, to its promotion targets; record each target."""
    refused: PromotionRefused | None = None
    try:
        outcomes = promote_run(open_db(db), run_id, dry_run=dry_run, target=target, force=force, reason=reason,
                               insecure=insecure_registry or ())
    except PromotionRefused as exc:  # an outcome with per-target detail, printed like the others
        refused, outcomes = exc, exc.outcomes
    code = exit_code(outcomes) if refused is None else refused.exit_code
    if as_json:
        print(json.dumps({"run": run_id, "dry_run": dry_run, "refused": str(refused) if refused else None,
                          "targets": [o.to_dict() for o in outcomes]}, indent=2, default=str))
        exit_with(code)
    if refused is not None:
        warn(f"refused: {refused}")
        exit_with(code)
    _print_outcomes(run_id, outcomes, dry_run)
    exit_with(code)


def _print_outcomes(run_id: int, outcomes: list[TargetOutcome], dry_run: bool) -> None:
    if outcomes:
        first = outcomes[0]
        say(f"{'plan' if dry_run else 'promotion'} of run {run_id}: {first.source_ref}@{first.source_digest}")
    for o in outcomes:
        label = o.planned if dry_run else o.outcome
        say(f"  {label:<10} {o.target}: {o.target_ref}" + (f" ({o.detail})" if o.detail else ""))
    for o in outcomes:
        if o.outcome in ("failed", "refused"):
            warn(f"error: {o.target} {o.outcome}: {o.detail}")
