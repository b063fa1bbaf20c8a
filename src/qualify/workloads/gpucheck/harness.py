#!/usr/bin/env python3
"""Driver of scripts/gpu-check.sh (run it through that script, which picks the Python).

A workload-side module (standard library and other workload modules only, like everything under
qualify/workloads: tests/unit/test_workload_boundary.py): it talks to the training workload
through its documented entry points (`python -m qualify.workloads.train --case FILE`
and `--describe PRESET`) and to the bare loop (`python -m qualify.workloads.gpucheck.bare_loop`), each in its own process,
stopped at its deadline by the workloads' one process-group killer (workloads/procs.kill_group).

What it does, in order, against one deadline (start + --budget-s, at most 480 s):
 1. writes the architecture's config.json for each candidate layer count, and checks
    that it is the workload's preset (same parameter count and FLOPs per token as
    `--describe PRESET`);
 2. base variant, with --layers auto: the largest layer count of the ladder that
    trains; a count whose training state alone cannot fit the GPU is skipped without
    a try, an OOM retries with the next count (every variant then uses that count);
 3. the bare loop (bare_loop.py) with the same layers, micro-batch, sequence
    length and step plan;
 4. the other variants, cheapest first: ckpt, compile, compile+ckpt.
Before each run the remaining runs are re-planned from what the runs so far cost:
first fewer steps and repeats (three plans: as asked, about half, minimal), then
variants are dropped in this order: compile+ckpt, compile, ckpt. Base and the bare
loop are never dropped. Every run gets a timeout that ends it before the deadline.

Writes OUT/gpu-check.json, OUT/gpu-check.txt (the table), and per run its case,
result document and log.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from qualify.workloads.procs import kill_group

MAX_BUDGET_S = 480          # the check must fit one device command of 8 minutes
RESERVE_S = 12              # kept for writing the summary after the last run
KILL_GRACE_S = 8            # SIGTERM -> SIGKILL

# The architectures this check trains, as the fields of their config.json. They must
# equal the workload's presets of the same name: step 1 compares them with
# `python -m qualify.workloads.train --describe PRESET` and stops on any difference.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    # meta-llama/Meta-Llama-3-8B config.json (untied embeddings, no rope scaling)
    "llama3-8b": {
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    # the workload's tiny-llama preset (the CPU smoke test)
    "tiny-llama": {
        "model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 2048, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2, "rope_theta": 500000.0,
    },
}

LADDER = (32, 24, 16, 8)
VARIANTS = ("base", "ckpt", "compile", "compile+ckpt")      # run order (cheapest first)
DROP_ORDER = ("compile+ckpt", "compile", "ckpt")             # first dropped first
# Step time of a variant relative to base, for planning only (checkpointing recomputes
# the forward: about +1/3 of a step).
STEP_FACTOR = {"base": 1.0, "bare": 1.0, "ckpt": 1.35, "compile": 1.0, "compile+ckpt": 1.35}
# Training state per parameter on the path the check takes (DeepSpeed ZeRO-0 bf16 with
# a torch AdamW, i.e. DeepSpeed's FP16_UnfusedOptimizer): bf16 weights 2 + bf16 grads 2
# + fp32 master 4 + fp32 grad copies 4 (all made before the optimizer step) + Adam
# moments 8. A lower bound: activations come on top.
STATE_BYTES_PER_PARAM = 20


def log(msg: str) -> None:
    print(f"gpu-check [{time.strftime('%H:%M:%S')}]: {msg}", flush=True)


# --------------------------------------------------------------------------- processes

def run_process(cmd: list[str], *, timeout: float, log_path: str,
                env: dict[str, str] | None = None, stdin: str | None = None
                ) -> tuple[int | None, str, float, bool]:
    """Run cmd in its own process group; (rc, stdout, wall s, timed out)."""
    start = time.monotonic()
    with open(log_path, "ab") as err:
        err.write(f"$ {' '.join(cmd)}\n".encode())
        err.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                env=env, start_new_session=True)
        timed_out = False
        try:
            out, _ = proc.communicate(stdin.encode() if stdin is not None else None,
                                      timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc, grace_s=KILL_GRACE_S)
            out, _ = proc.communicate()
    return proc.returncode, out.decode(errors="replace"), time.monotonic() - start, timed_out


def last_json(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(doc, dict):
                return doc
    return None


# --------------------------------------------------------------------------- the check

class Check:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.t0 = float(os.environ.get("GPU_CHECK_T0") or time.time())
        self.deadline = self.t0 + a.budget_s
        self.out = a.out
        self.py = a.python
        self.arch = ARCHITECTURES[a.preset]
        self.full_layers = int(self.arch["num_hidden_layers"])
        # Step plans (warm-up, steps, repeats): as asked, about half, minimal; each
        # no longer than the one before.
        half = (min(a.warmup, 2), max(1, a.steps // 2), max(1, min(a.repeats, 2)))
        plans = [(a.warmup, a.steps, a.repeats), half, (min(a.warmup, 1), min(half[1], 3), 1)]
        self.plans: list[tuple[int, int, int]] = []
        for p in plans:
            if p not in self.plans:
                self.plans.append(p)
        self.level = 0
        self.results: dict[str, dict[str, Any]] = {}   # variant (and "bare") -> summary
        self.attempts: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.dropped: dict[str, str] = {}
        self.layers: int | None = None
        self.cost: dict[str, Any] = {}                  # what base taught about costs
        self.env = dict(os.environ)
        self.facts: dict[str, Any] = {}

    # ----- time
    def elapsed(self) -> float:
        return time.time() - self.t0

    def left(self) -> float:
        return self.deadline - time.time()

    # ----- set-up
    def write_config(self, layers: int) -> str:
        path = os.path.join(self.out, f"{self.a.preset}-L{layers}.config.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({**self.arch, "num_hidden_layers": layers}, fh, indent=1, sort_keys=True)
        return path

    def device_facts(self) -> None:
        if self.a.cpu_smoke:
            self.facts["device"] = "cpu (smoke test: figures mean nothing)"
            return
        q = "name,driver_version,memory.total"
        try:
            out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=30).stdout
            name, driver, mem = [x.strip() for x in out.strip().splitlines()[0].split(",")[:3]]
            self.facts.update(device=name, driver=driver, memory_bytes=int(float(mem)) * 2**20)
        except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
            self.notes.append(f"nvidia-smi gave no device facts ({exc})")

    def check_architecture(self, ladder: list[int]) -> dict[str, Any]:
        """Counts per layer count (bare loop, meta device) and the preset cross-check."""
        cfg = self.write_config(self.full_layers)
        counts_cmd = [self.py, "-m", "qualify.workloads.gpucheck.bare_loop", "--config", cfg,
                      "--count", "--layers", ",".join(str(n) for n in sorted({*ladder, self.full_layers})),
                      "--seq-len", str(self.a.seq_len)]
        describe_cmd = [self.py, "-m", "qualify.workloads.train", "--describe", self.a.preset,
                        "--seq-len", str(self.a.seq_len)]
        logp = os.path.join(self.out, "describe.log")
        # Both import torch and transformers (seconds each): run them side by side.
        outs = []
        with open(logp, "ab") as err:
            procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=err, env=self.env)
                     for c in (counts_cmd, describe_cmd)]
            for p in procs:
                try:
                    outs.append(p.communicate(timeout=max(5.0, min(120.0, self.left() - 60)))[0])
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate()
                    outs.append(b"")
        counts, described = last_json(outs[0].decode()), last_json(outs[1].decode())
        if not counts or counts.get("status") != "passed":
            raise SystemExit(f"gpu-check: the bare loop --count failed; see {logp}")
        if not described:
            raise SystemExit(f"gpu-check: the workload's --describe {self.a.preset} failed; see {logp}")
        mine = counts["layers"][str(self.full_layers)]
        for key in ("params_total", "params_flops", "model_flops_per_token"):
            if mine[key] != described.get(key):
                raise SystemExit(
                    f"gpu-check: ARCHITECTURES[{self.a.preset!r}] is not the workload's preset: "
                    f"{key} {mine[key]} here, {described.get(key)} from --describe; "
                    "update qualify/workloads/gpucheck/harness.py")
        log(f"architecture {self.a.preset} checked against the workload's preset: "
            f"{described['params_total'] / 1e9:.3f} B parameters, "
            f"{described['model_flops_per_token'] / 1e9:.2f} GFLOP/token at seq {self.a.seq_len}")
        return counts["layers"]

    # ----- runs
    def run_variant(self, variant: str, layers: int, plan: tuple[int, int, int],
                    timeout: float) -> dict[str, Any]:
        warmup, steps, repeats = plan
        name = f"{variant}-L{layers}"
        params: dict[str, Any] = {
            "model": f"{self.a.preset}-L{layers}", "model_config_path": self.write_config(layers),
            "seq_len": self.a.seq_len, "micro_batch": self.a.micro_batch, "steps": steps,
            "warmup_steps": warmup, "repeats": repeats, "dtype": "bf16", "zero_stage": 0,
            "compile": "compile" in variant,
            "activation_checkpointing": "all" if "ckpt" in variant else "none",
            "launcher": "none",
        }
        if self.a.threads:
            params["num_threads"] = self.a.threads
        # The case document of the workload protocol (version 1); its own timeout ends
        # the run with a timeout document a little before the hard kill.
        case = {"protocol": 1, "case_id": f"gpu-check/{self.a.preset}-L{layers}/{variant}",
                "kind": "train", "params": params, "env": {},
                "timeout_s": max(5, int(timeout - KILL_GRACE_S - 2))}
        case_path = os.path.join(self.out, f"{name}.case.json")
        with open(case_path, "w", encoding="utf-8") as fh:
            json.dump(case, fh, indent=1)
        log(f"{variant}: {layers} layers, {warmup} warm-up + {repeats}x{steps} steps, "
            f"timeout {timeout:.0f} s (log {name}.log)")
        rc, out, wall, timed_out = run_process(
            [self.py, "-m", "qualify.workloads.train", "--case", case_path], timeout=timeout,
            log_path=os.path.join(self.out, f"{name}.log"), env=self.env)
        doc = last_json(out)
        if doc is not None:
            with open(os.path.join(self.out, f"{name}.json"), "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=1, sort_keys=True)
        return self._summary(variant, doc, layers, plan, wall, timed_out, rc, f"{name}.json")

    def run_bare(self, layers: int, plan: tuple[int, int, int], timeout: float) -> dict[str, Any]:
        warmup, steps, repeats = plan
        name = f"bare-L{layers}"
        cmd = [self.py, "-m", "qualify.workloads.gpucheck.bare_loop",
               "--config", self.write_config(layers), "--seq-len", str(self.a.seq_len),
               "--micro-batch", str(self.a.micro_batch), "--steps", str(steps),
               "--warmup", str(warmup), "--repeats", str(repeats),
               "--precision", self.a.bare_precision,
               "--device", "cpu" if self.a.cpu_smoke else "cuda",
               "--timeout-s", str(max(5, int(timeout - KILL_GRACE_S - 2)))]
        if self.a.threads:
            cmd += ["--threads", str(self.a.threads)]
        log(f"bare loop ({self.a.bare_precision}): {layers} layers, {warmup} warm-up + "
            f"{repeats}x{steps} steps, timeout {timeout:.0f} s (log {name}.log)")
        rc, out, wall, timed_out = run_process(cmd, timeout=timeout,
                                               log_path=os.path.join(self.out, f"{name}.log"),
                                               env=self.env)
        doc = last_json(out)
        if doc is not None:
            with open(os.path.join(self.out, f"{name}.json"), "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=1, sort_keys=True)
        return self._summary("bare", doc, layers, plan, wall, timed_out, rc, f"{name}.json")

    def _summary(self, variant, doc, layers, plan, wall, timed_out, rc, doc_name) -> dict[str, Any]:
        warmup, steps, repeats = plan
        s: dict[str, Any] = {"variant": variant, "layers": layers, "seq_len": self.a.seq_len,
                             "micro_batch": self.a.micro_batch, "warmup_steps": warmup,
                             "steps": steps, "repeats": repeats, "wall_s": round(wall, 1)}
        if doc is None:
            s.update(status="error", error_class="timeout" if timed_out else "crash",
                     error=f"no result document (exit {rc}{', killed at the deadline' if timed_out else ''})")
            log(f"{variant}: {s['error_class']} after {wall:.0f} s")
            return s
        m, e = doc.get("metrics") or {}, doc.get("environment") or {}
        status = doc.get("status")
        s.update({
            "status": status, "error_class": doc.get("error_class"),
            "error": (doc.get("error") or None) and str(doc.get("error"))[:300],
            "tokens_per_s": m.get("tokens_per_s"),
            "tflops_per_gpu": m.get("tflops_per_device"),
            "mfu": m.get("mfu"),
            "model_flops_per_token": m.get("model_flops_per_token"),
            "step_time_s_median": m.get("step_time_s_median"),
            "cv_tokens_per_s": m.get("cv_tokens_per_s"),
            "peak_memory_gib": (m["peak_memory_bytes"] / 2**30 if m.get("peak_memory_bytes") else None),
            "first_step_time_s": m.get("first_step_time_s"),
            "compile_time_s": m.get("compile_time_s"),
            "checkpointed_layers": e.get("checkpointed_layers"),
            "compiled": e.get("compiled"),
            "optimizer": e.get("optimizer"),
            "peak_flops_per_gpu": e.get("peak_flops_per_device"),
            "device_name": e.get("device_name"),
            "document": doc_name,
        })
        if variant == "bare":
            s["precision"] = e.get("precision")
            for key in ("torch", "transformers", "cuda_version"):
                self.facts.setdefault(key, e.get(key))
        else:
            for key in ("torch", "deepspeed", "transformers", "cuda_version", "python"):
                if e.get(key):
                    self.facts[key] = e.get(key)
        log(f"{variant}: {status if status == 'passed' else (doc.get('error_class') or status)}"
            + (f", {s['tokens_per_s']:.1f} tokens/s" if s.get("tokens_per_s") else "")
            + f" ({wall:.0f} s)")
        return s

    # ----- planning
    def n_steps(self, plan: tuple[int, int, int]) -> int:
        return plan[0] + plan[1] * plan[2]

    def estimate(self, what: str, plan: tuple[int, int, int]) -> float:
        c = self.cost
        fixed = c["overhead_s"] * (0.8 if what == "bare" else 1.0)
        extra = 0.0
        if "compile" in what:
            extra = c.get("compile_extra_s", self.a.compile_allowance_s)
            if what == "compile+ckpt":
                extra *= 1.2
        return fixed + extra + self.n_steps(plan) * c["step_s"] * STEP_FACTOR[what]

    def plan_rest(self, todo: list[str]) -> tuple[list[str], int, dict[str, str]]:
        """Which of the runs still to make fit before the deadline, and with which plan.

        Pure: a variant left out now is only dropped for good when its turn has passed
        (a quicker run before it may still make room)."""
        rest, left_out = list(todo), {}
        while True:
            budget = self.left() - RESERVE_S
            for level in range(self.level, len(self.plans)):
                if sum(self.estimate(v, self.plans[level]) for v in rest) <= budget:
                    return rest, level, left_out
            droppable = [v for v in DROP_ORDER if v in rest]
            if not droppable:
                return rest, len(self.plans) - 1, left_out
            need = sum(self.estimate(x, self.plans[-1]) for x in rest)
            left_out[droppable[0]] = (
                f"dropped to fit the budget: the remaining runs needed about {need:.0f} s "
                f"with the shortest plan, {max(0, budget):.0f} s were left")
            rest.remove(droppable[0])

    def learn(self, s: dict[str, Any]) -> None:
        """Update the cost model from a finished DeepSpeed run: the latest run without
        compile sets the per-process overhead (the first run also paid one-off costs,
        such as DeepSpeed's op build on a CPU), a compile run sets compile's extra time."""
        if s.get("status") != "passed" or not s.get("step_time_s_median"):
            return
        step = s["step_time_s_median"] / STEP_FACTOR[s["variant"]]
        n = self.n_steps((s["warmup_steps"], s["steps"], s["repeats"]))
        spent = n * s["step_time_s_median"]
        if "compile" not in s["variant"]:
            if s["variant"] == "base":
                self.cost["step_s"] = step
            self.cost["overhead_s"] = max(1.0, s["wall_s"] - spent)
        elif s["variant"] == "compile":
            self.cost["compile_extra_s"] = max(0.0, s["wall_s"] - self.cost["overhead_s"] - spent)

    # ----- the whole check
    def base_ladder(self, counts: dict[str, Any]) -> None:
        a = self.a
        if a.layers == "auto":
            ladder = [n for n in LADDER if n <= self.full_layers]
        else:
            ladder = [int(a.layers)]
        first_plan = self.plans[self.level]
        mem = self.facts.get("memory_bytes")
        for n in ladder:
            need = counts[str(n)]["params_total"] * STATE_BYTES_PER_PARAM
            if a.layers == "auto" and mem and need > mem and n != ladder[-1]:
                why = (f"not tried: the training state alone needs at least "
                       f"{need / 2**30:.0f} GiB ({STATE_BYTES_PER_PARAM} B/parameter), the GPU has "
                       f"{mem / 2**30:.0f} GiB")
                log(f"base with {n} layers {why}")
                self.attempts.append({"layers": n, "outcome": "skipped", "detail": why})
                continue
            # Leave room for the bare loop after base (about as long as base itself).
            timeout = (self.left() - RESERVE_S) * (0.55 if n == ladder[-1] or a.layers != "auto" else 0.45)
            s = self.run_variant("base", n, first_plan, timeout)
            self.attempts.append({"layers": n, "outcome": s.get("error_class") or s["status"],
                                  "wall_s": s["wall_s"]})
            if s["status"] == "passed":
                self.layers = n
                self.results["base"] = s
                return
            if s.get("error_class") == "oom" and a.layers == "auto" and n != ladder[-1]:
                log(f"base with {n} layers ran out of memory: retrying with fewer layers")
                continue
            self.layers = n
            self.results["base"] = s
            return

    def run(self) -> int:
        a = self.a
        os.makedirs(self.out, exist_ok=True)
        self.env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        log(f"budget {a.budget_s:.0f} s (deadline {time.strftime('%H:%M:%S', time.localtime(self.deadline))}),"
            f" {self.elapsed():.0f} s spent before the driver; output {self.out}")
        self.device_facts()
        if self.left() < 60:
            self.notes.append(f"the set-up before the driver took {self.elapsed():.0f} s: "
                              "no time left to train")
            log(self.notes[-1])
            return self.finish()
        ladder = [n for n in LADDER if n <= self.full_layers] if a.layers == "auto" else [int(a.layers)]
        counts = self.check_architecture(ladder)
        # The first plan from the budget alone: nothing has been measured yet.
        self.level = 0 if a.budget_s >= 360 else (1 if a.budget_s >= 200 else len(self.plans) - 1)
        self.level = min(self.level, len(self.plans) - 1)
        self.base_ladder(counts)
        base = self.results.get("base")
        rest = [v for v in VARIANTS if v in a.variants and v != "base"]
        if base is None or base["status"] != "passed":
            why = "base did not pass" if base else "no layer count could be tried before the deadline"
            for v in rest:
                self.dropped[v] = f"not run: {why}"
            if base is not None and not a.no_bare and self.left() > RESERVE_S + 20:
                # The bare loop still tells whether the plain model trains at all.
                self.results["bare"] = self.run_bare(self.layers, self.plans[self.level],
                                                     self.left() - RESERVE_S)
            return self.finish()
        self.learn(base)
        todo = (["bare"] if not a.no_bare else []) + rest
        while todo:
            kept, level, left_out = self.plan_rest(todo)
            if not kept:
                break
            self.level = max(self.level, level)
            what = kept[0]
            todo.remove(what)
            plan = self.plans[self.level]
            # This run may use the time up to the deadline less the shortest estimate
            # of each planned run after it (so one slow run cannot starve the next,
            # unless it must).
            after = sum(self.estimate(v, self.plans[-1]) for v in kept[1:])
            timeout = self.left() - RESERVE_S - min(after, 0.5 * (self.left() - RESERVE_S))
            if timeout < 5:
                self.dropped[what] = "dropped: no time left before the deadline"
                continue
            if what == "bare":
                self.results["bare"] = self.run_bare(self.layers, plan, timeout)
            else:
                self.results[what] = self.run_variant(what, self.layers, plan, timeout)
                self.learn(self.results[what])
        for v in todo:
            self.dropped[v] = left_out.get(v, "dropped: no time left before the deadline")
            log(f"{v}: {self.dropped[v]}")
        return self.finish()

    # ----- output
    def finish(self) -> int:
        a = self.a
        base, bare = self.results.get("base"), self.results.get("bare")
        base_tps = base.get("tokens_per_s") if base else None
        bare_tps = bare.get("tokens_per_s") if bare else None
        peak = base.get("peak_flops_per_gpu") if base else None
        if bare and bare_tps and bare.get("model_flops_per_token"):
            bare["tflops_per_gpu"] = bare["model_flops_per_token"] * bare_tps / 1e12
            bare["mfu"] = bare["model_flops_per_token"] * bare_tps / peak if peak else None
            if base and base.get("model_flops_per_token") not in (None, bare["model_flops_per_token"]):
                self.notes.append("the bare loop's FLOPs per token differ from the workload's: "
                                  f"{bare['model_flops_per_token']} vs {base['model_flops_per_token']}")
        for v, s in self.results.items():
            tps = s.get("tokens_per_s")
            s["vs_base"] = tps / base_tps if tps and base_tps else None
            s["vs_bare"] = tps / bare_tps if tps and bare_tps else None
        ratio = base_tps / bare_tps if base_tps and bare_tps else None
        doc = {
            "schema": "qualify.gpu-check/1",
            "preset": a.preset, "layers": self.layers, "layers_full": self.full_layers,
            "seq_len": a.seq_len, "micro_batch": a.micro_batch, "dtype": "bf16", "zero_stage": 0,
            "cpu_smoke": bool(a.cpu_smoke),
            "device": self.facts,
            "budget_s": a.budget_s, "wall_s": round(self.elapsed(), 1),
            "plans": [dict(zip(("warmup_steps", "steps", "repeats"), p)) for p in self.plans],
            "layer_attempts": self.attempts,
            "variants": {v: s for v, s in self.results.items() if v != "bare"},
            "dropped": self.dropped,
            "bare_loop": bare,
            "bare_loop_tokens_per_s": bare_tps,
            # > 1: the harness is faster than the bare loop; < 1: its overhead.
            "harness_over_bare": ratio,
            "harness_overhead_pct": (1 - ratio) * 100 if ratio else None,
            "env": {k: self.env.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES")},
            "notes": self.notes,
        }
        with open(os.path.join(self.out, "gpu-check.json"), "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
        table = self.table(doc)
        with open(os.path.join(self.out, "gpu-check.txt"), "w", encoding="utf-8") as fh:
            fh.write(table)
        print("\n" + table, flush=True)
        ran = [s for s in self.results.values()]
        ok = bool(ran) and base is not None and all(s.get("status") == "passed" for s in ran)
        return 0 if ok else 1

    def table(self, doc: dict[str, Any]) -> str:
        def f(x, fmt):
            return "n/a" if x is None else format(x, fmt)
        lines = []
        dev = doc["device"].get("device") or "n/a"
        lines.append(f"{doc['preset']} architecture, {doc['layers']}/{doc['layers_full']} layers, "
                     f"seq {doc['seq_len']}, micro-batch {doc['micro_batch']}, bf16; device {dev}; "
                     f"torch {doc['device'].get('torch', 'n/a')}, deepspeed "
                     f"{doc['device'].get('deepspeed', 'n/a')}")
        lines.append(f"{'run':14} {'status':8} {'tokens/s':>10} {'vs bare':>8} {'vs base':>8} "
                     f"{'TFLOP/s/GPU':>11} {'MFU':>6} {'step s':>8} {'cv':>6} {'peak GiB':>8} "
                     f"{'compile s':>9} {'steps':>7} {'wall s':>6}")
        rows = [("bare", doc["bare_loop"])] if doc["bare_loop"] else []
        rows += list(doc["variants"].items())
        for name, s in rows:
            label = f"bare ({s.get('precision') or self.a.bare_precision})" if name == "bare" else name
            status = s["status"] if s["status"] == "passed" else (s.get("error_class") or s["status"])
            lines.append(
                f"{label:14} {status:8} {f(s.get('tokens_per_s'), '10.1f'):>10} "
                f"{f(s.get('vs_bare'), '.3f'):>8} {f(s.get('vs_base'), '.3f'):>8} "
                f"{f(s.get('tflops_per_gpu'), '.1f'):>11} {f(s.get('mfu'), '.3f'):>6} "
                f"{f(s.get('step_time_s_median'), '.3f'):>8} {f(s.get('cv_tokens_per_s'), '.3f'):>6} "
                f"{f(s.get('peak_memory_gib'), '.1f'):>8} {f(s.get('compile_time_s'), '.1f'):>9} "
                f"{s['repeats']}x{s['steps']:<5} {s['wall_s']:6.0f}")
        for v, why in doc["dropped"].items():
            lines.append(f"{v:14} {why}")
        for at in doc["layer_attempts"]:
            if at["outcome"] != "passed":
                lines.append(f"base with {at['layers']} layers: {at['outcome']}"
                             + (f" ({at['detail']})" if at.get("detail") else ""))
        r = doc["harness_over_bare"]
        lines.append(f"harness/bare (base tokens/s over the bare loop's, same run): {f(r, '.3f')}"
                     + (f" (overhead {doc['harness_overhead_pct']:.1f}%)" if r else ""))
        lines.append(f"wall {doc['wall_s']:.0f} s of a {doc['budget_s']:.0f} s budget"
                     + ("; CPU smoke test: figures mean nothing" if doc["cpu_smoke"] else ""))
        for n in doc["notes"]:
            lines.append(f"note: {n}")
        return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu-check.sh", description="see scripts/gpu-check.sh")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the runs")
    ap.add_argument("--preset", default=os.environ.get("GPU_CHECK_PRESET"), choices=sorted(ARCHITECTURES))
    ap.add_argument("--cpu-smoke", action="store_true", default=os.environ.get("GPU_CHECK_CPU_SMOKE") == "1")
    ap.add_argument("--layers", default=None, help="auto (OOM ladder 32, 24, 16, 8) or a count")
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--variants", default=" ".join(VARIANTS))
    ap.add_argument("--bare-precision", choices=("master", "pure"), default="master")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare-loop reference")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--compile-allowance-s", type=float, default=None,
                    help="planned extra time of the first torch.compile (default 120, smoke 40)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    smoke = a.cpu_smoke
    a.preset = a.preset or ("tiny-llama" if smoke else "llama3-8b")
    a.layers = a.layers or ("2" if smoke else "auto")
    a.seq_len = a.seq_len or (64 if smoke else 8192)
    a.steps = a.steps or (2 if smoke else 10)
    a.warmup = a.warmup if a.warmup is not None else (1 if smoke else 3)
    a.repeats = a.repeats or (1 if smoke else 3)
    if smoke and a.threads is None:
        a.threads = 1   # a shared 2-core machine: one thread is far steadier
    if a.compile_allowance_s is None:
        a.compile_allowance_s = 40.0 if smoke else 120.0
    a.variants = a.variants.split()
    unknown = [v for v in a.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    if "base" not in a.variants:
        a.variants.insert(0, "base")   # the layer count and every ratio come from base
    if not 30 <= a.budget_s <= MAX_BUDGET_S:
        ap.error(f"--budget-s must be in 30..{MAX_BUDGET_S} (one device command is at most 8 minutes)")
    if a.layers != "auto":
        try:
            if int(a.layers) < 1:
                raise ValueError
        except ValueError:
            ap.error(f"--layers: auto or a positive count, got {a.layers!r}")
    elif a.preset != "llama3-8b":
        ap.error("--layers auto is for llama3-8b (32 layers); give a count")
    if min(a.seq_len, a.micro_batch, a.steps, a.repeats) < 1 or a.warmup < 0:
        ap.error("seq-len, micro-batch, steps and repeats must be >= 1, warmup >= 0")
    if not a.out:
        cache = os.environ.get("QUALIFY_CACHE_DIR") or os.path.expanduser("~/.cache/qualify")
        a.out = os.environ.get("OUT") or os.path.join(cache, "gpu-check", time.strftime("%Y%m%d-%H%M%S"))
    a.out = os.path.abspath(a.out)
    if shutil.which(a.python) is None and not os.path.exists(a.python):
        ap.error(f"--python {a.python}: not found")
    return Check(a).run()


if __name__ == "__main__":
    sys.exit(main())
