#!/usr/bin/env bash
# Create .venv and install qualify with the embedded-default workloads and the test tools.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch first, from the CPU wheel (see constraints.txt).
.venv/bin/pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e ".[workloads,dev]"
