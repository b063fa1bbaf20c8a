#!/usr/bin/env bash
# Training-throughput check of the llama3-8b architecture on one NVIDIA GPU, in one
# command that ends within its budget (default 420 s, at most 480 s = 8 minutes).
#
#   scripts/gpu-check.sh [--wheelhouse DIR] [--budget-s 420] [--out DIR]
#                        [--layers auto|N] [--seq-len 8192] [--micro-batch 1]
#                        [--steps 10] [--warmup 3] [--repeats 3]
#                        [--variants "base ckpt compile compile+ckpt"]
#                        [--bare-precision master|pure] [--no-bare] [--cpu-smoke]
#
# Runs qualify.workloads.train (DeepSpeed, bf16, ZeRO stage 0, one process) once per
# variant, and a bare PyTorch loop (qualify/workloads/gpucheck/bare_loop.py: same model, micro-batch,
# sequence length and steps; AdamW with fp32 master weights as DeepSpeed keeps them; no
# DeepSpeed, no qualify) in the same run, so harness/bare is a side-by-side ratio.
# Reports tokens/s, model TFLOP/s per GPU and MFU (peak from the workload's table,
# matched on the GPU name). Random weights: nothing is downloaded.
# The driver is src/qualify/workloads/gpucheck/harness.py (its docstring has the details).
#
# --layers auto (default) takes the largest of 32, 24, 16, 8 layers that trains: a
# count whose training state alone exceeds the GPU's memory is skipped without a
# try, an OOM retries with fewer layers; every variant then uses that count, so the
# variants compare like for like. (Full llama3-8b with this optimizer needs about 20
# bytes a parameter, ~150 GiB, before activations.)
#
# --budget-s: the whole command, this script's set-up included, ends by then. Before
# each run the rest is re-planned from the measured cost of the runs so far: first
# fewer steps/repeats, then variants are dropped (compile+ckpt, then compile, then
# ckpt); base and the bare loop always run. Each run is killed at the deadline.
#
# Output (--out, default $OUT when set, else ~/.cache/qualify/gpu-check/<time>):
# gpu-check.json (per variant: layers, seq_len, micro_batch, tokens/s, TFLOP/s per
# GPU, MFU; the bare loop's tokens/s; harness_over_bare), gpu-check.txt (the table),
# and each run's case, result document and log.
#
# Python: $PYTHON if set, else python3. When it lacks deepspeed (or hjson, pydantic):
#   --wheelhouse DIR  installs only what is missing, from the wheels in DIR, never from
#                     an index: pip (run from DIR's own pip wheel) resolves DIR's
#                     requirements.txt against what the interpreter already has
#                     (`--dry-run --report`, `--no-index`), then installs exactly the
#                     missing wheels with --no-deps into a site folder ($GPU_CHECK_SITE,
#                     default ~/.cache/qualify/gpu-site/py<X.Y>) that is put first on
#                     PYTHONPATH; a second resolution must then find nothing missing.
#                     Installed files keep their wheel's time (DeepSpeed's JIT ops stay built).
#                     Make DIR here with scripts/gpu-wheelhouse.sh DIR.
#   without it        a venv at $QUALIFY_GPU_VENV (default ~/.cache/qualify/gpu-venv)
#                     installed from a package index (needs one).
# qualify itself runs from this checkout (PYTHONPATH=src), it is never installed.
#
# On the GPU machine (no index; python3 3.12 with CUDA torch and transformers), from
# the repository root with .gpu-wheelhouse carried:
#   scripts/gpu-check.sh --wheelhouse .gpu-wheelhouse --budget-s 420
#
# CPU smoke test of the script (CI, or here): --cpu-smoke (or GPU_CHECK_CPU_SMOKE=1)
# trains the tiny-llama preset, 2 layers, seq 64, 1 warm-up + 2 steps, one thread.
set -euo pipefail
T0=$(date +%s.%N)
export GPU_CHECK_T0=$T0
SMOKE=${GPU_CHECK_CPU_SMOKE:-0}
WHEELHOUSE=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheelhouse) [ $# -ge 2 ] || { echo "gpu-check: --wheelhouse needs a folder" >&2; exit 2; }
                  WHEELHOUSE=$2; shift 2 ;;
    --wheelhouse=*) WHEELHOUSE=${1#*=}; shift ;;
    --cpu-smoke) SMOKE=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

die() { echo "gpu-check: $*" >&2; exit 2; }

if [ "$SMOKE" = 1 ]; then
  echo "gpu-check: CPU smoke test of the script, figures mean nothing"
  ARGS=(--cpu-smoke ${ARGS[@]+"${ARGS[@]}"})
else
  command -v nvidia-smi >/dev/null 2>&1 || die "no nvidia-smi: this check needs an NVIDIA GPU (or --cpu-smoke)"
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) || true
  [ -n "${GPU_NAME:-}" ] || die "nvidia-smi lists no GPU"
  echo "gpu-check: GPU 0 is ${GPU_NAME}; driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${QUALIFY_CACHE_DIR:-$HOME/.cache/qualify}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$CACHE/torch_extensions}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$CACHE/inductor}
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}

# Does $1 have the stack? On success STACK holds its versions.
STACK=""
has_stack() {
  STACK=$(SMOKE=$SMOKE timeout 120 "$1" - 2>/dev/null <<'EOF'
import os, platform, torch, deepspeed, transformers, hjson, pydantic
assert torch.cuda.is_available() or os.environ["SMOKE"] == "1"
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "deepspeed", deepspeed.__version__, "transformers", transformers.__version__,
      "pydantic", pydantic.VERSION)
EOF
) && [ -n "$STACK" ]
}

# Install what $1 lacks from the wheelhouse into a site folder first on PYTHONPATH.
from_wheelhouse() {
  local py=$1 wh=$2 pip site ver report
  [ -d "$wh" ] || die "--wheelhouse $wh: no such folder (make it with scripts/gpu-wheelhouse.sh $wh)"
  wh=$(cd "$wh" && pwd)
  [ -f "$wh/requirements.txt" ] || die "$wh has no requirements.txt: not made by scripts/gpu-wheelhouse.sh"
  pip=$(ls "$wh"/pip-*.whl 2>/dev/null | head -1)
  [ -n "$pip" ] || die "$wh has no pip wheel: remake it with scripts/gpu-wheelhouse.sh"
  ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || die "$py does not run"
  site=${GPU_CHECK_SITE:-$CACHE/gpu-site/py$ver}
  mkdir -p "$site"
  export PYTHONPATH="$site:$PYTHONPATH"
  # pip from the wheelhouse's own wheel, no index, no config file, no cache:
  pipw() { timeout 180 "$py" "$pip/pip" --isolated --disable-pip-version-check --no-cache-dir "$@"; }
  report=$site/.missing.json
  # What is missing, resolved against what this interpreter (and the site folder) has.
  pipw install --dry-run --quiet --report "$report" --no-index --find-links "$wh" \
      --only-binary=:all: -r "$wh/requirements.txt" \
    || die "the wheelhouse $wh cannot satisfy $py (see pip's message above)"
  local missing
  missing=$("$py" - "$report" <<'EOF'
import json, sys, urllib.parse, urllib.request
items = json.load(open(sys.argv[1]))["install"]
for it in items:
    print(urllib.request.url2pathname(urllib.parse.urlparse(it["download_info"]["url"]).path))
EOF
) || die "could not read pip's report $report"
  if [ -z "$missing" ]; then
    echo "gpu-check: nothing missing: $py already has what $wh/requirements.txt needs"
  else
    echo "gpu-check: installing from $wh into $site (no index): $(echo "$missing" | xargs -n1 basename | tr '\n' ' ')"
    # shellcheck disable=SC2086
    pipw install --quiet --no-index --no-deps --upgrade --target "$site" $missing \
      || die "installing the wheels into $site failed"
    # pip gives every installed file the time of the install. DeepSpeed's JIT ops (the CPU shm comm op, built by
    # ninja under TORCH_EXTENSIONS_DIR) are rebuilt when a source is newer than what was built from it: each
    # reinstall of the same wheel rebuilt them (26-150 s on a 2-core CPU). Each file takes its wheel's time
    # instead: the same wheel, the same times; a new wheel (a new file) is newer, and its ops are rebuilt.
    # shellcheck disable=SC2086
    "$py" - "$site" $missing <<'EOF' || die "could not date the files installed into $site"
import os, sys, zipfile
site, wheels = sys.argv[1], sys.argv[2:]
for wheel in wheels:
    stamp = os.stat(wheel).st_mtime_ns
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            path = os.path.join(site, name)
            if os.path.isfile(path) and not os.path.islink(path):
                os.utime(path, ns=(stamp, stamp))
EOF
    pipw install --dry-run --quiet --report "$report" --no-index --find-links "$wh" \
        --only-binary=:all: -r "$wh/requirements.txt" || die "resolution after the install failed"
    missing=$("$py" -c 'import json,sys; print(" ".join(i["metadata"]["name"] for i in json.load(open(sys.argv[1]))["install"]))' "$report")
    [ -z "$missing" ] || die "still missing after the install: $missing"
  fi
}

BASE_PY=${PYTHON:-python3}
command -v "$BASE_PY" >/dev/null 2>&1 || die "no $BASE_PY"
if has_stack "$BASE_PY"; then
  PY=$BASE_PY
elif [ -n "$WHEELHOUSE" ]; then
  from_wheelhouse "$BASE_PY" "$WHEELHOUSE"
  PY=$BASE_PY
  has_stack "$PY" || {
    SMOKE=$SMOKE "$PY" -c 'import os, torch, deepspeed, transformers; assert torch.cuda.is_available() or os.environ["SMOKE"] == "1", "torch sees no CUDA GPU"' >&2 || true
    die "$PY still lacks torch with CUDA, deepspeed or transformers after the wheelhouse install"
  }
elif [ -n "${PYTHON:-}" ]; then
  die "\$PYTHON=$PYTHON lacks CUDA torch, deepspeed or transformers (give --wheelhouse DIR)"
else
  VENV=${QUALIFY_GPU_VENV:-$CACHE/gpu-venv}
  if [ ! -x "$VENV/bin/python" ] || ! has_stack "$VENV/bin/python"; then
    echo "gpu-check: creating $VENV from a package index (torch, deepspeed, transformers)"
    python3 -m venv "$VENV" || die "python3 -m venv failed (install python3-venv)"
    "$VENV/bin/pip" install -q --upgrade pip
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
      "$VENV/bin/pip" install -q torch --index-url "$TORCH_INDEX_URL"
    else
      "$VENV/bin/pip" install -q torch
    fi
    "$VENV/bin/pip" install -q deepspeed transformers
  fi
  PY=$VENV/bin/python
  has_stack "$PY" || die "the venv's torch does not see a CUDA GPU (wrong wheel? set TORCH_INDEX_URL)"
fi
echo "gpu-check: $(echo "$STACK" | tail -1)"

exec "$PY" -m qualify.workloads.gpucheck --python "$PY" ${ARGS[@]+"${ARGS[@]}"}
