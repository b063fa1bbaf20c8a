"""Container image references (registry/repository[:tag][@digest]).

The grammar follows the Distribution project's reference package
(distribution/reference/regexp.go): lowercase path components, a tag of at most
128 characters, a digest ``algorithm:hex``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qualify.errors import BadInput

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
# ASCII only, as the distribution spec says: Python's \w would take any Unicode letter or digit (`ṫäg٣`),
# which no registry accepts (issue 24.10).
TAG_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_TAG = TAG_PATTERN
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?$"
)

DEFAULT_REGISTRY = "docker.io"


class InvalidReference(BadInput, ValueError):
    pass


@dataclass(frozen=True)
class ImageRef:
    registry: str
    repository: str  # path inside the registry, e.g. "egslingjun/training-xpu-pytorch"
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """registry/repository, without tag or digest."""
        return f"{self.registry}/{self.repository}"

    @property
    def reference(self) -> str:
        """What the registry API takes after /manifests/: the digest when known, else the tag."""
        return self.digest or self.tag or "latest"

    def with_tag(self, tag: str) -> "ImageRef":
        return ImageRef(self.registry, self.repository, tag, None)

    def with_digest(self, digest: str) -> "ImageRef":
        return ImageRef(self.registry, self.repository, None, digest)

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def parse_reference(text: str) -> ImageRef:
    """Parse an image reference; raises InvalidReference with the reason."""
    if not isinstance(text, str) or not text:
        raise InvalidReference("empty image reference")
    m = _REFERENCE.match(text)
    if not m:
        raise InvalidReference(
            f"{text!r} is not a valid image reference (expected registry/repository[:tag][@sha256:digest], lowercase path)"
        )
    domain, path = m.group("domain"), m.group("path")
    # A first component is a registry only if it looks like a host (a dot, a port or localhost),
    # as in the docker CLI; otherwise it is part of the path on the default registry.
    if domain and not ("." in domain or ":" in domain or domain == "localhost" or domain.startswith("[")):
        if not re.fullmatch(_COMPONENT, domain):
            raise InvalidReference(f"{text!r} is not a valid image reference ({domain!r}: repository "
                                   "path components must be lowercase)")
        path = f"{domain}/{path}"
        domain = None
    if len(path) > 255:
        raise InvalidReference(f"{text!r}: repository name longer than 255 characters")
    return ImageRef(domain or DEFAULT_REGISTRY, path, m.group("tag"), m.group("digest"))
