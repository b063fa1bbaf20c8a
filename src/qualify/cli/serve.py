"""`qualify serve`: the gating service (FastAPI app qualify.service, served by uvicorn).

The bearer token comes from the environment only (QUALIFY_SERVICE_TOKEN), never from argv. Listening beyond
loopback needs the token, and then every read needs it too.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Optional

import typer

from qualify.cli.common import DbOption, InsecureOption, open_db, say, warn
from qualify.errors import BadInput
from qualify.settings import ENFORCE_MODES, Settings, redact_url


def is_loopback_host(host: str) -> bool:
    """A listen address (no port: '::1' is IPv6 loopback, not host ':' port 1)."""
    bare = host.strip().strip("[]")
    if bare.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def serve(host: str = typer.Option("127.0.0.1", "--host", help="listen address (loopback unless asked otherwise)"),
          port: int = typer.Option(8700, "--port", min=0, max=65535),
          db: Optional[str] = DbOption, insecure_registry: Optional[list[str]] = InsecureOption,
          protect: Optional[list[str]] = typer.Option(
              None, "--protect", metavar="REPO-GLOB[:TAG-GLOB]",
              help="protected pushes (repeatable; default QUALIFY_PROTECT, comma-separated)"),
          enforce: Optional[str] = typer.Option(None, "--enforce", metavar="|".join(ENFORCE_MODES),
                                                help="on an unqualified push to a protected tag: record it (off), "
                                                     "re-point the tag to the previous qualified digest (revert), "
                                                     "or delete the manifest (delete); default QUALIFY_ENFORCE or off"),
          registry: Optional[str] = typer.Option(
              None, "--registry", metavar="HOST:PORT",
              help="the registry whose notifications the webhook receives (default QUALIFY_WEBHOOK_REGISTRY): "
                   "pushes are judged and enforced there only, whatever host an event names"),
          access_log: bool = typer.Option(True, "--access-log/--no-access-log", help="uvicorn's access log")) -> None:
    """Serve the gate over HTTP: GET /v1/gate?ref=IMAGE_REF, /v1/runs, /v1/runs/{id}, /healthz, /openapi.json;
    POST /v1/registry/events for the registry's notifications (bearer token)."""
    import uvicorn

    from qualify.service import create_app
    from qualify.service.limits import GuardedHttpToolsProtocol

    settings = Settings.load(database_url=db, protect=protect or None, enforce=enforce,
                             insecure_registries=insecure_registry or None, webhook_registry=registry)
    loopback = is_loopback_host(host)
    if not loopback and not settings.service_token:
        raise BadInput(f"--host {host} is not loopback: set QUALIFY_SERVICE_TOKEN (every request will need it)")
    if (settings.protect or settings.enforce != "off") and not settings.service_token:
        raise BadInput("protected tags and enforcement need the registry's webhook, which needs a token: "
                       "set QUALIFY_SERVICE_TOKEN (and the same bearer token in the registry's notifications)")
    if settings.enforce != "off" and not settings.protect:
        raise BadInput(f"--enforce {settings.enforce} without protected patterns would enforce nothing: "
                       "add --protect REPO-GLOB:TAG-GLOB (or QUALIFY_PROTECT)")
    if settings.protect and not settings.webhook_registry:
        raise BadInput("protected tags need the registry the webhook is bound to: --registry HOST:PORT (or "
                       "QUALIFY_WEBHOOK_REGISTRY); an event's own host is the pusher's Host header, never trusted")
    sessions = open_db(db, migrate=False)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("qualify.service").setLevel(logging.INFO)
    app = create_app(settings, sessions, reads_need_token=not loopback)
    say(f"qualify gating service on http://{host}:{port} (database {redact_url(settings.database_url)}; "
        f"webhook bound to {settings.webhook_registry or 'no registry'}; "
        f"protected: {', '.join(f'{r}:{t}' for r, t in settings.protect) or 'none'}; enforce: {settings.enforce}; "
        f"reads {'need the token' if not loopback else 'open on loopback'})")
    if not settings.service_token:
        warn("no QUALIFY_SERVICE_TOKEN: the service accepts no writes (the registry webhook answers 401)")
    # GuardedHttpToolsProtocol: each request's headers and body within a deadline (slowloris), 16 kB of head.
    # httptools and uvloop (C) rather than h11 and asyncio's loop (Python): the per-request cost is what bounds
    # the answers a second on a few cores (benchmarks/serve_load.py).
    uvicorn.run(app, host=host, port=port, access_log=access_log, log_level="info", server_header=False,
                http=GuardedHttpToolsProtocol, loop="uvloop", timeout_keep_alive=5)
