"""Measurement helpers for the training workload: step statistics, memory, activations.

summarize() is pure (tested directly); the others need torch, imported lazily.
"""

from __future__ import annotations

import resource
import statistics
import sys
from typing import Any

from qualify.workloads.protocol import percentile


def cv(values: list[float]) -> float | None:
    """Coefficient of variation (sample stdev / mean); None for fewer than 2 values."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


def summarize(step_times: list[list[float]], tokens_per_step: int, world: int) -> dict[str, Any]:
    """Throughput figures from the measured step times of each repeat.

    tokens/s is tokens_per_step / median step time (all repeats together); each
    repeat also gives one tokens/s from its own median, whose spread is the CV.
    """
    flat = [t for rep in step_times for t in rep]
    median = statistics.median(flat)
    per_repeat = [tokens_per_step / statistics.median(rep) for rep in step_times if rep]
    tps = tokens_per_step / median if median > 0 else None
    return {
        "tokens_per_s": tps,
        "tokens_per_s_per_device": tps / world if tps is not None else None,
        "step_time_s_median": median,
        "step_time_s_p10": percentile(flat, 10),
        "step_time_s_p90": percentile(flat, 90),
        "tokens_per_step": tokens_per_step,
        "repeats": len(step_times),
        "cv_tokens_per_s": cv(per_repeat),
        "_samples_tokens_per_s": per_repeat,
        "_samples_step_time_s": flat,
    }


def peak_memory(device) -> tuple[int | None, str]:
    """(bytes, how it was measured): CUDA max allocated, or the process's peak RSS."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    scale = 1 if sys.platform == "darwin" else 1024
    return int(rss * scale), "ru_maxrss (process peak RSS, includes runtime and model init)"


def saved_activation_bytes(model, input_ids) -> int:
    """Bytes autograd keeps for backward after one forward of a micro-batch.

    Counted through saved_tensors_hooks, each storage once, parameters excluded.
    Activation checkpointing shows here structurally: a checkpointed layer saves
    nothing beyond its input (torch.utils.checkpoint's own inner hooks take its saves),
    so the figure falls with each checkpointed layer, independently of the allocator.
    """
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[tuple[str, int], int] = {}

    def pack(t):
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in params:
                seen[(str(t.device), ptr)] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # tensors without storage
            pass
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=input_ids, labels=input_ids, use_cache=False)
    del out
    model.zero_grad(set_to_none=True)
    return int(sum(seen.values()))
