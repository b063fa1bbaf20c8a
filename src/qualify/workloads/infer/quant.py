"""torchao quantization schemes of the transformers engine.

Scheme names follow the weight/activation bit widths of the release note:

* none   - the unquantized reference (fp32 on CPU, bf16 on CUDA unless engine_args.dtype)
* w8a16  - torchao Int8WeightOnlyConfig (int8 per-channel weights, activations in float)
* w8a8   - torchao Int8DynamicActivationInt8WeightConfig (per-token dynamic int8
           activations, per-channel int8 weights: the release note's a8w8)
* w4a16  - int4 weight-only, group-wise. On CPU only torchao's
           prototype PrototypeInt4WeightOnlyConfig works (MACHINE-NOTES); it needs the
           output features to be a multiple of 16 and the group size to divide the input
           features, so such layers (e.g. an output layer with vocab % 16 != 0) are skipped.
           On CUDA: Int4WeightOnlyConfig with the tile-packed (tinygemm) layout
           (unverified here: no GPU).

What is quantized: every nn.Linear except the output layer (lm_head), which stays in float
as shipped AWQ/GPTQ/W8A8 checkpoints keep it (params.quantize_lm_head opts in); embeddings
are never quantized. Mixture-of-experts experts stored as fused 3-D parameters (transformers
5's Qwen3MoeExperts, not nn.Linear) are not quantized: readback() reports them as
unquantized_expert_weights.

Proven, not assumed (readback()): after quantize_ the workload reads the weights back and
counts those that really are torchao tensors of the scheme's bit width (bits of stored data
per weight) and activation handling (params.SCHEME_WEIGHTS); torchao leaves shapes it cannot
handle in float without a word. Weight bytes are those of the targeted linear layers' weights
as stored (quantized data + scales + zero points; biases and everything else excluded), so
that the ratio to the same weights unquantized means something on tiny models whose
embeddings dominate.

Standard library, torch and torchao only.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import torch

from qualify.workloads.infer import layer_evidence
from qualify.workloads.infer.params import SCHEME_WEIGHTS

INT4_GROUP_SIZES = (128, 64, 32)


def _linear_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    return [(name, mod) for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)]


def int4_group_size(in_features: int, out_features: int, requested: int) -> int | None:
    """Group size for one layer (the requested one, else the largest of 64/32 dividing it), or None to skip."""
    if out_features % 16 != 0:
        return None
    for gs in (requested,) + tuple(g for g in INT4_GROUP_SIZES if g < requested):
        if gs <= in_features and in_features % gs == 0:
            return gs
    return None


def _int4_config(group_size: int, device: str):
    if device.startswith("cuda"):
        from torchao.quantization import Int4WeightOnlyConfig

        return Int4WeightOnlyConfig(group_size=group_size, int4_packing_format="tile_packed_to_4d")
    from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig

    return PrototypeInt4WeightOnlyConfig(group_size=group_size)


def target_layers(model: torch.nn.Module, quantize_lm_head: bool = False) -> list[tuple[str, torch.nn.Linear]]:
    """The linear layers a scheme quantizes: all but the output layer unless quantize_lm_head."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [(name, mod) for name, mod in _linear_layers(model) if quantize_lm_head or mod is not output]


def expert_weights(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """Fused expert matrices of MoE layers: parameters of 3 or more dimensions outside nn.Linear."""
    out: list[tuple[str, torch.nn.Parameter]] = []
    for mod_name, mod in model.named_modules():
        if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
            continue
        for name, param in mod.named_parameters(recurse=False):
            if param.dim() >= 3:
                out.append((f"{mod_name}.{name}" if mod_name else name, param))
    return out


def quantize(model: torch.nn.Module, scheme: str, *, device: str = "cpu", group_size: int = 128,
             quantize_lm_head: bool = False, log: logging.Logger | None = None) -> dict[str, Any]:
    """Quantize the target layers of model in place with torchao's quantize_. Returns what was asked.

    "requested_layers" is what was handed to torchao; what really was quantized is readback()'s.
    """
    log = log or logging.getLogger(__name__)
    layers = target_layers(model, quantize_lm_head)
    names = {name for name, _ in layers}
    info: dict[str, Any] = {"requested_layers": 0, "skipped_layers": 0, "group_sizes": []}
    if scheme == "none":
        info["skipped_layers"] = len(layers)
        return info
    from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,
                                      quantize_)

    start = time.monotonic()
    if scheme in ("w8a16", "w8a8"):
        config = Int8WeightOnlyConfig() if scheme == "w8a16" else Int8DynamicActivationInt8WeightConfig()
        quantize_(model, config,
                  filter_fn=lambda mod, fqn: isinstance(mod, torch.nn.Linear) and fqn in names)
        info["requested_layers"] = len(layers)
    elif scheme == "w4a16":
        by_gs: dict[int, set[str]] = {}
        for name, mod in layers:
            gs = int4_group_size(mod.in_features, mod.out_features, group_size)
            if gs is None:
                info["skipped_layers"] += 1
                log.info("w4a16: skipping %s (%d -> %d): out %% 16 or group size does not fit",
                         name, mod.in_features, mod.out_features)
                continue
            by_gs.setdefault(gs, set()).add(name)
        for gs, gs_names in sorted(by_gs.items()):
            quantize_(model, _int4_config(gs, device),
                      filter_fn=lambda mod, fqn, gs_names=gs_names: isinstance(mod, torch.nn.Linear)
                      and fqn in gs_names)
            info["requested_layers"] += len(gs_names)
        info["group_sizes"] = sorted(by_gs)
    else:
        raise ValueError(f"scheme {scheme!r} is not a torchao scheme")
    info["quantize_time_s"] = time.monotonic() - start
    log.info("asked torchao to quantize %d linear layers with %s (skipped %d)", info["requested_layers"], scheme,
             info["skipped_layers"])
    return info


def weight_facts(t: torch.Tensor) -> dict[str, Any]:
    """What a weight is as stored: a torchao tensor or not, bits of stored data per weight,
    whether its activations are quantized too, and its type name."""
    cls = type(t)
    quantized = any(c.__module__.split(".")[0] == "torchao" for c in cls.__mro__)
    facts: dict[str, Any] = {"quantized": quantized, "bits": None, "act_quant": False, "type": cls.__name__}
    if not quantized:
        facts["bits"] = float(t.element_size() * 8)
        return facts
    data = getattr(t, "qdata", None)
    if not isinstance(data, torch.Tensor):
        ints = [c for c in _components(t) if not c.is_floating_point()]
        data = ints[0] if ints else None
    if isinstance(data, torch.Tensor) and t.numel():
        facts["bits"] = data.numel() * data.element_size() * 8 / t.numel()
    facts["act_quant"] = (getattr(t, "act_quant_kwargs", None) is not None
                          or getattr(t, "input_quant_func", None) is not None
                          or "ActivationQuantized" in cls.__name__)
    return facts


def linear_weight_bytes(layers: list[tuple[str, torch.nn.Module]]) -> int:
    """Bytes of these layers' weights as stored (data + scales + zero points for torchao tensors)."""
    return sum(c.numel() * c.element_size() for _, mod in layers for c in _components(mod.weight))


def readback(model: torch.nn.Module, scheme: str, layers: list[tuple[str, torch.nn.Module]],
             reference_bytes: int, quantize_lm_head: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics, environment facts) of what quantization really did to `layers` (the targets).

    quantized_weights counts the weights that are torchao tensors of the scheme's bits and
    activation handling; quantized_share is that over the targeted linear weights; weight_bytes
    is those weights as stored and reference_weight_bytes the same weights unquantized.
    """
    expected = SCHEME_WEIGHTS.get(scheme)
    types: collections.Counter[str] = collections.Counter()
    quantized = 0
    stray: list[str] = []
    for name, mod in layers:
        facts = weight_facts(mod.weight)
        types[f"{facts['type']}/{facts['bits']:g}bit" if facts["bits"] is not None else facts["type"]] += 1
        ok = _matches(facts, expected)
        quantized += int(ok)
        if expected is not None and not ok and len(stray) < 8:
            stray.append(name)
    stored = linear_weight_bytes(layers)
    experts = expert_weights(model)
    expert_quantized = sum(1 for _, w in experts if weight_facts(w)["quantized"])
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    metrics = {
        "quantized_weights": quantized,
        "linear_weights": len(layers),
        "quantized_share": quantized / len(layers) if layers else None,
        "weight_bytes": stored,
        "reference_weight_bytes": reference_bytes,
        "weight_bytes_ratio": stored / reference_bytes if reference_bytes else None,
        "unquantized_expert_weights": len(experts) - expert_quantized,
        "expert_weight_bytes": sum(c.numel() * c.element_size() for _, w in experts for c in _components(w)),
        "model_weight_bytes": weight_bytes(model),
    }
    output_name = next((name for name, mod in _linear_layers(model) if mod is output), None)
    targets = {n for n, _ in layers}
    # A target counts as quantized only as the scheme says; any other linear layer when quantized at all.
    every = [(name, _matches(facts, expected) if name in targets else bool(facts["quantized"]))
             for name, mod in _linear_layers(model) for facts in [weight_facts(mod.weight)]]
    env = {
        layer_evidence.KEY: layer_evidence.evidence(every, [n for n, _ in layers], lm_head=output_name,
                                                    quantize_lm_head=quantize_lm_head),
        "weight_types": dict(sorted(types.items())),
        "weight_bytes_measure": "targeted nn.Linear weights as stored (quantized data + scales + zero points); "
                                "reference: the same weights before quantization",
        "lm_head_quantized": bool(output is not None and weight_facts(output.weight)["quantized"]),
        "not_quantized_layers": stray or None,
        "moe_experts": (None if not experts else
                        f"{len(experts) - expert_quantized} fused expert weight tensors (not nn.Linear) left "
                        f"unquantized; not in linear_weights or weight_bytes"),
    }
    return metrics, env


def _matches(facts: dict[str, Any], expected: tuple[float, bool] | None) -> bool:
    """A weight quantized as the scheme says: its bits and its activation handling."""
    return bool(expected is not None and facts["quantized"] and facts["bits"] is not None
                and abs(facts["bits"] - expected[0]) < 0.5 and facts["act_quant"] == expected[1])


def _components(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors a (possibly torchao subclass) tensor is made of."""
    names = getattr(t, "tensor_data_names", None)
    if not names:
        return [t]
    out = [getattr(t, n) for n in names]
    for n in getattr(t, "optional_tensor_data_names", None) or ():
        v = getattr(t, n, None)
        if isinstance(v, torch.Tensor):
            out.append(v)
    return out


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters as stored (quantized data + scales for torchao tensors)."""
    total = 0
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        for c in _components(p):
            total += c.numel() * c.element_size()
    return total


def corrupt_weights(model: torch.nn.Module, seed: int) -> int:
    """Deliberately destroy the (quantized) linear weights: shuffle their stored values.

    For the failure-path tests (inject.corrupt_weights): a quantized model whose weight
    bytes were scrambled must fail on agreement. Returns the number of layers touched.
    """
    g = torch.Generator().manual_seed(seed + 99_991)
    count = 0
    with torch.no_grad():
        for _, mod in _linear_layers(model):
            w = mod.weight
            target = getattr(w, "qdata", None) if getattr(w, "tensor_data_names", None) else w
            if not isinstance(target, torch.Tensor):
                continue
            perm = torch.randperm(target.numel(), generator=g).to(target.device)
            target.copy_(target.reshape(-1)[perm].reshape(target.shape))
            count += 1
    return count
