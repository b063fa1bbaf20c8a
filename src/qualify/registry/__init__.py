"""The registry side of qualify: credentials, the HTTP API client, and skopeo copies."""

from qualify.registry.client import (ACCEPT, INDEX_TYPES, MANIFEST_TYPES, CopyResult, ImageManifest, RegistryClient,
                                     sha256_digest)
from qualify.registry.credentials import ENV_PASSWORD, ENV_USERNAME, Credentials, auth_file_candidates, find_credentials
from qualify.registry.errors import (CopyFailed, DigestMismatch, ImageNotFound, RegistryError, RegistryUnauthorized,
                                     RegistryUnreachable)
from qualify.registry.transport import is_loopback, plain_http

__all__ = ["ACCEPT", "INDEX_TYPES", "MANIFEST_TYPES", "CopyResult", "ImageManifest", "RegistryClient", "sha256_digest",
           "ENV_PASSWORD", "ENV_USERNAME", "Credentials", "auth_file_candidates", "find_credentials", "CopyFailed",
           "DigestMismatch", "ImageNotFound", "RegistryError", "RegistryUnauthorized", "RegistryUnreachable",
           "is_loopback", "plain_http"]
