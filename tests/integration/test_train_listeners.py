"""A lone training process opens no port beyond loopback (DESIGN: anything qualify starts
listens on 127.0.0.1). It used to: env:// made rank 0 start a TCPStore on the wildcard address
for a world of one. Multi-rank launches are covered by tests/integration/test_multinode.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support.listeners import ListenerSampler, environ_has

from qualify.workloads import protocol

pytestmark = [pytest.mark.workload, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_single_process_training_listens_on_nothing_wide(tmp_path: Path) -> None:
    if subprocess.run(["which", "ss"], capture_output=True).returncode != 0:
        pytest.skip("ss (iproute2) is not installed: cannot list listening sockets")
    mark = uuid.uuid4().hex
    case = protocol.make_case("train/lone", "train", {"model": "tiny-llama", "seq_len": 64, "steps": 2,
                                                      "warmup_steps": 1, "repeats": 1, "num_threads": 1})
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    env.update(QUALIFY_TEST_MARK=mark, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"),
                                                                                env.get("PYTHONPATH")])))
    with ListenerSampler(lambda pid: environ_has(pid, "QUALIFY_TEST_MARK", mark), every_s=0.2) as sampler:
        out = subprocess.run([sys.executable, "-m", "qualify.workloads.train", "--case", str(path)],
                             capture_output=True, text=True, timeout=400, cwd=REPO, env=env)
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["status"] == "passed", (doc["error"], out.stderr[-2000:])
    assert doc["environment"]["world_size"] == 1
    assert sampler.wide() == {}, f"a lone training process listens beyond loopback: {sampler.wide()}"
