"""`qualify validate`: good manifests pass; every class of bad input exits 2 naming the field."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from qualify.cli import app
from qualify.manifest.load import ManifestError, load_manifest

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "releases" / "cpu-smoke.yaml"
XPU = REPO / "releases" / "training-xpu-pytorch-25.05.yaml"

runner = CliRunner()


def smoke() -> dict[str, Any]:
    return yaml.safe_load(SMOKE.read_text())


def xpu() -> dict[str, Any]:
    return yaml.safe_load(XPU.read_text())


def write(tmp_path: Path, data: dict[str, Any] | str, name: str = "m.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def validate(path: Path):
    return runner.invoke(app, ["validate", str(path)])


def assert_bad(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output, f"{fragment!r} not in:\n{result.output}"


def test_shipped_manifests_validate() -> None:
    result = runner.invoke(app, ["validate", str(SMOKE), str(XPU)])
    assert result.exit_code == 0, result.output
    assert "4 training cases, 4 inference cases" in result.output
    assert "36 components, 12 training cases, 12 inference cases" in result.output
    assert "acs-registry-vpc.cn-beijing.cr.aliyuncs.com/egslingjun/training-xpu-pytorch:25.05" in result.output


def test_release_note_is_expressed() -> None:
    release = load_manifest(XPU).release
    names = {c.name for c in release.components}
    for required in ("ubuntu", "python", "torch", "cuda", "accl-p", "triton", "transformer-engine", "deepspeed",
                     "flash-attn", "transformers", "megatron-core", "vllm", "ray", "driver", "ffmpeg"):
        assert required in names
    torch = next(c for c in release.components if c.name == "torch")
    assert (torch.expected, torch.match) == ("2.6.0+ppu1.5.1", "public")
    assert {v.name for v in release.training.variants} == {"base", "accl", "compile", "compile+ckpt"}
    schemes = {s.scheme for m in release.inference.models for s in m.schemes}
    assert schemes == {"none", "w8a8", "awq-w4a16", "gptq-w4a16", "gptq-w8a16"}
    assert len(release.expanded_targets()) == 6


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    path = write(tmp_path, "release:\n  name: x\n  tag: [unclosed\n")
    assert_bad(validate(path), str(path), "line ", "YAML syntax error")


def test_duplicate_yaml_key(tmp_path: Path) -> None:
    text = SMOKE.read_text().replace("build:\n  builder: local\n", "build:\n  builder: local\n  builder: local\n")
    assert_bad(validate(write(tmp_path, text)), "duplicate key 'builder'")


def test_unknown_key_suggests_near_name(tmp_path: Path) -> None:
    data = smoke()
    data["training"]["variants"][2]["compiel"] = data["training"]["variants"][2].pop("compile")
    assert_bad(validate(write(tmp_path, data)), "training.variants[2].compiel", "did you mean 'compile'")


def test_wrong_type(tmp_path: Path) -> None:
    data = smoke()
    data["training"]["defaults"]["seq_len"] = "long"
    assert_bad(validate(write(tmp_path, data)), "training.defaults.seq_len", "integer")


def test_empty_matrix(tmp_path: Path) -> None:
    data = smoke()
    del data["training"], data["inference"]
    assert_bad(validate(write(tmp_path, data)), "test matrix is empty")
    data = smoke()
    data["training"]["models"] = []
    assert_bad(validate(write(tmp_path, data)), "training.models", "at least 1")


def test_duplicate_model_and_variant_names(tmp_path: Path) -> None:
    data = smoke()
    data["training"]["variants"].append({"name": "base"})
    assert_bad(validate(write(tmp_path, data)), "training", "duplicate variants name 'base'")
    data = smoke()
    data["inference"]["models"].append(copy.deepcopy(data["inference"]["models"][0]))
    assert_bad(validate(write(tmp_path, data)), "inference", "duplicate models name 'tiny-qwen3'")


def test_unknown_scheme(tmp_path: Path) -> None:
    data = smoke()
    data["inference"]["models"][0]["schemes"][1]["scheme"] = "w3a7"
    assert_bad(validate(write(tmp_path, data)), "inference.models[0].schemes[1].scheme", "'w3a7'")


def test_scheme_engine_cannot_run(tmp_path: Path) -> None:
    data = smoke()
    data["inference"]["models"][0]["schemes"].append({"scheme": "gptq-w4a16"})
    assert_bad(validate(write(tmp_path, data)), "inference.models[0].schemes[4].scheme",
               "cannot run on engine 'transformers'")


def test_cpu_vllm_release_is_valid_and_its_refusals_say_why(tmp_path: Path, monkeypatch) -> None:
    from qualify.manifest import load as manifest_load

    data = yaml.safe_load((REPO / "releases" / "cpu-vllm.yaml").read_text())
    data["build"]["containerfile"] = str(REPO / "images" / "vllm-cpu" / "Containerfile")
    data["build"]["context"] = str(REPO / "images" / "vllm-cpu")
    assert validate(write(tmp_path, data)).exit_code == 0
    # 8-bit weight-only on the CPU engine: refused on every CPU, with the engine's reason.
    bad = copy.deepcopy(data)
    bad["inference"]["models"][0]["schemes"].append({"scheme": "gptq-w8a16"})
    assert_bad(validate(write(tmp_path, bad)), "inference.models[0].schemes[2].scheme", "uint8b128",
               "CPU vllm engine")
    # W4A16 needs vllm-cpu's AVX-512 build: refused on an AVX2 CPU, accepted on an AVX-512 one.
    w4 = copy.deepcopy(data)
    w4["inference"]["models"][0]["schemes"] += [{"scheme": "gptq-w4a16"}, {"scheme": "awq-w4a16"}]
    monkeypatch.setattr(manifest_load, "cpu_flags", lambda: frozenset({"avx2"}))
    assert_bad(validate(write(tmp_path, w4)), "inference.models[0].schemes[3].scheme", "cpu_gemm_wna16", "avx512f")
    monkeypatch.setattr(manifest_load, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert validate(write(tmp_path, w4)).exit_code == 0
    # On GPUs (a case with gpus) the CPU engine's limits do not apply.
    w4["inference"]["defaults"]["resources"] = {"cpus": 1, "gpus": 1}
    monkeypatch.setattr(manifest_load, "cpu_flags", lambda: frozenset({"avx2"}))
    assert validate(write(tmp_path, w4)).exit_code == 0


def test_stage3_prefetch_bucket_rule(tmp_path: Path) -> None:
    data = xpu()
    data["training"]["defaults"]["deepspeed_config"]["zero_optimization"]["stage3_prefetch_bucket_size"] = 50000000
    assert_bad(validate(write(tmp_path, data)), "training.defaults.deepspeed_config",
               "stage3_prefetch_bucket_size", "empty or 'auto'")


def _deepseek_long(data: dict[str, Any]) -> dict[str, Any]:
    ds = next(m for m in data["inference"]["models"] if m["name"] == "deepseek-r1")
    ds["settings"]["engine_args"]["max_model_len"] = 131072
    return data


def test_deepseek_max_model_len_rule(tmp_path: Path) -> None:
    assert_bad(validate(write(tmp_path, _deepseek_long(xpu()))),
               "inference.models[2].schemes[0].settings.engine_args.max_model_len", "below 80000")


def test_deepseek_max_model_len_waived(tmp_path: Path) -> None:
    data = _deepseek_long(xpu())
    data["gate"]["waivers"].append({"id": "KI-ds-len", "cases": "infer/deepseek-r1/*",
                                    "check": "max_model_len_limit", "reason": "tested on 141 GiB devices",
                                    "expires": (dt.date.today() + dt.timedelta(days=30)).isoformat()})
    assert validate(write(tmp_path, data)).exit_code == 0


def test_moe_prequantized_needs_moe_wna16(tmp_path: Path) -> None:
    data = xpu()
    scheme = data["inference"]["models"][1]["schemes"][2]
    del scheme["settings"]
    assert_bad(validate(write(tmp_path, data)), "inference.models[1].schemes[2].settings.engine_args.quantization",
               "moe_wna16")


def test_expired_waiver(tmp_path: Path) -> None:
    data = xpu()
    data["gate"]["waivers"][0]["expires"] = "2020-01-01"
    assert_bad(validate(write(tmp_path, data)), "gate.waivers[0].expires", "expired on 2020-01-01")


def test_invalid_promotion_target(tmp_path: Path) -> None:
    data = xpu()
    data["promotion"]["targets"][0]["reference"] = "Registry.Example.com/UPPER/case:25.05"
    assert_bad(validate(write(tmp_path, data)), "promotion.targets[0].reference", "not a valid image reference")
    data = xpu()
    data["promotion"]["targets"][1]["template"] = "acs-registry-vpc.{region-id}.cr.aliyuncs.com/Bad Name/{image:tag}"
    assert_bad(validate(write(tmp_path, data)), "promotion.targets[1]", "vpc-cn-beijing")


def test_unknown_metric_and_variant_in_policy(tmp_path: Path) -> None:
    data = smoke()
    data["gate"]["thresholds"][0]["metric"] = "tokens_per_sec"
    data["gate"]["variant_gains"][0]["variant"] = "compiled"
    assert_bad(validate(write(tmp_path, data)), "gate.thresholds[0].metric", "did you mean 'tokens_per_s'",
               "gate.variant_gains[0].variant", "did you mean 'compile'")


def test_missing_file_and_non_mapping(tmp_path: Path) -> None:
    assert_bad(validate(tmp_path / "nope.yaml"), "nope.yaml", "cannot read file")
    assert_bad(validate(write(tmp_path, "- a\n- b\n")), "must be a YAML mapping")


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    data = smoke()
    data["training"]["defaults"]["seq_len"] = -1
    data["inference"]["defaults"]["num_prompts"] = "many"
    result = validate(write(tmp_path, data))
    assert_bad(result, "training.defaults.seq_len", "inference.defaults.num_prompts")


def test_load_error_lists_problems(tmp_path: Path) -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest(write(tmp_path, {"release": {"name": "x"}}))
    fields = {p.field for p in info.value.problems}
    assert {"release.repository", "release.tag", "release.candidate_tag"} <= fields


# ---------------------------------------------------------------- one source of truth with the workloads


def test_engines_schemes_and_probes_come_from_the_inference_workload() -> None:
    from qualify.manifest import model as manifest
    from qualify.workloads.infer import engines, params

    assert manifest.Scheme.__args__ == params.SCHEMES
    assert manifest.Engine.__args__ == params.ENGINES == tuple(engines.ENGINES)
    assert manifest.Probe.__args__ == params.PROBES
    assert manifest.ENGINE_SCHEMES is params.ENGINE_SCHEMES
    assert set(params.ENGINE_SCHEMES) == set(engines.ENGINES)  # every registered engine has a scheme list
    # What the manifest lets an engine run, the workload accepts.
    for engine, schemes in params.ENGINE_SCHEMES.items():
        for scheme in schemes:
            assert params.parse_params({"engine": engine, "model": "m", "scheme": scheme}).scheme == scheme


@pytest.mark.parametrize("bucket", [None, "", "auto", 5e7, 0, "5e7", [1]])
def test_prefetch_bucket_rule_is_the_workloads(bucket: Any) -> None:
    from pydantic import ValidationError

    from qualify.manifest import TrainSettings
    from qualify.workloads.protocol import BadCase
    from qualify.workloads.train.params import parse_params

    ds = {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": bucket}}
    try:
        parse_params({"model": "tiny-llama", "deepspeed_config": ds})
        workload_error = None
    except BadCase as exc:
        workload_error = str(exc)
    try:
        TrainSettings(deepspeed_config=ds)
        manifest_error = None
    except ValidationError as exc:
        manifest_error = exc.errors()[0]["msg"]
    assert (workload_error is None) == (manifest_error is None) == (bucket in (None, "", "auto"))
    if workload_error:
        assert manifest_error == f"Value error, {workload_error.removeprefix('param deepspeed_config: ')}"
