"""Fast tests of the training workload's pure parts: FLOPs, params, DeepSpeed config,
launch commands, MFU table, step statistics, and the image-side import boundary."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from qualify.workloads import protocol
from qualify.workloads.protocol import BadCase
from qualify.workloads.train.ranks import (
    choose_launcher,
    is_launched,
    launch_command,
    single_process_env,
)
from qualify.workloads.train.measure import cv, summarize
from qualify.workloads.train.mfu import (
    PEAK_FLOPS,
    lookup_peak,
    mfu,
    peak_dtype,
    peak_entry,
    resolve_peak,
)
from qualify.workloads.train.models import estimate_state_bytes, flops_per_token
from qualify.workloads.train.params import (
    deepspeed_config,
    effective_dtype,
    parse_params,
)

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = REPO / "src" / "qualify" / "workloads"






def test_describe_other_presets_and_tiny_sizes():
    from qualify.workloads.train.models import config_dict, describe

    qwen3 = describe(config_dict("qwen3-8b"), 4096)
    assert qwen3["params_total"] == 8_190_735_360 and qwen3["head_dim"] == 128   # published
    qwen25 = describe(config_dict("qwen2.5-7b"), 4096)
    assert qwen25["params_total"] == 7_615_616_512                              # published
    tiny = describe(config_dict("tiny-qwen2"), 128)
    assert 128 <= tiny["hidden_size"] <= 256 and 2 <= tiny["layers"] <= 4
    assert 1024 <= tiny["vocab_size"] <= 2048


def test_flops_formula():
    assert flops_per_token(100, 2, 4, 8, 16) == 6 * 100 + 12 * 2 * 4 * 8 * 16


@pytest.mark.parametrize("params, name", [
    ({}, "model"),
    ({"model": "gpt-17"}, "model"),
    ({"model": "tiny-llama", "seq_len": 0}, "seq_len"),
    ({"model": "tiny-llama", "seq_len": "128"}, "seq_len"),
    ({"model": "tiny-llama", "micro_batch": 1.5}, "micro_batch"),
    ({"model": "tiny-llama", "grad_accum": True}, "grad_accum"),
    ({"model": "tiny-llama", "steps": 0}, "steps"),
    ({"model": "tiny-llama", "warmup_steps": -1}, "warmup_steps"),
    ({"model": "tiny-llama", "repeats": 0}, "repeats"),
    ({"model": "tiny-llama", "zero_stage": 4}, "zero_stage"),
    ({"model": "tiny-llama", "dtype": "fp8"}, "dtype"),
    ({"model": "tiny-llama", "data": "wikitext"}, "data"),
    ({"model": "tiny-llama", "compile": "yes"}, "compile"),
    ({"model": "tiny-llama", "activation_checkpointing": "some"}, "activation_checkpointing"),
    ({"model": "tiny-llama", "activation_checkpointing": -1}, "activation_checkpointing"),
    ({"model": "tiny-llama", "num_threads": 0}, "num_threads"),
    ({"model": "tiny-llama", "peak_flops_per_device": -1.0}, "peak_flops_per_device"),
    ({"model": "tiny-llama", "memory_limit_gb": 0}, "memory_limit_gb"),
    ({"model": "tiny-llama", "launcher": "mpirun"}, "launcher"),
    ({"model": "tiny-llama", "devices": 0}, "devices"),
    ({"model": "tiny-llama", "nodes": 2, "node_rank": 2}, "node_rank"),
    ({"model": "tiny-llama", "inject": {"nan_at": 3}}, "inject"),
    ({"model": "tiny-llama", "deepspeed_config": []}, "deepspeed_config"),
    ({"model": "tiny-llama", "model_config_path": "/nonexistent/config.json"}, "model_config_path"),
    ({"model": "tiny-llama", "stepz": 3}, "stepz"),
])
def test_bad_params_name_the_param(params, name):
    with pytest.raises(BadCase, match=name):
        parse_params(params)


@pytest.mark.parametrize("value, ok", [(None, True), ("", True), ("auto", True),
                                       (5e7, False), (0, False), ("5e7", False)])
def test_release_note_prefetch_bucket_rule(value, ok):
    zero = {"stage": 3}
    if value is not None:
        zero["stage3_prefetch_bucket_size"] = value
    params = {"model": "tiny-llama", "deepspeed_config": {"zero_optimization": zero}}
    if ok:
        parse_params(params)
    else:
        with pytest.raises(BadCase, match="stage3_prefetch_bucket_size"):
            parse_params(params)


def test_deepspeed_config_merged_under_switches():
    user = {"zero_optimization": {"stage": 2, "overlap_comm": True},
            "gradient_accumulation_steps": 4, "train_batch_size": 999,
            "bf16": {"enabled": False}}
    # Switches left at their defaults do not override the user's config...
    cfg = deepspeed_config(parse_params({"model": "tiny-llama", "deepspeed_config": user}))
    assert cfg["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert cfg["gradient_accumulation_steps"] == 4
    assert cfg["train_micro_batch_size_per_gpu"] == 2
    assert "train_batch_size" not in cfg          # inconsistent, DeepSpeed derives it
    assert effective_dtype(cfg) == "fp32"
    # ...switches the case set explicitly do.
    cfg = deepspeed_config(parse_params({"model": "tiny-llama", "deepspeed_config": user,
                                         "zero_stage": 1, "grad_accum": 2, "dtype": "bf16"}))
    assert cfg["zero_optimization"]["stage"] == 1 and cfg["zero_optimization"]["overlap_comm"]
    assert cfg["gradient_accumulation_steps"] == 2
    assert effective_dtype(cfg) == "bf16"
    assert cfg["zero_allow_untested_optimizer"] is True


def test_launch_commands():
    cmd = launch_command("torchrun", devices=8, nodes=2, node_rank=1, master_addr="10.0.0.1",
                         master_port=29500, case_path="/tmp/c.json", python="py")
    assert cmd == ["py", "-m", "qualify.workloads.train.torchrun", "--nproc-per-node=8", "--nnodes=2",
                   "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=29500",
                   "-m", "qualify.workloads.train", "--case", "/tmp/c.json"]
    cmd = launch_command("deepspeed", devices=4, nodes=1, node_rank=0, master_addr="127.0.0.1",
                         master_port=1234, case_path="c.json", python="py")
    assert cmd[:3] == ["py", "-m", "deepspeed.launcher.runner"]
    assert "--num_gpus=4" in cmd and "--master_port=1234" in cmd
    assert cmd[-4:] == ["--module", "qualify.workloads.train", "--case", "c.json"]
    multi = launch_command("deepspeed", devices=8, nodes=4, node_rank=0, master_addr="h0",
                           master_port=1, case_path="c", python="py", hostfile="/etc/hosts.ds")
    assert "--hostfile=/etc/hosts.ds" in multi and "--num_nodes=4" in multi
    with pytest.raises(ValueError):
        launch_command("none", devices=1, nodes=1, node_rank=0, master_addr="a", master_port=1,
                       case_path="c")
    assert choose_launcher("auto", 1, 1) == "none"
    assert choose_launcher("auto", 2, 1) == "torchrun"
    assert choose_launcher("deepspeed", 1, 1) == "deepspeed"
    assert is_launched({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"})
    assert not is_launched({})
    env = single_process_env({"MASTER_PORT": "1"})
    assert env == {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    assert "MASTER_PORT" in single_process_env({})


def test_mfu_table():
    assert lookup_peak("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert lookup_peak("NVIDIA H200", "bf16") == 989e12
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert lookup_peak("NVIDIA H100 PCIe", "bf16") == 756e12
    assert lookup_peak("NVIDIA H20", "bf16") == 148e12
    assert ("ppu", "bf16") in PEAK_FLOPS and lookup_peak("PPU-ZW810E", "bf16") is None  # vendor figure needed
    assert lookup_peak("Intel(R) Xeon(R) Processor", "bf16") is None
    assert lookup_peak(None, "bf16") is None
    assert mfu(4.945e14, 989e12) == pytest.approx(0.5)
    assert mfu(1e12, None) is None


def test_peak_table_is_keyed_by_device_and_dtype():
    # Issue 12: fp32 was divided by the bf16 peak (understated 2-15x); NVL/PCIe parts mapped to SXM.
    assert lookup_peak("NVIDIA H100 80GB HBM3", "fp32") == 67e12
    assert lookup_peak("NVIDIA H100 80GB HBM3", "tf32") == 494.5e12
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "fp32") == 19.5e12
    assert lookup_peak("NVIDIA H200 NVL", "bf16") == 835e12
    assert lookup_peak("NVIDIA H200 NVL", "fp32") == 60e12
    assert lookup_peak("NVIDIA H800 PCIe", "bf16") == 756e12
    assert lookup_peak("NVIDIA H800", "bf16") == 989e12
    assert lookup_peak("NVIDIA H20", "fp32") == 44e12
    assert lookup_peak("NVIDIA H200", "fp8") is None           # unknown pair: no guess
    assert lookup_peak("NVIDIA GH200 480GB", "bf16") is None   # whole words only: not an "h200"
    assert peak_entry("NVIDIA H100 NVL", "bf16") == ("h100 nvl/bf16", 835e12)
    for (device, dtype), value in PEAK_FLOPS.items():
        assert value is None or 1e12 < value < 2e15, (device, dtype)   # dense, FLOP/s


def test_peak_dtype_and_source():
    class Matmul:
        allow_tf32 = False

    class FakeTorch:
        backends = type("B", (), {"cuda": type("C", (), {"matmul": Matmul})})
        precision = "highest"

        @classmethod
        def get_float32_matmul_precision(cls):
            return cls.precision

    assert peak_dtype("bf16", FakeTorch) == "bf16"
    assert peak_dtype("fp32", FakeTorch) == "fp32"
    FakeTorch.precision = "high"
    assert peak_dtype("fp32", FakeTorch) == "tf32"
    assert peak_dtype("fp32") == "fp32"
    table = resolve_peak(manifest_peak=None, device_type="cuda", device_name="NVIDIA H200 NVL", dtype="fp32")
    assert table == {"peak": 60e12, "source": "table:h200 nvl/fp32", "null_reason": None}
    given = resolve_peak(manifest_peak=5e14, device_type="cuda", device_name="NVIDIA H200", dtype="bf16")
    assert (given["peak"], given["source"]) == (5e14, "manifest")
    assert resolve_peak(manifest_peak=2e12, device_type="cpu", device_name="Xeon", dtype="bf16")["source"] \
        == "manifest"
    cpu = resolve_peak(manifest_peak=None, device_type="cpu", device_name="Xeon", dtype="bf16")
    assert cpu["peak"] is None and "peak_flops_per_device" in cpu["null_reason"]
    ppu = resolve_peak(manifest_peak=None, device_type="cuda", device_name="PPU-ZW810E", dtype="bf16")
    assert ppu["peak"] is None and "no bf16 figure for ppu" in ppu["null_reason"]
    unknown = resolve_peak(manifest_peak=None, device_type="cuda", device_name="Acme X1", dtype="bf16")
    assert "not in the peak table" in unknown["null_reason"]


def test_summarize_step_times():
    s = summarize([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]], tokens_per_step=100, world=2)
    assert s["step_time_s_median"] == 2.0
    assert s["tokens_per_s"] == 50.0 and s["tokens_per_s_per_device"] == 25.0
    assert s["_samples_tokens_per_s"] == [50.0, 50.0] and s["cv_tokens_per_s"] == 0.0
    assert s["step_time_s_p10"] == pytest.approx(1.5) and s["repeats"] == 2
    assert cv([1.0]) is None


def test_state_estimate():
    assert estimate_state_bytes(10, "bf16", 0, 1) == 160
    assert estimate_state_bytes(10, "bf16", 3, 4) == 40
    assert estimate_state_bytes(10, "fp32", 1, 2) == 40 + 40 + 40   # optimizer halved




# The image-side boundary: what may be imported by the training workload's modules.
ALLOWED_ROOTS = {"torch", "deepspeed", "transformers"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names.add("." * node.level + (node.module or ""))
            else:
                names.add(node.module or "")
    return names


def test_train_modules_import_only_stdlib_torch_deepspeed_transformers():
    files = sorted((WORKLOADS / "train").rglob("*.py"))
    assert {f.name for f in files} >= {"__main__.py", "runner.py", "models.py", "mfu.py"}
    for f in files:
        for name in _imports(f):
            root = name.split(".")[0]
            ok = (root in sys.stdlib_module_names or root in ALLOWED_ROOTS
                  or name == "__future__"
                  or name == "qualify.workloads" or name.startswith("qualify.workloads."))
            assert ok, f"{f.name} imports {name}"


def test_model_dependent_params():
    from qualify.workloads.train.params import check_against_model

    p = parse_params({"model": "tiny-llama", "activation_checkpointing": 9})
    with pytest.raises(BadCase, match="activation_checkpointing"):
        check_against_model(p, layers=4, max_positions=4096)
    p = parse_params({"model": "tiny-llama", "seq_len": 8192})
    with pytest.raises(BadCase, match="seq_len"):
        check_against_model(p, layers=4, max_positions=4096)


def test_checkpointing_first_n_layers_saves_fewer_activations():
    """Structural, allocator-free: each checkpointed layer stops keeping activations."""
    import torch

    from qualify.workloads.train import models as tm
    from qualify.workloads.train.measure import saved_activation_bytes

    config = tm.build_config(tm.config_dict("tiny-qwen3"))
    ids = torch.randint(0, config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    saved = {}
    for setting in ("none", 1, 3, "all"):
        torch.manual_seed(0)
        model = tm.build_model(config).train()
        n = tm.apply_checkpointing(model, setting)
        assert n == {"none": 0, 1: 1, 3: 3, "all": 4}[setting]
        assert [layer.gradient_checkpointing for layer in tm.decoder_layers(model)][:n] == [True] * n
        saved[setting] = saved_activation_bytes(model, ids)
    assert saved["none"] > saved[1] > saved[3] > saved["all"] > 0


# ---------------------------------------------------------------- several ranks (issue 12)

def _doc(status="passed", error_class=None, error=None, **env):
    return {"status": status, "error_class": error_class, "error": error,
            "metrics": {"tokens_per_step": 512, "repeats": 2}, "samples": {}, "probes": {},
            "environment": {"world_size": 2, "zero_stage": 0, "dtype": "bf16", "model": "tiny-llama", **env}}


def test_merge_rank_results_a_failing_rank_wins_over_what_it_caused():
    from qualify.workloads.train.ranks import merge_rank_results

    nan = _doc("failed", "nan_loss", "loss is nan at step 2", rank=1)
    crash = _doc("error", "crash", "Connection closed by peer", rank=0)
    out = merge_rank_results({0: crash, 1: nan}, expected=[0, 1], launcher_exit_code=1)
    assert (out["status"], out["error_class"]) == ("failed", "nan_loss")
    assert out["error"] == "rank 1: loss is nan at step 2 (then rank 0: crash)"
    assert out["environment"]["rank"] == 1 and out["environment"]["launcher_exit_code"] == 1
    assert out["environment"]["ranks"]["0"]["error_class"] == "crash"
    # The launcher was stopped at the case timeout: an OOM on a rank is still the class.
    timed = _doc("error", "timeout", "stopped by SIGTERM")
    out = merge_rank_results({0: timed, 1: _doc("error", "oom", "out of memory")}, expected=[0, 1],
                             launcher_exit_code=None, launcher_problem="torchrun: did not finish in 60 s")
    assert out["error_class"] == "oom"
    out = merge_rank_results({0: timed}, expected=[0, 1], launcher_exit_code=None,
                             launcher_problem="torchrun: did not finish in 60 s")
    assert out["error_class"] == "timeout"
    out = merge_rank_results({}, expected=[0, 1], launcher_exit_code=None,
                             launcher_problem="torchrun: did not finish in 60 s")
    assert (out["status"], out["error_class"]) == ("error", "timeout") and "[0, 1]" in out["error"]


def test_merge_rank_results_passes_only_when_every_rank_passed_and_the_launcher_exited_0():
    from qualify.workloads.train.ranks import merge_rank_results

    ok = {0: _doc(rank=0), 1: _doc(rank=1)}
    out = merge_rank_results(ok, expected=[0, 1], launcher_exit_code=0)
    assert out["status"] == "passed" and out["environment"]["rank"] == 0   # rank 0's figures
    bad_exit = merge_rank_results(ok, expected=[0, 1], launcher_exit_code=1)
    assert (bad_exit["status"], bad_exit["error_class"]) == ("error", "crash")
    assert "launcher exited 1" in bad_exit["error"]
    missing = merge_rank_results({0: _doc()}, expected=[0, 1], launcher_exit_code=0)
    assert missing["error_class"] == "crash" and "rank(s) [1]" in missing["error"]
    none = merge_rank_results({}, expected=[0, 1], launcher_exit_code=0)
    assert none["status"] == "error" and "no rank wrote" in none["error"]
    disagree = {0: _doc(), 1: _doc(world_size=4)}
    out = merge_rank_results(disagree, expected=[0, 1], launcher_exit_code=0)
    assert out["error_class"] == "crash" and "disagree on world_size" in out["error"]
    # Multi-node DeepSpeed runner: the other nodes' ranks are not ours to see; judge what is here.
    assert merge_rank_results({0: _doc()}, expected=None, launcher_exit_code=0)["status"] == "passed"


def test_a_rank_writes_its_document_and_exits_non_zero_when_it_did_not_pass(tmp_path):
    from qualify.workloads.train.ranks import rank_result_path, read_rank_results

    case = tmp_path / "case.json"
    case.write_text(json.dumps(protocol.make_case("train/x", "train", {})))

    def failing(case, log):
        raise protocol.WorkloadFailure("nan_loss", "loss is nan at step 0")

    path = rank_result_path(str(tmp_path), 3)
    rc = protocol.run_workload("train", failing, ["--case", str(case)], result_path=path, failure_exit_code=1)
    assert rc == 1
    rc = protocol.run_workload("train", lambda c, log: {"status": "passed"}, ["--case", str(case)],
                               result_path=rank_result_path(str(tmp_path), 0), failure_exit_code=1)
    assert rc == 0
    (tmp_path / "rank-9.json").write_text("{not json")
    docs = read_rank_results(str(tmp_path))
    assert sorted(docs) == [0, 3]
    assert docs[3]["error_class"] == "nan_loss" and docs[0]["status"] == "passed"
    # Without the options, a workload exits 0 with its document (single process, as before).
    assert protocol.run_workload("train", failing, ["--case", str(case)]) == 0


def test_nan_injection_can_name_one_rank():
    assert parse_params({"model": "tiny-llama", "inject": {"nan_at_step": 2, "rank": 1}}).inject == {
        "nan_at_step": 2, "rank": 1}
    with pytest.raises(BadCase, match="inject"):
        parse_params({"model": "tiny-llama", "inject": {"nan_at_step": 2, "node": 1}})
    with pytest.raises(BadCase, match="rank"):
        parse_params({"model": "tiny-llama", "inject": {"nan_at_step": 2, "rank": -1}})


# ---------------------------------------------------------------- evidence and memory (issue 11, 12)

def test_checkpoint_calls_are_counted_per_layer():
    import torch

    from qualify.workloads.train import models as tm

    config = tm.build_config(tm.config_dict("tiny-llama"))
    ids = torch.randint(0, config.vocab_size, (1, 16))
    for setting, expected in (("none", [0, 0, 0, 0]), (2, [1, 1, 0, 0]), ("all", [1, 1, 1, 1])):
        torch.manual_seed(0)
        model = tm.build_model(config).train()
        tm.apply_checkpointing(model, setting)
        counter = tm.count_checkpoint_calls(model, "cpu")
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        assert counter.tolist() == expected, setting
    # An attribute that says "on" proves nothing: in eval mode no layer checkpoints.
    model.eval()
    counter = tm.count_checkpoint_calls(model, "cpu")
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    assert counter.tolist() == [0, 0, 0, 0]


def test_peak_memory_resets_after_warm_up_on_cpu():
    import torch

    from qualify.workloads.train.measure import PeakMemory

    memory = PeakMemory(torch.device("cpu"))
    big = bytearray(256 * 2**20)                 # a set-up peak
    big[::4096] = b"x" * len(big[::4096])         # touch every page
    del big
    setup = memory.peak()
    assert memory.reset() is True                # /proc/self/clear_refs on Linux
    assert memory.peak() < setup - 200 * 2**20   # the training peak starts from here
    assert memory.describe().startswith("VmHWM")


def test_a_stale_op_build_lock_is_removed_and_a_fresh_one_kept(tmp_path) -> None:
    """torch's FileBaton waits without limit on a lock a killed build left: every later launch hung (seen)."""
    import os

    from qualify.workloads.train.env import STALE_BUILD_LOCK_S, clear_stale_build_locks

    stale, fresh = tmp_path / "deepspeed_shm_comm", tmp_path / "other_op"
    for folder in (stale, fresh):
        folder.mkdir()
        (folder / "lock").write_text("")
    now = 10_000.0
    os.utime(stale / "lock", (now - STALE_BUILD_LOCK_S - 1, now - STALE_BUILD_LOCK_S - 1))
    os.utime(fresh / "lock", (now - 60, now - 60))  # a build running now: never touched
    assert clear_stale_build_locks(str(tmp_path), now=now) == [str(stale / "lock")]
    assert not (stale / "lock").exists() and (fresh / "lock").exists()
    assert clear_stale_build_locks(str(tmp_path / "missing"), now=now) == []


def test_inductor_precompiled_headers_go_to_the_compile_cache_not_the_launch_scratch(tmp_path, monkeypatch) -> None:
    """Each launch has its own TMPDIR; inductor's precompiled headers under it were rebuilt (150 MB, ~4 s) by
    every compile launch. They belong in the compile cache that every launch shares."""
    from torch._inductor import codecache

    from qualify.workloads.train.env import share_precompiled_headers

    monkeypatch.setattr(codecache, "_HEADER_DIR", codecache._HEADER_DIR)  # restored after the test
    monkeypatch.setattr(codecache, "_HEADER_LOCK_DIR", codecache._HEADER_LOCK_DIR)
    assert share_precompiled_headers(None) is None
    folder = share_precompiled_headers(str(tmp_path))
    assert folder == str(tmp_path / "precompiled_headers") == codecache._HEADER_DIR
    assert codecache._HEADER_LOCK_DIR == str(tmp_path / "precompiled_headers" / "locks")
