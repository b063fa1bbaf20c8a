#!/usr/bin/env python3
"""A bare PyTorch training loop: the reference that scripts/gpu-check.sh measures the
harness against (no DeepSpeed, no qualify; torch and transformers only).

    python -m qualify.workloads.gpucheck.bare_loop --config CONFIG.json --seq-len T --micro-batch B
                     [--steps 10] [--warmup 3] [--repeats 3] [--precision master|pure]
                     [--device auto|cuda|cpu] [--threads N] [--timeout-s S]
    python -m qualify.workloads.gpucheck.bare_loop --config CONFIG.json --count --layers 32,24,16,8 --seq-len T

CONFIG.json holds the fields of a Hugging Face config.json (with model_type): the same
file the training workload gets as model_config_path, so both sides build the same
architecture. The model is built with random weights directly on the device, in bf16,
with sdpa attention, and trained on random token ids (drawn on the CPU each step and
moved to the device, as the workload does) with the loss computed by the model itself
(labels = input ids). One optimizer step per micro-batch.

--precision master (default) does what DeepSpeed ZeRO-0 bf16 does with a torch
optimizer (its FP16_UnfusedOptimizer): bf16 weights and grads, an fp32 master copy
that a torch AdamW (fused on CUDA) updates from fp32 copies of the grads, then copied
back to the bf16 weights. The ratio harness/bare then measures the harness (engine,
its grad-norm and overflow checks, qualify's measurement), not a different
mixed-precision scheme. --precision pure is the simplest loop: AdamW directly on the
bf16 weights.

Timing as the workload's: warm-up steps, then repeats x steps timed steps with cyclic
GC paused inside a repeat; a step ends with loss.item() and a device synchronize;
tokens/s = micro_batch * seq_len / median step time. Model FLOPs per token use
torchtitan's formula 6*N + 12*L*H*Q*T (N = non-embedding parameters including the
output projection), the one the workload uses, so TFLOP/s compare like for like.

--count builds the model on the meta device for each layer count and prints the
parameter counts and FLOPs per token (nothing allocated).

Prints exactly one JSON document as the last line of stdout; status "passed" or
"error" with error_class "oom", "timeout" or "crash".
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import signal
import statistics
import sys
import time
import traceback
from typing import Any

from qualify.workloads.protocol import is_oom


class _Timeout(Exception):
    pass


def _load_fields(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        fields = json.load(fh)
    if not isinstance(fields, dict) or "model_type" not in fields:
        raise SystemExit(f"bare_loop: {path} is not a config.json (no model_type)")
    return fields


def build_config(fields: dict[str, Any], layers: int | None = None):
    from transformers import AutoConfig

    fields = dict(fields)
    if layers is not None:
        fields["num_hidden_layers"] = int(layers)
    model_type = fields.pop("model_type")
    for key in ("architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path"):
        fields.pop(key, None)
    return AutoConfig.for_model(model_type, **fields)


def build_model(config, device, dtype=None):
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"attn_implementation": "sdpa"}
    if dtype is not None:
        kwargs["dtype"] = dtype
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, **kwargs)


def counts(model, config, seq_len: int) -> dict[str, Any]:
    """Parameter counts and training model FLOPs per token (torchtitan's formula)."""
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and out.weight is emb
    non_embedding = total - emb.numel()
    flops_params = non_embedding + (out.weight.numel() if tied else 0)
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return {"params_total": int(total), "params_non_embedding": int(non_embedding),
            "params_flops": int(flops_params), "layers": int(layers),
            "model_flops_per_token": int(6 * flops_params + 12 * layers * heads * head_dim * seq_len)}


def count_main(args) -> int:
    fields = _load_fields(args.config)
    out = {}
    for n in [int(x) for x in args.layers.split(",") if x.strip()]:
        config = build_config(fields, n)
        out[str(n)] = counts(build_model(config, "meta"), config, args.seq_len)
    print(json.dumps({"status": "passed", "seq_len": args.seq_len, "layers": out}, sort_keys=True))
    return 0


def _device_name(torch, device) -> str | None:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def train(args, doc: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers

    if args.device == "auto":
        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device if args.device != "cuda" else "cuda:0")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    torch.set_num_threads(args.threads or cores)
    torch.manual_seed(args.seed)
    env = doc["environment"]
    env.update({"torch": torch.__version__, "transformers": transformers.__version__,
                "cuda_version": torch.version.cuda, "device_type": device.type,
                "device_name": _device_name(torch, device), "threads": torch.get_num_threads(),
                "precision": args.precision, "python": platform.python_version()})

    fields = _load_fields(args.config)
    config = build_config(fields, args.layers_n)
    t0 = time.monotonic()
    model = build_model(config, device, torch.bfloat16).train()
    doc["metrics"].update(counts(model, config, args.seq_len))
    params = [p for p in model.parameters() if p.requires_grad]
    fused = device.type == "cuda"
    if args.precision == "master":
        master = [p.detach().clone().float() for p in params]
        optimizer = torch.optim.AdamW(master, lr=args.lr, fused=fused)
    else:
        master = None
        optimizer = torch.optim.AdamW(params, lr=args.lr, fused=fused)
    env["model_class"] = type(model).__name__
    env["build_s"] = time.monotonic() - t0

    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    losses: list[float] = []

    def step() -> float:
        start = time.perf_counter()
        ids = torch.randint(0, config.vocab_size, (args.micro_batch, args.seq_len), generator=gen)
        ids = ids.to(device)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        if master is not None:
            for m, p in zip(master, params):
                m.grad = p.grad.to(torch.float32)
            optimizer.step()
            with torch.no_grad():
                for m, p in zip(master, params):
                    m.grad = None
                    p.copy_(m)
        else:
            optimizer.step()
        model.zero_grad(set_to_none=True)
        value = loss.detach().float().item()
        sync()
        elapsed = time.perf_counter() - start
        losses.append(value)
        if not math.isfinite(value):
            raise FloatingPointError(f"loss is {value} at step {len(losses) - 1}")
        return elapsed

    first = None
    for _ in range(args.warmup):
        t = step()
        first = t if first is None else first
    n_warm = len(losses)
    times: list[list[float]] = []
    gc_was_enabled = gc.isenabled()
    try:
        for _ in range(args.repeats):
            gc.collect()
            gc.disable()
            times.append([step() for _ in range(args.steps)])
            if gc_was_enabled:
                gc.enable()
    finally:
        if gc_was_enabled:
            gc.enable()
    flat = [t for rep in times for t in rep]
    first = flat[0] if first is None else first
    tokens_per_step = args.micro_batch * args.seq_len
    median = statistics.median(flat)
    per_repeat = [tokens_per_step / statistics.median(rep) for rep in times]
    tps = tokens_per_step / median
    cv = (statistics.stdev(per_repeat) / statistics.fmean(per_repeat)
          if len(per_repeat) > 1 else None)
    if device.type == "cuda":
        peak, how = int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    else:
        peak, how = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "ru_maxrss"
    fpt = doc["metrics"]["model_flops_per_token"]
    doc["metrics"].update({
        "tokens_per_s": tps, "step_time_s_median": median, "tokens_per_step": tokens_per_step,
        "step_time_s_min": min(flat), "step_time_s_max": max(flat),
        "cv_tokens_per_s": cv, "repeats": len(times), "first_step_time_s": first,
        "tflops_per_device": fpt * tps / 1e12, "peak_memory_bytes": peak,
        "loss_first": losses[0], "loss_last": losses[-1],
    })
    env["memory_measure"] = how
    doc["samples"] = {"step_time_s": flat, "tokens_per_s": per_repeat, "loss": losses[n_warm:]}
    doc["status"] = "passed"
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="HF config.json fields (with model_type)")
    ap.add_argument("--count", action="store_true", help="print counts for --layers, build nothing")
    ap.add_argument("--layers", default=None,
                    help="layer count (training) or comma-separated counts (--count)")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--precision", choices=("master", "pure"), default="master")
    ap.add_argument("--device", default="auto", help="auto, cuda or cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=None)
    args = ap.parse_args(argv)
    if args.count:
        if not args.layers:
            ap.error("--count needs --layers")
        return count_main(args)
    args.layers_n = int(args.layers) if args.layers else None
    if min(args.steps, args.repeats, args.micro_batch, args.seq_len) < 1 or args.warmup < 0:
        ap.error("steps, repeats, micro-batch and seq-len must be >= 1, warmup >= 0")

    def on_signal(signum, _frame):
        raise _Timeout(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    if args.timeout_s and args.timeout_s > 0:
        signal.signal(signal.SIGALRM, on_signal)
        signal.alarm(max(1, int(math.ceil(args.timeout_s))))
    start = time.monotonic()
    doc: dict[str, Any] = {
        "kind": "bare-loop", "status": "error", "error_class": None, "error": None,
        "params": {"seq_len": args.seq_len, "micro_batch": args.micro_batch, "steps": args.steps,
                   "warmup_steps": args.warmup, "repeats": args.repeats, "layers": args.layers_n,
                   "precision": args.precision, "dtype": "bf16", "lr": args.lr},
        "metrics": {}, "samples": {}, "environment": {"host": platform.node()},
    }
    try:
        train(args, doc)
    except BaseException as exc:  # noqa: BLE001 - every failure ends as a document
        if isinstance(exc, (_Timeout, KeyboardInterrupt)):
            doc["error_class"] = "timeout"
        elif is_oom(exc):
            doc["error_class"] = "oom"
        else:
            doc["error_class"] = "crash"
            traceback.print_exc()
        doc["status"] = "error"
        doc["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        signal.alarm(0)
    doc["duration_s"] = time.monotonic() - start
    print(json.dumps(doc, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
