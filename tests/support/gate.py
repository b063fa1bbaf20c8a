"""Shared builders for the gate, promotion and CLI tests (no tests here).

A small release: training tiny x {base, compile}, inference tq x {none, w8a8} (4 cases),
two components (torch required, apex optional), and a gate policy each test adjusts.
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import numpy as np
import yaml

from qualify.manifest import fingerprint
from qualify.manifest.cases import Case, expand
from qualify.gate.checks import ComponentData, ResultData
from qualify.manifest import ReleaseManifest
from qualify.manifest.load import load_manifest_text
from qualify.workloads.protocol import make_result

TODAY = dt.date(2025, 6, 1)

BASE_MANIFEST: dict[str, Any] = {
    "apiVersion": "qualify/v1",
    "release": {"name": "demo", "repository": "127.0.0.1:5000/qualify/demo", "tag": "1.1",
                "candidate_tag": "1.1-rc1", "previous_tag": "1.0"},
    "build": {"builder": "buildah", "containerfile": "Containerfile"},
    "components": [{"name": "torch", "expected": "2.13.0"},
                   {"name": "apex", "expected": "0.1", "optional": True}],
    "training": {"models": [{"name": "tiny"}],
                 "variants": [{"name": "base"}, {"name": "compile", "compile": True}]},
    "inference": {"defaults": {"probes": ["prefix_cache", "degenerate"]},
                  "models": [{"name": "tq", "model": "tiny-qwen3",
                              "schemes": [{"scheme": "none"}, {"scheme": "w8a8"}]}]},
    "gate": {
        "thresholds": [{"cases": "train/*", "metric": "tokens_per_s", "min": 100},
                       {"cases": "infer/*", "metric": "latency_s_p90", "max": 2.0}],
        "regression": {"max_regression": 0.05, "alpha": 0.05, "min_samples": 3},
        "variant_gains": [{"variant": "compile", "baseline": "base", "min_gain": 0.1}],
        "agreement": {"w8a8": 0.9},
    },
    "promotion": {"targets": [{"name": "public", "reference": "127.0.0.1:5000/pub/demo:1.1"}],
                  "insecure_registries": []},
}


def manifest_dict(**sections: Any) -> dict[str, Any]:
    """BASE_MANIFEST with top-level sections replaced; ``gate_extra`` merges into gate."""
    data = copy.deepcopy(BASE_MANIFEST)
    gate_extra = sections.pop("gate_extra", None)
    release_extra = sections.pop("release_extra", None)
    data.update(copy.deepcopy(sections))
    if gate_extra:
        data["gate"].update(copy.deepcopy(gate_extra))
    if release_extra:
        data["release"].update(release_extra)
    if not data["release"].get("previous_tag") and "baseline" not in data["gate"].get("regression", {}):
        # A first release says so: history mode needs a previous release (issue 24.1).
        data["gate"]["regression"] = {**data["gate"].get("regression", {}), "baseline": "optional"}
    return data


def manifest_text(**sections: Any) -> str:
    return yaml.safe_dump(manifest_dict(**sections), sort_keys=False)


def release(**sections: Any) -> ReleaseManifest:
    return load_manifest_text(manifest_text(**sections), check_expiry=False).release


def cases_of(rel: ReleaseManifest) -> list[Case]:
    return expand(rel)


def noisy(value: float, n: int = 5, noise: float = 0.01, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(x) for x in value * (1 + noise * rng.standard_normal(n))]


def result_doc(case: Case, status: str = "passed", *, metrics: dict[str, Any] | None = None,
               samples: dict[str, list[float]] | None = None, probes: dict[str, Any] | None = None,
               error_class: str | None = None, error: str | None = None) -> dict[str, Any]:
    return make_result(case.document(), status, error_class=error_class, error=error, metrics=metrics,
                       samples=samples, probes=probes)


def agreement_parts(value: float, *, sequences: int = 160, length: int = 64, seed: int = 0,
                    flip: float = 0.0, data: str = "d" * 64
                    ) -> tuple[dict[str, Any], dict[str, list[float]], dict[str, Any]]:
    """(metrics, samples, environment) of an infer result whose token agreement is `value` over
    sequences x length positions, as the workload reports them (per-sequence counts, packed flags).
    The disagreeing positions are drawn by `seed`; `flip` re-draws that share of them (another release
    that disagrees about as often on partly other positions)."""
    from qualify.workloads.infer import metrics as infer_metrics

    total = sequences * length
    rng = np.random.default_rng(seed)
    wrong = set(int(i) for i in rng.choice(total, size=round((1 - value) * total), replace=False))
    if flip:
        moved = sorted(wrong)[: round(flip * len(wrong))]
        rest = [i for i in range(total) if i not in wrong]
        wrong = (wrong - set(moved)) | set(int(i) for i in rng.choice(rest, size=len(moved), replace=False))
    flags = [[(s * length + t) not in wrong for t in range(length)] for s in range(sequences)]
    samples, env = infer_metrics.agreement_record(flags, data)
    metrics = {"token_agreement": sum(map(sum, flags)) / total, "eval_positions": total, "eval_sequences": sequences}
    return metrics, samples, env


def good_doc(case: Case, *, scale: float = 1.0, seed: int = 0, n: int = 5, noise: float = 0.01,
             gain: dict[str, float] | None = None) -> dict[str, Any]:
    """A passing result: train ~1000 tokens/s (x1.3 for compile), infer ~200 tokens/s; the n figures are
    the case's launches (qualify.launches: what the gate tests)."""
    gain = {"compile": 1.3} if gain is None else gain
    if case.kind == "train":
        series = noisy(1000 * scale * gain.get(case.variant or "", 1.0), n, noise, seed)
        doc = result_doc(case, metrics={"tokens_per_s": float(np.median(series)), "mfu": None},
                         samples={"tokens_per_s": series, "per_launch.tokens_per_s": series})
        # the evidence a real training workload reports when a variant's switch took effect
        doc["environment"].update({"compile_graphs": 1 if case.params.get("compile") else 0,
                                   "compile_graph_breaks": 0,
                                   "checkpointed_layers": 0 if case.params.get("activation_checkpointing") in (None, "none")
                                   else 2})
        return doc
    if case.kind == "infer":
        series = noisy(200 * scale, n, noise, seed + 1)
        quality, counts, record = agreement_parts(1.0 if case.variant == "none" else 0.99)
        doc = result_doc(case, metrics={"output_tokens_per_s": float(np.median(series)), "latency_s_p90": 0.5,
                                        **quality},
                         samples={"output_tokens_per_s": series, "per_launch.output_tokens_per_s": series, **counts},
                         probes={"prefix_cache": {"status": "passed", "detail": "identical"},
                                 "degenerate": {"status": "passed", "detail": "ok"}})
        doc["environment"].update(record)
        return doc
    series = noisy(1.0 * scale, n, noise, seed)
    return result_doc(case, metrics={"wall_s": float(np.median(series))},
                      samples={"wall_s": series, "per_launch.wall_s": series})


def calibrated(results: dict[str, ResultData], sd_run: float = 0.005, df: float = 20) -> dict[str, Any]:
    """The gate's calibrations mapping for these results: every metric of every result's fingerprint has a
    measured run-to-run variation of sd_run (what `qualify calibrate` would have stored)."""
    from qualify.gate import calibration
    from qualify.gate.noninferiority import RunVariation

    return {calibration.lookup(r.fingerprint, metric): RunVariation(sd_run, df)
            for r in results.values() for metric in r.metrics}


def as_result(case: Case, doc: dict[str, Any]) -> ResultData:
    return ResultData.from_doc(doc, model=case.model, variant=case.variant,
                               fingerprint=fingerprint.of_case(case, doc.get("environment") or {}))


def good_results(rel: ReleaseManifest, **kwargs: Any) -> dict[str, ResultData]:
    return {c.case_id: as_result(c, good_doc(c, **kwargs)) for c in cases_of(rel)}


GOOD_COMPONENTS = [ComponentData("torch", True, "2.13.0", "2.13.0", "exact"),
                   ComponentData("apex", False, "0.1", None, "exact", optional=True)]

GOOD_COMPONENT_ROWS = [
    {"name": "torch", "rule": "exact", "expected": "2.13.0", "actual": "2.13.0", "ok": True},
    {"name": "apex", "rule": "exact", "expected": "0.1", "actual": None, "ok": False, "optional": True},
]


# --------------------------------------------------------------------------- database


def seed_run(session, text: str, *, digest: str, repository: str | None = None, tag: str | None = None,
             builder: str = "buildah", docs: dict[str, dict[str, Any]] | None = None,
             components: list[dict[str, Any]] | None = None, finish: str | None = "passed",
             calibrated: bool = True, further: dict[str, str] | None = None):
    """A run of the manifest `text` with its candidate image and results (docs by case id;
    default: good results for every case). Returns the Run (flushed, not committed). calibrated: every
    result's fingerprint also gets a stored calibration (0.5% run to run), as `qualify calibrate` would
    have measured on a quiet machine, so that history mode can decide."""
    from qualify.manifest.load import load_manifest_text as load
    from qualify.store import repo

    loaded = load(text, check_expiry=False)
    rel = loaded.release
    db_release = repo.get_or_create_release(session, rel.release.name, rel.release.repository, rel.release.tag,
                                            rel.release.previous_tag)
    run = repo.create_run(session, db_release, manifest_path="test.yaml", manifest_sha256=loaded.sha256,
                          manifest_text=text, triggered_by="test")
    image = repo.get_or_create_image(session, repository or rel.release.repository,
                                     tag or rel.release.candidate_tag, digest, builder=builder)
    repo.attach_candidate(session, run, image)
    for name, further_digest in (further or {}).items():
        view = rel.for_image(name).release
        row = repo.get_or_create_image(session, view.repository, view.candidate_tag, further_digest, builder=builder)
        repo.attach_image(session, run, name, row)
    repo.record_component_checks(session, run, GOOD_COMPONENT_ROWS if components is None else components)
    cases = {c.case_id: c for c in expand(rel)}
    docs = {cid: good_doc(c) for cid, c in cases.items()} if docs is None else docs
    for case_id, doc in docs.items():
        case = cases[case_id]
        fp = fingerprint.of_case(case, doc.get("environment") or {})
        repo.record_case_result(session, run.id, case_id=case_id, kind=case.kind, model=case.model,
                                variant=case.variant, doc=doc, fingerprint=fp)
        if calibrated:
            _seed_calibration(session, case_id, fp, rel.gate.regression.metrics_for(case.kind))
    if finish:
        repo.finish_run(session, run, finish)
    session.flush()
    return run


def _seed_calibration(session, case_id: str, fp: dict[str, Any], metrics: list[str]) -> None:
    from qualify.gate import calibration
    from qualify.store import repo

    known = {(r.fingerprint_key, r.metric) for r in repo.latest_calibrations(session, [calibration.key(fp)])}
    for metric in metrics:
        if (calibration.key(fp), metric) not in known:
            repo.record_calibration(session, fingerprint_key=calibration.key(fp), fingerprint=fp, case_id=case_id,
                                    metric=metric, image="seeded", launches=5, runs=6, sd_run=0.005, df=20,
                                    sd_launch=0.01, false_alarm_rate=0.0, aa_comparisons=30, slowdown=0.1,
                                    slowed_runs=3, detection_rate=1.0, detectable=0.08)
