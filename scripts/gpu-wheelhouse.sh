#!/usr/bin/env bash
# Prepare, here, the wheels that scripts/gpu-check.sh installs on a GPU machine that
# reaches no package index.
#
#   scripts/gpu-wheelhouse.sh DIR [--python-version 3.12 ...] [--check]
#
# The GPU machine's python3 (3.12) has CUDA torch, transformers (so numpy, packaging,
# tqdm), triton, ninja, psutil, py-cpuinfo, msgpack, einops and nvidia-ml-py, and no
# deepspeed, hjson or pydantic. DIR gets:
#   - deepspeed (the version constraints.txt pins) as a pure-Python wheel built here
#     with `pip wheel --no-deps` (its ops are built just in time there, with ninja);
#   - hjson, pydantic and pydantic-core (CPython manylinux x86_64 for each
#     --python-version, default 3.12), annotated-types, typing-inspection,
#     typing-extensions (pydantic needs a newer one than torch brings);
#   - small wheels of deepspeed's other dependencies (einops, msgpack, ninja, psutil,
#     py-cpuinfo, packaging, tqdm): pip installs them only if the machine lacks them;
#   - pip itself, run from its wheel there (the machine's own pip is not relied on);
#   - requirements.txt (what gpu-check.sh installs) and MANIFEST.txt (sizes, sha256).
# Provided by the machine and never carried: torch (and its CUDA libraries, triton),
# numpy (and the rest of transformers' dependencies).
#
# Then it proves the folder complete: for each --python-version, pip (from the folder's
# own wheel) resolves requirements.txt with --no-index against DIR alone, plus
# metadata-only stand-ins for the provided packages (torch 2.11.0, numpy 2.0.0), for
# CPython manylinux x86_64 (`--dry-run --target`, so nothing installed here counts).
# A missing or incompatible wheel fails here, not on the GPU machine. Finally it
# prints DIR's size and fails if it reaches the device tool's 64 MiB carry limit.
# --check only does the proof and the size check (no download).
#
# Needs a package index (PyPI) here; any python3 with pip downloads ($PYTHON to choose).
# Use: scripts/gpu-wheelhouse.sh .gpu-wheelhouse   (an ignored path, carried to the
# GPU machine next to the checkout; binaries stay out of git).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
LIMIT=$((64 * 1024 * 1024))

DIR="" CHECK_ONLY=0 VERSIONS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) VERSIONS+=("$2"); shift 2 ;;
    --check) CHECK_ONLY=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "gpu-wheelhouse: unknown option $1" >&2; exit 2 ;;
    *) [ -z "$DIR" ] || { echo "gpu-wheelhouse: one folder only" >&2; exit 2; }; DIR=$1; shift ;;
  esac
done
[ -n "$DIR" ] || { echo "usage: scripts/gpu-wheelhouse.sh DIR [--python-version 3.12 ...] [--check]" >&2; exit 2; }
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(3.12)
die() { echo "gpu-wheelhouse: $*" >&2; exit 1; }

pin() {  # the version constraints.txt pins for $1
  local v
  v=$(sed -n "s/^$1==\([^ #]*\).*/\1/p" "$REPO/constraints.txt" | head -1)
  [ -n "$v" ] || die "constraints.txt pins no $1"
  echo "$v"
}
DEEPSPEED=deepspeed==$(pin deepspeed)
PYDANTIC=pydantic==$(pin pydantic)
# Exact pins: pydantic-core must be the one that pydantic version requires.
PURE=("$PYDANTIC" hjson==3.1.0 annotated-types==0.8.0 typing-inspection==0.4.5
      typing-extensions==4.16.0 einops==0.8.2 packaging==26.4 tqdm==4.70.1 py-cpuinfo==9.0.0
      pip==26.3)
COMPILED=(pydantic-core==2.50.4 msgpack==1.2.4 psutil==7.2.2 ninja==1.13.2)
PROVIDED=(torch==2.11.0 numpy==2.0.0)   # stand-ins for the GPU machine's own packages
PLATFORMS=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux_2_28_x86_64)

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

if [ "$CHECK_ONLY" = 0 ]; then
  "$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip (set PYTHON)"
  ds_version=${DEEPSPEED#*==}
  if ls "$DIR"/deepspeed-"$ds_version"-py3-none-any.whl >/dev/null 2>&1; then
    echo "gpu-wheelhouse: deepspeed $ds_version wheel already there"
  else
    echo "gpu-wheelhouse: building the deepspeed $ds_version wheel (pure Python, no ops)"
    DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-binary deepspeed "$DEEPSPEED" -w "$DIR" \
      2> >(grep -v "is ignored: it is neither" >&2) || die "pip wheel $DEEPSPEED failed"
  fi
  echo "gpu-wheelhouse: downloading ${PURE[*]}"
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$DIR" "${PURE[@]}" \
    2> >(grep -v "is ignored: it is neither" >&2) || die "pip download failed"
  for v in "${VERSIONS[@]}"; do
    echo "gpu-wheelhouse: downloading ${COMPILED[*]} for CPython $v manylinux x86_64"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --implementation cp \
      --python-version "$v" --abi "cp${v/./}" "${PLATFORMS[@]}" -d "$DIR" "${COMPILED[@]}" \
      2> >(grep -v "is ignored: it is neither" >&2) || die "pip download for CPython $v failed"
  done
  # Keep only the pinned wheels (an older pin's wheel would be carried for nothing).
  "$PY" - "$DIR" "$DEEPSPEED" "${PURE[@]}" "${COMPILED[@]}" <<'PYEOF'
import os, re, sys
folder, pins = sys.argv[1], sys.argv[2:]
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
keep = {(norm(p.split("==")[0]), p.split("==")[1]) for p in pins}
for name in sorted(os.listdir(folder)):
    if name.endswith(".whl"):
        dist, version = name.split("-")[:2]
        if (norm(dist), version) not in keep:
            os.remove(os.path.join(folder, name))
            print(f"gpu-wheelhouse: removed {name} (not pinned)")
PYEOF
  {
    echo "# What scripts/gpu-check.sh --wheelhouse installs (made by scripts/gpu-wheelhouse.sh)."
    echo "# Dependencies resolve from this folder, except those the GPU machine provides:"
    echo "# ${PROVIDED[*]%%==*}."
    echo "$DEEPSPEED"
    echo "hjson"
    echo "pydantic>=2.0.0"
  } >"$DIR/requirements.txt"
  "$PY" - "$DIR" <<'PYEOF'
import hashlib, os, sys
folder = sys.argv[1]
with open(os.path.join(folder, "MANIFEST.txt"), "w") as out:
    for name in sorted(os.listdir(folder)):
        if name.endswith(".whl"):
            data = open(os.path.join(folder, name), "rb").read()
            out.write(f"{hashlib.sha256(data).hexdigest()}  {len(data):>9}  {name}\n")
PYEOF
fi

[ -f "$DIR/requirements.txt" ] || die "$DIR has no requirements.txt (run without --check first)"
PIP_WHL=$(ls "$DIR"/pip-*.whl 2>/dev/null | head -1)
[ -n "$PIP_WHL" ] || die "$DIR has no pip wheel"

# The proof: resolve with no index, DIR and the stand-ins only, for each target Python.
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$PY" - "$TMP/stubs" "${PROVIDED[@]}" <<'PYEOF'
import os, sys, zipfile
out, pins = sys.argv[1], sys.argv[2:]
os.makedirs(out)
for pin in pins:
    name, version = pin.split("==")
    info = f"{name}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 "Summary: stand-in: provided by the GPU machine, never carried\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpu-wheelhouse\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(os.path.join(out, f"{name}-{version}-py3-none-any.whl"), "w") as z:
        for p, text in files.items():
            z.writestr(p, text)
PYEOF
status=0
for v in "${VERSIONS[@]}"; do
  report=$TMP/report-$v.json
  if ! "$PY" "$PIP_WHL/pip" --isolated --disable-pip-version-check --no-cache-dir install \
        --dry-run --quiet --report "$report" --no-index --find-links "$DIR" --find-links "$TMP/stubs" \
        --only-binary=:all: --implementation cp --python-version "$v" --abi "cp${v/./}" \
        "${PLATFORMS[@]}" --target "$TMP/target-$v" -r "$DIR/requirements.txt"; then
    echo "gpu-wheelhouse: FAILED: $DIR does not resolve for CPython $v with --no-index" >&2
    status=1
    continue
  fi
  "$PY" - "$report" "$DIR" "$v" "${PROVIDED[@]%%==*}" <<'PYEOF' || status=1
import json, os, sys, urllib.parse, urllib.request
report, folder, version, provided = sys.argv[1], sys.argv[2], sys.argv[3], set(sys.argv[4:])
used, stand_ins = [], []
for item in json.load(open(report))["install"]:
    path = urllib.request.url2pathname(urllib.parse.urlparse(item["download_info"]["url"]).path)
    name = item["metadata"]["name"]
    if os.path.dirname(path) == folder:
        used.append(os.path.basename(path))
    elif name.lower() in provided:
        stand_ins.append(name)
    else:
        sys.exit(f"gpu-wheelhouse: {name} resolved from {path}, not from {folder}")
print(f"gpu-wheelhouse: CPython {version}: resolves with no index: {len(used)} wheels from the "
      f"folder, provided by the machine: {', '.join(sorted(stand_ins))}")
for name in sorted(used):
    print(f"    {name}")
PYEOF
done
size=$(du -sb "$DIR" | cut -f1)
echo "gpu-wheelhouse: $DIR is $size bytes ($(( (size + 1048575) / 1048576 )) MiB; the carry limit is 64 MiB)"
[ "$size" -lt "$LIMIT" ] || { echo "gpu-wheelhouse: FAILED: $DIR is over the 64 MiB carry limit" >&2; status=1; }
exit $status
