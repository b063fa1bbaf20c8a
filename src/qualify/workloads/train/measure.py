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


def _status_bytes(field: str) -> int | None:
    """A /proc/self/status memory figure (VmHWM, VmRSS) in bytes, or None off Linux."""
    try:
        with open("/proc/self/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class PeakMemory:
    """The process's peak memory, with a reset: one definition for GPU and CPU.

    CUDA: torch.cuda.max_memory_allocated, reset with reset_peak_memory_stats. CPU (Linux): the
    peak resident set size VmHWM, reset by writing 5 to /proc/self/clear_refs; where that write
    is refused, the peak after a reset is the largest VmRSS sampled after each step (a lower
    bound, said so in describe()). Before the first reset the peak is the process's since start.
    """

    def __init__(self, device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.reset_ok: bool | None = None  # None: never reset
        self.sampled: int | None = None

    def peak(self) -> int | None:
        if self.cuda:
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        if self.reset_ok is False:
            return self.sampled
        hwm = _status_bytes("VmHWM")
        if hwm is not None:
            return hwm
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss * (1 if sys.platform == "darwin" else 1024))  # Linux: KiB, macOS: bytes

    def reset(self) -> bool:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
            self.reset_ok = True
            return True
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                fh.write("5")
            self.reset_ok = _status_bytes("VmHWM") is not None
        except OSError:
            self.reset_ok = False
        if not self.reset_ok:
            self.sampled = _status_bytes("VmRSS")
        return self.reset_ok

    def sample(self) -> None:
        """After a step: only needed where the peak could not be reset (CPU without clear_refs)."""
        if self.reset_ok is False:
            rss = _status_bytes("VmRSS")
            if rss is not None:
                self.sampled = max(self.sampled or 0, rss)

    def describe(self) -> str:
        if self.cuda:
            return "torch.cuda.max_memory_allocated, peak stats reset after warm-up"
        if self.reset_ok is False:
            return "largest VmRSS sampled after each timed step (/proc/self/clear_refs refused; a lower bound)"
        return "VmHWM (process peak RSS, includes the runtime), reset after warm-up via /proc/self/clear_refs"


def peak_memory(device) -> tuple[int | None, str]:
    """(bytes, how it was measured): CUDA max allocated, or the process's peak RSS since start."""
    tracker = PeakMemory(device)
    return tracker.peak(), ("torch.cuda.max_memory_allocated" if tracker.cuda
                            else "process peak RSS since start (includes runtime and model init)")


def _saved_bytes_hooks(params: set[int], seen: dict[tuple[str, int], int]):
    import torch

    def pack(t):
        try:
            if isinstance(t, torch.nn.Parameter) or hasattr(t, "ds_id"):  # weights (ZeRO-3: gathered)
                return t
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in params:
                seen[(str(t.device), ptr)] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # tensors without storage
            pass
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)


def engine_activation_memory(engine, batch, device) -> dict[str, Any]:
    """Activation memory of the timed engine, from one more step after the timed repeats.

    CUDA: allocated after the forward minus allocated before it (what the forward keeps for
    backward), and the step's peak above the memory before the forward. CPU (no allocator
    statistics): the bytes autograd saves for backward during the forward (each storage once,
    weights excluded), which a compiled module's saves count too. Returns
    {"activation_memory_bytes", "activation_peak_bytes", "activation_memory_measure"}.
    """
    import torch

    out: dict[str, Any] = {"activation_peak_bytes": None}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        loss = engine(input_ids=batch, labels=batch, use_cache=False).loss
        torch.cuda.synchronize(device)
        out["activation_memory_bytes"] = int(torch.cuda.memory_allocated(device) - before)
        engine.backward(loss)
        engine.step()
        torch.cuda.synchronize(device)
        out["activation_peak_bytes"] = int(torch.cuda.max_memory_allocated(device) - before)
        out["activation_memory_measure"] = ("torch.cuda.memory_allocated after the forward minus before it, "
                                            "one step of the timed engine after the timed repeats")
        return out
    params = {p.untyped_storage().data_ptr() for p in engine.module.parameters()}
    seen: dict[tuple[str, int], int] = {}
    with _saved_bytes_hooks(params, seen):
        loss = engine(input_ids=batch, labels=batch, use_cache=False).loss
    engine.backward(loss)
    engine.step()
    out["activation_memory_bytes"] = int(sum(seen.values()))
    out["activation_memory_measure"] = ("bytes autograd saved for backward in the forward of one step of the "
                                        "timed engine after the timed repeats (saved_tensors_hooks; the CPU "
                                        "allocator has no statistics)")
    return out


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
    with torch.enable_grad(), _saved_bytes_hooks(params, seen):
        out = model(input_ids=input_ids, labels=input_ids, use_cache=False)
    del out
    model.zero_grad(set_to_none=True)
    return int(sum(seen.values()))
