"""What can go wrong talking to a registry; messages name the reference, never credentials."""

from __future__ import annotations

from qualify.errors import BadInput, ExitCode, InfraError

class RegistryError(InfraError):
    """A registry operation failed; the message names the reference, never credentials."""


class RegistryUnreachable(RegistryError):
    """The registry did not answer (connection refused, DNS, TLS, timeout, 5xx)."""


class RegistryUnauthorized(RegistryError):
    """The registry refused our credentials (or we have none) for this reference."""


class ImageNotFound(RegistryError, BadInput):
    """The repository, tag or digest does not exist (the reference is wrong: exit 2)."""

    exit_code = ExitCode.BAD_INPUT


class DigestMismatch(RegistryError):
    """What the registry returned does not hash to the expected digest."""


class CopyFailed(RegistryError):
    """A copy did not complete (skopeo failed, a manifest was refused)."""
