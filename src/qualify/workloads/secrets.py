"""What looks like a secret: variable names and values that qualify never reports.

Standard library only: the probe uses it inside the image (so that a secret never leaves it),
the driver uses it again before it compares or stores anything (verify.py), and the CLI before
it prints a case's environment. One definition, both sides.

A name is secret-looking when it says so (PASSWORD, TOKEN, SECRET, CREDENTIAL, API_KEY, AUTH,
PRIVATE, ... or ends in _KEY) or names a connection string that usually carries one
(DATABASE_URL, *_DSN). A value is credential-looking when it has the shape of a known credential
(a URL with a password in it, a PEM private key, GitHub/GitLab/Hugging Face/Slack/AWS/Google
tokens, a JWT, an Authorization header value). Version strings never match either rule.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

REDACTED = "<redacted>"

_SECRET_NAME = re.compile(
    r"PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|AUTH|COOKIE"
    r"|(^|_)KEY($|_)|(^|_)PASS($|_)|(^|_)PWD($|_)|DATABASE_URL|(^|_)DSN$",
    re.IGNORECASE,
)

_CREDENTIAL_VALUES = [
    r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@",  # scheme://user:password@host
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",  # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\bglpat-[A-Za-z0-9_-]{20,}",  # GitLab
    r"\bhf_[A-Za-z0-9]{30,}",  # Hugging Face
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bAIza[0-9A-Za-z_-]{35}",  # Google API keys
    r"\bsk-[A-Za-z0-9_-]{20,}",  # OpenAI-style secret keys
    r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JWT
    r"\b(?:Bearer|Basic)\s+[A-Za-z0-9+/=._~-]{16,}",  # Authorization header values
]
_CREDENTIAL = re.compile("|".join(f"(?:{p})" for p in _CREDENTIAL_VALUES))


def is_secret_name(name: str) -> bool:
    """True for a variable name that says it holds a secret (QUALIFY_REGISTRY_PASSWORD, HF_TOKEN)."""
    return bool(_SECRET_NAME.search(str(name)))


def looks_like_credential(value: Any) -> bool:
    """True for a value shaped like a known credential, whatever the variable it came from."""
    return isinstance(value, str) and bool(_CREDENTIAL.search(value))


def redact_value(name: str, value: Any) -> Any:
    """REDACTED when the name or the value looks secret; the value otherwise (None stays None)."""
    if value is None:
        return None
    if is_secret_name(name) or looks_like_credential(value):
        return REDACTED
    return value


def redact_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a name -> value mapping with every secret-looking value replaced by REDACTED."""
    return {str(k): redact_value(str(k), v) for k, v in env.items()}


def scrub_text(text: str) -> str:
    """Free text (a command's output) with every credential-shaped part replaced by REDACTED."""
    return _CREDENTIAL.sub(REDACTED, text) if isinstance(text, str) else text
