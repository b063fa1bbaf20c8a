"""Component verification: compare what the probe found in the image with the manifest."""

from __future__ import annotations

import re
from typing import Any

from qualify.manifest import Component
from qualify.versions import matches
from qualify.workloads import protocol


def probe_case(components: list[Component]) -> dict[str, Any]:
    """The probe workload's case document for these components."""
    commands = {c.name: list(c.command) for c in components if c.source == "command" and c.command}
    env = [c.env for c in components if c.source == "env" and c.env]
    return protocol.make_case("probe/components", "probe", {"commands": commands, "env": env})


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def actual_version(component: Component, facts: dict[str, Any]) -> tuple[str | None, str]:
    """The version found for a component, and where it came from (for the reason)."""
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
        return facts.get("driver"), "accelerator driver"
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


def compare_components(components: list[Component], facts: dict[str, Any]) -> list[dict[str, Any]]:
    """One check per component: expected vs actual, ok, and a reason. Missing is a failure, not an exception."""
    checks: list[dict[str, Any]] = []
    for component in components:
        actual, where = actual_version(component, facts)
        ok, reason = matches(component.match, component.expected, actual)
        if actual is None and component.optional:
            ok, reason = True, "optional, not present"
        checks.append({"name": component.name, "rule": component.match, "expected": component.expected,
                       "actual": actual, "ok": ok, "optional": component.optional,
                       "detail": f"{reason} ({where})"})
    return checks
