"""Keys for the attestation tests: fresh ECDSA P-256 / Ed25519 pairs written as PEM files (no tests here)."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519


def private_key(kind: str = "ecdsa"):
    return ec.generate_private_key(ec.SECP256R1()) if kind == "ecdsa" else ed25519.Ed25519PrivateKey.generate()


def private_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def public_pem(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def key_pair(folder: Path, name: str = "qualify", kind: str = "ecdsa") -> tuple[Path, Path]:
    """(private PEM path, public PEM path) of a new key under folder."""
    key = private_key(kind)
    folder.mkdir(parents=True, exist_ok=True)
    private, public = folder / f"{name}.key", folder / f"{name}.pub"
    private.write_bytes(private_pem(key))
    private.chmod(0o600)
    public.write_bytes(public_pem(key))
    return private, public
