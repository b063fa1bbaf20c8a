#!/usr/bin/env bash
# Set up qualify on a fresh clone. Idempotent: a second run installs nothing new.
#   bash scripts/bootstrap.sh          the venv (.venv) with qualify and the CPU workloads
#   bash scripts/bootstrap.sh --test   also the test tools and the system packages the
#                                      integration tests use (registry, skopeo, podman, buildah)
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_TEST=0
[ "${1:-}" = "--test" ] && WITH_TEST=1
PY="${PYTHON:-python3}"

TEST_FLAG=()
[ "$WITH_TEST" = 1 ] && TEST_FLAG=(--test)
PIP=(.venv/bin/pip install -q --disable-pip-version-check)
# A new checkout on a machine that bootstrapped the same pins before takes that venv (scripts/venv-cache.sh: hard
# links, about 1 s, where pip takes about 90 s) and only re-points qualify's editable install to itself.
# QUALIFY_NO_VENV_CACHE=1 always installs.
if [ ! -e .venv ] && [ -z "${QUALIFY_NO_VENV_CACHE:-}" ] &&
   VENV_KEY=$(bash scripts/venv-cache.sh restore .venv "${TEST_FLAG[@]}"); then
  echo "bootstrap: .venv from the venv cache (key $VENV_KEY)"
  "${PIP[@]}" --no-deps --no-build-isolation -e .
else
  NEW_VENV=0
  if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
    NEW_VENV=1
  fi
  # torch first, from the CPU wheel: a bare requirement would pull a multi-GB CUDA build.
  .venv/bin/python -c "import torch" 2>/dev/null || "${PIP[@]}" "torch==2.13.0"
  if [ "$WITH_TEST" = 1 ]; then
    "${PIP[@]}" -c constraints.txt -e ".[workloads,dev]"
  else
    "${PIP[@]}" -c constraints.txt -e ".[workloads]"
  fi
  # Only a venv this run made from nothing becomes the template, never one changed by hand since.
  if [ "$NEW_VENV" = 1 ] && [ -z "${QUALIFY_NO_VENV_CACHE:-}" ]; then
    bash scripts/venv-cache.sh save .venv "${TEST_FLAG[@]}" || echo "bootstrap: the venv cache was not saved" >&2
  fi
fi

if [ "$WITH_TEST" = 1 ]; then
  # System packages for the registry, promotion and container tests, and the browser that looks at the
  # HTML report and the Prefect UI (Debian).
  PKGS=(docker-registry skopeo umoci buildah podman runc debootstrap chromium)
  missing=()
  for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      apt-get update -q >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    else
      echo "bootstrap: missing system packages (install as root): ${missing[*]}" >&2
    fi
  fi
fi

# qualify's own modules compiled once: an editable install is never byte-compiled by pip, and where
# PYTHONDONTWRITEBYTECODE is set (it is on these machines) every `qualify` call would compile them again
# (about 0.1 s of a `gate check`). A stale file is recompiled in memory, never trusted.
.venv/bin/python -m compileall -q src flows tasks driver >/dev/null
