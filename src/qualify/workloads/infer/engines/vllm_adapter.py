"""The vllm engine of the inference workload (GPU images only).

UNVERIFIED HERE: vLLM cannot be installed or run on the development machine (no GPU,
and its pins conflict with the orchestrator's environment). The adapter is written
against vLLM 0.8.5's documented offline API:

* ``vllm.LLM(model=..., quantization=..., enable_prefix_caching=..., max_model_len=...,
  tensor_parallel_size=..., dtype=..., gpu_memory_utilization=..., seed=...,
  skip_tokenizer_init=...)``
* ``vllm.SamplingParams(temperature=0, max_tokens=..., ignore_eos=True, logprobs=k,
  prompt_logprobs=k, detokenize=...)``
* ``LLM.generate([{"prompt_token_ids": [...]}, ...], sampling_params, use_tqdm=False)``
  -> ``RequestOutput`` with ``prompt_logprobs`` (list of None | {id: Logprob}),
  ``outputs[0].token_ids``, ``outputs[0].logprobs`` and, on the V0 engine,
  ``metrics`` (RequestMetrics: arrival_time, first_token_time, last_token_time,
  finished_time); the V1 engine leaves ``metrics`` None, then times come from the wall
  clock (one request at a time, max_tokens=1 for TTFT).
* ``LLM.reset_prefix_cache()`` (to compute a request "fresh" for the prefix probe, and before
  every throughput repeat so that no repeat is served from the prefix cache).

The pure parts - case -> LLM/SamplingParams kwargs, checkpoint scheme detection,
RequestOutput parsing, error classification - are unit-tested with plain fake objects
(tests/test_infer_vllm_adapter.py); the fakes only stand in because vLLM cannot run here.
vllm is imported lazily, only in run().
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any, Mapping, Sequence

from qualify.workloads.infer import checkpoint as infer_checkpoint
from qualify.workloads.infer import metrics as infer_metrics
from qualify.workloads.infer import models as infer_models
from qualify.workloads.infer import probes as infer_probes
from qualify.workloads.infer.params import DEFAULT_TRAIN_STEPS, PREQUANTIZED_SCHEMES, SCHEME_WEIGHTS, InferParams
from qualify.workloads.protocol import BadCase, WorkloadFailure, is_oom

# Release note: "to run models quantized by using AWQ and GPTQ on vLLM 0.8.5, you must add
# the --quantization moe_wna16 flag" (MoE models such as DeepSeek-R1 / Qwen3-235B-A22B).
MOE_WNA16 = "moe_wna16"
# Keys of engine_args that this adapter interprets itself (everything else goes to LLM()).
_OWN_KEYS = {"quantization"}

_OOM_MARKERS = (
    "no available memory for the cache blocks",
    "larger than the maximum number of tokens that can be stored in kv cache",
    "insufficient memory",
    "cuda error: out of memory",
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


def check_scheme(p: InferParams, config: Mapping[str, Any] | None) -> str | None:
    """Refuse a case whose scheme contradicts the checkpoint (vLLM quantizes nothing here on the fly)."""
    found = checkpoint_scheme(config)
    if found is None:
        return None
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


def parse_request_output(out: Any, *, wall_start: float | None = None, wall_end: float | None = None,
                         wall_ttft: float | None = None) -> dict[str, Any]:
    """Token ids, logprobs and timings of one RequestOutput.

    Timings come from out.metrics (V0 RequestMetrics) when it has them, otherwise from
    the wall clock given by the caller.
    """
    comp = out.outputs[0]
    tokens = [int(t) for t in comp.token_ids]
    rec: dict[str, Any] = {"tokens": tokens, "logprobs": logprob_dicts(getattr(comp, "logprobs", None)),
                           "prompt_logprobs": logprob_dicts(getattr(out, "prompt_logprobs", None)),
                           "timing": None, "ttft_s": None, "latency_s": None, "tpot_s": None}
    m = getattr(out, "metrics", None)
    arrival = getattr(m, "arrival_time", None) if m is not None else None
    first = getattr(m, "first_token_time", None) if m is not None else None
    end = None
    if m is not None:
        end = getattr(m, "finished_time", None) or getattr(m, "last_token_time", None)
    if arrival is not None and first is not None and end is not None:
        rec.update(timing="engine_metrics", ttft_s=first - arrival, latency_s=end - arrival)
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
    return "oom" if any(m in text for m in _OOM_MARKERS) else None


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


def run(p: InferParams, log: logging.Logger) -> dict[str, Any]:
    for key in ("corrupt_weights", "break_kv_cache", "reference_seed"):
        if p.inject.get(key):
            raise BadCase(f"inject.{key}: only the transformers engine injects faults")
    source = infer_models.resolve_model(p.model, "vllm")
    path = source.path
    if source.kind == "preset":
        steps = p.train_steps if p.train_steps is not None else DEFAULT_TRAIN_STEPS
        path = infer_models.prepare_preset(source.preset, p.seed, steps, log)
        if path is None:
            raise BadCase("train_steps: the vllm engine needs a trained preset directory (train_steps > 0)")
    config = infer_models.read_config_json(path) if source.kind != "hub" else None
    check_scheme(p, config)
    meta = infer_models.read_preset_meta(path)
    has_tok = meta is None
    try:
        from vllm import LLM, SamplingParams  # noqa: F401 - lazy: only in the image
    except ImportError as exc:
        raise WorkloadFailure("load_failed", f"vllm is not importable in this image: {exc}") from exc

    def load(model_path: str, reference: bool):
        kwargs = llm_kwargs(p, model_path, config if not reference else infer_models.read_config_json(model_path),
                            reference=reference, has_tokenizer=has_tok)
        log.info("vllm.LLM(%s)", kwargs)
        try:
            return LLM(**kwargs)
        except Exception as exc:  # noqa: BLE001
            if classify_error(exc) == "oom":
                raise WorkloadFailure("oom", f"loading {model_path}: {type(exc).__name__}: {exc}") from exc
            raise WorkloadFailure("load_failed", f"loading {model_path}: {type(exc).__name__}: {exc}") from exc

    def gen(llm, ids_list, **skw):
        sp = SamplingParams(**sampling_kwargs(p, detokenize=has_tok, **skw))
        return llm.generate([{"prompt_token_ids": [int(t) for t in ids]} for ids in ids_list], sp, use_tqdm=False)

    metrics: dict[str, Any] = {}
    qenv = _quantization_readback(p, source, path, metrics, log)
    vocab = int((config or {}).get("vocab_size") or 0)
    tokenizer = infer_models.load_tokenizer(path) if has_tok and path and source.kind != "hub" else None

    # ---- reference first (only its teacher-forced logprobs are needed), then release it
    ref_positions: list[dict[int, float]] | None = None
    ref_actual: list[float] = []
    data = None
    if p.reference_model is not None:
        ref_src = infer_models.resolve_model(p.reference_model, "vllm", param="reference_model")
        ref = load(ref_src.path, reference=True)
        if not vocab and has_tok:
            vocab = len(ref.get_tokenizer())
        data = infer_models.token_source_for(source, path, vocab, p.seed, tokenizer or (
            ref.get_tokenizer() if has_tok else None))
        eval_seqs = data.eval_sequences(p.num_prompts, p.eval_tokens + 1).tolist()
        ref_positions, ref_actual = [], []
        for ids, out in zip(eval_seqs, gen(ref, eval_seqs, max_tokens=1, prompt_logprobs=p.top_k)):
            pos, act = teacher_forced_positions(parse_request_output(out), ids)
            ref_positions += pos
            ref_actual += act
        _shutdown(ref)

    t0 = time.monotonic()
    llm = load(path, reference=False)
    metrics["load_time_s"] = time.monotonic() - t0
    if not vocab and has_tok:
        vocab = len(llm.get_tokenizer())
    if data is None:
        data = infer_models.token_source_for(source, path, vocab, p.seed,
                                             tokenizer or (llm.get_tokenizer() if has_tok else None))
    eval_seqs = data.eval_sequences(p.num_prompts, p.eval_tokens + 1).tolist()
    q_positions: list[dict[int, float]] = []
    q_actual: list[float] = []
    for ids, out in zip(eval_seqs, gen(llm, eval_seqs, max_tokens=1, prompt_logprobs=p.top_k)):
        pos, act = teacher_forced_positions(parse_request_output(out), ids)
        q_positions += pos
        q_actual += act
    if ref_positions is None and p.scheme == "none":
        ref_positions, ref_actual = q_positions, q_actual  # the model is its own reference
    if ref_positions is not None:
        metrics.update(infer_metrics.compare_topk(ref_positions, q_positions, p.top_k))
        metrics.update(infer_metrics.perplexity_figures(infer_metrics.mean_nll(q_actual),
                                                        infer_metrics.mean_nll(ref_actual)))
    else:
        log.warning("no reference_model: agreement not measured for a pre-quantized checkpoint")
        metrics.update({"token_agreement": None, "topk_overlap": None, "kl_div_mean": None})
        metrics.update(infer_metrics.perplexity_figures(infer_metrics.mean_nll(q_actual), None))

    # ---- serving: batched throughput per repeat; per-request timings
    # Each repeat sends its own prompts, and the prefix cache is emptied before the measured pass
    # after warm-up and before every repeat: otherwise (prefix caching is on by default) every
    # repeat after the first is served from the cache, prefill is not measured, and the median
    # is a cached repeat.
    reset = getattr(llm, "reset_prefix_cache", None)
    resets = {"asked": 0, "refused": 0}

    def empty_prefix_cache() -> None:
        if reset is None:
            return
        resets["asked"] += 1
        if reset() is False:  # vLLM refuses while requests are running
            resets["refused"] += 1

    warm_prompts = data.prompts(p.num_prompts, p.prompt_len, repeat=p.repeats).tolist()
    for i in range(p.warmup):
        gen(llm, [warm_prompts[i % len(warm_prompts)]], max_tokens=p.max_new_tokens)
    rates: list[float] = []
    outputs: list[list[int]] = []
    records: list[dict[str, Any]] = []
    prompts: list[list[int]] = []
    for rep in range(p.repeats):
        prompts = data.prompts(p.num_prompts, p.prompt_len, repeat=rep).tolist()
        empty_prefix_cache()
        start = time.perf_counter()
        outs = gen(llm, prompts, max_tokens=p.max_new_tokens)
        end = time.perf_counter()
        recs = [parse_request_output(o) for o in outs]
        rates.append(sum(len(r["tokens"]) for r in recs) / max(end - start, 1e-9))
        if rep == 0:
            outputs = [r["tokens"] for r in recs]
        records += [r for r in recs if r["timing"] == "engine_metrics"]
    if not records:  # V1: no per-request metrics; time each request alone on the wall clock
        for ids in prompts:
            empty_prefix_cache()
            t = time.perf_counter()
            gen(llm, [ids], max_tokens=1)
            ttft = time.perf_counter() - t
            empty_prefix_cache()
            t = time.perf_counter()
            out = gen(llm, [ids], max_tokens=p.max_new_tokens)[0]
            records.append(parse_request_output(out, wall_start=t, wall_end=time.perf_counter(), wall_ttft=ttft))
    serving, samples = infer_metrics.serving_summary(records, rates)
    metrics.update(serving)
    metrics["itl_s_p50"] = None  # not observable through the offline API

    # ---- probes
    probes: dict[str, dict[str, Any]] = {}
    max_len = p.engine_args.get("max_model_len")
    try:
        max_len = max_len or int(llm.llm_engine.model_config.max_model_len)
    except Exception:  # noqa: BLE001
        pass
    # A probe never changes the case's status; one that raises is reported as "error".
    if "prefix_cache" in p.probes:
        probes["prefix_cache"] = infer_probes.run_probe(
            "prefix_cache", lambda: _prefix_probe(p, llm, gen, data, max_len or 2048), log)
    if "max_model_len" in p.probes:
        if not max_len:
            probes["max_model_len"] = infer_probes.skipped("max_model_len unknown")
        else:
            probes["max_model_len"] = infer_probes.run_probe(
                "max_model_len", lambda: _max_model_len_probe(p, llm, gen, data, max_len, outputs), log)
    if "degenerate" in p.probes:
        probes["degenerate"] = infer_probes.run_probe(
            "degenerate", lambda: infer_probes.check_degenerate(outputs, vocab or 1 << 62, p.max_repeat_run), log)
    metrics["max_model_len"] = max_len
    _shutdown(llm)
    env = _environment()
    env.update({"scheme": p.scheme, "model": p.model, "model_path": path,
                "llm_kwargs": {k: v for k, v in llm_kwargs(p, path, config, has_tokenizer=has_tok).items()
                               if isinstance(v, (str, int, float, bool)) or v is None},
                "timing": records[0]["timing"] if records else None, "eval_windows": len(eval_seqs),
                "prefix_cache_resets": resets["asked"] if reset is not None else None,
                "prefix_cache_resets_refused": resets["refused"] if reset is not None else None,
                "prompts_per_repeat": "distinct prompts for every repeat and for the warm-up"})
    env.update(data.facts())
    env.update(qenv)
    return {"metrics": metrics, "samples": samples, "probes": probes, "environment": env}


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
    """One request at max_model_len must run: an engine failure on it is the probe's finding."""
    new = max(1, min(p.max_new_tokens, 4, max_len - 1))
    ids = data.probe_tokens(1, max_len - new, offset=2)[0].tolist()
    try:
        out = gen(llm, [ids], max_tokens=new)[0]
    except Exception as exc:  # noqa: BLE001
        cls = classify_error(exc) or "crash"
        return infer_probes.probe("failed", f"one request of {max_len} tokens: {type(exc).__name__}: "
                                  f"{str(exc)[:300]}", error_class=cls)
    outputs.append([int(t) for t in out.outputs[0].token_ids])
    return infer_probes.probe("passed", f"one request of {max_len} tokens ran")


def _prefix_probe(p: InferParams, llm: Any, gen, data, max_len: int) -> dict[str, Any]:
    if p.engine_args.get("enable_prefix_caching") is False:
        return infer_probes.skipped("prefix caching disabled (--no-enable-prefix-caching)", by_setting=True)
    reset = getattr(llm, "reset_prefix_cache", None)
    if reset is None:
        return infer_probes.skipped("LLM.reset_prefix_cache is missing: cannot compute fresh requests")
    new = min(p.max_new_tokens, 16)
    prefix_len = min(4 * p.prompt_len, max_len - 8 - new, 512)
    if prefix_len < 4:
        return infer_probes.skipped(f"max_model_len {max_len} leaves no room for a shared prefix")
    prefix = data.probe_tokens(1, prefix_len, offset=0)[0].tolist()
    suffixes = data.probe_tokens(4, 8, offset=1).tolist()
    requests = [prefix + s for s in suffixes]
    reset()
    gen(llm, [prefix], max_tokens=1)  # populate the cache with the shared prefix
    cached = [[int(t) for t in o.outputs[0].token_ids] for o in gen(llm, requests, max_tokens=new)]
    fresh: list[list[int]] = [[] for _ in requests]
    margins: list[list[float]] = [[] for _ in requests]
    for i in reversed(range(len(requests))):
        reset()
        rec = parse_request_output(gen(llm, [requests[i]], max_tokens=new, logprobs=2)[0])
        fresh[i] = rec["tokens"]
        margins[i] = [m if m is not None else float("inf") for m in (top2_margin(d) for d in rec["logprobs"])]
    tie_tol = p.prefix_tie_tol if p.prefix_tie_tol is not None else 0.1
    return infer_probes.compare_prefix_runs(fresh, cached, margins, tie_tol)
