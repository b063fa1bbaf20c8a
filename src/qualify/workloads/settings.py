"""What the workloads read from the environment inside the image: one frozen settings object.

Standard library only. Read it when it is needed (``WorkloadSettings.from_env()``), not at
import time: protocol.run_workload applies the case's ``env`` before the handler runs, and
the training workload sets the rendezvous variables of a lone process before it reads them.

Variables (the README's configuration table lists the same):

======================== ============================== ==========================================
variable                 default                        used for
======================== ============================== ==========================================
QUALIFY_CACHE_DIR        ~/.cache/qualify               trained tiny inference presets (<dir>/infer)
                                                        and the two compile caches below
TORCH_EXTENSIONS_DIR     <QUALIFY_CACHE_DIR>/           DeepSpeed's op builds (training workload
                         torch_extensions               exports it when unset)
TORCHINDUCTOR_CACHE_DIR  <QUALIFY_CACHE_DIR>/inductor   torch.compile kernels (likewise)
QUALIFY_MODELS_DIR       unset                          weights of real models: <dir>/<name>
QUALIFY_QUANTIZER_PYTHON unset (this interpreter)       the interpreter with llmcompressor (vllm
                                                        engine: infer/compress.py)
QUALIFY_HOSTFILE         unset (/job/hostfile)          multi-node deepspeed launcher's hostfile
QUALIFY_TRAIN_LAUNCHED   unset                          "1" marks a worker the training workload
                                                        relaunched itself
RANK, LOCAL_RANK,        0, 0, 1                        this process's place in a distributed
WORLD_SIZE                                              training run (set by the launcher)
LOCAL_WORLD_SIZE         WORLD_SIZE                     ranks on this node: they share its cores
MASTER_ADDR, MASTER_PORT unset                          rendezvous (a lone process gets defaults)
CUDA_VISIBLE_DEVICES     unset                          recorded in every result's environment
QUALIFY_RANK_RESULT_DIR  unset                          set by the training workload's relaunch:
                                                        each rank writes its result document to
                                                        <dir>/rank-<RANK>.json
======================== ============================== ==========================================

Not settings, and read elsewhere on purpose: the training workload records the variables
that shape a run (NCCL_*, TORCH_*, OMP_*, ... matched by a pattern, train/env.py), the probe
reports the variables a case names, and a relaunch hands its own environment to the workers.

The accelerator driver's version is deliberately NOT a setting: a variable set in the image
would let the image claim its own driver. Inside the image the probe reads the kernel module
(/proc/driver/nvidia/version) or asks nvidia-smi, else reports it unknown; the driver side
supplies the node's driver facts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

LAUNCHED_MARK = "QUALIFY_TRAIN_LAUNCHED"
# Set in each worker by a distributed launcher (torchrun, deepspeed, MPI wrappers).
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", *RANK_VARS)


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}: expected an integer, got {value!r}") from None


@dataclass(frozen=True)
class WorkloadSettings:
    cache_dir: str
    torch_extensions_dir: str
    torchinductor_cache_dir: str
    models_dir: str | None = None
    quantizer_python: str | None = None
    hostfile: str | None = None
    launched: bool = False
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    visible_devices: str | None = None
    rank_result_dir: str | None = None
    # The rendezvous variables that are set (name -> value), whatever their value.
    rendezvous: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> WorkloadSettings:
        # An empty QUALIFY_CACHE_DIR / TORCH_EXTENSIONS_DIR / TORCHINDUCTOR_CACHE_DIR counts as unset.
        cache = env.get("QUALIFY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "qualify")
        world = _int(env, "WORLD_SIZE", 1)
        return cls(
            cache_dir=cache,
            torch_extensions_dir=env.get("TORCH_EXTENSIONS_DIR") or os.path.join(cache, "torch_extensions"),
            torchinductor_cache_dir=env.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(cache, "inductor"),
            models_dir=env.get("QUALIFY_MODELS_DIR") or None,
            quantizer_python=env.get("QUALIFY_QUANTIZER_PYTHON") or None,
            hostfile=env.get("QUALIFY_HOSTFILE"),
            launched=env.get(LAUNCHED_MARK) == "1" or all(v in env for v in RANK_VARS),
            rank=_int(env, "RANK", 0),
            local_rank=_int(env, "LOCAL_RANK", 0),
            world_size=world,
            local_world_size=_int(env, "LOCAL_WORLD_SIZE", world),
            visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
            rank_result_dir=env.get("QUALIFY_RANK_RESULT_DIR") or None,
            rendezvous=MappingProxyType({k: env[k] for k in RENDEZVOUS_VARS if k in env}),
        )

    def cache_env(self) -> dict[str, str]:
        """The compile-cache variables to export, so that DeepSpeed's op build and inductor's
        kernels happen once per machine (their own values when set, else under cache_dir)."""
        return {"TORCH_EXTENSIONS_DIR": self.torch_extensions_dir,
                "TORCHINDUCTOR_CACHE_DIR": self.torchinductor_cache_dir}
