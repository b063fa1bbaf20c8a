"""Case expansion: stable ids, stable order, frozen values, merged settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from qualify.manifest.cases import expand
from qualify.manifest.load import load_manifest

REPO = Path(__file__).resolve().parents[2]


def test_ids_are_stable_and_readable() -> None:
    release = load_manifest(REPO / "releases" / "training-xpu-pytorch-25.05.yaml").release
    first = expand(release)
    again = expand(load_manifest(REPO / "releases" / "training-xpu-pytorch-25.05.yaml").release)
    assert [c.case_id for c in first] == [c.case_id for c in again]
    assert [c.fingerprint() for c in first] == [c.fingerprint() for c in again]
    ids = [c.case_id for c in first]
    assert ids[:4] == ["train/llama3-8b/base", "train/llama3-8b/accl", "train/llama3-8b/compile",
                       "train/llama3-8b/compile+ckpt"]
    assert "infer/qwen3-8b/gptq-w4a16" in ids
    assert len(set(ids)) == len(ids)


def test_cases_are_frozen() -> None:
    case = expand(load_manifest(REPO / "releases" / "cpu-smoke.yaml").release)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        case.case_id = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        case.params["seq_len"] = 1  # type: ignore[index]


def test_training_variant_switches_and_env_merge() -> None:
    cases = {c.case_id: c for c in expand(load_manifest(REPO / "releases" / "training-xpu-pytorch-25.05.yaml").release)}
    ckpt = cases["train/llama3-8b/compile+ckpt"].document()
    assert ckpt["params"]["compile"] is True
    assert ckpt["params"]["activation_checkpointing"] == "all"
    assert ckpt["env"]["CHECKPOINT_OPTIMIZATION"] == "true"
    assert ckpt["params"]["deepspeed_config"]["zero_optimization"]["stage3_prefetch_bucket_size"] == "auto"
    assert ckpt["params"]["devices"] == 8
    base = cases["train/llama3-8b/base"].document()
    assert base["params"]["compile"] is False and base["env"] == {}


def test_inference_settings_merge_and_references() -> None:
    cases = {c.case_id: c for c in expand(load_manifest(REPO / "releases" / "training-xpu-pytorch-25.05.yaml").release)}
    ds = cases["infer/deepseek-r1/awq-w4a16"]
    params = ds.document()["params"]
    assert params["engine"] == "vllm"
    assert params["engine_args"]["quantization"] == "moe_wna16"
    assert params["engine_args"]["enable_prefix_caching"] is False
    assert params["engine_args"]["max_model_len"] == 65536
    assert params["model"] == "/models/DeepSeek-R1-AWQ"
    assert params["reference_model"] == "/models/DeepSeek-R1"
    assert params["min_token_agreement"] == 0.90
    assert ds.resources.gpus == 16 and ds.resources.nodes == 2
    assert cases["infer/qwen3-8b/w8a8"].document()["params"]["reference_model"] == "/models/Qwen3-8B"


def test_multi_node_training_gets_devices_per_node_not_the_total(tmp_path) -> None:
    # Issue 12: gpus is the case's total; `gpus: 16, nodes: 2` is 8 ranks per node (16 in all), not 32.
    import yaml

    from qualify.manifest.cases import devices_per_node
    from qualify.manifest import Resources

    data = yaml.safe_load((REPO / "releases" / "training-xpu-pytorch-25.05.yaml").read_text())
    data["training"]["defaults"]["resources"] = {"gpus": 16, "nodes": 2, "cpus": 64}
    path = tmp_path / "two-nodes.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    case = next(c for c in expand(load_manifest(path).release) if c.kind == "train")
    params = case.document()["params"]
    assert (params["devices"], params["nodes"]) == (8, 2)
    assert params["devices"] * params["nodes"] == case.resources.gpus
    assert devices_per_node(Resources(gpus=8)) == 8
    assert devices_per_node(Resources(gpus=0, nodes=2)) == 1
    assert devices_per_node(Resources(gpus=0.5)) == 1
