#!/usr/bin/env bash
# The reference comparison with two real CPU images, both built by the pipeline (gate.reference, issue 28):
#   1. qualify run releases/cpu-image-standard.yaml: the standard image (torch.compile off image-wide) is built,
#      pushed and qualified like any release;
#   2. its digest is pinned into releases/cpu-image-vs-standard.pinned.yaml (a copy of
#      releases/cpu-image-vs-standard.yaml beside it, so that its build paths stay inside this repository);
#   3. qualify run that copy: the CPU image (torch.compile on) against the standard one, the compile case in duet.
# Needs what releases/cpu-image.yaml needs: the debootstrap base (scripts/base-image.sh), the torch CPU wheel in
# /opt/wheels and a registry on 127.0.0.1:5555 (docs/IMAGES.md). Exit status: the second run's (0 = PASS).
set -euo pipefail
cd "$(dirname "$0")/.."
QUALIFY=".venv/bin/qualify"
DB="${QUALIFY_DATABASE_URL:-sqlite:///$PWD/.qualify/reference-demo.db}"
PINNED=releases/cpu-image-vs-standard.pinned.yaml
mkdir -p .qualify
out=$(mktemp)
trap 'rm -f "$out"' EXIT

echo "reference-demo: qualifying the standard image (releases/cpu-image-standard.yaml)" >&2
if ! "$QUALIFY" run releases/cpu-image-standard.yaml --db "$DB" --json > "$out"; then
  echo "reference-demo: the standard image did not qualify; its run says why:" >&2
  cat "$out" >&2
  exit 1
fi
digest=$(.venv/bin/python -c 'import json, sys; print(json.load(open(sys.argv[1]))["digest"])' "$out")
case "$digest" in sha256:*) ;; *) echo "reference-demo: no digest in the standard run's outcome" >&2; exit 1 ;; esac
sed "s/@sha256:0\{64\}/@$digest/" releases/cpu-image-vs-standard.yaml > "$PINNED"
echo "reference-demo: the standard image is $digest; comparing the CPU image with it ($PINNED)" >&2
exec "$QUALIFY" run "$PINNED" --db "$DB"
