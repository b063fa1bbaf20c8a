"""The environment a workload (or a container engine) gets: the driver's, minus qualify's secrets.

A workload is the candidate's code: it must not inherit what the driver holds to reach the
database, the registry, Prefect or a cloud account. ``workload_environment`` drops

- qualify's own driver settings (qualify.settings.ENVIRONMENT: QUALIFY_DATABASE_URL,
  QUALIFY_DATA_DIR, QUALIFY_RAY_*, QUALIFY_ACTOR, QUALIFY_DEBUG) and every QUALIFY_REGISTRY_*
  variable; QUALIFY_CACHE_DIR stays (the workloads read it: qualify.workloads.settings);
- database connections: PG* (libpq: PGPASSWORD, PGHOST, ...), DATABASE_URL, *_DSN;
- Prefect's API settings (PREFECT_API_*: the URL of a loopback API and its key);
- cloud and registry credentials: AWS_*, AZURE_*, GOOGLE_APPLICATION_CREDENTIALS, REGISTRY_AUTH_FILE,
  DOCKER_CONFIG, DOCKER_AUTH_CONFIG, SSH_AUTH_SOCK, NETRC, KUBECONFIG;
- every variable whose name looks secret (qualify.workloads.secrets: *_TOKEN, *_PASSWORD,
  *_SECRET, *_KEY, ...) or whose value looks like a credential.

What a workload needs stays: PATH, HOME, locale, the Python and library paths, the compile
caches, NCCL_*/OMP_*/TORCH_* and the rest. A manifest that must hand a workload a variable gives
it in the case's ``env`` (never a secret: that is printed by ``qualify cases``).

``engine_environment`` is the same rule for the container engine's own process, except that
the engine keeps the files it authenticates pulls with (REGISTRY_AUTH_FILE, DOCKER_CONFIG):
they are the engine's, and nothing of its environment reaches a container unless named.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

from qualify.settings import CREDENTIAL_ENVIRONMENT, ENVIRONMENT
from qualify.workloads.secrets import is_secret_name, looks_like_credential

# Driver settings a workload reads too.
_WORKLOAD_READS = {"QUALIFY_CACHE_DIR"}
_DRIVER_ONLY = (set(ENVIRONMENT) | set(CREDENTIAL_ENVIRONMENT)) - _WORKLOAD_READS
_DROP_PATTERN = re.compile(
    r"^(QUALIFY_REGISTRY_|QUALIFY_DATABASE|PG|PREFECT_API_|AWS_|AZURE_|ALIBABA_CLOUD_|ALICLOUD_)"
    r"|^(DATABASE_URL|GOOGLE_APPLICATION_CREDENTIALS|SSH_AUTH_SOCK|NETRC|KUBECONFIG|DOCKER_AUTH_CONFIG"
    r"|REGISTRY_AUTH_FILE|DOCKER_CONFIG)$"
)
# The container engine authenticates its own pulls with these files.
_ENGINE_KEEPS = {"REGISTRY_AUTH_FILE", "DOCKER_CONFIG"}


def withheld(name: str, value: str = "") -> bool:
    """True when a variable of the driver's environment must not reach a workload."""
    return (name in _DRIVER_ONLY or bool(_DROP_PATTERN.search(name)) or is_secret_name(name)
            or looks_like_credential(value))


def workload_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's environment without qualify's secrets, for a workload process."""
    base = os.environ if base is None else base
    return {k: v for k, v in base.items() if not withheld(k, v)}


def engine_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for the container engine's process (podman/docker): the same rule, but the
    engine keeps its pull-authentication files."""
    base = os.environ if base is None else base
    return {k: v for k, v in base.items() if k in _ENGINE_KEEPS or not withheld(k, v)}
