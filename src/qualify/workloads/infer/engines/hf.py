"""The transformers engine of the inference workload (runs on CPU here, CUDA where present).

One case: load the model (a tiny preset trained on its synthetic language, or a model
directory), take reference logits on the evaluation sequences, quantize the same model
in place with torchao, take the quantized logits on the SAME token ids, compare; then
time greedy generation with a manual KV-cache decode loop (so TTFT, TPOT and ITL
exist) and run the known-issue probes on the quantized model.

Requests run one at a time (concurrency 1) and never stop at EOS (like vLLM's
benchmark with ignore_eos): every request yields exactly max_new_tokens tokens.

In a duet launch (gate.regression.baseline: duet; workloads/duet.py) each timed request is a step: both
sides start request k together at the step barrier, trade core sets every request, and each request's wall
time is recorded (`samples.step_time_s`): with the same prompts and the same token count on both sides, the
ratio of two request times is the inverse ratio of their output token rates.

Standard library, torch, transformers, torchao and qualify.workloads only.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from typing import Any

import torch

from qualify.workloads import duet, phases
from qualify.workloads.infer import metrics as infer_metrics
from qualify.workloads.infer import models as infer_models
from qualify.workloads.infer import probes as infer_probes
from qualify.workloads.infer import quant as infer_quant
from qualify.workloads.infer.params import DEFAULT_TRAIN_STEPS, InferParams
from qualify.workloads.protocol import BadCase, WorkloadFailure, is_oom, measurement_gate

# engine_args understood by this engine. vLLM-only knobs are accepted and ignored where
# harmless so that one matrix entry can describe both engines.
ENGINE_ARGS = {"dtype", "device", "max_model_len", "attn_implementation", "enable_prefix_caching",
               "tensor_parallel_size", "gpu_memory_utilization", "eval_batch_size"}
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
CPU_MAX_MODEL_LEN = 1024  # default cap of the max_model_len probe on CPU
GPU_MAX_MODEL_LEN = 32768
PREFIX_REQUESTS = 4
PREFIX_SUFFIX_LEN = 8
# A duet side waiting for its peer keeps its core busy with matmuls of this size (workloads/duet.py says why).
FILLER_SIZE = 192
# Sequences per teacher-forced forward pass (engine_args.eval_batch_size): ~160 evaluation windows
# in a few batched passes rather than one pass per handful.
EVAL_BATCH = 32


def check_engine_args(engine_args: dict[str, Any]) -> None:
    for key, value in engine_args.items():
        if key not in ENGINE_ARGS:
            raise BadCase(f"engine_args.{key}: not understood by the transformers engine "
                          f"(known: {', '.join(sorted(ENGINE_ARGS))})")
    if engine_args.get("dtype", "auto") not in set(DTYPES) | {"auto"}:
        raise BadCase(f"engine_args.dtype: {engine_args['dtype']!r} is not one of {sorted(DTYPES)} or 'auto'")
    if engine_args.get("tensor_parallel_size", 1) != 1:
        raise BadCase("engine_args.tensor_parallel_size: the transformers engine runs on one device")
    mml = engine_args.get("max_model_len")
    if mml is not None and (isinstance(mml, bool) or not isinstance(mml, int) or mml < 2):
        raise BadCase(f"engine_args.max_model_len: expected an integer >= 2, got {mml!r}")
    ebs = engine_args.get("eval_batch_size", EVAL_BATCH)
    if isinstance(ebs, bool) or not isinstance(ebs, int) or ebs < 1:
        raise BadCase(f"engine_args.eval_batch_size: expected a positive integer, got {ebs!r}")
    if "device" in engine_args and not isinstance(engine_args["device"], str):
        raise BadCase("engine_args.device: expected a string such as 'cpu' or 'cuda'")


def resolve_device(engine_args: dict[str, Any]) -> str:
    device = engine_args.get("device", "auto")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BadCase(f"engine_args.device: {device!r} requested but CUDA is not available")
    return device


def resolve_dtype(engine_args: dict[str, Any], device: str) -> torch.dtype:
    name = engine_args.get("dtype", "auto")
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return DTYPES[name]


def environment(device: str, dtype: torch.dtype) -> dict[str, Any]:
    import transformers

    env: dict[str, Any] = {
        "engine": "transformers",
        "engine_version": transformers.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
        "dtype": str(dtype).replace("torch.", ""),
        "num_threads": torch.get_num_threads(),
    }
    try:
        import torchao

        env["torchao"] = torchao.__version__
    except Exception as exc:  # noqa: BLE001
        env["torchao"] = f"unavailable: {exc}"
    env.update(device_facts(device))
    return env


def device_facts(device: str) -> dict[str, Any]:
    import platform

    facts: dict[str, Any] = {"cuda": torch.version.cuda, "device_count": 1}
    if device.startswith("cuda") and torch.cuda.is_available():
        facts["device_name"] = torch.cuda.get_device_name(torch.device(device))
        facts["device_count"] = torch.cuda.device_count()
    else:
        facts["device_name"] = platform.processor() or platform.machine() or "cpu"
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as fh:
            facts["driver"] = fh.readline().strip()
    except OSError:
        facts["driver"] = None
    return facts


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ---------------------------------------------------------------- decoding


def _crop(cache, length: int) -> None:
    """Cut a KV cache back to its first `length` positions (negative crop: both 4.5x and 5.x)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _cache_tensors(cache) -> list[torch.Tensor]:
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return [t for layer in cache.layers for t in (layer.keys, layer.values) if isinstance(t, torch.Tensor)]
    return list(getattr(cache, "key_cache", [])) + list(getattr(cache, "value_cache", []))


def break_cache(cache, seed: int) -> None:
    """inject.break_kv_cache: overwrite the cached prefix with loud noise (a broken KV reuse)."""
    g = torch.Generator().manual_seed(seed + 4_242)
    with torch.no_grad():
        for t in _cache_tensors(cache):
            noise = torch.randn(t.shape, generator=g).to(t.device, t.dtype)
            t.copy_(noise * (10 * t.float().std().clamp_min(1.0)).to(t.dtype))


@torch.no_grad()
def greedy_generate(model, prompt: torch.Tensor, max_new: int, *, cache=None, margins: bool = False,
                    device: str = "cpu") -> dict[str, Any]:
    """Greedy decode of one request with the KV cache; wall time of every token.

    prompt is a 1-D tensor of ids; with `cache`, the prompt continues it (prefix reuse).
    """
    ids = prompt.to(device).view(1, -1)
    tokens: list[int] = []
    times: list[float] = []
    tops: list[float] = []
    nonfinite = torch.zeros((), dtype=torch.long, device=device)
    _sync(device)
    start = time.perf_counter()
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    cache = out.past_key_values
    logits = out.logits[0, -1]
    for step in range(max_new):
        tok = int(logits.argmax())  # .item() synchronises
        times.append(time.perf_counter())
        tokens.append(tok)
        nonfinite += (~torch.isfinite(logits)).any()
        if margins:
            top2 = logits.float().topk(2).values
            tops.append(float(top2[0] - top2[1]))
        if step == max_new - 1:
            break
        out = model(input_ids=torch.tensor([[tok]], device=device), past_key_values=cache, use_cache=True)
        logits = out.logits[0, -1]
    return {"tokens": tokens, "start": start, "times": times, "margins": tops,
            "nonfinite": int(nonfinite), "cache": cache}


@torch.no_grad()
def teacher_forced_logits(model, sequences: torch.Tensor, device: str, batch: int = 4) -> torch.Tensor:
    """Logits [N, T-1, V] (float32, CPU) of every position predicting the next token."""
    chunks = []
    for i in range(0, sequences.shape[0], batch):
        ids = sequences[i:i + batch, :-1].to(device)
        chunks.append(model(input_ids=ids, use_cache=False).logits.float().cpu())
    return torch.cat(chunks)


# ---------------------------------------------------------------- probes


def prefix_cache_probe(model, tokens: infer_models.TokenSource, p: InferParams, max_len: int, device: str,
                       tie_tol: float) -> dict[str, Any]:
    suffix_len = PREFIX_SUFFIX_LEN
    new = min(p.max_new_tokens, 16)
    prefix_len = min(4 * p.prompt_len, max_len - suffix_len - new, 512)
    if prefix_len < 4:
        return infer_probes.skipped(f"max_model_len {max_len} leaves no room for a shared prefix")
    prefix = tokens.probe_tokens(1, prefix_len, offset=0)[0]
    suffixes = tokens.probe_tokens(PREFIX_REQUESTS, suffix_len, offset=1)
    # (b) fresh from scratch, in order
    fresh, fresh_margins = [], []
    for i in range(PREFIX_REQUESTS):
        r = greedy_generate(model, torch.cat([prefix, suffixes[i]]), new, margins=True, device=device)
        fresh.append(r["tokens"])
        fresh_margins.append(r["margins"])
    # (a) one shared prefix computed once, its cache reused by every request, in reverse order
    with torch.no_grad():
        cache = model(input_ids=prefix.to(device).view(1, -1), use_cache=True).past_key_values
    if p.inject.get("break_kv_cache"):
        break_cache(cache, p.seed)
    cached: list[list[int] | None] = [None] * PREFIX_REQUESTS
    for i in reversed(range(PREFIX_REQUESTS)):
        _crop(cache, prefix_len)
        cached[i] = greedy_generate(model, suffixes[i], new, cache=cache, device=device)["tokens"]
    result = infer_probes.compare_prefix_runs(fresh, cached, fresh_margins, tie_tol)
    result["detail"] += f" (prefix {prefix_len} tokens, {suffix_len}-token suffixes, {new} new tokens)"
    return result


def max_model_len_probe(model, tokens: infer_models.TokenSource, p: InferParams, max_len: int, device: str,
                        log: logging.Logger) -> tuple[dict[str, Any], list[int] | None]:
    new = max(1, min(p.max_new_tokens, 4, max_len - 1))
    prompt = tokens.probe_tokens(1, max_len - new, offset=2)[0]
    try:
        r = greedy_generate(model, prompt, new, device=device)
    except Exception as exc:  # noqa: BLE001 - judged below
        oom = is_oom(exc)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        log.error("max_model_len probe at %d tokens: %s: %s", max_len, type(exc).__name__, exc)
        return infer_probes.probe("failed", f"one request of {max_len} tokens failed: {type(exc).__name__}: "
                                  f"{str(exc)[:300]}", error_class="oom" if oom else "crash"), None
    total = len(prompt) + len(r["tokens"])
    return infer_probes.probe("passed", f"one request of {total} tokens (max_model_len {max_len}) ran in "
                              f"{r['times'][-1] - r['start']:.3f} s", tokens=total), r["tokens"]


# ---------------------------------------------------------------- the case


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _load_reference(p: InferParams, source: infer_models.ModelSource, path: str | None, steps: int,
                    dtype: torch.dtype, device: str, attn: str | None, log: logging.Logger):
    """A separate reference: reference_model, or the preset trained with inject.reference_seed."""
    ref_seed = p.inject.get("reference_seed")
    if ref_seed is not None:
        meta = infer_models.read_preset_meta(path)
        preset = source.preset or (meta or {}).get("preset")
        if preset is None:
            raise BadCase("inject.reference_seed: only for tiny presets (the seed selects the training)")
        ref_steps = steps or int((meta or {}).get("steps", 0))
        model, _ = infer_models.load_model(infer_models.ModelSource("preset", preset, preset=preset), seed=ref_seed,
                                           train_steps=ref_steps, dtype=dtype, device=device, log=log,
                                           attn_implementation=attn)
        return model
    ref_source = infer_models.resolve_model(p.reference_model, "transformers", param="reference_model")
    try:
        model, _ = infer_models.load_model(ref_source, seed=p.seed, train_steps=steps, dtype=dtype, device=device,
                                           log=log, attn_implementation=attn)
    except BadCase:
        raise
    except Exception as exc:  # noqa: BLE001
        if is_oom(exc):
            raise
        raise WorkloadFailure("load_failed", f"loading reference {p.reference_model}: "
                              f"{type(exc).__name__}: {exc}") from exc
    return model


def _serve(model, prompts: torch.Tensor, p: InferParams, device: str, barrier: duet.StepBarrier | None = None
           ) -> tuple[dict[str, Any], dict[str, list[float]], list[list[int]], int]:
    """Greedy requests one at a time: (metrics, samples, first repeat's outputs, non-finite steps).

    Every request builds its own KV cache from scratch (greedy_generate with cache=None), so no
    repeat is served from a cache that an earlier one filled: unlike vLLM's prefix cache there is
    nothing to reset between repeats here.

    With a duet barrier, each timed request waits for the peer's (busy, on a CPU: _filler) and its wall time
    goes into samples.step_time_s; a repeat's token rate is then over its requests' own times, not the waits.
    """
    phases.enter("warmup")
    for i in range(p.warmup):
        greedy_generate(model, prompts[i % p.num_prompts], p.max_new_tokens, device=device)
    filler = _filler(device) if barrier is not None else None
    phases.enter(phases.MEASURE)
    records: list[dict[str, Any]] = []
    rates: list[float] = []
    outputs: list[list[int]] = []
    request_s: list[float] = []
    nonfinite = 0
    for rep in range(p.repeats):
        total_tokens = 0
        served_s = 0.0
        _sync(device)
        t_rep = time.perf_counter()
        for i in range(p.num_prompts):
            if barrier is not None:
                barrier.wait(filler)  # duet: both sides start request k together
            t_req = time.perf_counter()
            r = greedy_generate(model, prompts[i], p.max_new_tokens, device=device)
            _sync(device)
            took = time.perf_counter() - t_req
            served_s += took
            if barrier is not None:
                barrier.done()
                request_s.append(took)
            records.append(infer_metrics.request_record(r["start"], r["times"]))
            total_tokens += len(r["tokens"])
            nonfinite += r["nonfinite"]
            if rep == 0:
                outputs.append(r["tokens"])
        elapsed = served_s if barrier is not None else time.perf_counter() - t_rep
        rates.append(total_tokens / max(elapsed, 1e-9))
    phases.enter("report")
    metrics, samples = infer_metrics.serving_summary(records, rates)
    if barrier is not None:
        samples["step_time_s"] = request_s  # the duet's steps (execution/duet reads them)
    return metrics, samples, outputs, nonfinite


def _filler(device: str) -> Any:
    """The busy wait's unit of work at the duet barrier: a small matmul on a CPU; None (an idle wait) on a GPU,
    whose host thread only waits for its own device."""
    if device != "cpu":
        return None
    a = torch.randn(FILLER_SIZE, FILLER_SIZE)
    return lambda: torch.mm(a, a)


def run(p: InferParams, log: logging.Logger, barrier: duet.StepBarrier | None = None) -> dict[str, Any]:
    """One case on this engine; `barrier`: a duet launch's step barrier (runner.handler opens it), else None."""
    check_engine_args(p.engine_args)
    device = resolve_device(p.engine_args)
    dtype = resolve_dtype(p.engine_args, device)
    torch.set_num_threads(p.num_threads or os.cpu_count() or 1)
    torch.manual_seed(p.seed)
    source = infer_models.resolve_model(p.model, "transformers")
    if source.kind != "preset" and p.train_steps:
        raise BadCase("train_steps: only tiny presets are trained; a model directory is used as is")
    steps = p.train_steps if p.train_steps is not None else (
        DEFAULT_TRAIN_STEPS if source.kind == "preset" else 0)
    attn = p.engine_args.get("attn_implementation")
    metrics: dict[str, Any] = {}

    phases.enter("model_build")
    t0 = time.monotonic()
    try:
        model, path = infer_models.load_model(source, seed=p.seed, train_steps=steps, dtype=dtype, device=device,
                                              log=log, attn_implementation=attn)
    except BadCase:
        raise
    except Exception as exc:  # noqa: BLE001
        if is_oom(exc):
            raise
        raise WorkloadFailure("load_failed", f"loading {p.model}: {type(exc).__name__}: {exc}") from exc
    _sync(device)
    metrics["load_time_s"] = time.monotonic() - t0
    config = model.config
    vocab = int(config.vocab_size)
    max_pos = int(getattr(config, "max_position_embeddings", 0) or 0) or None
    requested_len = p.engine_args.get("max_model_len")
    if requested_len is not None and max_pos is not None and requested_len > max_pos:
        raise BadCase(f"engine_args.max_model_len: {requested_len} exceeds the model's "
                      f"max_position_embeddings {max_pos}")
    cap = CPU_MAX_MODEL_LEN if device == "cpu" else GPU_MAX_MODEL_LEN
    max_len = requested_len or min(max_pos or cap, cap)
    need = p.prompt_len + p.max_new_tokens
    if need > max_len:
        raise BadCase(f"prompt_len: prompt_len + max_new_tokens = {need} exceeds max_model_len {max_len}")
    if p.eval_tokens + 1 > max_len:
        raise BadCase(f"eval_tokens: {p.eval_tokens} + 1 exceeds max_model_len {max_len}")
    tokenizer = infer_models.load_tokenizer(path)
    tokens = infer_models.token_source_for(source, path, vocab, p.seed, tokenizer)
    prompts = tokens.prompts(p.num_prompts, p.prompt_len)
    eval_batch = int(p.engine_args.get("eval_batch_size", EVAL_BATCH))
    eval_seqs = tokens.eval_sequences(p.eval_windows, p.eval_tokens + 1) if p.evaluate_agreement else None

    # ---- reference logits (same token ids as the quantized model will see); the first launch only.
    # They are held in float32 on the CPU until the quantized pass: sequences x eval_tokens x vocabulary x 4
    # bytes (10 MB for a tiny preset; a 150k vocabulary at 10,000 positions would need 6 GB).
    ref_logits = None
    if eval_seqs is not None:
        phases.enter("agreement")
        t0 = time.monotonic()
        ref_seed = p.inject.get("reference_seed")
        if p.reference_model is not None or ref_seed is not None:
            ref_model = _load_reference(p, source, path, steps, dtype, device, attn, log)
            if int(ref_model.config.vocab_size) != vocab:
                raise BadCase(f"reference_model: vocabulary {ref_model.config.vocab_size} differs from {vocab}")
            ref_logits = teacher_forced_logits(ref_model, eval_seqs, device, eval_batch)
            del ref_model
            _free()
        else:
            ref_logits = teacher_forced_logits(model, eval_seqs, device, eval_batch)
        eval_s = time.monotonic() - t0

    # ---- quantize in place, then read back what really happened
    qlayers = infer_quant.target_layers(model, p.quantize_lm_head)
    reference_bytes = infer_quant.linear_weight_bytes(qlayers)  # the same weights, unquantized
    _sync(device)
    phases.enter("quantize")
    t0 = time.monotonic()
    qinfo = infer_quant.quantize(model, p.scheme, device=device, group_size=p.group_size,
                                 quantize_lm_head=p.quantize_lm_head, log=log)
    _sync(device)
    metrics["quantize_time_s"] = time.monotonic() - t0 if p.scheme != "none" else 0.0
    if p.inject.get("corrupt_weights"):
        n = infer_quant.corrupt_weights(model, p.seed)
        log.warning("inject.corrupt_weights: scrambled the stored weights of %d linear layers", n)
    qmetrics, qenv = infer_quant.readback(model, p.scheme, qlayers, reference_bytes,
                                              quantize_lm_head=p.quantize_lm_head)
    metrics.update(qmetrics)
    metrics["requested_layers"] = qinfo["requested_layers"]
    # Kept names: quantized_layers is now the read-back count; weight_bytes_ref the reference bytes.
    metrics["quantized_layers"] = qmetrics["quantized_weights"]
    metrics["skipped_layers"] = qmetrics["linear_weights"] - qmetrics["quantized_weights"]
    metrics["weight_bytes_ref"] = reference_bytes
    log.info("read back: %d of %d linear weights quantized (%s), weight bytes %d -> %d (ratio %.3f)",
             qmetrics["quantized_weights"], qmetrics["linear_weights"], qenv["weight_types"], reference_bytes,
             qmetrics["weight_bytes"], qmetrics["weight_bytes_ratio"] or float("nan"))

    # ---- agreement with the reference, per sequence (the gate's sampling unit)
    samples: dict[str, list[float]] = {}
    agreement_env: dict[str, Any] = {"agreement_evaluated": eval_seqs is not None}
    if eval_seqs is not None:
        phases.enter("agreement")
        t0 = time.monotonic()
        q_logits = teacher_forced_logits(model, eval_seqs, device, eval_batch)
        quality, flags = infer_metrics.compare_logits_by_sequence(ref_logits, q_logits, eval_seqs[:, 1:], k=p.top_k)
        del ref_logits, q_logits
        metrics.update(quality)
        metrics["agreement_eval_s"] = eval_s + time.monotonic() - t0
        samples, record_env = infer_metrics.agreement_record(flags, infer_metrics.data_digest(eval_seqs.tolist()))
        agreement_env.update(record_env)
        log.info("agreement %.4f over %d positions in %d sequences, top-%d overlap %.4f KL %s ppl %s (ref %s)",
                 quality["token_agreement"], quality["eval_positions"], quality["eval_sequences"], p.top_k,
                 quality["topk_overlap"], quality["kl_div_mean"], quality.get("perplexity"),
                 quality.get("perplexity_ref"))
    else:
        log.info("agreement not evaluated in this launch (the case's first launch evaluates it)")

    # ---- serving figures (greedy, one request at a time), after the measurement gate: the load, the quantization
    # and the agreement above are set-up that may overlap other launches' set-up (workloads/measure_gate.py).
    measurement_gate()
    serving, serving_samples, outputs, nonfinite = _serve(model, prompts, p, device, barrier)
    metrics.update(serving)
    samples.update(serving_samples)

    # ---- probes on the quantized model (infer_probes.run_requested: the one dispatch of both engines), in this
    # order: the degenerate probe also reads the max_model_len probe's long output.
    long_out: list[list[int]] = []

    def prefix() -> dict[str, Any]:
        tie_tol = p.prefix_tie_tol if p.prefix_tie_tol is not None else (1e-3 if dtype == torch.float32 else 0.1)
        return prefix_cache_probe(model, tokens, p, max_len, device, tie_tol)

    def long_request() -> dict[str, Any]:
        result, out = max_model_len_probe(model, tokens, p, max_len, device, log)
        if out is not None:
            long_out.append(out)
        return result

    def degenerate() -> dict[str, Any]:
        outputs.extend(long_out)
        return infer_probes.check_degenerate(outputs, vocab, p.max_repeat_run, nonfinite)

    phases.enter("probes")
    prefix_off = p.engine_args.get("enable_prefix_caching") is False
    probes = infer_probes.run_requested(p.probes, {
        "prefix_cache": (infer_probes.skipped("prefix caching disabled (engine_args)", by_setting=True)
                         if prefix_off else prefix),
        "max_model_len": long_request,
        "degenerate": degenerate,
    }, log)
    phases.enter("report")
    metrics["max_model_len"] = max_len

    env = environment(device, dtype)
    env.update(tokens.facts())
    env["eval_windows"] = int(eval_seqs.shape[0]) if eval_seqs is not None else None
    env.update(agreement_env)
    if barrier is not None:
        env["duet"] = barrier.report()
    env.update({"scheme": p.scheme, "model": p.model, "model_path": path,
                "train_steps": steps if source.kind == "preset" else None,
                "int4_group_sizes": qinfo.get("group_sizes") or None,
                "quantize_lm_head": p.quantize_lm_head, **qenv})
    return {"metrics": metrics, "samples": samples, "probes": probes, "environment": env}
