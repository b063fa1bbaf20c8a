"""Paths to a wrong PASS or a wrong exit code, end to end through `qualify run` (issue 24): synthetic and
sleep cases, so that each run takes seconds of workload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.flows import run_qualify

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.prefect, pytest.mark.workload]

BASE = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8]


def _manifest(path: Path, tag: str, previous: str | None, cases: list[dict[str, Any]],
              gate: dict[str, Any] | None = None, name: str = "synth", build: dict[str, Any] | None = None) -> Path:
    data: dict[str, Any] = {
        "apiVersion": "qualify/v1",
        "release": {"name": name, "repository": f"127.0.0.1:5000/q/{name}", "tag": tag,
                    "candidate_tag": f"{tag}-rc1", **({"previous_tag": previous} if previous else {})},
        "execution": {"executor": "local", "case_timeout_s": 60, "infra_retries": 0},
        "custom_cases": cases,
        "gate": gate or {},
        "promotion": {"on_pass": False, "targets": [{"name": "public", "reference": f"127.0.0.1:5000/q/pub:{tag}"}]},
    }
    if build:
        data["build"] = build
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _fast(scale: float = 1.0, name: str = "fast") -> dict[str, Any]:
    return {"name": name, "kind": "synthetic", "params": {"samples": {"tokens_per_s": [v * scale for v in BASE]}}}


def _run(tmp: Path, db: str, manifest: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    res = run_qualify(["run", str(manifest), "--db", db, "--json", *extra], tmp)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout)


def _reason(outcome: dict[str, Any], check: str) -> dict[str, Any]:
    return next(r for r in outcome["reasons"] if r["check"] == check)


OPTIONAL = {"regression": {"baseline": "optional"}}


# --------------------------------------------------------------------------- 1: no previous release


def test_history_mode_without_a_previous_release_is_refused_before_anything_runs(tmp_path: Path) -> None:
    db_file = tmp_path / "q.db"
    for k, gate in enumerate([{}, {"regression": {"baseline": "history"}}]):
        res = run_qualify(["run", str(_manifest(tmp_path / f"m{k}.yaml", "1.0", None, [_fast()], gate)),
                           "--db", f"sqlite:///{db_file}"], tmp_path)
        assert res.returncode == 2, (res.stdout, res.stderr)
        [line] = res.stderr.strip().splitlines()
        assert "release.previous_tag" in line and "baseline: optional" in line
        assert not db_file.exists()  # refused before a run was opened
    code, first = _run(tmp_path, f"sqlite:///{db_file}", _manifest(tmp_path / "first.yaml", "1.0", None, [_fast()],
                                                                  OPTIONAL))
    assert (code, first["verdict"]) == (0, "PASS") and _reason(first, "regression")["status"] == "NO-BASELINE"


# --------------------------------------------------------------------------- 4: per-release standing


def _gate_check(tmp: Path, db: str, ref: str, *extra: str) -> tuple[int, dict[str, Any]]:
    res = run_qualify(["gate", "check", ref, "--db", db, "--json", *extra], tmp)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout)


def test_a_laxer_release_or_a_re_judged_older_run_never_clears_a_digest(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    strict = {**OPTIONAL, "thresholds": [{"cases": "synthetic/*", "metric": "tokens_per_s", "min": 1000}]}
    code, a = _run(tmp_path, db, _manifest(tmp_path / "a.yaml", "2.0", None, [_fast()], strict))
    assert (code, a["verdict"]) == (1, "FAIL")
    code, b = _run(tmp_path, db, _manifest(tmp_path / "b.yaml", "2.1", None, [_fast()], OPTIONAL))
    assert (code, b["verdict"]) == (0, "PASS") and a["digest"] == b["digest"]  # the local builder: one digest
    ref = f"127.0.0.1:5000/q/synth@{a['digest']}"

    # B's PASS is the digest's newest decision, yet A's FAIL stands: gate check and promote A refuse
    code, check = _gate_check(tmp_path, db, ref)
    assert (code, check["ok"], check["verdict"], check["run"]) == (1, False, "FAIL", a["run_id"])
    assert {s["release"]: s["verdict"] for s in check["standings"]} == {"synth:2.0": "FAIL", "synth:2.1": "PASS"}
    promote = run_qualify(["promote", str(a["run_id"]), "--db", db], tmp_path)
    assert promote.returncode == 1 and f"run {a['run_id']}'s latest decision" in promote.stderr \
        and "is FAIL, not PASS" in promote.stderr
    # whoever evaluates last does not win
    for run_id in (a["run_id"], b["run_id"]):
        assert run_qualify(["gate", "evaluate", str(run_id), "--db", db], tmp_path).returncode in (0, 1)
        assert _gate_check(tmp_path, db, ref)[0] == 1
    # bound to the release name, both tags of it count: A's FAIL still stands
    assert _gate_check(tmp_path, db, ref, "--release", "synth")[0] == 1

    # within one release: re-judging the older PASS run never overrides the newer run's FAIL
    code, old = _run(tmp_path, db, _manifest(tmp_path / "c1.yaml", "3.0", None, [_fast()], OPTIONAL, name="line"))
    assert (code, old["verdict"]) == (0, "PASS")
    code, new = _run(tmp_path, db, _manifest(tmp_path / "c2.yaml", "3.0", None, [_fast()], strict, name="line"))
    assert (code, new["verdict"]) == (1, "FAIL")
    again = run_qualify(["gate", "evaluate", str(old["run_id"]), "--db", db], tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr  # its own decision is PASS again
    line_ref = f"127.0.0.1:5000/q/line@{old['digest']}"
    code, check = _gate_check(tmp_path, db, line_ref)
    assert (code, check["verdict"], check["run"]) == (1, "FAIL", new["run_id"])
    promote = run_qualify(["promote", str(old["run_id"]), "--db", db], tmp_path)
    assert promote.returncode == 1 and f"run {new['run_id']} of release line:3.0 is newer" in promote.stderr


# --------------------------------------------------------------------------- 3: waivers; 2: a crash after the document


def test_a_waiver_covers_only_what_it_names_and_a_crash_after_the_document_is_a_crash(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    code, base = _run(tmp_path, db, _manifest(tmp_path / "base.yaml", "1.0", None, [_fast()], OPTIONAL))
    assert (code, base["verdict"]) == (0, "PASS")
    waiver = {"id": "W-all", "cases": "*", "reason": "cover everything", "expires": "2099-01-01"}
    for check in ("*", "?*", "[a-z]*", "regress*"):
        manifest = _manifest(tmp_path / "all.yaml", "1.1", "1.0", [_fast(0.85)], {"waivers": [{**waiver, "check": check}]})
        res = run_qualify(["run", str(manifest), "--db", db], tmp_path)
        assert res.returncode == 2, (res.stdout, res.stderr)
        [line] = res.stderr.strip().splitlines()
        assert "gate.waivers[0].check" in line and repr(check) in line

    # one family written out: the thresholds are waived, the regression and the crash stay FAILs
    gate = {"thresholds": [{"cases": "synthetic/*", "metric": "tokens_per_s", "min": 95},
                           {"cases": "synthetic/*", "metric": "tokens_per_s", "max": 50}],
            "waivers": [{**waiver, "check": "threshold:*"}]}
    teardown = {"name": "teardown", "kind": "synthetic",
                "params": {"samples": {"tokens_per_s": BASE}, "after_result": "SEGV"}}
    code, out = _run(tmp_path, db, _manifest(tmp_path / "family.yaml", "1.1", "1.0", [_fast(0.85), teardown], gate))
    assert (code, out["verdict"]) == (1, "FAIL")
    waived = [(r["check"], r["case_id"], r["figures"]["waiver"]) for r in out["reasons"] if r["status"] == "WAIVED"]
    assert waived and {w[0] for w in waived} == {"threshold:tokens_per_s"} and {w[2] for w in waived} == {"W-all"}
    # not waived, never PASS: the 15% drop is FAIL, or INCOMPLETE where history mode has no calibration of its
    # run-to-run variation (issue 22: without one, history mode shows nothing either way)
    assert _reason(out, "regression")["status"] in ("FAIL", "INCOMPLETE")
    [crashed] = [c for c in out["cases"] if c["case_id"] == "synthetic/teardown"]
    assert crashed["error_class"] == "crash" and "after it printed a passed result document" in crashed["error"]
    assert "SIGSEGV" in crashed["error"]


# --------------------------------------------------------------------------- 8: infrastructure before the cases


def _infra_scenarios(tmp: Path) -> dict[str, tuple[list[str], dict[str, str], str]]:
    """name -> (qualify arguments, environment, a fragment the one line names)."""
    from support.net import free_port

    dead = free_port()  # nothing listens there
    nap = [{"name": "nap", "kind": "sleep", "params": {"duration_s": 0.1}}]
    local = _manifest(tmp / "local.yaml", "1.0", "0.9", nap)
    prebuilt = _manifest(tmp / "prebuilt.yaml", "1.0", "0.9", nap, name="pre",
                         build={"builder": "prebuilt", "reference": f"127.0.0.1:{dead}/q/pre:1.0-rc1"})
    data = yaml.safe_load(prebuilt.read_text())
    data["promotion"]["insecure_registries"] = [f"127.0.0.1:{dead}"]
    prebuilt.write_text(yaml.safe_dump(data))
    (tmp / "Containerfile").write_text("FROM scratch\n")
    buildah = _manifest(tmp / "buildah.yaml", "1.0", "0.9", nap, name="bah",
                        build={"builder": "buildah", "containerfile": "Containerfile"})
    empty_bin = tmp / "bin"
    empty_bin.mkdir(exist_ok=True)
    sqlite = f"sqlite:///{tmp / 'q.db'}"
    return {
        "registry unreachable": (["run", str(prebuilt), "--db", sqlite], {}, f"127.0.0.1:{dead}"),
        "builder missing": (["run", str(buildah), "--db", sqlite], {"PATH": str(empty_bin)}, "buildah"),
        "ray unreachable": (["run", str(local), "--db", sqlite, "--ray-address", f"127.0.0.1:{dead}"], {}, "Ray"),
        "database down": (["run", str(local), "--db", f"postgresql://qualify@127.0.0.1:{dead}/nothing"], {},
                          f"127.0.0.1:{dead}"),
    }


@pytest.mark.parametrize("scenario", ["registry unreachable", "builder missing", "ray unreachable", "database down"])
def test_an_infrastructure_failure_before_the_cases_is_exit_3_in_one_line(tmp_path: Path, scenario: str) -> None:
    args, env, fragment = _infra_scenarios(tmp_path)[scenario]
    res = run_qualify(args, tmp_path, timeout=600, **env)
    assert res.returncode == 3, (res.stdout, res.stderr)
    lines = [line for line in res.stderr.splitlines() if line.strip() and line.strip() != "starting"]
    assert len(lines) == 1, res.stderr
    [line] = lines
    assert fragment in line and line.startswith(("infrastructure error:", "error:")) and "FAIL" not in line, line
    for noise in ("Traceback", "NoneType: None", "| ERROR", "Finished in state"):
        assert noise not in res.stderr, res.stderr


# --------------------------------------------------------------------------- 6: the database vanishes or is replaced


def _wait_for(predicate, proc, timeout_s: float = 300.0, what: str = "") -> None:
    """Wait for predicate while the run is alive: a run that ended first fails at once, with its output."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}:\n{out}\n{err[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _spooled(data_dir: Path) -> dict[str, Path]:
    """Run 1's spooled results by case id, wherever this database's own data directory (db-<uuid>/) is; read with
    the spool's own reader, whatever its file names."""
    from qualify.execution import spool

    return {result.case_id: path for db_dir in sorted(data_dir.glob("db-*"))
            for path, result in spool.pending(db_dir, 1)}


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_database_that_vanishes_mid_run_is_exit_3_with_the_results_spooled(tmp_path: Path, how: str) -> None:
    import shutil
    import subprocess
    import sys

    from support.cli import cli_env
    from support.paths import REPO

    db_file = tmp_path / "q.db"
    release = tmp_path / "release-the-long-case"  # the long case runs until the database has been swapped
    cases = [{"name": "short", "kind": "sleep", "params": {"duration_s": 0.2}, "resources": {"cpus": 1}},
             {"name": "long", "kind": "sleep", "params": {"duration_s": 0.2, "hold_until_file": str(release)},
              "resources": {"cpus": 1}}]
    manifest = _manifest(tmp_path / "m.yaml", "1.0", None, cases, OPTIONAL)
    if how == "replaced":  # another, valid results database, ready to be moved over the run's
        other = tmp_path / "other.db"
        assert run_qualify(["db", "upgrade", "--db", f"sqlite:///{other}"], tmp_path).returncode == 0
    env = cli_env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "qualify", "run", str(manifest), "--db", f"sqlite:///{db_file}",
                             "--json"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: "sleep/short" in _spooled(tmp_path / "data"), proc, what="the short case's spooled result")
        if how == "removed":
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db_file}{suffix}").unlink(missing_ok=True)
        else:
            shutil.copy(tmp_path / "other.db", tmp_path / "swap.db")
            (tmp_path / "swap.db").replace(db_file)
        release.touch()
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, (out, err)
    assert "PASS" not in out and "Traceback" not in err
    # stderr also carries the progress lines; the failure is one line, printed once
    lines = [line for line in err.splitlines() if line.startswith(("error:", "infrastructure error:", "refused:"))]
    assert len(lines) == 1 and ("vanished" in lines[0] or "replaced" in lines[0] or "not the one" in lines[0]), err
    assert "--resume 1" in lines[0] and ("vanished" if how == "removed" else "replaced") in lines[0]
    kept = _spooled(tmp_path / "data")
    assert sorted(kept) == ["sleep/long", "sleep/short"]
    assert all(json.loads(path.read_text())["doc"]["status"] == "passed" for path in kept.values())
