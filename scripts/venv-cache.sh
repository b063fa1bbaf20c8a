#!/usr/bin/env bash
# A venv that scripts/bootstrap.sh made before, on this machine, for the same inputs, is the next clone's venv:
# hard links to a template kept in qualify's cache, not a second pip install of 2 GB (about 90 s here).
#   bash scripts/venv-cache.sh key [--test]        the template's key for this checkout
#   bash scripts/venv-cache.sh save VENV [--test]  VENV (complete, just installed) becomes the template
#   bash scripts/venv-cache.sh restore VENV [--test] VENV made from the template, its key printed: exit 1 when
#                                                    there is none
# The key: the Python (version and path), the machine, the pins (constraints.txt), the project's declared
# dependencies and build system (not the rest of pyproject.toml), the bootstrap and this script, and --test.
# Whatever changes one of these makes a new template; the 3 most recently used are kept.
#
# Why hard links are safe here: pip, Python and the tests replace a venv's files (write a new file, rename or
# unlink), never write into one, so a clone's venv and the template cannot change each other; the files that name
# the venv's path (bin/ scripts, pyvenv.cfg) are rewritten as new files, and the editable install of qualify is
# re-made by the caller for its own checkout. Where links cannot be made (another file system), it copies.
#   QUALIFY_CACHE_DIR  qualify's cache (default ~/.cache/qualify): templates under <cache>/venvs/
set -euo pipefail
cd "$(dirname "$0")/.."
ACTION="${1:?usage: venv-cache.sh key|save VENV|restore VENV [--test]}"
shift
VENV=""
if [ "$ACTION" != key ]; then VENV="${1:?venv-cache.sh $ACTION needs a venv path}"; shift; fi
WITH_TEST=0
[ "${1:-}" = "--test" ] && WITH_TEST=1
PY="${PYTHON:-python3}"
TEMPLATES="${QUALIFY_CACHE_DIR:-$HOME/.cache/qualify}/venvs"
KEEP=3

key() {
  {
    "$PY" - <<'PY'
import json, sys, tomllib
with open("pyproject.toml", "rb") as f:
    data = tomllib.load(f)
project = data.get("project", {})
print(json.dumps([sys.version, sys.executable, data.get("build-system"), project.get("dependencies"),
                  project.get("optional-dependencies")], sort_keys=True))
PY
    uname -m
    echo "test=$WITH_TEST"
    cat constraints.txt scripts/bootstrap.sh scripts/venv-cache.sh
  } | sha256sum | cut -c1-16
}

# Hard links where the file system allows them, else a copy; into a new folder only.
link_tree() {
  cp -al "$1" "$2" 2>/dev/null || { rm -rf "$2"; cp -a "$1" "$2"; }
}

# The files that name the venv's own path (bin/ scripts, pyvenv.cfg), rewritten from $2 to $3 as new files renamed
# over the old names: a hard link to the other tree is dropped, never written through.
repoint() {
  "$PY" - "$@" <<'PY'
import os, sys
from pathlib import Path
tree, old, new = Path(sys.argv[1]), sys.argv[2].encode(), sys.argv[3].encode()
for f in [*(tree / "bin").iterdir(), tree / "pyvenv.cfg"]:
    if f.is_symlink() or not f.is_file():
        continue
    data = f.read_bytes()
    if old not in data:
        continue
    tmp = f.with_name(f".{f.name}.repoint")
    tmp.write_bytes(data.replace(old, new))
    os.chmod(tmp, f.stat().st_mode & 0o7777)
    os.replace(tmp, f)
PY
}

abs() { (cd "$1" && pwd -P); }

case "$ACTION" in
  key)
    key
    ;;
  save)
    [ -x "$VENV/bin/python" ] || { echo "venv-cache: $VENV is not a venv" >&2; exit 2; }
    K=$(key)
    mkdir -p "$TEMPLATES"
    [ -d "$TEMPLATES/$K" ] && exit 0
    SRC=$(abs "$VENV")
    TMP=$(mktemp -d "$TEMPLATES/.new-$K.XXXXXX")
    trap 'rm -rf "$TMP"' EXIT
    link_tree "$SRC" "$TMP/venv"
    repoint "$TMP/venv" "$SRC" "$TEMPLATES/$K"
    # Another bootstrap may have saved the same key meanwhile: the first one stays.
    mv -T "$TMP/venv" "$TEMPLATES/$K" 2>/dev/null || true
    # Keep the most recently used templates (restore touches the one it uses).
    ls -1dt "$TEMPLATES"/*/ 2>/dev/null | tail -n +$((KEEP + 1)) | while read -r old; do rm -rf "$old"; done
    ;;
  restore)
    K=$(key)
    [ -x "$TEMPLATES/$K/bin/python" ] || exit 1
    [ ! -e "$VENV" ] || { echo "venv-cache: $VENV exists already" >&2; exit 2; }
    # Made beside VENV under another name, renamed when complete: a failed restore leaves no half venv.
    PART="$VENV.restoring.$$"
    trap 'rm -rf "$PART"' EXIT
    link_tree "$TEMPLATES/$K" "$PART"
    repoint "$PART" "$TEMPLATES/$K" "$(abs "$(dirname "$VENV")")/$(basename "$VENV")"
    mv -T "$PART" "$VENV"
    touch "$TEMPLATES/$K"
    echo "$K"
    ;;
  *)
    echo "venv-cache: unknown action '$ACTION' (key, save or restore)" >&2
    exit 2
    ;;
esac
