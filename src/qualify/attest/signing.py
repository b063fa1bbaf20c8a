"""Keys and DSSE envelopes (securesystemslib): sign a statement, verify an envelope with a public key.

The signing key comes from settings only (a PEM file, or the PEM itself in an environment variable; never
argv): ECDSA P-256 or Ed25519, as cosign and Kyverno verify them. No key configured means no attestation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey

from qualify.errors import BadInput

# The DSSE payload type cosign writes and verifies for in-toto statements.
PAYLOAD_TYPE = "application/vnd.in-toto+json"


class AttestKeyError(BadInput):
    """A key in the settings or on the command line cannot be used (exit 2)."""


@dataclass(frozen=True)
class SigningKey:
    signer: CryptoSigner
    source: str  # where it came from (a path or a variable name), never the key

    @property
    def keyid(self) -> str:
        return self.signer.public_key.keyid


def _check_type(key: object, where: str) -> None:
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        if key.curve.name != "secp256r1":
            raise AttestKeyError(f"{where}: ECDSA key on {key.curve.name}: use P-256 (secp256r1) or Ed25519")
        return
    if not isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        raise AttestKeyError(f"{where}: a {type(key).__name__.lstrip('_')}: use an ECDSA P-256 or Ed25519 key")


def load_signing_key(pem: bytes, source: str, password: str | None = None) -> SigningKey:
    try:
        private = serialization.load_pem_private_key(pem, password.encode() if password else None)
    except (ValueError, TypeError) as exc:
        raise AttestKeyError(f"{source}: not a usable PEM private key ({exc})") from None
    _check_type(private, source)
    return SigningKey(CryptoSigner(private), source)  # type: ignore[arg-type]


def load_public_key(path: Path) -> SSlibKey:
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise AttestKeyError(f"--key {path}: {exc.strerror or exc}") from None
    try:
        public = serialization.load_pem_public_key(pem)
    except ValueError as exc:
        raise AttestKeyError(f"--key {path}: not a PEM public key ({exc})") from None
    _check_type(public, f"--key {path}")
    return SSlibKey.from_crypto(public)  # type: ignore[arg-type]


def sign(statement_payload: bytes, key: SigningKey) -> dict[str, Any]:
    """A DSSE envelope (as a dict: payloadType, payload, signatures) over the statement bytes."""
    envelope = Envelope(statement_payload, PAYLOAD_TYPE, {})
    envelope.sign(key.signer)
    return envelope.to_dict()


def envelope_bytes(envelope: dict[str, Any]) -> bytes:
    return json.dumps(envelope, separators=(",", ":")).encode()


class EnvelopeInvalid(Exception):
    """An envelope that does not verify with the key (or is no envelope)."""


def verify(envelope_json: bytes, key: SSlibKey) -> bytes:
    """The verified payload; EnvelopeInvalid when the envelope is malformed, of another payload type, or not
    signed by `key`. Any keyid is accepted (DSSE keyids are hints): the signature decides."""
    try:
        data = json.loads(envelope_json)
        envelope = Envelope.from_dict(json.loads(json.dumps(data)))  # from_dict rewrites its argument
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise EnvelopeInvalid(f"not a DSSE envelope: {type(exc).__name__}: {exc}") from None
    if envelope.payload_type != PAYLOAD_TYPE:
        raise EnvelopeInvalid(f"payload type {envelope.payload_type!r}, not {PAYLOAD_TYPE}")
    pae = envelope.pae()
    for signature in envelope.signatures.values():
        try:
            key.verify_signature(signature, pae)
            return envelope.payload
        except VerificationError:
            continue
        except Exception:  # noqa: BLE001 - a malformed signature is a signature that does not verify
            continue
    raise EnvelopeInvalid("no signature verifies with the given key")
