"""What a tag-form question (`gate check REPO:TAG`, `GET /v1/gate?ref=REPO:TAG`) judged: the digest the tag
points to NOW, in the registry, which before a push is the image already there, not the one about to be pushed.
Both answers say so; the digest form (REPO@DIGEST, or REPO:TAG@DIGEST) is the one to ask before a push."""

from __future__ import annotations

from qualify.imageref import ImageRef


def judged_note(ref: ImageRef, digest: str) -> str | None:
    """The note for a tag-form answer (None for the digest form: the caller named the digest)."""
    if ref.digest:
        return None
    return (f"judged {digest}: the digest {ref} points to now in the registry; before a push, ask about the "
            f"digest you are about to push ({ref.name}@sha256:...)")
