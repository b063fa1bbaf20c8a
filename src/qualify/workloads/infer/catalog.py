"""The inference workload's model names: tiny presets (trained here on CPU) and the release note's real models.

Standard library only, so that the orchestrator can validate a manifest's model names without importing torch.
"""

from __future__ import annotations

from typing import Any

# family -> config keyword arguments. Dimensions are multiples of 16 / 32 so that the
# int4 path is exercised; tiny-llama's vocabulary (260) is deliberately NOT a multiple
# of 16, so int4 must skip its output layer (MACHINE-NOTES: the CPU int4 kernel needs
# N % 16 == 0).
TINY_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny-qwen3": ("qwen3", dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                 max_position_embeddings=512, tie_word_embeddings=False)),
    "tiny-llama": ("llama", dict(vocab_size=260, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                 rope_theta=500000.0, tie_word_embeddings=False)),
    # Experts are fused 3-D parameters in transformers 5 (not nn.Linear): torchao's
    # quantize_ leaves them alone, only attention and the output layer are quantized.
    "tiny-qwen3-moe": ("qwen3_moe", dict(vocab_size=256, hidden_size=128, intermediate_size=256,
                                         moe_intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
                                         decoder_sparse_step=1, max_position_embeddings=512,
                                         tie_word_embeddings=False)),
}

# Real models of the release note. Only meaningful with weights: a directory under
# $QUALIFY_MODELS_DIR/<name> (transformers and vllm), or the hub id (vllm, which may
# find it in the image's Hugging Face cache).
REAL_MODELS: dict[str, str] = {
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "deepseek-r1": "deepseek-ai/DeepSeek-R1",
    "llama3-8b": "meta-llama/Meta-Llama-3-8B",
}
