"""What a pre-quantized checkpoint really holds, read from its safetensors headers (vllm engine).

vLLM loads AWQ/GPTQ/compressed-tensors checkpoints in its own worker processes, where the
adapter cannot look at the loaded weights; the checkpoint files can be read instead. Each
.safetensors file starts with an 8-byte little-endian header length and a JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}}: names, shapes and byte sizes of
every tensor, without reading the data (standard library only).

readback() compares the quantized checkpoint with its unquantized reference, module by module:
the linear weights are the reference's 2-D "<module>.weight" tensors except the embeddings and
the output layer (lm_head), as in quant.target_layers. A module counts as quantized when the
checkpoint stores it as a quantized tensor (qweight of AWQ/GPTQ, weight_packed of
compressed-tensors, or an 8-bit integer weight) with the scheme's bits of stored data per
weight (stored bytes * 8 / the reference weight's element count). Bytes are those of every
tensor of the module except its bias (data, scales, zero points, group indices) against the
reference weight's bytes.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

from qualify.workloads.infer import layer_evidence

_QDATA = ("qweight", "weight_packed")
_INT8 = ("I8", "U8")
_EXCLUDED_MODULES = ("embed_tokens", "wte", "word_embeddings", "lm_head", "embed_out", "output")


def read_headers(directory: str) -> dict[str, dict[str, Any]]:
    """{tensor name: {"dtype", "shape", "bytes"}} of every .safetensors file in directory."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(directory, name), "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > 100 * 2**20:
                raise ValueError(f"{name}: safetensors header of {length} bytes is not plausible")
            header = json.loads(fh.read(length))
        for tensor, info in header.items():
            if tensor == "__metadata__" or not isinstance(info, dict):
                continue
            begin, end = info["data_offsets"]
            out[tensor] = {"dtype": info["dtype"], "shape": list(info["shape"]), "bytes": int(end) - int(begin)}
    return out


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def linear_modules(reference: dict[str, dict[str, Any]], quantize_lm_head: bool = False) -> list[str]:
    """Modules whose 2-D weight a scheme quantizes (embeddings and, by default, lm_head excluded)."""
    mods = []
    for name, info in reference.items():
        if not name.endswith(".weight") or len(info["shape"]) != 2:
            continue
        module = name[: -len(".weight")]
        last = module.rsplit(".", 1)[-1]
        if last in _EXCLUDED_MODULES and not (quantize_lm_head and last == "lm_head"):
            continue
        mods.append(module)
    return sorted(mods)


def _parts(q: dict[str, dict[str, Any]], module: str) -> dict[str, dict[str, Any]]:
    return {k[len(module) + 1:]: v for k, v in q.items()
            if k.startswith(module + ".") and "." not in k[len(module) + 1:] and not k.endswith(".bias")}


def _stored_bits(q: dict[str, dict[str, Any]], ref: dict[str, dict[str, Any]], module: str) -> float | None:
    """Bits per weight of the module's quantized data in the checkpoint (None: not quantized data)."""
    parts = _parts(q, module)
    data = next((parts[n] for n in _QDATA if n in parts), None)
    if data is None and parts.get("weight", {}).get("dtype") in _INT8:
        data = parts["weight"]
    return data["bytes"] * 8 / _numel(ref[f"{module}.weight"]["shape"]) if data else None


def readback(quantized_dir: str, reference_dir: str, bits: int,
             quantize_lm_head: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics, environment facts) as quant.readback gives them for torchao, from the files."""
    q = read_headers(quantized_dir)
    ref = read_headers(reference_dir)
    if not q or not ref:
        raise ValueError("no .safetensors files in " + (quantized_dir if not q else reference_dir))
    modules = linear_modules(ref, quantize_lm_head)
    quantized = 0
    stored = reference_bytes = 0
    stray: list[str] = []
    for module in modules:
        ref_weight = ref[f"{module}.weight"]
        reference_bytes += ref_weight["bytes"]
        parts = _parts(q, module)
        stored += sum(v["bytes"] for v in parts.values())
        stored_bits = _stored_bits(q, ref, module)
        if stored_bits is not None and abs(stored_bits - bits) < 0.5:
            quantized += 1
        elif len(stray) < 8:
            stray.append(module)
    metrics = {
        "quantized_weights": quantized,
        "linear_weights": len(modules),
        "quantized_share": quantized / len(modules) if modules else None,
        "weight_bytes": stored,
        "reference_weight_bytes": reference_bytes,
        "weight_bytes_ratio": stored / reference_bytes if reference_bytes else None,
    }
    every = linear_modules(ref, quantize_lm_head=True)  # the output layer too: quantized only when asked
    lm_head = next((m for m in every if m.rsplit(".", 1)[-1] == "lm_head"), None)
    targets = set(modules)
    # A target counts as quantized only at the scheme's bits; any other linear layer when quantized at all.
    found = ((m, b is not None and (m not in targets or abs(b - bits) < 0.5))
             for m in every for b in [_stored_bits(q, ref, m)])
    env = {layer_evidence.KEY: layer_evidence.evidence(found, modules, lm_head=lm_head,
                                                       quantize_lm_head=quantize_lm_head),
           "weight_bytes_measure": "checkpoint safetensors headers: the linear modules' tensors (bias excluded) "
                                   "against the reference checkpoint's weights",
           "not_quantized_layers": stray or None}
    return metrics, env
