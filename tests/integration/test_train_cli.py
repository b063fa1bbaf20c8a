"""Fast tests of the training workload's pure parts: FLOPs, params, DeepSpeed config,
launch commands, MFU table, step statistics, and the image-side import boundary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from qualify.workloads import protocol

pytestmark = [pytest.mark.workload]

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = REPO / "src" / "qualify" / "workloads"


def _describe(preset: str, seq_len: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "qualify.workloads.train", "--describe", preset,
                          "--seq-len", str(seq_len)], capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])




def test_describe_llama3_8b_matches_hand_count():
    # Meta-Llama-3-8B config.json: hidden 4096, 32 layers, 32 heads, 8 kv heads,
    # intermediate 14336, vocab 128256, untied embeddings.
    hidden, layers, heads, kv_heads, inter, vocab, seq = 4096, 32, 32, 8, 14336, 128256, 8192
    head_dim = hidden // heads
    attn = hidden * hidden * 2 + hidden * (kv_heads * head_dim) * 2   # q, o + k, v
    mlp = 3 * hidden * inter                                           # gate, up, down
    norms = 2 * hidden
    embedding = vocab * hidden
    lm_head = vocab * hidden                                           # untied: non-embedding
    non_embedding = layers * (attn + mlp + norms) + hidden + lm_head   # + final norm
    total = embedding + non_embedding
    # torchtitan: 6*N + 12*L*H*Q*T
    flops = 6 * non_embedding + 12 * layers * heads * head_dim * seq

    d = _describe("llama3-8b", seq)
    assert total == 8_030_261_248                                      # the published 8.03B
    assert d["params_total"] == total
    assert d["params_embedding"] == embedding
    assert d["params_non_embedding"] == non_embedding
    assert (d["layers"], d["heads"], d["head_dim"]) == (layers, heads, head_dim)
    assert d["model_flops_per_token"] == flops == 57_914_449_920


def test_bad_case_document_from_subprocess(tmp_path):
    case = protocol.make_case("train/bad", "train", {"model": "tiny-llama", "zero_stage": 7})
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    out = subprocess.run([sys.executable, "-m", "qualify.workloads.train", "--case", str(path)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert protocol.validate_result(doc) == []
    assert (doc["status"], doc["error_class"]) == ("error", "bad_case")
    assert "zero_stage" in doc["error"]
