"""What a manifest may ask of the container engine, checked twice: when the manifest is validated
(qualify.manifest.ContainerOptions) and again by the container executor right before it runs
(defence in depth: an executor built by hand, or from a stored manifest, is held to the same rule).

Widening needs an explicit, reasoned opt-in (``execution.container.opt_ins``) that the report shows:

=================  ==========================================================================
opt-in             what it allows
=================  ==========================================================================
privileged         ``privileged: true`` (``--privileged``: every device, every capability)
host-network       ``network: host`` (the host's loopback services: PostgreSQL, Prefect, Ray)
default-network    ``network: default`` (the engine's bridge: the internet and the host's ports)
host-ipc           ``ipc_host: true`` (``--ipc=host``: the host's shared memory)
host-mounts        ``--volume /host/path:/in/container[:ro]`` in ``extra_args``
=================  ==========================================================================

``extra_args`` is an allow-list, not a deny-list: only resource limits and options that narrow
what the container may do pass (the engine has too many ways to widen privileges for a deny-list
to be complete: ``--cap-add``, ``--device``, ``--pid``, ``--userns``, ``--security-opt``,
``--mount``, ``--env-host``, ``--entrypoint``, ...). Allowed, with the shape of their value:

- limits: ``--shm-size``, ``--ulimit``, ``--pids-limit``, ``--memory``, ``--memory-swap``,
  ``--memory-reservation``, ``--cpus``, ``--cpuset-cpus``, ``--cpuset-mems``, ``--cpu-shares``,
  ``--oom-score-adj``;
- narrowing: ``--cap-drop``, ``--security-opt=no-new-privileges``, ``--read-only``, ``--init``,
  ``--tmpfs`` (a tmpfs inside the container, nothing of the host);
- with the ``host-mounts`` opt-in only: ``--volume``/``-v`` with an absolute host path (never
  ``/``, ``/proc``, ``/sys``, ``/boot`` or a container engine's socket).

Everything else, including the options that have their own field (``--network``, ``--ipc``,
``--privileged``, ``--gpus``, ``--device``), is refused with the field it belongs to.

``device_template`` names one device node per assigned accelerator: an absolute path under
``/dev`` with an ``{index}`` or ``{id}`` placeholder and nothing else to format; block devices,
memory and terminals (``/dev/sd*``, ``/dev/nvme*``, ``/dev/mem``, ``/dev/tty*``, ...) are refused.
"""

from __future__ import annotations

import posixpath
import re
import string
from typing import Iterable

OPT_INS = ("privileged", "host-network", "default-network", "host-ipc", "host-mounts")
MIN_REASON = 10

_SIZE = r"\d+(\.\d+)?[bkmgtBKMGT]?[iI]?[bB]?"
# flag -> the regex its value must match (None: a flag without a value).
EXTRA_ARGS: dict[str, str | None] = {
    "--shm-size": _SIZE,
    "--ulimit": r"[a-z]+=-?\d+(:-?\d+)?",
    "--pids-limit": r"-?\d+",
    "--memory": _SIZE,
    "--memory-swap": rf"-1|{_SIZE}",
    "--memory-reservation": _SIZE,
    "--cpus": r"\d+(\.\d+)?",
    "--cpuset-cpus": r"[0-9,-]+",
    "--cpuset-mems": r"[0-9,-]+",
    "--cpu-shares": r"\d+",
    "--oom-score-adj": r"-?\d+",
    "--cap-drop": r"[A-Za-z_]+",
    "--security-opt": r"no-new-privileges(=true|:true)?",
    "--read-only": None,
    "--init": None,
    "--tmpfs": r"/[A-Za-z0-9_./-]*(:[A-Za-z0-9=,]+)?",
}
MOUNT_FLAGS = ("--volume", "-v")
# Options that have a field of their own: say which.
_OWN_FIELD = {
    "--network": "network", "--net": "network", "--ipc": "ipc_host", "--privileged": "privileged",
    "--gpus": "gpu_mode", "--device": "device_template (or gpu_mode)",
}
_MOUNT_OPTIONS = {"ro", "rw", "z", "Z", "O", "U", "noexec", "nosuid", "nodev", "exec", "suid", "dev",
                  "private", "rprivate", "shared", "rshared", "slave", "rslave", "bind", "rbind"}
_FORBIDDEN_MOUNTS = ("/proc", "/sys", "/boot", "/var/run/docker.sock", "/run/docker.sock", "/run/podman",
                     "/var/run/podman", "/run/containerd", "/var/run/containerd", "/run/crio")
_DEVICE_NAME = re.compile(r"^/dev/[A-Za-z0-9_./-]+$")
_FORBIDDEN_DEVICES = re.compile(
    r"^/dev/(mem|kmem|port|sd|hd|vd|xvd|nvme|loop|dm-|md|mapper/|disk/|mmcblk|sr|kmsg|console|tty|pts/|"
    r"fuse|kvm|vhost|cpu/|mcelog|watchdog|initctl|log|shm|mqueue)")
_ID = re.compile(r"^[A-Za-z0-9_-]+$")


def required_opt_ins(*, privileged: bool, network: str, ipc_host: bool,
                     extra_args: Iterable[str]) -> dict[str, str]:
    """opt-in -> the field that needs it."""
    need: dict[str, str] = {}
    if privileged:
        need["privileged"] = "privileged"
    if network == "host":
        need["host-network"] = "network"
    elif network == "default":
        need["default-network"] = "network"
    if ipc_host:
        need["host-ipc"] = "ipc_host"
    for i, arg in enumerate(extra_args):
        if arg.split("=", 1)[0] in MOUNT_FLAGS:
            need.setdefault("host-mounts", f"extra_args[{i}]")
    return need


def extra_args_problems(args: list[str], host_mounts: bool) -> list[str]:
    """One message per argument of extra_args that is not allowed (each names extra_args[i])."""
    problems: list[str] = []
    i = 0
    while i < len(args):
        arg = str(args[i])
        where = f"extra_args[{i}]"
        flag, eq, inline = arg.partition("=")
        if not flag.startswith("-"):
            problems.append(f"{where}: {arg!r} is not an option (a bare word would be taken as the image or "
                            "its command)")
            i += 1
            continue
        if flag in MOUNT_FLAGS:
            value, i = (inline, i + 1) if eq else (str(args[i + 1]) if i + 1 < len(args) else "", i + 2)
            if not host_mounts:
                problems.append(f"{where}: {flag} mounts a host path: it needs the opt-in "
                                "execution.container.opt_ins: [{what: host-mounts, reason: ...}]")
            else:
                problem = mount_problem(value)
                if problem:
                    problems.append(f"{where}: {flag} {value!r}: {problem}")
            continue
        if flag not in EXTRA_ARGS:
            own = _OWN_FIELD.get(flag)
            hint = (f"use execution.container.{own}" if own else
                    "extra_args allows only resource limits and options that narrow privileges: "
                    + ", ".join(sorted(EXTRA_ARGS)) + " (and --volume with the host-mounts opt-in)")
            problems.append(f"{where}: {flag!r} is not allowed: {hint}")
            # Its value, if it has one, is part of the same refusal.
            i += 2 if (not eq and i + 1 < len(args) and not str(args[i + 1]).startswith("-")) else 1
            continue
        pattern = EXTRA_ARGS[flag]
        if pattern is None:
            if eq:
                problems.append(f"{where}: {flag} takes no value")
            i += 1
            continue
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(args):
            value, i = str(args[i + 1]), i + 2
        else:
            problems.append(f"{where}: {flag} needs a value")
            break
        if not re.fullmatch(pattern, value) or (flag == "--tmpfs" and ".." in value):
            problems.append(f"{where}: {flag} {value!r} is not a value qualify allows for it")
    return problems


def mount_problem(spec: str) -> str | None:
    """Why a --volume SRC:DST[:OPTIONS] is refused even with the host-mounts opt-in; None when fine."""
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        return "expected /host/path:/container/path[:ro]"
    src, dst = parts[0], parts[1]
    if not src.startswith("/"):
        return "the host path must be absolute (named volumes are not allowed)"
    if not dst.startswith("/") or ".." in dst.split("/"):
        return "the container path must be absolute, without '..'"
    if ".." in src.split("/") or posixpath.normpath(src) != src.rstrip("/") or src == "/":
        return "the host path must be a normalised absolute path other than '/'"
    if any(src == f or src.startswith(f + "/") for f in _FORBIDDEN_MOUNTS):
        return f"{src} is never mounted (the host's kernel interfaces, boot files or a container engine)"
    if len(parts) == 3 and not set(parts[2].split(",")) <= _MOUNT_OPTIONS:
        return f"unknown mount options {parts[2]!r}"
    return None


def device_template_problem(template: str) -> str | None:
    """Why a device template is refused; None when fine."""
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as exc:
        return f"{template!r} is not a valid template: {exc}"
    names = [f for _, f, _, _ in fields if f is not None]
    if not names:
        return f"{template!r} has no {{index}} or {{id}} placeholder: every case would get the same device"
    for _, name, spec, conversion in fields:
        if name is None:
            continue
        if name not in ("index", "id"):
            return f"{template!r}: unknown placeholder {{{name}}} (only {{index}} and {{id}})"
        if spec or conversion:
            return f"{template!r}: placeholders take no format spec or conversion"
    return device_path_problem(template.format(index="0", id="0"), template)


def device_path_problem(path: str, template: str | None = None) -> str | None:
    what = repr(template) if template is not None else repr(path)
    if not _DEVICE_NAME.match(path) or ".." in path.split("/") or posixpath.normpath(path) != path:
        return f"{what} must name a device node under /dev (letters, digits, _ . - /; no '..')"
    if _FORBIDDEN_DEVICES.match(path):
        return f"{what} names a disk, memory or terminal device, never an accelerator"
    return None


def device_for(template: str, gpu_id: str) -> str:
    """The device node of one assigned accelerator; ValueError when the template or id is refused."""
    problem = device_template_problem(template)
    if problem is None and not _ID.match(str(gpu_id)):
        problem = f"accelerator id {gpu_id!r} is not a plain id"
    if problem is None:
        path = template.format(index=gpu_id, id=gpu_id)
        problem = device_path_problem(path)
        if problem is None:
            return path
    raise ValueError(f"execution.container.device_template: {problem}")


def reason_problem(reason: str) -> str | None:
    if len((reason or "").strip()) < MIN_REASON:
        return f"give a reason the report can show (at least {MIN_REASON} characters)"
    return None


def container_problems(*, privileged: bool, network: str, ipc_host: bool, extra_args: Iterable[str],
                       device_template: str | None, opt_ins: Iterable[str]) -> list[str]:
    """Everything refused about these container options, one message each (field named first)."""
    granted = set(opt_ins)
    args = [str(a) for a in extra_args]
    problems: list[str] = []
    for what, where in required_opt_ins(privileged=privileged, network=network, ipc_host=ipc_host,
                                        extra_args=args).items():
        if what not in granted and what != "host-mounts":
            problems.append(f"{where}: needs the opt-in execution.container.opt_ins: "
                            f"[{{what: {what}, reason: ...}}]")
    problems += extra_args_problems(args, "host-mounts" in granted)
    if device_template is not None:
        problem = device_template_problem(device_template)
        if problem:
            problems.append(f"device_template: {problem}")
    unknown = granted - set(OPT_INS)
    if unknown:
        problems.append(f"opt_ins: unknown {sorted(unknown)} (known: {', '.join(OPT_INS)})")
    return problems
