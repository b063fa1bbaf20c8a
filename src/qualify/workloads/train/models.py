"""Model presets for the training workload, parameter counting and model FLOPs.

Runs inside the candidate image: standard library, torch and transformers only.

The large presets are the published architectures, written as the fields of their
config.json on the Hugging Face Hub (weights are never needed: the workload trains
from a random initialisation). The tiny presets keep each family's structure
(GQA, SwiGLU, RMSNorm, rope; qk-norm for qwen3; qkv bias for qwen2) at a size that
trains in tens of milliseconds a step on a CPU core.
"""

from __future__ import annotations

import json
import os
from typing import Any

# meta-llama/Meta-Llama-3-8B config.json (untied embeddings, no rope scaling).
_LLAMA3_8B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000, "eos_token_id": 128001,
}
# Qwen/Qwen3-8B config.json (explicit head_dim 128, qk-norm, untied embeddings).
_QWEN3_8B = {
    "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False, "use_sliding_window": False,
    "bos_token_id": 151643, "eos_token_id": 151645,
}
# Qwen/Qwen2.5-7B config.json (qkv bias, untied embeddings).
_QWEN25_7B = {
    "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "vocab_size": 152064, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
    "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151643,
}
_TINY = {
    "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}

PRESETS: dict[str, dict[str, Any]] = {
    "llama3-8b": _LLAMA3_8B,
    "qwen3-8b": _QWEN3_8B,
    "qwen2.5-7b": _QWEN25_7B,
    "tiny-llama": {"model_type": "llama", **_TINY, "rope_theta": 500000.0},
    "tiny-qwen3": {"model_type": "qwen3", **_TINY, "head_dim": 64, "rope_theta": 1000000.0,
                   "use_sliding_window": False},
    "tiny-qwen2": {"model_type": "qwen2", **_TINY, "rope_theta": 1000000.0,
                   "use_sliding_window": False},
}


def config_dict(preset: str | None, config_path: str | None = None) -> dict[str, Any]:
    """The config.json fields of a preset, or of a HF config.json file (which wins)."""
    if config_path:
        with open(os.path.expanduser(config_path), encoding="utf-8") as fh:
            data = json.load(fh)
        if not isinstance(data, dict) or "model_type" not in data:
            raise ValueError(f"{config_path}: not a Hugging Face config.json (no model_type)")
        return data
    if preset not in PRESETS:
        raise KeyError(f"unknown preset {preset!r}; known: {', '.join(sorted(PRESETS))}")
    return dict(PRESETS[preset])


def build_config(fields: dict[str, Any], overrides: dict[str, Any] | None = None):
    """A transformers config object from config.json fields."""
    from transformers import AutoConfig

    fields = {**fields, **(overrides or {})}
    model_type = fields.pop("model_type")
    for key in ("architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path"):
        fields.pop(key, None)
    return AutoConfig.for_model(model_type, **fields)


def head_dim(config) -> int:
    hd = getattr(config, "head_dim", None)
    return int(hd) if hd else config.hidden_size // config.num_attention_heads


def build_model(config, device: Any = "cpu", dtype: Any = None, attn_implementation: str = "sdpa"):
    """A causal LM with random weights, created directly on `device` (use "meta" to count only)."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"attn_implementation": attn_implementation}
    if dtype is not None:
        kwargs["dtype"] = dtype
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, **kwargs)


def count_params(model) -> dict[str, int]:
    """Parameter counts of a causal LM (meta tensors count like real ones).

    Choice, kept everywhere: "embedding" is the input token embedding only (a table
    lookup, no matmul FLOPs). The output projection (lm_head) is a matmul every token
    pays for, so it counts as non-embedding, as torchtitan does for untied models.
    When the embeddings are tied, the shared matrix is one parameter tensor: it is
    counted once in `total` and in `embedding`, and added back for the FLOPs
    (`flops_params`) because the output matmul still happens.
    """
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and out.weight is emb
    non_embedding = total - emb.numel()
    flops_params = non_embedding + (out.weight.numel() if tied else 0)
    return {"total": int(total), "embedding": int(emb.numel()),
            "non_embedding": int(non_embedding), "flops_params": int(flops_params),
            "tied_embeddings": bool(tied)}


def flops_per_token(n_params: int, layers: int, heads: int, head_dim_: int, seq_len: int) -> int:
    """Training model FLOPs per token of a dense decoder, recompute never counted.

    torchtitan's formula (torchtitan/models/utils.py, get_dense_model_nparams_and_flops):
    6*N + 12*L*H*Q*T, where N is the non-embedding parameter count (3 matmuls of
    2 FLOPs per weight: forward, grad input, grad weight), L layers, H attention heads,
    Q head dim, T sequence length (the 12*L*H*Q*T term is the attention scores and
    weighted sum, forward and backward, without the causal halving).
    """
    return int(6 * n_params + 12 * layers * heads * head_dim_ * seq_len)


def describe(fields: dict[str, Any], seq_len: int) -> dict[str, Any]:
    """Counts and model FLOPs/token of an architecture, built on the meta device."""
    config = build_config(fields)
    model = build_model(config, device="meta")
    counts = count_params(model)
    layers, heads, q = config.num_hidden_layers, config.num_attention_heads, head_dim(config)
    return {
        "model_type": config.model_type,
        "params_total": counts["total"],
        "params_embedding": counts["embedding"],
        "params_non_embedding": counts["non_embedding"],
        "params_flops": counts["flops_params"],
        "tied_embeddings": counts["tied_embeddings"],
        "layers": layers,
        "heads": heads,
        "kv_heads": getattr(config, "num_key_value_heads", heads),
        "head_dim": q,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "seq_len": seq_len,
        "model_flops_per_token": flops_per_token(counts["flops_params"], layers, heads, q, seq_len),
        "flops_formula": "6*N + 12*L*H*Q*T (torchtitan), N = non-embedding params incl. lm_head",
    }


def decoder_layers(model) -> list:
    """The repeated decoder blocks of a causal LM (transformers' GradientCheckpointingLayer)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def apply_checkpointing(model, setting: str | int) -> int:
    """Turn activation checkpointing on for "all" layers, the first N, or "none".

    Returns the number of decoder layers whose checkpointing attribute is on (what was asked
    of transformers); the evidence that they checkpoint is count_checkpoint_calls().
    """
    layers = decoder_layers(model)
    if setting == "none" or setting == 0:
        return 0
    n = len(layers) if setting == "all" else int(setting)
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5.2x
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    for layer in layers[n:]:
        layer.gradient_checkpointing = False
    return sum(1 for layer in layers if getattr(layer, "gradient_checkpointing", False))


def count_checkpoint_calls(model, device):
    """Count, per decoder layer, the calls into its activation-checkpoint function.

    transformers' GradientCheckpointingLayer runs its forward through
    self._gradient_checkpointing_func (torch.utils.checkpoint, non-reentrant) when it
    checkpoints; each is wrapped so that a call adds one to the layer's slot of the returned
    counter tensor (on `device`). A tensor, not a Python number: under torch.compile the
    increment is one more op of the traced graph, with no guard on its value, so the counter
    neither breaks the graph nor forces recompiles (a Python counter recompiled every step).
    Install before torch.compile; read the counter outside timed regions. A layer whose slot
    grows during a step checkpointed in that step, whatever its attribute says.
    """
    import torch

    layers = decoder_layers(model)
    counter = torch.zeros(len(layers), dtype=torch.long, device=device)
    for i, layer in enumerate(layers):
        func = getattr(layer, "_gradient_checkpointing_func", None)
        if func is None:
            continue

        def counted(*args, _func=func, _i=i, **kwargs):
            counter[_i] += 1
            return _func(*args, **kwargs)

        layer._gradient_checkpointing_func = counted
    return counter


def estimate_state_bytes(n_params: int, dtype: str, zero_stage: int, world: int) -> int:
    """Lower bound of the training state: weights, grads, fp32 master, Adam moments.

    bf16: 2 + 2 + 4 (master) + 8 (Adam) bytes a parameter; fp32: 4 + 4 + 8. ZeRO
    stage 1 partitions optimizer state (master + moments), 2 also grads, 3 also weights.
    """
    w = 2 if dtype == "bf16" else 4
    grads = w
    optim = (4 if dtype == "bf16" else 0) + 8
    world = max(1, world)
    if zero_stage >= 1:
        optim /= world
    if zero_stage >= 2:
        grads /= world
    if zero_stage >= 3:
        w /= world
    return int(n_params * (w + grads + optim))
