"""The GPU check's scripts without a GPU (issue 17).

- scripts/gpu-wheelhouse.sh makes a wheelhouse under the 64 MiB carry limit that
  resolves for CPython 3.12 with no index (machine-provided torch and numpy as
  stand-ins), fails on a missing wheel, and really installs into a fresh Python 3.12
  where one exists here.
- scripts/gpu-check.sh --cpu-smoke --wheelhouse DIR, run by a "machine" Python that has
  torch and transformers but not deepspeed, hjson or pydantic (as the GPU machine),
  installs those from the wheelhouse with no index reachable and reports every variant
  and the bare-loop ratio.

Needs PyPI once to fill the wheelhouse (cached under $QUALIFY_CACHE_DIR/gpu-check-test).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.workload]

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE_SH = REPO / "scripts" / "gpu-wheelhouse.sh"
GPU_CHECK_SH = REPO / "scripts" / "gpu-check.sh"
LIMIT = 64 * 2**20
HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"
# What the GPU machine's python3 lacks (MACHINE-NOTES): the wheelhouse must bring these.
LACKING = ("deepspeed", "hjson", "pydantic", "pydantic_core", "annotated_types", "typing_inspection")
VARIANTS = ("base", "ckpt", "compile", "compile+ckpt")


def _cache() -> Path:
    base = Path(os.environ.get("QUALIFY_CACHE_DIR") or Path.home() / ".cache" / "qualify")
    return base / "gpu-check-test"


def _pin(name: str) -> str:
    text = (REPO / "constraints.txt").read_text()
    return re.search(rf"^{name}==(\S+)", text, re.M).group(1)


def _wheels(folder: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in folder.glob("*.whl"):
        out.setdefault(p.name.split("-")[0].lower(), []).append(p.name)
    return out


@pytest.fixture(scope="module")
def wheelhouse() -> tuple[Path, str]:
    folder = _cache() / "wheelhouse"
    versions = ["3.12"] + ([HERE] if HERE != "3.12" else [])
    args = ["bash", str(WHEELHOUSE_SH), str(folder)]
    for v in versions:
        args += ["--python-version", v]
    r = subprocess.run(args, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, f"gpu-wheelhouse.sh failed:\n{r.stdout}\n{r.stderr}"
    return folder, r.stdout


def test_wheelhouse_is_complete_small_and_resolves_for_312(wheelhouse):
    folder, out = wheelhouse
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    assert size < LIMIT, f"{size} bytes: over the device tool's 64 MiB carry limit"
    assert re.search(r"is \d+ bytes", out)  # the script prints its size
    assert "CPython 3.12: resolves with no index" in out
    assert "provided by the machine: numpy, torch" in out
    wheels = _wheels(folder)
    assert wheels["deepspeed"] == [f"deepspeed-{_pin('deepspeed')}-py3-none-any.whl"]
    assert wheels["pydantic"] == [f"pydantic-{_pin('pydantic')}-py3-none-any.whl"]
    assert any("-cp312-cp312-manylinux" in w for w in wheels["pydantic_core"])
    for name in LACKING + ("typing_extensions", "pip"):
        assert name in wheels, f"no {name} wheel in {folder}"
    # The machine's own heavy packages are never carried.
    assert not {"torch", "numpy", "transformers", "triton"} & set(wheels)
    reqs = (folder / "requirements.txt").read_text()
    assert f"deepspeed=={_pin('deepspeed')}" in reqs


@pytest.mark.parametrize("remove", ["hjson-*.whl", "pydantic_core-*cp312*.whl", "typing_inspection-*.whl"])
def test_wheelhouse_check_fails_on_a_missing_wheel(wheelhouse, tmp_path, remove):
    folder, _ = wheelhouse
    broken = tmp_path / "wh"
    shutil.copytree(folder, broken)
    gone = list(broken.glob(remove))
    assert gone
    for p in gone:
        p.unlink()
    r = subprocess.run(["bash", str(WHEELHOUSE_SH), str(broken), "--check"], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode != 0
    assert "does not resolve for CPython 3.12" in r.stderr
    dist = remove.split("-")[0].replace("_", "-")
    assert dist in r.stderr.replace("_", "-")


def _python312() -> str | None:
    candidates = [os.environ.get("QUALIFY_TEST_PYTHON312"), shutil.which("python3.12")]
    candidates += sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.12*/bin/python3.12")))
    for c in candidates:
        if not c:
            continue
        try:
            r = subprocess.run([c, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                               capture_output=True, timeout=60)
        except OSError:
            continue
        if r.returncode == 0:
            return c
    return None


def _stand_ins(folder: Path) -> Path:
    """Metadata-only wheels for what the GPU machine provides (torch, numpy)."""
    folder.mkdir()
    for name, version in (("torch", "2.11.0"), ("numpy", "2.0.0")):
        info = f"{name}-{version}.dist-info"
        with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
            z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
            z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            z.writestr(f"{info}/RECORD", "")
    return folder


def test_wheelhouse_installs_into_a_fresh_python312_with_no_index(wheelhouse, tmp_path):
    py312 = _python312()
    if py312 is None:
        pytest.skip("no Python 3.12 here: the dry resolution for 3.12 above is the proof")
    folder, _ = wheelhouse
    venv = tmp_path / "py312"
    subprocess.run([py312, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    pip = next(folder.glob("pip-*.whl"))
    env = {**os.environ, "PIP_NO_INDEX": "1", "https_proxy": "http://127.0.0.1:9",
           "http_proxy": "http://127.0.0.1:9"}
    env.pop("PYTHONPATH", None)
    r = subprocess.run([str(venv / "bin/python"), f"{pip}/pip", "--isolated", "install", "--no-index",
                        "--find-links", str(folder), "--find-links", str(_stand_ins(tmp_path / "stubs")),
                        "-r", str(folder / "requirements.txt")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    probe = ("import importlib.metadata as m, hjson, pydantic, pydantic_core, annotated_types, "
             "typing_inspection, msgpack, psutil, cpuinfo, einops, tqdm, packaging; "
             "print(m.version('deepspeed'), pydantic.VERSION, pydantic_core.__version__)")
    r = subprocess.run([str(venv / "bin/python"), "-c", probe], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == [_pin("deepspeed"), _pin("pydantic")]


def _machine_python(root: Path) -> Path:
    """A Python like the GPU machine's: torch and transformers (this venv's), and no
    deepspeed, hjson or pydantic (nor their own dependencies)."""
    farm = root / "provided"
    farm.mkdir(parents=True)
    site = Path(metadata.distribution("torch").locate_file(""))
    hidden: set[str] = set()
    for dist in ("deepspeed", "hjson", "pydantic", "pydantic_core", "annotated_types",
                 "typing_inspection"):
        d = metadata.distribution(dist)
        for f in d.files or []:
            top = f.parts[0]
            if top != "..":
                hidden.add(top)
    for entry in site.iterdir():
        if entry.name not in hidden and not entry.name.endswith(".pth"):
            (farm / entry.name).symlink_to(entry)
    venv = root / "machine"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    purelib = subprocess.run([str(venv / "bin/python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "provided.pth").write_text(f"{farm}\n")
    return venv / "bin/python"


# Alone: the check plans its variants against its own deadline (at most 8 minutes), and on a fresh machine its
# first run builds DeepSpeed's CPU shm op and compiles cold. Beside the other test worker and the image builds
# (fresh CI, an AMD EPYC without AVX-512) the op build took 150 s, the compile variant hit its timeout and the
# last variant was dropped: the test failed on how busy the machine was, not on the script.
@pytest.mark.alone
def test_cpu_smoke_installs_from_the_wheelhouse_with_no_index(wheelhouse, tmp_path):
    folder, _ = wheelhouse
    # A fixed path, made anew each run: under tmp_path (a new path each run) the compile variants compiled cold on
    # every run (13-21 s each, warm caches, quiet), at a fixed path they hit torch.compile's cache (2.7 s): what it
    # traces (transformers) lives in the machine's farm, and the cache does not carry across source paths.
    root = _cache() / "machine-python"
    shutil.rmtree(root, ignore_errors=True)
    machine = _machine_python(root)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    check = subprocess.run([str(machine), "-c", "import torch, transformers; import deepspeed"],
                           capture_output=True, text=True, env=env)
    assert check.returncode != 0 and "deepspeed" in check.stderr, "the machine Python must lack deepspeed"
    cache = _cache()
    site = cache / "site"   # a fixed path: DeepSpeed's JIT op build is cached per source path
    shutil.rmtree(site, ignore_errors=True)
    out = tmp_path / "out"
    env.update({
        "PYTHON": str(machine), "GPU_CHECK_SITE": str(site), "PIP_NO_INDEX": "1",
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "https_proxy": "http://127.0.0.1:9",
        "http_proxy": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1",
        "TORCH_EXTENSIONS_DIR": str(cache / "torch_extensions"),
    })
    r = subprocess.run(["bash", str(GPU_CHECK_SH), "--wheelhouse", str(folder), "--cpu-smoke",
                        "--out", str(out), "--budget-s", "480"],
                       capture_output=True, text=True, timeout=600, env=env)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-6000:]
    assert "Looking in indexes" not in text
    installed = re.search(r"installing from .* \(no index\): (.*)", r.stdout)
    assert installed, r.stdout[-3000:]
    for name in ("deepspeed", "hjson", "pydantic-", "pydantic_core", "annotated_types",
                 "typing_inspection"):
        assert name in installed.group(1)
    assert (site / "deepspeed").is_dir() and (site / "pydantic_core").is_dir()
    assert not (site / "torch").exists()      # provided by the machine, never installed
    # Each installed file has its wheel's time, not the install's: a reinstall of the same wheel leaves DeepSpeed's
    # JIT ops built (ninja rebuilds what is older than its sources).
    wheel = next(folder.glob("deepspeed-*.whl"))
    for installed in (site / "deepspeed" / "__init__.py", site / "deepspeed" / "ops" / "csrc" / "cpu" / "comm" / "shm.cpp"):
        assert installed.stat().st_mtime_ns == wheel.stat().st_mtime_ns, installed

    doc = json.loads((out / "gpu-check.json").read_text())
    assert doc["cpu_smoke"] is True and doc["layers"] == 2 and doc["seq_len"] == 64
    assert doc["dropped"] == {}
    for v in VARIANTS:
        s = doc["variants"][v]
        assert s["status"] == "passed", s
        assert s["tokens_per_s"] > 0 and s["layers"] == 2 and s["micro_batch"] == 1
        assert s["tflops_per_gpu"] > 0 and s["mfu"] is None   # a CPU has no peak
    assert doc["variants"]["compile"]["compiled"] is True
    assert doc["variants"]["ckpt"]["checkpointed_layers"] == 2
    bare = doc["bare_loop"]
    assert bare["status"] == "passed" and bare["tokens_per_s"] > 0
    assert bare["model_flops_per_token"] == doc["variants"]["base"]["model_flops_per_token"]
    assert doc["harness_over_bare"] == pytest.approx(
        doc["variants"]["base"]["tokens_per_s"] / bare["tokens_per_s"])
    assert doc["device"]["deepspeed"] == _pin("deepspeed")
    assert doc["wall_s"] <= 480
    table = (out / "gpu-check.txt").read_text()
    for v in ("bare (master)",) + VARIANTS:
        assert v in table
    assert "harness/bare" in table


def test_budget_is_capped_at_eight_minutes():
    r = subprocess.run([sys.executable, "-m", "qualify.workloads.gpucheck", "--cpu-smoke",
                        "--budget-s", "600", "--out", "/nonexistent"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--budget-s must be in 30..480" in r.stderr


# --------------------------------------------------------------------------- the planner

def _driver():
    from qualify.workloads.gpucheck import harness

    return harness


# A GPU-like run of llama3-8b at seq 8192 on a 141 GB device (made-up but plausible costs):
# (fixed s, step s) per run; 24 layers runs out of memory after 40 s.
_COSTS = {"base": (33.0, 0.65), "bare": (25.0, 0.6), "ckpt": (35.0, 0.85),
          "compile": (130.0, 0.55), "compile+ckpt": (150.0, 0.75)}
_PARAMS = {"32": 8_030_261_248, "24": 6_285_430_784, "16": 4_540_600_320, "8": 2_795_769_856}


def _simulate(monkeypatch, tmp_path, budget: float, preamble: float = 40.0):
    drv = _driver()
    clock = {"now": 1_000_000.0}
    monkeypatch.setattr(drv.time, "time", lambda: clock["now"])
    monkeypatch.setenv("GPU_CHECK_T0", str(clock["now"]))
    clock["now"] += preamble
    runs: list[tuple[str, int, tuple, float]] = []

    def facts(self):
        self.facts.update(device="NVIDIA H200", memory_bytes=141 * 10**9)

    def arch(self, ladder):
        clock["now"] += 10
        return {k: {"params_total": v, "model_flops_per_token": 0} for k, v in _PARAMS.items()}

    def fake(self, variant, layers, plan, timeout):
        runs.append((variant, layers, plan, timeout))
        fixed, step = _COSTS[variant]
        n = plan[0] + plan[1] * plan[2]
        cost, doc = fixed + n * step, None
        if variant == "base" and layers > 16:
            cost, doc = 40.0, {"status": "error", "error_class": "oom", "error": "CUDA out of memory"}
        if cost > timeout:
            clock["now"] += timeout + drv.KILL_GRACE_S
            return self._summary(variant, None, layers, plan, timeout, True, -15, "x.json")
        clock["now"] += cost
        doc = doc or {"status": "passed", "metrics": {
            "tokens_per_s": 8192 / step, "step_time_s_median": step, "tflops_per_device": 400.0,
            "mfu": 0.4, "model_flops_per_token": 10**10}, "environment": {"precision": "master"}}
        return self._summary(variant, doc, layers, plan, cost, False, 0, "x.json")

    monkeypatch.setattr(drv.Check, "device_facts", facts)
    monkeypatch.setattr(drv.Check, "check_architecture", arch)
    monkeypatch.setattr(drv.Check, "run_variant", fake)
    monkeypatch.setattr(drv.Check, "run_bare", lambda self, layers, plan, timeout: fake(self, "bare", layers, plan, timeout))
    rc = drv.main(["--python", sys.executable, "--budget-s", str(budget), "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "gpu-check.json").read_text())
    return rc, doc, runs


def test_planner_full_budget_runs_the_ladder_then_fits_what_it_can(monkeypatch, tmp_path):
    rc, doc, runs = _simulate(monkeypatch, tmp_path, 420)
    assert [(v, n) for v, n, _, _ in runs][:3] == [("base", 24), ("base", 16), ("bare", 16)]
    assert doc["layer_attempts"][0] == {"layers": 32, "outcome": "skipped", "detail": pytest.approx(
        doc["layer_attempts"][0]["detail"])}   # 32 layers: state alone > 141 GB, never tried
    assert doc["layer_attempts"][1]["outcome"] == "oom" and doc["layers"] == 16
    assert doc["wall_s"] <= 420
    assert doc["harness_over_bare"] == pytest.approx(0.6 / 0.65)
    # Whatever was dropped went in the stated order, and base and bare always ran.
    dropped = list(doc["dropped"])
    assert dropped == [v for v in ("compile+ckpt", "compile", "ckpt") if v in dropped][:len(dropped)]
    assert set(doc["variants"]) | set(dropped) == {"base", "ckpt", "compile", "compile+ckpt"}
    assert doc["bare_loop"]["status"] == "passed"


@pytest.mark.parametrize("budget", [200, 240, 300, 360, 480])
def test_planner_never_passes_the_deadline(monkeypatch, tmp_path, budget):
    rc, doc, runs = _simulate(monkeypatch, tmp_path, budget)
    assert doc["wall_s"] <= budget
    assert doc["variants"]["base"]["status"] == "passed"
    assert doc["bare_loop"] is not None
    order = ("compile+ckpt", "compile", "ckpt")
    dropped = [v for v in order if v in doc["dropped"]]
    # compile is dropped before ckpt, compile+ckpt before compile
    assert dropped == list(order[:len(dropped)]), doc["dropped"]
    plans = [p for _, _, p, _ in runs]
    assert all(plans[i + 1][1] <= plans[i][1] for i in range(len(plans) - 1))  # steps only shrink
