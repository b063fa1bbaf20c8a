"""`qualify compare` (per case and metric, with the gate's rule) and `qualify history` (a case over runs)."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import run_cli
from support.gate import manifest_text, noisy, seed_run
from support.reports import REPOSITORY, seed_release_line

from qualify.comparison import compare_series, resolve_ref
from qualify.errors import BadInput
from qualify.gate.noninferiority import RunVariation
from qualify.manifest import RegressionPolicy


def invoke(*args: str):
    from typer.testing import CliRunner

    from qualify.cli import app

    return CliRunner().invoke(app, list(args))


def test_the_call_follows_the_gates_rule() -> None:
    policy = RegressionPolicy(max_regression=0.05, alpha=0.05, min_samples=3, max_launches=5)
    quiet = RunVariation(0.005, 20)
    base = noisy(1000, 5, 0.01, 1)
    slower = compare_series("c", "tokens_per_s", base, noisy(850, 5, 0.01, 2), policy, variation=quiet)
    assert slower.call == "regression" and slower.change_best < -0.05
    faster = compare_series("c", "tokens_per_s", base, noisy(1150, 5, 0.01, 2), policy, variation=quiet)
    assert faster.call == "improvement" and faster.change_worst > 0.05
    same = compare_series("c", "tokens_per_s", base, noisy(1000, 5, 0.01, 2), policy, variation=quiet)
    assert same.call == "within tolerance"
    # lower is better for wall time: a longer wall time is the regression (-16.7% on the one scale)
    wall = compare_series("c", "wall_s", [1.0, 1.01, 0.99], [1.2, 1.21, 1.19], policy, variation=quiet)
    assert wall.call == "regression" and abs(wall.change - (1 / 1.2 - 1)) < 0.01
    # never calibrated: two runs cannot be told apart, whatever the change
    assert compare_series("c", "tokens_per_s", base, noisy(700, 5, 0.01, 2), policy).call == "undecided"
    assert compare_series("c", "tokens_per_s", [], [700], policy).call == "missing"


def test_compare_two_releases(db_url: str, sessions) -> None:
    line = seed_release_line(sessions)
    proc = run_cli("compare", "1.0", "1.1", "--db", db_url, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["a"]["run_id"] == line.run_a and "PASS" in out["a"]["how"]
    assert out["b"]["run_id"] == line.run_b and "no PASS run" in out["b"]["how"]  # B's only run is a FAIL
    calls = {(r["case_id"], r["metric"]): r["call"] for r in out["rows"]}
    assert calls == {("train/tiny/base", "tokens_per_s"): "regression",
                     ("train/tiny/compile", "tokens_per_s"): "within tolerance",
                     ("infer/tq/none", "output_tokens_per_s"): "improvement",
                     ("infer/tq/w8a8", "output_tokens_per_s"): "within tolerance"}
    row = next(r for r in out["rows"] if r["case_id"] == "train/tiny/base")
    assert row["median_a"] > row["median_b"] and row["change_worst"] <= row["change"] <= row["change_best"]

    text = invoke("compare", f"run:{line.run_a}", "1.1", "--db", db_url)  # a bare tag takes run A's repository
    assert text.exit_code == 0, text.output
    assert "regression" in text.stdout and "summary: 1 improvement, 1 regression, 2 within tolerance" in text.stdout
    by_repo = invoke("compare", f"{REPOSITORY}:1.0", f"{REPOSITORY}:1.1", "--db", db_url, "--metric", "mfu")
    assert by_repo.exit_code == 0 and "mfu" in by_repo.stdout and "missing" in by_repo.stdout

    for bad in (["9.9", "1.1"], ["run:99", "1.1"], ["run:x", "1.1"], [f"{REPOSITORY}@sha256:{'a' * 64}", "1.1"]):
        refused = invoke("compare", *bad, "--db", db_url)
        assert refused.exit_code == 2, (bad, refused.output)
    # a run compared with itself, under any pair of names for it, is refused with a word (issue 26.9)
    for same in (["1.1", "1.1"], [f"run:{line.run_b}", "1.1"], [f"{REPOSITORY}:1.0", f"run:{line.run_a}"]):
        refused = invoke("compare", *same, "--db", db_url)
        assert refused.exit_code == 2 and "same run" in refused.output, (same, refused.output)


def test_a_tag_in_two_repositories_must_be_qualified(sessions) -> None:
    seed_release_line(sessions)
    other = manifest_text(release_extra={"repository": "127.0.0.1:5000/other/demo", "tag": "1.0",
                                         "candidate_tag": "1.0-rc1", "previous_tag": None})
    with sessions() as s:
        seed_run(s, other, digest="sha256:" + "c" * 64)
        s.commit()
        try:
            resolve_ref(s, "1.0")
        except BadInput as exc:
            assert "2 repositories" in str(exc) and "REPOSITORY:TAG" in str(exc)
        else:
            raise AssertionError("an ambiguous tag was accepted")
        assert resolve_ref(s, "1.0", "127.0.0.1:5000/other/demo").repository == "127.0.0.1:5000/other/demo"


def test_history_marks_fingerprint_changes_and_draws_a_chart(db_url: str, sessions, tmp_path: Path) -> None:
    line = seed_release_line(sessions)
    # a third run whose training case ran with another sequence length: not like for like
    text = manifest_text(release_extra={"tag": "1.2", "candidate_tag": "1.2-rc1", "previous_tag": "1.1"},
                         training={"defaults": {"seq_len": 256}, "models": [{"name": "tiny"}],
                                   "variants": [{"name": "base"}, {"name": "compile", "compile": True}]})
    with sessions() as s:
        run_c = seed_run(s, text, digest="sha256:" + "d" * 64).id
        s.commit()
    png = tmp_path / "h" / "base.png"
    proc = run_cli("history", "train/tiny/base", "--db", db_url, "--png", str(png), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["metric"] == "tokens_per_s" and [p["run_id"] for p in out["points"]] == [line.run_a, line.run_b, run_c]
    assert [p["verdict"] for p in out["points"]] == ["PASS", "FAIL", None]
    assert out["points"][1]["fingerprint_changes"] == []
    assert any("seq_len" in c for c in out["points"][2]["fingerprint_changes"])
    assert out["points"][1]["median"] < out["points"][0]["median"] and out["points"][0]["n"] == 5
    assert png.read_bytes().startswith(b"\x89PNG")

    table = invoke("history", "train/tiny/base", "--db", db_url, "--limit", "2")
    assert table.exit_code == 0, table.output
    assert "CHANGED: params.seq_len: None -> 256" in table.stdout and f"{line.run_a:>5}  1.0" not in table.stdout
    assert invoke("history", "train/nope/base", "--db", db_url).exit_code == 2
    assert invoke("history", "train/tiny/base", "--db", db_url, "--metric", "furlongs").exit_code == 2
    latency = invoke("history", "infer/tq/none", "--db", db_url, "--metric", "latency_s_p90", "--json")
    assert [p["median"] for p in json.loads(latency.stdout)["points"]] == [0.5, 0.5, 0.5]
