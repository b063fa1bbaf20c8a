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

Standard library, torch and torchao only.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

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


def quantize(model: torch.nn.Module, scheme: str, *, device: str = "cpu", group_size: int = 128,
             log: logging.Logger | None = None) -> dict[str, Any]:
    """Quantize model in place with torchao's quantize_. Returns what was done."""
    log = log or logging.getLogger(__name__)
    layers = _linear_layers(model)
    info: dict[str, Any] = {"quantized_layers": 0, "skipped_layers": 0, "group_sizes": []}
    if scheme == "none":
        info["skipped_layers"] = len(layers)
        return info
    from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,
                                      quantize_)

    start = time.monotonic()
    if scheme in ("w8a16", "w8a8"):
        config = Int8WeightOnlyConfig() if scheme == "w8a16" else Int8DynamicActivationInt8WeightConfig()
        quantize_(model, config)
        info["quantized_layers"] = len(layers)
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
        for gs, names in sorted(by_gs.items()):
            quantize_(model, _int4_config(gs, device),
                      filter_fn=lambda mod, fqn, names=names: isinstance(mod, torch.nn.Linear) and fqn in names)
            info["quantized_layers"] += len(names)
        info["group_sizes"] = sorted(by_gs)
    else:
        raise ValueError(f"scheme {scheme!r} is not a torchao scheme")
    info["quantize_time_s"] = time.monotonic() - start
    log.info("quantized %d linear layers with %s (skipped %d)", info["quantized_layers"], scheme,
             info["skipped_layers"])
    return info


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
