"""Ray's authentication state in a process that starts a local Ray and later joins a cluster.

A local `ray.init()` turns token authentication on for its whole process, in three places: RAY_AUTH_MODE=token
in os.environ, Ray's process-wide config (ray._raylet.Config) re-read to token mode, and the token cached
(AuthenticationTokenLoader). Nothing turns them off at ray.shutdown(). What then failed was a mixed state: once
the environment changed back (the suite's conftest restores it after each test) while the config or the token
cache still said token, a cluster without token authentication that the process joined had its workers' reports
refused ("Missing authorization header"; the workers log InvalidAuthToken): the case's streamed items never
arrived, and the run reported them lost. (With all three left as Ray left them, such a join worked here.)

So a local Ray started here gives the process back as it found it: `remember` before the start records the mode
the environment had; `restore` after its shutdown puts it back and re-reads the config and the token cache
(`refresh`). A join re-reads them from the environment first, so that whatever changed the environment since (a
test's restored environment, the user's own setting) is what the driver uses.

Config.initialize and AuthenticationTokenLoader.reset_cache are Ray's private API (Ray is pinned >=2.60,<3);
where they are missing, only the environment is put back.
"""

from __future__ import annotations

import os
import threading

import ray

AUTH_MODE_ENV = "RAY_AUTH_MODE"
_UNSET = object()

_lock = threading.Lock()
_before: object | str | None = None  # None: no local start remembered; _UNSET: the variable was not set


def remember() -> None:
    """Before a local ray.init(): the authentication mode the environment has now (set or not)."""
    global _before
    with _lock:
        if _before is None:
            _before = os.environ.get(AUTH_MODE_ENV, _UNSET)


def restore() -> None:
    """After the local Ray's ray.shutdown(): the environment's mode as it was before the start, and Ray's
    config and token cache re-read from it (refresh: not while Ray is up). Nothing when no start was
    remembered."""
    global _before
    with _lock:
        before, _before = _before, None
    if before is None:
        return
    if before is _UNSET:
        os.environ.pop(AUTH_MODE_ENV, None)
    else:
        os.environ[AUTH_MODE_ENV] = str(before)
    refresh()


def refresh() -> bool:
    """Re-read Ray's process-wide config (its authentication mode among it) from the environment and drop its
    cached token, as Ray's own tests reset the state between clusters (ray._private.authentication_test_utils:
    the config first, so that a draining core-worker thread does not reload the token while the config still
    says token mode). Only while Ray is down in this process. True when it was done.

    Both are needed: with the config alone back in "disabled", the driver's core worker still required the token
    it had cached, and refused the workers' reports (tests/integration/test_ray_auth.py)."""
    if ray.is_initialized():
        return False
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:
        return False
    initialize = getattr(Config, "initialize", None)
    if initialize is None:
        return False
    initialize("")
    reset = getattr(AuthenticationTokenLoader.instance(), "reset_cache", None)
    if reset is not None:
        reset()
    return True


def token_mode_cached() -> bool:
    """Whether this process's Ray config holds token authentication now (for tests and diagnostics)."""
    try:
        from ray._private.authentication.authentication_utils import is_token_auth_enabled
    except ImportError:
        return False
    return bool(is_token_auth_enabled())
