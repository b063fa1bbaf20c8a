"""The gating service (`qualify serve`): the results database over HTTP, and the registry's webhook."""

from qualify.service.app import create_app
from qualify.service.webhook import EnforcingClient, MalformedEvents, Webhook, is_protected, parse_envelope

__all__ = ["create_app", "EnforcingClient", "MalformedEvents", "Webhook", "is_protected", "parse_envelope"]
