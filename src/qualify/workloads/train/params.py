"""Validation of the training case's params and the DeepSpeed config they imply.

Pure standard library (no torch): the orchestrator side may import it to check a
case before it is sent, and the tests run it in process.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field
from typing import Any

from qualify.workloads.merge import deep_merge
from qualify.workloads.protocol import BadCase
from qualify.workloads.train.models import PRESETS

LAUNCHERS = ("auto", "none", "deepspeed", "torchrun")
DTYPES = ("bf16", "fp32")
DATA = ("synthetic", "memorize")
ATTN = ("sdpa", "eager")
# Fault injection (tests): a NaN loss at step k (on one rank); ranks that hang once launched,
# deaf to SIGTERM (as a rank stuck in a collective is), to prove that a timeout stops the whole tree.
INJECT = ("nan_at_step", "rank", "hang_after_launch_s")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class TrainParams:
    model: str
    model_config_path: str | None = None
    seq_len: int = 128
    micro_batch: int = 2
    grad_accum: int = 1
    steps: int = 10
    warmup_steps: int = 3
    repeats: int = 3
    compile: bool = False
    activation_checkpointing: str | int = "none"
    zero_stage: int = 0
    dtype: str = "bf16"
    deepspeed_config: dict[str, Any] = field(default_factory=dict)
    data: str = "synthetic"
    seed: int = 0
    num_threads: int | None = None
    peak_flops_per_device: float | None = None
    devices: int = 1
    nodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    launcher: str = "auto"
    memory_limit_gb: float | None = None
    inject: dict[str, Any] = field(default_factory=dict)
    lr: float = 3e-4
    attn_implementation: str = "sdpa"
    # Tests and benchmarks only: each step does this fraction of its measured cost in extra matmuls (real
    # compute, never a sleep: runner.ExtraWork), so that a real regression of known size is produced on demand.
    slowdown: float = 0.0
    explicit: frozenset[str] = frozenset()

    @property
    def world_size(self) -> int:
        return self.devices * self.nodes

    @property
    def threads(self) -> int:
        return self.num_threads or available_cores()


def _int(params: dict, name: str, lo: int, hi: int | None = None) -> None:
    if name not in params:
        return
    v = params[name]
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadCase(f"param {name}: expected an integer, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise BadCase(f"param {name}: must be {rng}, got {v}")


def _positive(params: dict, name: str) -> None:
    if name not in params or params[name] is None:
        return
    v = params[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise BadCase(f"param {name}: expected a positive number, got {v!r}")


def _choice(params: dict, name: str, choices: tuple[str, ...]) -> None:
    if name in params and params[name] not in choices:
        raise BadCase(f"param {name}: must be one of {', '.join(choices)}, got {params[name]!r}")


def prefetch_bucket_problem(ds_config: dict[str, Any]) -> str | None:
    """The release note's ZeRO-3 rule, the one definition (the manifest applies it too).

    training-xpu-pytorch 25.05 usage notes: leave zero_optimization.stage3_prefetch_bucket_size
    empty or set it to auto. Returns what is wrong with ds_config, or None.
    """
    zero = ds_config.get("zero_optimization") or {}
    if not isinstance(zero, dict) or "stage3_prefetch_bucket_size" not in zero:
        return None
    bucket = zero["stage3_prefetch_bucket_size"]
    if bucket in (None, "", "auto"):
        return None
    return (f"zero_optimization.stage3_prefetch_bucket_size is {bucket!r}: "
            "the release note requires it empty or 'auto'")


def check_release_rules(ds_config: dict[str, Any]) -> None:
    """Rules from the image's release note that a DeepSpeed config must follow."""
    zero = ds_config.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        raise BadCase("param deepspeed_config: zero_optimization must be an object")
    problem = prefetch_bucket_problem(ds_config)
    if problem:
        raise BadCase(f"param deepspeed_config: {problem}")


def parse_params(params: dict[str, Any]) -> TrainParams:
    """Check every param and return them with defaults filled in; BadCase names the param."""
    if not isinstance(params, dict):
        raise BadCase("params must be an object")
    known = {f for f in TrainParams.__dataclass_fields__ if f != "explicit"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise BadCase(f"unknown param(s): {', '.join(unknown)}")
    model = params.get("model")
    if not isinstance(model, str) or not model:
        raise BadCase("param model: required, a preset name "
                      f"({', '.join(PRESETS)}) or a label with model_config_path")
    path = params.get("model_config_path")
    if path is not None:
        if not isinstance(path, str) or not os.path.isfile(os.path.expanduser(path)):
            raise BadCase(f"param model_config_path: no such file {path!r}")
    elif model not in PRESETS:
        raise BadCase(f"param model: unknown preset {model!r}; known: {', '.join(PRESETS)}")
    _int(params, "seq_len", 2)
    _int(params, "micro_batch", 1)
    _int(params, "grad_accum", 1)
    _int(params, "steps", 1)
    _int(params, "warmup_steps", 0)
    _int(params, "repeats", 1)
    _int(params, "zero_stage", 0, 3)
    _int(params, "seed", 0)
    _int(params, "num_threads", 1)
    _int(params, "devices", 1)
    _int(params, "nodes", 1)
    _int(params, "node_rank", 0)
    _int(params, "master_port", 1, 65535)
    _positive(params, "peak_flops_per_device")
    _positive(params, "memory_limit_gb")
    _positive(params, "lr")
    slowdown = params.get("slowdown", 0.0)
    if isinstance(slowdown, bool) or not isinstance(slowdown, (int, float)) or not 0 <= slowdown < 10:
        raise BadCase(f"param slowdown: a fraction in [0, 10), got {slowdown!r}")
    _choice(params, "dtype", DTYPES)
    _choice(params, "data", DATA)
    _choice(params, "launcher", LAUNCHERS)
    _choice(params, "attn_implementation", ATTN)
    if "compile" in params and not isinstance(params["compile"], bool):
        raise BadCase(f"param compile: expected true or false, got {params['compile']!r}")
    ac = params.get("activation_checkpointing", "none")
    if not (ac in ("none", "all") or (isinstance(ac, int) and not isinstance(ac, bool) and ac >= 0)):
        raise BadCase(f"param activation_checkpointing: must be \"none\", \"all\" or a layer "
                      f"count >= 0, got {ac!r}")
    if "master_addr" in params and not (isinstance(params["master_addr"], str) and params["master_addr"]):
        raise BadCase(f"param master_addr: expected a host name, got {params['master_addr']!r}")
    if params.get("node_rank", 0) >= params.get("nodes", 1):
        raise BadCase(f"param node_rank: must be < nodes, got {params.get('node_rank')}")
    ds = params.get("deepspeed_config", {})
    if not isinstance(ds, dict):
        raise BadCase(f"param deepspeed_config: expected an object, got {type(ds).__name__}")
    check_release_rules(ds)
    inject = params.get("inject", {})
    if not isinstance(inject, dict) or set(inject) - set(INJECT):
        raise BadCase(f"param inject: only {', '.join(INJECT)} are supported, got {inject!r}")
    _int(inject, "nan_at_step", 0)
    _int(inject, "rank", 0)
    _positive(inject, "hang_after_launch_s")
    values = {k: v for k, v in params.items() if k in known}
    values["deepspeed_config"] = copy.deepcopy(ds)
    values["inject"] = dict(inject)
    return TrainParams(**values, explicit=frozenset(params))


def check_against_model(p: TrainParams, layers: int, max_positions: int | None) -> None:
    """Checks that need the architecture (layer count, context length)."""
    ac = p.activation_checkpointing
    if isinstance(ac, int) and ac > layers:
        raise BadCase(f"param activation_checkpointing: {ac} layers asked, the model has {layers}")
    if max_positions and p.seq_len > max_positions:
        raise BadCase(f"param seq_len: {p.seq_len} exceeds the model's max_position_embeddings "
                      f"{max_positions}")


def deepspeed_config(p: TrainParams) -> dict[str, Any]:
    """The DeepSpeed config: the case's deepspeed_config merged under the switches.

    A switch the case set explicitly (micro_batch, grad_accum, zero_stage, dtype)
    always wins; a switch left at its default only fills what deepspeed_config leaves
    unset. train_batch_size is dropped when it disagrees (DeepSpeed derives it).
    """
    user = p.deepspeed_config
    switches: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": ("micro_batch", p.micro_batch),
        "gradient_accumulation_steps": ("grad_accum", p.grad_accum),
    }
    cfg = copy.deepcopy(user)
    for key, (param, value) in switches.items():
        if param in p.explicit or key not in cfg:
            cfg[key] = value
    zero = cfg.setdefault("zero_optimization", {})
    if "zero_stage" in p.explicit or "stage" not in zero:
        zero["stage"] = p.zero_stage
    if "dtype" in p.explicit or ("bf16" not in cfg and "fp16" not in cfg):
        cfg = deep_merge(cfg, {"bf16": {"enabled": p.dtype == "bf16"}})
        if p.dtype == "bf16":
            cfg.setdefault("fp16", {})["enabled"] = False
    # A torch optimizer is passed to deepspeed.initialize (no op to compile); ZeRO
    # accepts it only with this flag.
    cfg.setdefault("zero_allow_untested_optimizer", True)
    cfg.setdefault("steps_per_print", 10**9)
    cfg.setdefault("wall_clock_breakdown", False)
    tbs = cfg.get("train_batch_size")
    if tbs is not None and tbs != (cfg["train_micro_batch_size_per_gpu"]
                                   * cfg["gradient_accumulation_steps"] * p.world_size):
        cfg.pop("train_batch_size")
    check_release_rules(cfg)
    return cfg


def effective_dtype(cfg: dict[str, Any]) -> str:
    if (cfg.get("bf16") or {}).get("enabled"):
        return "bf16"
    if (cfg.get("fp16") or {}).get("enabled"):
        return "fp16"
    return "fp32"
