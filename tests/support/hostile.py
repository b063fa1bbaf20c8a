"""Hostile manifests, shared by the loader's unit tests and the CLI's integration tests.

The small ones live in tests/support/hostile/ (each starts with ``# expect: a | b`` lines: the fragments the
refusal must print); the big and special ones (a FIFO, /dev/zero, 20,000 levels of nesting, 10^6 cases,
200,000 problems) are made by the builders below. The expected fragments are computed from the caps.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import qualify.manifest.load as manifest_load
from support.paths import REPO

HOSTILE = Path(__file__).resolve().parent / "hostile"
SMOKE = REPO / "releases" / "cpu-smoke.yaml"

MINIMAL = """\
apiVersion: qualify/v1
release: {name: hostile, repository: 127.0.0.1:5000/qualify/hostile, tag: "0.1", candidate_tag: "0.1-rc1"}
"""
NAP = "  - {name: nap, kind: sleep, params: {duration_s: 0.1}}\n"


def expectations(path: Path) -> list[str]:
    """The fragments a fixture's ``# expect: a | b`` lines promise."""
    out: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("# expect:"):
            out += [part.strip() for part in line.removeprefix("# expect:").split("|") if part.strip()]
    assert out, f"{path.name} has no '# expect:' line"
    return out


def limits() -> Any:
    return manifest_load.LIMITS


FIXTURES = sorted(HOSTILE.glob("*.yaml"))


# --------------------------------------------------------------------------- generated hostile inputs
# Each builder writes (or names) one hostile input and returns its path; the expected
# fragments are computed in the test from the caps, so the builders alone can be pointed
# at an older checkout to see what it did.


def deep_nesting(tmp: Path) -> Path:
    path = tmp / "deep.yaml"
    path.write_text(MINIMAL + "custom_cases:\n  - {name: nap, kind: sleep, params: {deep: "
                    + "[" * 20_000 + "]" * 20_000 + "}}\n")
    return path


def custom_matrix(tmp: Path) -> Path:
    """10^6 cases from `count:` (100 custom cases of 10,000 each)."""
    path = tmp / "count-matrix.yaml"
    path.write_text(MINIMAL + "custom_cases:\n" + "".join(
        f"  - {{name: nap{k}, kind: sleep, params: {{duration_s: 0.1}}, count: 10000}}\n" for k in range(100)))
    return path


def training_matrix(tmp: Path) -> Path:
    """10^6 cases from 1,000 models x 1,000 variants."""
    path = tmp / "train-matrix.yaml"
    path.write_text(MINIMAL + "training:\n  models:\n"
                    + "".join(f"    - {{name: m{k}, preset: tiny-llama}}\n" for k in range(1000))
                    + "  variants:\n" + "".join(f"    - {{name: v{k}}}\n" for k in range(1000)))
    return path


def fifo(tmp: Path) -> Path:
    path = tmp / "fifo.yaml"
    os.mkfifo(path)
    return path


def dev_zero(tmp: Path) -> Path:
    return Path("/dev/zero")


def symlink_to_dev_zero(tmp: Path) -> Path:
    path = tmp / "zero.yaml"
    path.symlink_to("/dev/zero")
    return path


def directory(tmp: Path) -> Path:
    path = tmp / "dir.yaml"
    path.mkdir()
    return path


def not_utf8(tmp: Path) -> Path:
    path = tmp / "latin1.yaml"
    path.write_bytes((MINIMAL + "custom_cases:\n  - {name: nap, kind: sleep, params: {who: 'Müller'}}\n")
                     .encode("latin-1"))
    return path


def ten_mib(tmp: Path) -> Path:
    path = tmp / "big.yaml"
    pad = "  - {name: nap%07d, kind: sleep, params: {duration_s: 0.1}}\n"
    body = MINIMAL + "custom_cases:\n"
    rows = (10 * 2**20 - len(body)) // len(pad % 0) + 1
    path.write_text(body + "".join(pad % k for k in range(rows)))
    return path


def many_problems(tmp: Path) -> Path:
    """200,000 problems in 150 KB: 50,000 empty waivers, each missing 4 required keys."""
    path = tmp / "problems.yaml"
    path.write_text(MINIMAL + "custom_cases:\n" + NAP + "gate: {waivers: [" + "{}, " * 50_000 + "]}\n")
    return path


def huge_integer(tmp: Path) -> Path:
    path = tmp / "bigint.yaml"
    path.write_text(MINIMAL + "custom_cases:\n  - {name: nap, kind: sleep, count: " + "9" * 5000 + "}\n")
    return path


def huge_value(tmp: Path) -> Path:
    """A 200,000-character value where a number is expected: the message quotes it, shortened."""
    path = tmp / "longvalue.yaml"
    path.write_text(MINIMAL + "custom_cases:\n" + NAP + "execution: {case_timeout_s: '" + "x" * 200_000 + "'}\n")
    return path


GENERATED: dict[str, tuple[Callable[[Path], Path], Callable[[Any], list[str]]]] = {
    "deep_nesting": (deep_nesting, lambda lim: ["line 4, column", f"deeper than {lim.max_depth} levels",
                                                f"max_depth={lim.max_depth}"]),
    "custom_matrix": (custom_matrix, lambda lim: ["custom_cases[0].count", "1,000,000 cases",
                                                  f"cap of {lim.max_cases:,}", "max_cases"]),
    "training_matrix": (training_matrix, lambda lim: [": training: ", "1,000,000 cases", f"cap of {lim.max_cases:,}",
                                                      "training.models x training.variants = 1,000 x 1,000"]),
    "fifo": (fifo, lambda lim: ["FIFO", "give a regular file"]),
    "dev_zero": (dev_zero, lambda lim: ["character device", "give a regular file"]),
    "symlink_to_dev_zero": (symlink_to_dev_zero, lambda lim: ["character device"]),
    "directory": (directory, lambda lim: ["directory"]),
    "not_utf8": (not_utf8, lambda lim: ["not UTF-8", "offset"]),
    "ten_mib": (ten_mib, lambda lim: [f"over the cap of {lim.max_bytes:,} bytes", "max_bytes"]),
    "many_problems": (many_problems, lambda lim: ["gate.waivers[0].id", "Field required",
                                                  f"and {200_000 - lim.max_problems:,} more problems",
                                                  f"max_problems={lim.max_problems}"]),
    "huge_integer": (huge_integer, lambda lim: ["line 4, column", "cannot read this int value", "4300"]),
    "huge_value": (huge_value, lambda lim: ["execution.case_timeout_s", "200,002 characters"]),
}
