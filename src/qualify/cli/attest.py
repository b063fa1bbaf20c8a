"""`qualify attest RUN` (write or re-write a run's signed attestations) and `qualify verify IMAGE_REF --key PUB`
(offline: signature, subject, result and freshness; exit codes as `gate check`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from qualify.cli.common import DbOption, InsecureOption, JsonOption, exit_with, open_db, say, settings
from qualify.errors import BadInput, ExitCode
from qualify.imageref import ImageRef, parse_reference
from qualify.registry import RegistryClient, RegistryError

if TYPE_CHECKING:
    from qualify.attest.check import VerifyResult

# qualify.attest (cryptography, securesystemslib, in-toto-attestation, protobuf: about 0.3 s) is imported by the
# commands that use it, not by every command's start-up.

KeyOption = typer.Option(..., "--key", metavar="PUB", help="the public key (PEM) the attestation must verify with")


def attest(run_id: int = typer.Argument(..., metavar="RUN"), db: Optional[str] = DbOption,
           insecure_registry: Optional[list[str]] = InsecureOption) -> None:
    """Sign the run's latest decision and store it next to the image and its promoted copies (the key comes
    from QUALIFY_ATTEST_KEY_FILE or QUALIFY_ATTEST_KEY, never the command line)."""
    from qualify.attest.service import AttestStatus, write_for_run

    conf = settings(db)
    with RegistryClient(set(insecure_registry or []) | set(conf.insecure_registries)) as client:
        outcome = write_for_run(open_db(db, migrate=False), run_id, settings=conf, client=client)
    if outcome.status == AttestStatus.NO_KEY:
        raise BadInput(outcome.detail)
    if outcome.status == AttestStatus.NO_REGISTRY_IMAGE:
        raise BadInput(outcome.detail)
    say(f"run {run_id}: {outcome.detail}")
    for written in outcome.written:
        say(f"  {written.reference} ({written.scheme}, {written.manifest_digest})")


def resolve(ref: ImageRef, client: RegistryClient) -> tuple[str, str | None]:
    """(digest, what the tag resolves to) of a reference; a digest reference with a tag must agree."""
    try:
        tag_digest = client.resolve(ref.with_tag(ref.tag)) if ref.tag else None
    except RegistryError:
        raise
    except Exception as exc:  # noqa: BLE001 - an URL httpx refuses: the reference is at fault
        raise BadInput(f"cannot resolve {ref}: {type(exc).__name__}: {exc}") from None
    digest = ref.digest or tag_digest
    if digest is None:
        raise BadInput(f"{ref}: give a tag or a digest")
    return digest, tag_digest


def verify_reference(image_ref: str, key: Path, insecure: list[str], *, policy_digest: str | None = None,
                     max_age: str | None = None, release: str | None = None) -> VerifyResult:
    from qualify.attest.check import check_reference, parse_age
    from qualify.attest.signing import load_public_key

    ref = parse_reference(image_ref)
    public = load_public_key(key)
    age = parse_age(max_age) if max_age is not None else None
    with RegistryClient(set(insecure) | set(settings().insecure_registries)) as client:
        digest, tag_digest = resolve(ref, client)
        result = check_reference(client, ref, digest, public, policy_digest=policy_digest, max_age=age,
                                 release_name=release)
    if tag_digest is not None and tag_digest != digest:
        result.problems.append(f"tag {ref.tag} resolves to {tag_digest}, not {digest}")
    return result


def report(result: VerifyResult, image_ref: str, as_json: bool) -> None:
    code = ExitCode.OK if result.ok and not result.problems else ExitCode.FAIL
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
        exit_with(code)
    if result.result is None:
        say(f"NO ATTESTATION: {image_ref} ({result.digest}) has no qualify attestation that verifies with the key")
    else:
        label = "PASS" if code == ExitCode.OK else f"REFUSED ({result.result})"
        say(f"{label}: {image_ref} ({result.digest}) verdict {result.verdict or 'n/a'} release {result.release} "
            f"run {result.run} decision {result.decision} verified at {result.time_verified} "
            f"policy {str(result.policy_digest)[:12]}")
    for problem in result.problems:
        say(f"  refused: {problem}")
    for reason in result.reasons:
        say(f"  {reason['status']:<11} {reason['check']}: {reason['reason']}")
    for line in result.rejected:
        say(f"  not counted: {line}")
    exit_with(code)


def verify(image_ref: str = typer.Argument(..., metavar="IMAGE_REF"), key: Path = KeyOption,
           policy_digest: Optional[str] = typer.Option(None, "--policy-digest", metavar="D",
                                                       help="require this gate policy sha256 (a prefix)"),
           max_age: Optional[str] = typer.Option(None, "--max-age", metavar="AGE",
                                                 help="refuse an attestation older than this (7d, 12h, 30m)"),
           insecure_registry: Optional[list[str]] = InsecureOption, as_json: bool = JsonOption) -> None:
    """Exit 0 only when the image's signed attestation verifies with the key, is about its digest, says PASSED
    for this repository, and meets --policy-digest and --max-age. No database needed."""
    result = verify_reference(image_ref, key, insecure_registry or [], policy_digest=policy_digest, max_age=max_age)
    report(result, image_ref, as_json)
