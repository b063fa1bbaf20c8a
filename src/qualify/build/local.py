"""The `local` builder: an existing Python environment stands for the image.

Its digest is a hash of the environment's package set (name==version, sorted) plus the
Python version, so the same environment always gets the same identity and any package
change gives a new one.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from qualify.build.base import BuildError, BuildInputError, BuildResult
from qualify.manifest import ReleaseManifest

_LIST_PACKAGES = (
    "import importlib.metadata as m, json, platform;"
    "print(json.dumps({'python': platform.python_version(), 'packages': sorted("
    "f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions() if d.metadata['Name'])}))"
)


def environment_digest(python: str) -> tuple[str, dict]:
    try:
        res = subprocess.run([python, "-c", _LIST_PACKAGES], capture_output=True, text=True, timeout=120)
    except OSError as exc:
        raise BuildInputError(f"build.python {python!r} cannot run: {exc.strerror or exc}") from None
    if res.returncode != 0:
        raise BuildError(f"build.python {python!r} failed to list its packages", log_tail=res.stderr[-4000:])
    listing = json.loads(res.stdout)
    # Editable installs of qualify itself are not part of the "image".
    listing["packages"] = [p for p in listing["packages"] if not p.lower().startswith("qualify==")]
    canonical = json.dumps(listing, sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest(), listing


def build(manifest: ReleaseManifest, data_dir: Path, manifest_dir: Path) -> BuildResult:
    python = manifest.build.python or sys.executable
    if manifest.build.python and not Path(python).is_absolute():
        python = str((manifest_dir / python).resolve())
    digest, listing = environment_digest(python)
    return BuildResult(repository=manifest.release.repository, tag=manifest.release.candidate_tag, digest=digest,
                       builder="local", image_ref=None, python=python,
                       log_tail=f"local environment {python}: {len(listing['packages'])} packages, "
                                f"Python {listing['python']}")
