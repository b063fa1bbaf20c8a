#!/usr/bin/env bash
# Training-throughput check of the llama3-8b architecture on one NVIDIA GPU.
#
#   scripts/gpu-check.sh [--layers auto|N] [--seq-len 8192] [--micro-batch 1]
#                        [--steps 10] [--warmup 3] [--repeats 3]
#                        [--variants "base compile ckpt compile+ckpt"] [--out DIR]
#
# Runs qualify.workloads.train (DeepSpeed, bf16, ZeRO stage 0, one process) once per
# variant and prints tokens/s, model TFLOP/s per GPU and MFU (peak from the workload's
# table, matched on the GPU name). Random weights: no download is needed.
#
# --layers auto (default) tries the full 32 layers first and only if the base variant
# runs out of memory retries with 24, then 16, then 8 layers; every variant then uses
# the layer count that fitted, so the variants compare like for like. (Full llama3-8b
# with AdamW needs ~120 GiB of weights+grads+fp32 master+moments before activations.)
#
# Python: $PYTHON if set; else python3 if it already has CUDA torch, deepspeed and
# transformers; else a venv at $QUALIFY_GPU_VENV (default ~/.cache/qualify/gpu-venv)
# with torch from $TORCH_INDEX_URL (default: PyPI, whose Linux wheel is the CUDA build)
# and deepspeed + transformers from the default index (PIP_INDEX_URL / PIP_FIND_LINKS
# are honoured, for a mirror or a wheelhouse).
#
# Smoke test of this script without a GPU (CI, or here): GPU_CHECK_CPU_SMOKE=1
# GPU_CHECK_PRESET=tiny-llama scripts/gpu-check.sh --layers 2 --seq-len 64 --steps 2
set -euo pipefail
PRESET=${GPU_CHECK_PRESET:-llama3-8b}
SMOKE=${GPU_CHECK_CPU_SMOKE:-0}

LAYERS=auto SEQ_LEN=8192 MICRO=1 STEPS=10 WARMUP=3 REPEATS=3
VARIANTS="base compile ckpt compile+ckpt"
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) LAYERS=$2; shift 2 ;;
    --seq-len) SEQ_LEN=$2; shift 2 ;;
    --micro-batch) MICRO=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --variants) VARIANTS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
  esac
done

die() { echo "gpu-check: $*" >&2; exit 2; }

if [ "$SMOKE" = 1 ]; then
  echo "gpu-check: CPU smoke test of the script (GPU_CHECK_CPU_SMOKE=1), figures mean nothing"
else
  command -v nvidia-smi >/dev/null 2>&1 || die "no nvidia-smi: this check needs an NVIDIA GPU"
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) || true
  [ -n "${GPU_NAME:-}" ] || die "nvidia-smi lists no GPU"
  echo "gpu-check: GPU 0 is ${GPU_NAME}; driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${QUALIFY_CACHE_DIR:-$HOME/.cache/qualify}
OUT=${OUT:-$CACHE/gpu-check/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$CACHE/torch_extensions}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$CACHE/inductor}
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}

has_stack() {
  SMOKE=$SMOKE "$1" - <<'EOF' >/dev/null 2>&1
import os, torch, deepspeed, transformers
assert torch.cuda.is_available() or os.environ["SMOKE"] == "1"
EOF
}

if [ -n "${PYTHON:-}" ]; then
  has_stack "$PYTHON" || die "\$PYTHON=$PYTHON lacks CUDA torch, deepspeed or transformers"
elif command -v python3 >/dev/null 2>&1 && has_stack python3; then
  PYTHON=python3
else
  VENV=${QUALIFY_GPU_VENV:-$CACHE/gpu-venv}
  if [ ! -x "$VENV/bin/python" ] || ! has_stack "$VENV/bin/python"; then
    echo "gpu-check: creating $VENV (torch, deepspeed, transformers)"
    python3 -m venv "$VENV" || die "python3 -m venv failed (install python3-venv)"
    "$VENV/bin/pip" install -q --upgrade pip
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
      "$VENV/bin/pip" install -q torch --index-url "$TORCH_INDEX_URL"
    else
      "$VENV/bin/pip" install -q torch
    fi
    "$VENV/bin/pip" install -q deepspeed transformers
  fi
  PYTHON=$VENV/bin/python
  has_stack "$PYTHON" || die "the venv's torch does not see a CUDA GPU (wrong wheel? set TORCH_INDEX_URL)"
fi
"$PYTHON" -c 'import torch, deepspeed, transformers as t; print("gpu-check: torch", torch.__version__, "cuda", torch.version.cuda, "deepspeed", deepspeed.__version__, "transformers", t.__version__)'

# One case: variant, layers -> result document in $OUT/<variant>-L<layers>.json
run_variant() {
  local variant=$1 layers=$2 doc=$OUT/$1-L$2.json
  "$PYTHON" - "$variant" "$layers" "$OUT" "$SEQ_LEN" "$MICRO" "$STEPS" "$WARMUP" "$REPEATS" "$PRESET" <<'EOF'
import json, sys
from qualify.workloads import protocol
from qualify.workloads.train.models import PRESETS
variant, layers, out, seq, micro, steps, warmup, repeats, preset = sys.argv[1:]
cfg = f"{out}/{preset}-L{layers}.json"
json.dump({**PRESETS[preset], "num_hidden_layers": int(layers)}, open(cfg, "w"))
params = {"model": f"{preset}-L{layers}", "model_config_path": cfg, "seq_len": int(seq),
          "micro_batch": int(micro), "steps": int(steps), "warmup_steps": int(warmup),
          "repeats": int(repeats), "dtype": "bf16", "zero_stage": 0,
          "compile": "compile" in variant,
          "activation_checkpointing": "all" if "ckpt" in variant else "none"}
case = protocol.make_case(f"train/{preset}-L{layers}/{variant}", "train", params, timeout_s=3600)
json.dump(case, open(f"{out}/{variant}-L{layers}.case.json", "w"))
EOF
  echo "gpu-check: running $variant with $layers layers (log: $OUT/$variant-L$layers.log)" >&2
  "$PYTHON" -m qualify.workloads.train --case "$OUT/$variant-L$layers.case.json" \
    2>"$OUT/$variant-L$layers.log" | tail -1 >"$doc" || true
  "$PYTHON" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("error_class") or d["status"])' "$doc" 2>/dev/null || echo crash
}

if [ "$LAYERS" = auto ]; then
  [ "$PRESET" = llama3-8b ] || die "--layers auto is for llama3-8b (32 layers)"
  CHOSEN=""
  for n in 32 24 16 8; do
    outcome=$(run_variant base "$n")
    echo "gpu-check: base with $n layers: $outcome"
    if [ "$outcome" = passed ]; then CHOSEN=$n; break; fi
    [ "$outcome" = oom ] || die "base variant failed ($outcome) with $n layers; see $OUT/base-L$n.log"
  done
  [ -n "$CHOSEN" ] || die "even 8 layers do not fit"
  LAYERS=$CHOSEN
  [ "$LAYERS" = 32 ] || echo "gpu-check: NOTE reduced to $LAYERS of 32 layers to fit one GPU"
else
  run_variant base "$LAYERS" >/dev/null
fi
for v in $VARIANTS; do
  [ "$v" = base ] && continue
  run_variant "$v" "$LAYERS" >/dev/null
done

"$PYTHON" - "$OUT" "$LAYERS" "$PRESET" $VARIANTS <<'EOF'
import json, sys
from qualify.workloads.train.models import PRESETS
out, layers, preset, variants = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
full = PRESETS[preset]["num_hidden_layers"]
def f(x, fmt):
    return "n/a" if x is None else format(x, fmt)
rows, base_tps = [], None
print(f"\n{preset} architecture, {layers}/{full} layers, DeepSpeed bf16 ZeRO-0, one device; documents in {out}")
print(f"{'variant':14} {'status':8} {'tokens/s':>10} {'vs base':>8} {'TFLOP/s/GPU':>12} {'MFU':>7} "
      f"{'step s':>8} {'cv':>6} {'peak GiB':>9} {'compile s':>9} {'ckpt layers':>11}")
for v in variants:
    try:
        d = json.load(open(f"{out}/{v}-L{layers}.json"))
    except Exception:
        print(f"{v:14} {'no document'}"); continue
    m, e = d.get("metrics") or {}, d.get("environment") or {}
    tps = m.get("tokens_per_s")
    if v == "base":
        base_tps = tps
    ratio = tps / base_tps if tps and base_tps else None
    status = d["status"] if d["status"] == "passed" else (d.get("error_class") or d["status"])
    mem = m.get("peak_memory_bytes")
    print(f"{v:14} {status:8} {f(tps, '10.1f'):>10} {f(ratio, '.3f'):>8} "
          f"{f(m.get('tflops_per_device'), '.1f'):>12} {f(m.get('mfu'), '.3f'):>7} "
          f"{f(m.get('step_time_s_median'), '.3f'):>8} {f(m.get('cv_tokens_per_s'), '.3f'):>6} "
          f"{f(mem / 2**30 if mem else None, '.1f'):>9} {f(m.get('compile_time_s'), '.1f'):>9} "
          f"{str(e.get('checkpointed_layers', 'n/a')):>11}")
    if d["status"] != "passed":
        print(f"{'':14} {d.get('error')}")
name = None
for v in variants:
    try:
        name = json.load(open(f"{out}/{v}-L{layers}.json"))["environment"].get("device_name")
        break
    except Exception:
        pass
print(f"device {name}; MFU is null when the device is not in qualify/workloads/train/mfu.py")
EOF
