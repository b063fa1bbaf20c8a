"""qualify's configuration on the driver: one frozen object, built as defaults -> environment -> flags.

Every environment variable the driver reads is a field here (ENVIRONMENT lists them; a test
checks that the README's configuration table names exactly these plus the workloads' own,
qualify.workloads.settings). Registry credentials are read by qualify.registry.credentials only,
so they never travel inside a Settings object that could be logged or pickled to a Ray worker.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

# Variables read on the driver (beyond the registry credentials and the standard container auth
# files: REGISTRY_AUTH_FILE, DOCKER_CONFIG, XDG_RUNTIME_DIR).
ENVIRONMENT = {
    "QUALIFY_DATABASE_URL": "database_url",
    "QUALIFY_DATA_DIR": "data_dir",
    "QUALIFY_CACHE_DIR": "cache_dir",
    "QUALIFY_RAY_ADDRESS": "ray_address",
    "QUALIFY_RAY_TEMP": "ray_temp_dir",
    "QUALIFY_ACTOR": "actor",
    "QUALIFY_DEBUG": "debug",
    # the gating service (`qualify serve`)
    "QUALIFY_SERVICE_TOKEN": "service_token",
    "QUALIFY_PROTECT": "protect",
    "QUALIFY_ENFORCE": "enforce",
    "QUALIFY_INSECURE_REGISTRIES": "insecure_registries",
    "QUALIFY_WEBHOOK_REGISTRY": "webhook_registry",
    # signed attestations (qualify.attest): the private key as a PEM file, or the PEM itself
    "QUALIFY_ATTEST_KEY_FILE": "attest_key_file",
    "QUALIFY_ATTEST_KEY": "attest_key",
    "QUALIFY_ATTEST_KEY_PASSWORD": "attest_key_password",
    # where people reach the service and Prefect's UI (links in artifacts and reports)
    "QUALIFY_PUBLIC_URL": "public_url",
    "QUALIFY_PREFECT_UI_URL": "prefect_ui_url",
    # `qualify run` without PREFECT_API_URL: this user's Prefect server on 127.0.0.1:<port> is used when one
    # runs (0: never; the ephemeral API starts)
    "QUALIFY_PREFECT_REUSE_PORT": "prefect_reuse_port",
}
ENFORCE_MODES = ("off", "revert", "delete")
CREDENTIAL_ENVIRONMENT = ("QUALIFY_REGISTRY_USERNAME", "QUALIFY_REGISTRY_PASSWORD", "QUALIFY_REGISTRY_HOST")


@dataclass(frozen=True)
class Settings:
    data_dir: Path = Path(".qualify")  # SQLite file, reports, build logs
    cache_dir: Path = Path("~/.cache/qualify").expanduser()  # op builds, compile cache, models, containers
    database_url: str = ""  # empty: SQLite in data_dir
    ray_address: str | None = None  # join this cluster instead of starting a local one
    ray_temp_dir: Path | None = None  # a local Ray's session files (default: <tmp>/qualify-ray)
    actor: str | None = None  # who promotes (default: the OS user)
    debug: bool = False  # tracebacks for unexpected errors
    # The gating service's bearer token: every write (the registry webhook) needs it, and every read when the
    # service listens beyond loopback. Never logged, never in argv (environment only), hidden from repr.
    service_token: str | None = dataclasses.field(default=None, repr=False)
    # Protected pushes: "repository-glob:tag-glob" patterns (the repository as host/path or path alone).
    protect: tuple[tuple[str, str], ...] = ()
    # What the service does with a push of a digest without PASS to a protected tag: off (record it),
    # revert (re-point the tag to the previous qualified digest, or delete it when there is none), delete.
    enforce: str = "off"
    # Registries reached over plain HTTP (host:port), as --insecure-registry.
    insecure_registries: tuple[str, ...] = ()
    # The registry (host:port) whose notifications the webhook receives: its token is bound to it, every push
    # is judged and enforced there, whatever host an event names (that is the pusher's Host header).
    webhook_registry: str | None = None
    # The attestation signing key (ECDSA P-256 or Ed25519, PEM): a file, or the PEM in the environment (never
    # argv). Neither set: no attestation is written (said once). Secrets: hidden from repr, never logged.
    attest_key_file: Path | None = None
    attest_key: str | None = dataclasses.field(default=None, repr=False)
    attest_key_password: str | None = dataclasses.field(default=None, repr=False)
    # The base URL at which people reach `qualify serve` (e.g. https://qualify.example.com): artifacts link each
    # run's report at <public_url>/v1/runs/<id>/report. Unset: they name the report file on the worker.
    public_url: str | None = None
    # The Prefect UI's base URL (e.g. http://127.0.0.1:4200), for the report's link back to its flow run when the
    # report is rendered outside the flow (`qualify serve`, `qualify report`); the flow itself asks Prefect.
    prefect_ui_url: str | None = None
    # Without PREFECT_API_URL, `qualify run` uses this user's Prefect server on 127.0.0.1 at this port when one
    # answers (driver/local_prefect.py), instead of starting Prefect's ephemeral API (~9 s). 0: never.
    prefect_reuse_port: int = 4200

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **flags: object) -> "Settings":
        """Defaults, then the environment, then explicit flags (None flags are ignored)."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for var, name in ENVIRONMENT.items():
            raw = env.get(var)
            if raw:
                values[name] = raw
        values.update({k: v for k, v in flags.items() if v is not None})
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - fields
        if unknown:
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        settings = cls(**{k: _coerce(k, v) for k, v in values.items()})  # type: ignore[arg-type]
        if not settings.database_url:
            settings = dataclasses.replace(
                settings, database_url=f"sqlite:///{(settings.data_dir / 'qualify.db').resolve()}")
        return settings


def _coerce(name: str, value: object) -> object:
    if name in ("data_dir", "cache_dir", "ray_temp_dir", "attest_key_file"):
        return Path(str(value)).expanduser()
    if name == "debug":
        return str(value).lower() in ("1", "true", "yes", "on")
    if name == "protect":
        return parse_protect(value)
    if name == "enforce":
        mode = str(value).strip().lower()
        if mode not in ENFORCE_MODES:
            from qualify.errors import BadInput

            raise BadInput(f"QUALIFY_ENFORCE / --enforce {value!r}: one of {', '.join(ENFORCE_MODES)}")
        return mode
    if name in ("public_url", "prefect_ui_url"):
        return public_base_url(name, str(value))
    if name == "prefect_reuse_port":
        text = str(value).strip()
        if not text.isdigit() or int(text) > 65535:
            from qualify.errors import BadInput

            raise BadInput(f"QUALIFY_PREFECT_REUSE_PORT {value!r}: a TCP port (0 to turn the reuse off)")
        return int(text)
    if name == "database_url":
        return check_database_url(str(value))
    if name == "webhook_registry":
        return parse_registry(value)
    if name == "insecure_registries":
        # comma-separated in the environment and in each --insecure-registry value alike
        items = [value] if isinstance(value, str) else list(value)  # type: ignore[call-overload]
        return tuple(h.strip() for item in items for h in str(item).split(",") if h.strip())
    return value


def parse_protect(value: object) -> tuple[tuple[str, str], ...]:
    """'repo-glob:tag-glob,...' (or a list of such strings) -> ((repo-glob, tag-glob), ...). A pattern without a
    tag part protects every tag. The split is at the last ':' after the last '/', so host:port stays whole."""
    from qualify.errors import BadInput

    items = value.split(",") if isinstance(value, str) else list(value)  # type: ignore[call-overload]
    out = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        slash = item.rfind("/")
        colon = item.rfind(":")
        repo, tag = (item[:colon], item[colon + 1:]) if colon > slash else (item, "*")
        if slash < 0 and tag.isdigit() and (repo == "localhost" or "." in repo or repo.startswith("[")):
            raise BadInput(f"protected pattern {item!r} reads as repository {repo!r} with tag {tag!r}; for every "
                           f"repository of the registry {item} write '{item}/*' (or '{item}/*:TAG-GLOB')")
        if not repo or not tag:
            raise BadInput(f"protected pattern {item!r}: write REPOSITORY-GLOB[:TAG-GLOB], e.g. 'team/*:25.*'")
        out.append((repo, tag))
    return tuple(out)


def public_base_url(name: str, value: str) -> str:
    """An http(s) base URL without a trailing slash (links are built as base + path)."""
    from urllib.parse import urlsplit

    from qualify.errors import BadInput

    url = value.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        variable = {"public_url": "QUALIFY_PUBLIC_URL", "prefect_ui_url": "QUALIFY_PREFECT_UI_URL"}[name]
        raise BadInput(f"{variable} {value!r}: an http(s) base URL such as https://qualify.example.com")
    return url


_REGISTRY = re.compile(r"^(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*|\[[0-9a-f:.]+\])"
                       r"(?::[0-9]{1,5})?$")


def parse_registry(value: object) -> str:
    """A registry as image references name it: host[:port], lower-cased (hosts are case-insensitive)."""
    from qualify.errors import BadInput

    text = str(value).strip().lower().rstrip("/")
    if not _REGISTRY.match(text):
        raise BadInput(f"QUALIFY_WEBHOOK_REGISTRY / --registry {value!r}: write the registry as HOST[:PORT], "
                       "e.g. 127.0.0.1:5000")
    return text


_SECRET_QUERY = re.compile(r"(?i)([?&;](?:password|passwd|pwd|pass|sslpassword|secret|token)=)[^&;#]*")


def check_database_url(url: str) -> str:
    """Refuse a URL whose password holds an unencoded '@': the driver would read part of the password as the
    host, and print it in its connection error."""
    from qualify.errors import BadInput

    _scheme, sep, rest = url.partition("://")
    authority = rest.split("?", 1)[0]
    at = authority.rfind("@")
    if sep and at >= 0 and "@" in authority[:at]:
        raise BadInput(f"the database URL {redact_url(url)}: its user or password holds an unencoded '@': "
                       "percent-encode it as %40")
    return url


def redact_url(url: str) -> str:
    """A database URL without its password, for messages and logs: the userinfo's password (everything between
    the first ':' of the userinfo and the LAST '@', so an unencoded '@' in it stays hidden) and every
    password-like query parameter (`?password=`)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _SECRET_QUERY.sub(r"\1***", url) if "@" not in url else "<a database URL>"
    at = rest.rfind("@")
    if at >= 0 and ":" in rest[:at]:
        rest = f"{rest[:at].split(':', 1)[0]}:***@{rest[at + 1:]}"
    return scheme + "://" + _SECRET_QUERY.sub(r"\1***", rest)
