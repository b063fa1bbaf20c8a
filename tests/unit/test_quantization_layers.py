"""Partial quantization never passes (issue 24.5): every linear layer the scheme should quantize, and only those,
is quantized; lm_head by its setting. The workload names the layers; the gate compares the sets."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import pytest
from support.gate import cases_of, good_results, release

from qualify.gate.checks import check_quantization_evidence
from qualify.workloads.infer import checkpoint, layer_evidence

CASE = "infer/tq/w8a8"
LAYERS = [f"model.layers.{i}.{p}" for i in range(4) for p in ("self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj")]


def _judge(evidence: dict | None) -> list:
    rel = release()
    results = good_results(rel)
    env = dict(results[CASE].environment)
    if evidence is not None:
        env[layer_evidence.KEY] = evidence
    results[CASE] = dataclasses.replace(results[CASE], environment=env, metrics={
        **results[CASE].metrics, "quantized_weights": 12, "linear_weights": 12, "quantized_share": 1.0,
        "weight_bytes_ratio": 0.3})
    return [r for r in check_quantization_evidence(cases_of(rel), results) if r.case_id == CASE]


def _evidence(quantized: list[str], expected: list[str] = LAYERS, lm_head_q: bool = False,
              quantize_lm_head: bool = False) -> dict:
    every = [(name, name in quantized) for name in LAYERS] + [("lm_head", lm_head_q)]
    return layer_evidence.evidence(every, expected, lm_head="lm_head", quantize_lm_head=quantize_lm_head)


def test_every_targeted_layer_and_no_other_passes() -> None:
    [reason] = _judge(_evidence(LAYERS))
    assert reason.status == "PASS" and "all 12" in reason.message


@pytest.mark.parametrize("left", [1, 4, 6, 11, 12])
def test_any_layer_left_in_float_fails_and_is_named(left: int) -> None:
    # the byte ratio and share figures say "all quantized": only the names tell
    [reason] = _judge(_evidence(LAYERS[left:]))
    assert reason.status == "FAIL" and f"{left} of 12 layers" in reason.message
    assert LAYERS[0] in reason.message and reason.figures["layers_left_in_float"] == sorted(LAYERS[:left])


def test_lm_head_quantized_without_its_setting_fails() -> None:
    [reason] = _judge(_evidence(LAYERS, lm_head_q=True))
    assert reason.status == "FAIL" and "lm_head" in reason.message and "quantize_lm_head" in reason.message


def test_lm_head_expected_with_its_setting() -> None:
    expected = LAYERS + ["lm_head"]
    assert _judge(_evidence(LAYERS, expected, lm_head_q=True, quantize_lm_head=True))[0].status == "PASS"
    [reason] = _judge(_evidence(LAYERS, expected, lm_head_q=False, quantize_lm_head=True))
    assert reason.status == "FAIL" and "lm_head" in reason.message


@pytest.mark.parametrize("evidence", [None, {}, {"expected": [], "quantized": []}, {"expected": "x"}])
def test_figures_without_layer_evidence_are_incomplete(evidence) -> None:
    [reason] = _judge(evidence)
    assert reason.status == "INCOMPLETE" and "per-layer evidence" in reason.message


# --------------------------------------------------------------------------- the workload side: checkpoint files


def _write(directory: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    directory.mkdir()
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


@pytest.mark.parametrize("floats", [[], ["model.layers.0.mlp.up_proj"], ["model.layers.0.mlp.up_proj",
                                                                          "model.layers.1.self_attn.q_proj"]])
def test_the_checkpoint_readback_names_each_layer(tmp_path: Path, floats: list[str]) -> None:
    names = [f"model.layers.{i}.{p}" for i in range(2) for p in ("self_attn.q_proj", "mlp.up_proj")]
    ref = {f"{n}.weight": ("F32", [8, 8], 256) for n in names}
    ref["lm_head.weight"] = ("F32", [16, 8], 512)
    ref["model.embed_tokens.weight"] = ("F32", [16, 8], 512)
    quant = {f"{n}.weight": ("F32", [8, 8], 256) if n in floats else ("I8", [8, 8], 64) for n in names}
    quant["lm_head.weight"] = ("F32", [16, 8], 512)
    _write(tmp_path / "ref", ref)
    _write(tmp_path / "q", quant)
    metrics, env = checkpoint.readback(str(tmp_path / "q"), str(tmp_path / "ref"), 8)
    ev = env[layer_evidence.KEY]
    assert ev["expected"] == sorted(names) and ev["not_quantized"] == sorted(floats + ["lm_head"])
    assert ev["quantized"] == sorted(set(names) - set(floats)) and ev["lm_head"]["quantized"] is False
    assert metrics["quantized_weights"] == len(names) - len(floats)
