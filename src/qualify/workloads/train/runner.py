"""The training workload's case handler: relaunch per device, or train in this process.

`handle` is what protocol.run_workload calls; `main` is the entry point of
`python -m qualify.workloads.train` (see the package docstring for the choices made).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from qualify.workloads import duet, phases, protocol
from qualify.workloads.settings import WorkloadSettings
from qualify.workloads.train.env import (clear_stale_build_locks, device_facts, limit_memory, recorded_env, redact,
                                         share_precompiled_headers)
from qualify.workloads.train.ranks import (RANK_RESULT_DIR, choose_launcher, free_port, gloo_env, is_launched,
                                            launch_command, merge_rank_results, rank_result_path,
                                            read_rank_results, relaunch, single_process_env)
from qualify.workloads.train.mfu import mfu, peak_dtype, resolve_peak
from qualify.workloads.train.params import (TrainParams, available_cores, check_against_model,
                                            deepspeed_config, effective_dtype, parse_params)


class _Timeout(Exception):
    pass


def _timeout_behind(exc: BaseException) -> _Timeout | None:
    """The _Timeout that `exc` is, or that it was raised from or while handling: torch.compile's inductor
    re-raises whatever stops a compile as its own InductorError, so a case whose timeout fired during a compile
    (the first step of a compiled model) was reported as a crash (CI: the GPU check's compile variant, 'crash
    (119 s)', at its 115 s timeout)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, _Timeout):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class _NanLoss(Exception):
    def __init__(self, step: int, value: float) -> None:
        super().__init__(f"loss is {value} at step {step}")
        self.step = step


@dataclass
class _Setup:
    """What one training process knows once torch and the process group are up."""
    p: TrainParams
    config: Any
    counts: dict[str, Any]
    ds_cfg: dict[str, Any]
    dtype: str
    micro: int
    accum: int
    device: Any
    world: int
    rank: int
    env: dict[str, Any]


# --------------------------------------------------------------------------- handler

def handle(case: dict[str, Any], log: logging.Logger) -> dict[str, Any]:
    p = parse_params(case.get("params", {}))
    timeout_s = case.get("timeout_s")
    try:  # duet: pinned before torch starts its threads; relaunched ranks inherit the cpu set
        spec = duet.DuetSpec.from_case(case)
        if spec is not None:
            duet.pin(spec.cpus)
    except (ValueError, OSError) as exc:
        raise protocol.BadCase(f"duet: {exc}") from None
    launcher = choose_launcher(p.launcher, p.devices, p.nodes)
    if launcher != "none" and not is_launched():
        _arm_timeout(None)  # SIGTERM only: the launcher's own timeout is communicate()'s
        return _relaunched(case, p, launcher, timeout_s, log)
    if launcher != "none" and p.inject.get("hang_after_launch_s"):
        _hang(p.inject["hang_after_launch_s"], log)
    _arm_timeout(timeout_s)
    try:
        return _train(case, p, launcher, log)
    except Exception as exc:  # outside the step loop (imports, model build, engine init)
        timeout = _timeout_behind(exc)
        if timeout is None:
            raise
        return {"status": "error", "error_class": "timeout", "error": str(timeout)}
    finally:
        signal.alarm(0)


def _hang(seconds: float, log: logging.Logger) -> None:
    """inject.hang_after_launch_s: a launched rank that hangs deaf to SIGTERM and SIGINT, as a
    rank stuck in a collective does (a test of the executor's timeout, never a benchmark)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log.warning("rank %s hangs for %g s (inject.hang_after_launch_s)",
                WorkloadSettings.from_env().rank, seconds)
    time.sleep(seconds)


def _arm_timeout(timeout_s: Any) -> None:
    def on_signal(signum, _frame):
        raise _Timeout(f"stopped by {signal.Signals(signum).name}")

    # SIGTERM (an executor stopping us) and the case's own timeout both end as a
    # timeout document rather than a silent death.
    signal.signal(signal.SIGTERM, on_signal)
    if isinstance(timeout_s, (int, float)) and timeout_s > 0:
        signal.signal(signal.SIGALRM, on_signal)
        signal.alarm(max(1, int(math.ceil(timeout_s))))


def _relaunched(case, p: TrainParams, launcher: str, timeout_s, log) -> dict[str, Any]:
    """Start one worker per device through torchrun/deepspeed; merge the ranks' documents.

    Each rank writes its document into a scratch directory (launch.RANK_RESULT_DIR) and exits
    non-zero when it did not pass; the launcher's exit code is judged too (merge_rank_results).
    """
    port = p.master_port or (free_port() if p.nodes == 1 else 29500)
    scratch = tempfile.mkdtemp(prefix="qualify-ranks-")
    case_path = os.path.join(scratch, "case.json")
    with open(case_path, "w", encoding="utf-8") as fh:
        json.dump(case, fh)
    cmd = launch_command(launcher, devices=p.devices, nodes=p.nodes, node_rank=p.node_rank,
                         master_addr=p.master_addr, master_port=port, case_path=case_path,
                         hostfile=WorkloadSettings.from_env().hostfile)
    rc: int | None = None
    problem: str | None = None
    stdout = ""
    try:
        try:
            rc, stdout = relaunch(cmd, timeout_s, log, {RANK_RESULT_DIR: scratch}, defaults=gloo_env(p.master_addr))
        except (subprocess.TimeoutExpired, _Timeout) as exc:
            problem = f"{launcher}: " + (str(exc) if isinstance(exc, _Timeout) else f"did not finish in {timeout_s} s")
        docs = read_rank_results(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not docs and rc is not None:
        try:  # a launcher that did not hand our variable to its workers: rank 0's stdout
            docs = {0: protocol.parse_result_output(stdout)}
        except ValueError:
            pass
    # The ranks this node started (a multi-node DeepSpeed runner starts the other nodes' itself).
    expected = (list(range(p.node_rank * p.devices, (p.node_rank + 1) * p.devices))
                if launcher == "torchrun" or p.nodes == 1 else None)
    fields = merge_rank_results(docs, expected=expected, launcher_exit_code=rc, launcher_problem=problem)
    fields["environment"].update({"launcher": launcher, "launch_command": " ".join(cmd)})
    if fields["status"] != "passed":
        log.error("ranks: %s", fields["environment"]["ranks"])
    return fields


# --------------------------------------------------------------------------- one process

def _train(case, p: TrainParams, launcher: str, log: logging.Logger) -> dict[str, Any]:
    s = _setup(case, p, launcher)
    restore: Callable[[], None] = lambda: None  # noqa: E731
    try:
        import torch

        restore = limit_memory(p.memory_limit_gb, s.counts["total"], s.dtype,
                               int(s.ds_cfg["zero_optimization"].get("stage", 0)), s.world,
                               s.device, s.env, torch)
        engine, fixed, ckpt_counter = _build(s, log)
        # duet: rank 0 of each side meets the peer before each timed step (other ranks follow by collectives).
        barrier = duet.enter(case, trade_cores=s.world == 1) if s.rank == 0 else None
        # The measurement gate (rank 0; the other ranks wait in the next step's collectives).
        gate = protocol.measurement_gate if s.rank == 0 else (lambda: None)  # noqa: E731
        try:
            return _measure(s, engine, fixed, ckpt_counter, log, barrier, gate)
        finally:
            if barrier is not None:
                barrier.close()
    except Exception as exc:  # noqa: BLE001 - an OOM still reports where it happened
        if not protocol.is_oom(exc):
            raise
        restore()  # room to write the document
        log.error("oom: %s\n%s", exc, traceback.format_exc(limit=6))
        s.env["load_avg_end"] = list(os.getloadavg())
        return {"status": "error", "error_class": "oom",
                "error": f"{type(exc).__name__}: {exc}"[:2000], "environment": s.env}
    finally:
        restore()


def _setup(case, p: TrainParams, launcher: str) -> _Setup:
    os.environ.update(single_process_env())
    import deepspeed
    import torch
    import transformers
    from deepspeed.accelerator import get_accelerator

    from qualify.workloads.train import models as tm

    phases.enter("model_build")  # the process group and the model: set-up, not measurement
    config = tm.build_config(tm.config_dict(p.model, p.model_config_path))
    check_against_model(p, config.num_hidden_layers,
                        getattr(config, "max_position_embeddings", None))
    counts = tm.count_params(tm.build_model(config, device="meta"))
    ds_cfg = deepspeed_config(p)

    settings = WorkloadSettings.from_env()  # after single_process_env() above
    acc = get_accelerator()
    device = torch.device(acc.device_name(settings.local_rank))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # Threads: the case's num_threads, else every core this process may use, shared
    # between the ranks of this node.
    torch.set_num_threads(p.num_threads or max(1, available_cores() // max(1, settings.local_world_size)))
    torch.manual_seed(p.seed)
    # With several ranks, a collective that waits on a dead peer gives up well inside the case
    # timeout (the launcher normally stops the peers first): never the 30-minute default.
    dist_kwargs: dict[str, Any] = {}
    timeout_s = case.get("timeout_s")
    if settings.world_size > 1 and isinstance(timeout_s, (int, float)) and timeout_s > 0:
        import datetime

        dist_kwargs["timeout"] = datetime.timedelta(seconds=max(30.0, min(1800.0, timeout_s / 2)))
    backend = "gloo" if device.type == "cpu" else acc.communication_backend_name()
    if settings.world_size == 1 and not torch.distributed.is_initialized():
        # A lone process needs no rendezvous server: env:// would start a TCPStore listening on
        # every interface (c10d binds the wildcard address). An in-memory store opens no port;
        # deepspeed.init_distributed then keeps this process group.
        torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(), rank=0,
                                             world_size=1, **dist_kwargs)
    deepspeed.init_distributed(dist_backend=backend, **dist_kwargs)

    env: dict[str, Any] = protocol.environment_base()
    env.update({
        "torch": torch.__version__, "deepspeed": deepspeed.__version__,
        "transformers": transformers.__version__, "device_type": device.type,
        "accelerator": acc.device_name(), "world_size": torch.distributed.get_world_size(),
        "rank": torch.distributed.get_rank(), "launcher": launcher,
        "threads": torch.get_num_threads(),
        "env_passed": redact(case.get("env") or {}), "env_recorded": recorded_env(),
        "model": p.model, "model_type": config.model_type, "dtype": effective_dtype(ds_cfg),
        "zero_stage": int(ds_cfg["zero_optimization"].get("stage", 0)),
        "deepspeed_config": ds_cfg, "load_avg_start": list(os.getloadavg()),
        "collective_timeout_s": dist_kwargs["timeout"].total_seconds() if dist_kwargs else None,
    })
    env.update(device_facts(torch, device))
    return _Setup(p=p, config=config, counts=counts, ds_cfg=ds_cfg, dtype=env["dtype"],
                  micro=int(ds_cfg["train_micro_batch_size_per_gpu"]),
                  accum=int(ds_cfg["gradient_accumulation_steps"]), device=device,
                  world=env["world_size"], rank=env["rank"], env=env)


def _build(s: _Setup, log: logging.Logger):
    """Model (random weights, on the device), checkpointing, compile, DeepSpeed engine."""
    import deepspeed
    import torch

    from qualify.workloads.train import models as tm
    from qualify.workloads.train.measure import saved_activation_bytes

    p, env = s.p, s.env
    t0 = time.monotonic()
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(s.dtype, torch.float32)
    model = tm.build_model(s.config, device=s.device, dtype=torch_dtype,
                           attn_implementation=p.attn_implementation).train()
    # What was asked of transformers; the evidence (checkpointed_layers) is counted in _measure.
    env["checkpointing_enabled_layers"] = tm.apply_checkpointing(model, p.activation_checkpointing)
    env["num_layers"] = len(tm.decoder_layers(model))
    ckpt_counter = tm.count_checkpoint_calls(model, s.device)  # before compile: traced once
    gen = torch.Generator(device="cpu").manual_seed(p.seed + s.rank)
    fixed = torch.randint(0, s.config.vocab_size, (s.micro, p.seq_len), generator=gen)
    fixed = fixed.to(s.device)
    # Measured on the eager model before DeepSpeed: the structural memory effect of
    # checkpointing, the same whether or not the model is compiled afterwards.
    env_bytes = saved_activation_bytes(model, fixed)

    if p.compile:
        env["precompiled_headers"] = share_precompiled_headers(WorkloadSettings.from_env().torchinductor_cache_dir)
    module = torch.compile(model) if p.compile else model
    optimizer = None
    if "optimizer" not in s.ds_cfg:
        # A plain torch optimizer: no DeepSpeed optimizer op to compile.
        optimizer = torch.optim.AdamW(model.parameters(), lr=p.lr,
                                      fused=s.device.type == "cuda")
    engine, ds_optimizer, _, _ = deepspeed.initialize(model=module, optimizer=optimizer,
                                                      config=s.ds_cfg)
    env.update({
        "model_class": type(engine.module).__name__,
        # Only that the module is wrapped; "compiled" is decided from the graphs dynamo compiled.
        "compile_wrapped": isinstance(engine.module, torch._dynamo.eval_frame.OptimizedModule),
        "optimizer": type(ds_optimizer).__name__,
        "client_optimizer": type(optimizer).__name__ if optimizer is not None else None,
        "activation_saved_bytes": env_bytes,
    })
    log.info("model %s ready in %.1f s: %s, checkpointing on for %d of %d layers, optimizer %s",
             p.model, time.monotonic() - t0, env["model_class"], env["checkpointing_enabled_layers"],
             env["num_layers"], env["optimizer"])
    return engine, fixed, ckpt_counter


class _Stepper:
    """One optimizer step = grad_accum micro-batches through the engine, timed."""

    def __init__(self, s: _Setup, engine, fixed) -> None:
        import torch

        self.s, self.engine, self.fixed, self.torch = s, engine, fixed, torch
        self.gen = torch.Generator(device="cpu").manual_seed(s.p.seed + s.rank + 1)
        # inject.rank limits the NaN to one rank (a peer's failure in a multi-rank case).
        self.nan_at = (s.p.inject.get("nan_at_step")
                       if s.p.inject.get("rank") in (None, s.rank) else None)
        self.losses: list[float] = []
        from deepspeed.accelerator import get_accelerator

        self.sync = get_accelerator().synchronize
        self.extra: ExtraWork | None = None  # set by calibrate_slowdown once the step's cost is known
        self.barrier: Any = None  # a duet launch's StepBarrier (workloads/duet.py): timed steps only
        # A duet side that waits for its peer on a CPU keeps its core busy with matmuls in the step's threads,
        # so that the peer's step never runs beside an idle core (workloads/duet.py says why). On a GPU the
        # host thread only waits for its own device: no filler.
        self.filler = ExtraWork(torch, s.device, 1, 0.0, 0.0).run if s.device.type == "cpu" else None

    def batch(self):
        if self.s.p.data == "memorize":
            return self.fixed
        ids = self.torch.randint(0, self.s.config.vocab_size, (self.s.micro, self.s.p.seq_len),
                                 generator=self.gen)
        return ids.to(self.s.device)

    def calibrate_slowdown(self) -> dict[str, Any]:
        """params.slowdown f: from now on each step does f times its measured cost in extra matmuls."""
        self.extra = ExtraWork.sized(self.torch, self.s.device, self.s.p.slowdown, self)
        return self.extra.describe()

    def __call__(self, timed: bool = False) -> float:
        index = len(self.losses)
        if timed and self.barrier is not None:
            self.barrier.wait(self.filler)  # duet: both sides start this step together
        start = time.perf_counter()
        total = self.torch.zeros((), device=self.s.device)
        for _ in range(self.s.accum):
            ids = self.batch()
            loss = self.engine(input_ids=ids, labels=ids, use_cache=False).loss
            if index == self.nan_at:
                loss = loss * float("nan")
            self.engine.backward(loss)
            self.engine.step()
            total += loss.detach().float()
        value = (total / self.s.accum).item()  # also the synchronisation point on CPU
        if self.extra is not None:  # params.slowdown: a regression of known size (tests, benchmarks)
            self.extra.run()
        self.sync()
        elapsed = time.perf_counter() - start
        if timed and self.barrier is not None:
            self.barrier.done()
        self.losses.append(value)
        if not math.isfinite(value):
            raise _NanLoss(index, value)
        return elapsed


class ExtraWork:
    """Real extra compute per step (params.slowdown): `units` matmuls of a fixed square matrix on the
    step's device and threads, sized once so that they cost `fraction` of a step (never a sleep: a sleep
    frees the cores, so it would not slow a side that shares the machine as a heavier release would)."""

    SIZE = 192

    def __init__(self, torch, device, units: int, unit_s: float, fraction: float) -> None:
        self.torch, self.units, self.unit_s, self.fraction = torch, units, unit_s, fraction
        gen = torch.Generator(device="cpu").manual_seed(1234)
        self.a = torch.randn(self.SIZE, self.SIZE, generator=gen).to(device)
        self.b = torch.randn(self.SIZE, self.SIZE, generator=gen).to(device)
        self.sink = 0.0
        self.sizing: list[float] = []  # per sizing round: the step's time over one matmul's
        self.clock = "wall"  # what the sizing rounds timed: wall time, or the one CPU thread's time

    @classmethod
    def sized(cls, torch, device, fraction: float, step: Callable[[], float], rounds: int = 3) -> "ExtraWork":
        """Sized against the step itself: `rounds` times an untimed step, then a block of matmuls about as long;
        the number of matmuls is f times the median of the rounds' (step time / one matmul's time in its block).

        Why rounds of step-long blocks: the step's cost and the matmul's cost must be read under the same
        neighbour. On this machine a matmul runs 2.4 times slower while the other vCPU runs matmuls too; when the
        matmul's cost was the fastest of 30 single matmuls (15 ms in all) and the step's the fastest of three
        steps, the two saw different neighbours, and the "10% slower" copy of a benchmark was 4% to 17% slower
        from one launch to the next (issue 23). A round's step and block share their neighbour, and the median
        of three rounds drops one that did not. On one CPU thread both are read as that thread's CPU time: a
        neighbour that takes half the core for a while (a burner) then moves neither, where it moved the wall-time
        ratio by whatever it overlapped (the benchmark's burner made a 10% copy 7-9% slower)."""
        on_cpu = device.type == "cpu" and torch.get_num_threads() == 1
        clock = time.thread_time if on_cpu else time.perf_counter
        work = cls(torch, device, 1, 0.0, fraction)
        work.run()  # warm-up
        singles = []
        for _ in range(5):
            t0 = time.perf_counter()
            work.run()
            singles.append(time.perf_counter() - t0)
        ratios, unit_times = [], []
        for _ in range(rounds):
            t0 = clock()
            step_s = step()
            step_s = clock() - t0 if on_cpu else step_s
            block = max(1, round(step_s / max(min(singles), 1e-7)))
            work.units = block
            t0 = clock()
            work.run()
            unit_s = (clock() - t0) / block
            unit_times.append(unit_s)
            ratios.append(step_s / unit_s if unit_s > 0 else 0.0)
        work.unit_s = statistics.median(unit_times)
        work.units = max(1, round(fraction * statistics.median(ratios)))
        work.sizing = ratios
        work.clock = "thread_cpu" if on_cpu else "wall"
        return work

    def run(self) -> None:
        out = self.a
        for _ in range(self.units):
            out = self.torch.mm(self.a, self.b)
        self.sink = float(out[0, 0])  # the result is used: the work cannot be skipped

    def describe(self) -> dict[str, Any]:
        return {"slowdown": self.fraction, "slowdown_units": self.units, "slowdown_unit_s": self.unit_s,
                "slowdown_work": f"{self.units} x {self.SIZE}x{self.SIZE} matmul per step",
                "slowdown_sizing": [round(r, 2) for r in self.sizing], "slowdown_clock": self.clock}


class _Evidence:
    """What the timed engine really did: graphs dynamo compiled and graph breaks (over the
    engine's steps), decoder layers that called their checkpoint function during the timed
    steps (count_checkpoint_calls), never read from a flag or an attribute."""

    def __init__(self, counter) -> None:
        from torch._dynamo.utils import counters

        self.counters = counters
        self.counter = counter
        self.graphs0, self.breaks0 = self._dynamo()
        self.calls0: list[int] | None = None
        self.timed_steps = 0

    def _dynamo(self) -> tuple[int, int]:
        return (int(self.counters["stats"].get("unique_graphs", 0)),
                int(sum(self.counters["graph_break"].values())))

    def timed_start(self) -> None:
        self.calls0 = self.counter.tolist()

    def report(self, env: dict[str, Any], log: logging.Logger) -> None:
        graphs, breaks = self._dynamo()
        env["compile_graphs"] = graphs - self.graphs0
        env["compile_graph_breaks"] = breaks - self.breaks0
        env["compiled"] = bool(env.get("compile_wrapped")) and env["compile_graphs"] > 0
        if env.get("compile_wrapped") and not env["compiled"]:
            log.warning("torch.compile compiled no graph: the model ran eagerly")
        if self.calls0 is not None:
            calls = self.counter.tolist()
            grown = [b - a for a, b in zip(self.calls0, calls)]
            env["checkpointed_layers"] = sum(1 for g in grown if g > 0)
            env["checkpoint_calls_per_step"] = (sum(grown) / self.timed_steps) if self.timed_steps else None
        else:
            env["checkpointed_layers"] = None  # no timed step ran
        env["evidence_measure"] = ("compile: torch._dynamo counters (unique_graphs, graph_break) over the "
                                   "engine's steps; checkpointing: decoder layers that called their "
                                   "checkpoint function during the timed steps")


def _measure(s: _Setup, engine, fixed, ckpt_counter, log: logging.Logger, barrier: Any = None,
             gate: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Warm up, then repeats x steps timed steps (a duet launch: each after the barrier); the result fields.
    `gate`: the measurement gate, passed after the first warm-up step (it carries the compile or the compile-cache
    load, set-up that may overlap other launches' set-up) and before the rest of the warm-up and the timed steps."""
    from qualify.workloads.train import models as tm
    from qualify.workloads.train.measure import PeakMemory, engine_activation_memory, summarize

    p, env, config = s.p, s.env, s.config
    step = _Stepper(s, engine, fixed)
    fpt = tm.flops_per_token(s.counts["flops_params"], config.num_hidden_layers,
                             config.num_attention_heads, tm.head_dim(config), p.seq_len)
    tokens_per_step = s.micro * s.accum * p.seq_len * s.world
    metrics: dict[str, Any] = {
        "model_flops_per_token": fpt, "params_total": s.counts["total"],
        "params_non_embedding": s.counts["non_embedding"], "tokens_per_step": tokens_per_step,
        "activation_saved_bytes": env.pop("activation_saved_bytes"),
    }
    times: list[list[float]] = []
    first_step = None
    gc_was_enabled = gc.isenabled()
    evidence = _Evidence(ckpt_counter)
    memory = PeakMemory(s.device)
    try:
        phases.enter("warmup")
        for _ in range(p.warmup_steps):
            elapsed = step()
            if first_step is None:
                first_step = elapsed
                gate()
        if first_step is None:
            gate()
        n_warm = len(step.losses)
        # The set-up peak (model init, the eager activation pass, deepspeed.initialize, warm-up and
        # compile) is kept apart; the training peak is measured from here on.
        metrics["setup_peak_memory_bytes"] = memory.peak()
        if p.slowdown:
            env.update(step.calibrate_slowdown())
        memory.reset()
        evidence.timed_start()
        step.barrier = barrier
        phases.enter(phases.MEASURE)
        for _ in range(p.repeats):
            # As timeit does: collect between repeats, no cyclic GC pause inside one.
            gc.collect()
            gc.disable()
            times.append([])
            for _ in range(p.steps):
                times[-1].append(step(timed=True))
                evidence.timed_steps += 1
                memory.sample()
            first_step = times[0][0] if first_step is None else first_step
            if gc_was_enabled:
                gc.enable()
        phases.enter("report")
    except Exception as exc:
        if not isinstance(exc, _NanLoss):
            timeout = _timeout_behind(exc)
            if timeout is None:
                raise
            exc = timeout
        if gc_was_enabled:
            gc.enable()
        evidence.report(env, log)
        env["load_avg_end"] = list(os.getloadavg())
        nan = isinstance(exc, _NanLoss)
        finite = [x for x in step.losses if math.isfinite(x)]  # JSON has no NaN
        metrics["loss_first"] = step.losses[0] if step.losses else None
        metrics["loss_last"] = step.losses[-1] if step.losses else None
        return {"status": "failed" if nan else "error",
                "error_class": "nan_loss" if nan else "timeout", "error": str(exc),
                "metrics": metrics,
                "samples": {"loss": finite, "step_time_s": [t for r in times for t in r]},
                "environment": env}
    losses = step.losses
    summary = summarize(times, tokens_per_step, s.world)
    samples = {"step_time_s": summary.pop("_samples_step_time_s"),
               "tokens_per_s": summary.pop("_samples_tokens_per_s"),
               "loss": losses[n_warm:]}
    metrics.update(summary)
    per_device = summary["tokens_per_s_per_device"]
    achieved = fpt * per_device if per_device else None  # model FLOP/s per device
    import torch

    # The peak of this device for the dtype the matmuls run in (fp32 may run as TF32); the
    # manifest's peak_flops_per_device wins; an unknown pair leaves MFU null with its reason.
    env["peak_dtype"] = peak_dtype(s.dtype, torch if s.device.type == "cuda" else None)
    chosen = resolve_peak(manifest_peak=p.peak_flops_per_device, device_type=s.device.type,
                          device_name=env.get("device_name"), dtype=env["peak_dtype"])
    peak = chosen["peak"]
    env["peak_flops_per_device"] = peak
    env["peak_source"] = env["peak_flops_source"] = chosen["source"]
    mem = memory.peak()
    env["memory_measure"] = memory.describe()
    evidence.report(env, log)
    # One more step of the same engine, after the timed repeats: its activation memory.
    env.update(engine_activation_memory(engine, step.batch(), s.device))
    env["load_avg_end"] = list(os.getloadavg())
    if barrier is not None:
        env["duet"] = barrier.report()
    metrics.update({
        "tflops_per_device": achieved / 1e12 if achieved else None,
        # Model FLOPs only: the recompute of checkpointed layers is never counted.
        "mfu": mfu(achieved, peak),
        "peak_memory_bytes": mem,
        "first_step_time_s": first_step,
        # The first step's extra time over a typical step (compile, allocator warm-up).
        "compile_time_s": max(0.0, first_step - summary["step_time_s_median"]),
        "loss_first": losses[0], "loss_last": losses[-1],
    })
    env["mfu_null_reason"] = (None if metrics["mfu"] is not None
                              else chosen["null_reason"] or "no achieved FLOP/s measured")
    fields: dict[str, Any] = {"status": "passed", "probes": {}}
    if p.data == "memorize":
        falls = losses[-1] < losses[0]
        detail = f"loss {losses[0]:.4f} -> {losses[-1]:.4f}"
        fields["probes"]["loss_falls"] = {"status": "passed" if falls else "failed",
                                          "detail": detail}
        if not falls:
            fields.update(status="failed", error_class="degenerate",
                          error=f"memorisation loss did not fall ({detail})")
    log.info("tokens/s %.1f (median step %.4f s, cv %s), loss %.3f -> %.3f",
             summary["tokens_per_s"] or 0, summary["step_time_s_median"],
             summary["cv_tokens_per_s"], losses[0], losses[-1])

    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    return {**fields, "metrics": metrics, "samples": samples, "environment": env}


# --------------------------------------------------------------------------- entry point

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--describe", metavar="PRESET")
    ap.add_argument("--config", metavar="CONFIG_JSON", help="with --describe: a HF config.json")
    ap.add_argument("--seq-len", type=int, default=128)
    args, rest = ap.parse_known_args(argv)
    if args.describe or args.config:
        from qualify.workloads.train.models import config_dict, describe

        try:
            fields = config_dict(args.describe, args.config)
        except (KeyError, ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(describe(fields, args.seq_len), sort_keys=True))
        return 0
    settings = WorkloadSettings.from_env()
    os.environ.update(settings.cache_env())
    for lock in clear_stale_build_locks(settings.torch_extensions_dir):
        print(f"removed a stale op-build lock left by a killed build: {lock}", file=sys.stderr)
    if settings.rank != 0:
        # Only rank 0 reports on stdout; the other ranks' documents go to stderr.
        sys.stdout = sys.stderr
    if settings.launched and settings.rank_result_dir:
        # A worker of our relaunch: its own document for the parent to merge, and a non-zero exit
        # when it did not pass, so that the launcher stops the peers waiting on it.
        return protocol.run_workload("train", handle, rest,
                                     result_path=rank_result_path(settings.rank_result_dir, settings.rank),
                                     failure_exit_code=1)
    return protocol.run_workload("train", handle, rest)

