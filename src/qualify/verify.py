"""Component verification: compare what the probe found in the image with the manifest.

The probe's facts are redacted before anything is compared or stored: the value of an
environment variable whose name looks secret, or whose value looks like a credential, is
"<redacted>", and credential-shaped text in command outputs too (qualify.workloads.secrets).
The probe redacts the same inside the image; this is the driver's own check, whatever image
answered. A check's actual, detail and reason therefore never carry a secret into the database,
the gate reasons, the Prefect summary or the HTML report.
"""

from __future__ import annotations

import re
from typing import Any

from qualify.manifest import Component
from qualify.versions import matches
from qualify.workloads import protocol
from qualify.workloads.secrets import REDACTED, redact_env, scrub_text


def redact_facts(facts: dict[str, Any]) -> dict[str, Any]:
    """A copy of the probe's facts with secret-looking env values and command output redacted."""
    out = dict(facts or {})
    if isinstance(out.get("env"), dict):
        out["env"] = redact_env(out["env"])
    if isinstance(out.get("commands"), dict):
        commands = {}
        for name, result in out["commands"].items():
            result = dict(result) if isinstance(result, dict) else {}
            for key in ("output", "error"):
                if isinstance(result.get(key), str):
                    result[key] = scrub_text(result[key])
            commands[name] = result
        out["commands"] = commands
    return out


def probe_case(components: list[Component]) -> dict[str, Any]:
    """The probe workload's case document for these components."""
    commands = {c.name: list(c.command) for c in components if c.source == "command" and c.command}
    env = [c.env for c in components if c.source == "env" and c.env]
    # Importing torch is most of the probe's time (2.5 s of 2.8 s on a 2-core machine, in every run's verify
    # stage): only the CUDA runtime's version needs it; torch's own version comes from the package metadata.
    needs_torch = any(c.source == "cuda" for c in components)
    return protocol.make_case("probe/components", "probe", {"commands": commands, "env": env, "torch": needs_torch})


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


UNKNOWN_DRIVER = "unknown on this node"


def driver_version(node: dict[str, Any] | None) -> tuple[str | None, str]:
    """The node's accelerator driver as its host side read it (qualify.execution.node_facts), never the candidate's
    claim: whatever the probe reports from inside the image is not looked at."""
    node = node or {}
    where = f"node {node.get('host') or '?'}: {node.get('driver_source') or 'no driver facts from the node'}"
    if not node.get("driver"):
        return None, f"{UNKNOWN_DRIVER} ({where})"
    return str(node["driver"]), where


def actual_version(component: Component, facts: dict[str, Any],
                   node: dict[str, Any] | None = None) -> tuple[str | None, str]:
    """The version found for a component, and where it came from (for the reason).

    facts: what the probe found inside the candidate; node: the driver facts of the node it ran on.
    """
    source = component.source
    if source == "os":
        os_info = facts.get("os") or {}
        if not os_info.get("id"):
            return None, "no /etc/os-release"
        return f"{os_info['id']} {os_info.get('version_id') or ''}".strip(), "/etc/os-release"
    if source == "python":
        return facts.get("python"), "platform.python_version()"
    if source == "package":
        name = _norm(component.package or component.name)
        return (facts.get("packages") or {}).get(name), f"importlib.metadata {name}"
    if source == "cuda":
        return facts.get("cuda_runtime") or facts.get("torch_cuda"), "torch.version.cuda"
    if source == "driver":
        return driver_version(node)
    if source == "env":
        return (facts.get("env") or {}).get(component.env or ""), f"${component.env}"
    if source == "command":
        result = (facts.get("commands") or {}).get(component.name) or {}
        output = result.get("output") or ""
        if result.get("returncode") is None:
            return None, f"command {component.command!r} not runnable: {result.get('error', 'missing')}"
        pattern = component.regex or r"(\d+(?:\.\d+)+\S*)"
        m = re.search(pattern, output)
        return (m.group(1) if m else None), f"output of {' '.join(component.command or [])}"
    return None, f"unknown source {source!r}"


def compare_components(components: list[Component], facts: dict[str, Any],
                       node: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One check per component: expected vs actual, ok, and a reason. Missing is a failure, not an exception.

    node: the host-side facts of the node the probe ran on (the driver); None: unknown.
    """
    checks: list[dict[str, Any]] = []
    facts = redact_facts(facts)
    for component in components:
        actual, where = actual_version(component, facts, node)
        if actual == REDACTED:
            ok, reason = False, (f"the value of ${component.env} looks like a secret: qualify never reports "
                                 "it (name the variable that holds the version, not a credential)")
            checks.append({"name": component.name, "rule": component.match, "expected": component.expected,
                           "actual": actual, "ok": ok, "optional": component.optional,
                           "detail": f"{reason} ({where})"})
            continue
        ok, reason = matches(component.match, component.expected, actual)
        if actual is None and component.optional:
            ok, reason = True, "optional, not present"
        checks.append({"name": component.name, "rule": component.match, "expected": component.expected,
                       "actual": actual, "ok": ok, "optional": component.optional,
                       "detail": f"{reason} ({where})"})
    return checks
