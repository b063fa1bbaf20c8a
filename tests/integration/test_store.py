"""The results database on SQLite and PostgreSQL: migrations, constraints, the indexed queries."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from qualify.store import repo
from qualify.store.engine import make_engine
from qualify.workloads import protocol

REPO = Path(__file__).resolve().parents[2]
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


def _run(session, tag: str = "25.05", digest: str = DIGEST_A, previous: str | None = "25.04"):
    release = repo.get_or_create_release(session, "img", "reg.example.com/q/img", tag, previous)
    run = repo.create_run(session, release, manifest_path="m.yaml", manifest_sha256="0" * 64,
                          manifest_text="x: 1", triggered_by="test")
    image = repo.get_or_create_image(session, "reg.example.com/q/img", f"{tag}-rc1", digest, builder="buildah")
    repo.attach_candidate(session, run, image)
    return run


def _doc(case_id: str, status: str = "passed", **metrics: float) -> dict:
    return protocol.make_result({"case_id": case_id, "kind": "train"}, status,
                                error_class=None if status == "passed" else "crash",
                                metrics=metrics, samples={"tokens_per_s": [1.0, 2.0]})


def test_schema_is_at_head_and_has_the_indexes(db_url: str) -> None:
    engine = make_engine(db_url)
    insp = inspect(engine)
    assert {"releases", "images", "runs", "component_checks", "case_results", "gate_decisions",
            "promotions"} <= set(insp.get_table_names())
    index_names = {i["name"] for i in insp.get_indexes("case_results")}
    assert "ix_case_results_case_run" in index_names
    assert "ix_gate_decisions_digest_verdict" in {i["name"] for i in insp.get_indexes("gate_decisions")}
    engine.dispose()


def test_one_result_per_run_and_case(sessions) -> None:
    with sessions() as session:
        run = _run(session)
        repo.record_case_result(session, run.id, case_id="train/m/base", kind="train", model="m",
                                variant="base", doc=_doc("train/m/base", tokens_per_s=10.0))
        session.commit()
        with pytest.raises(repo.DuplicateResult):
            repo.record_case_result(session, run.id, case_id="train/m/base", kind="train", model="m",
                                    variant="base", doc=_doc("train/m/base"))
    with sessions() as session:
        assert repo.final_case_ids(session, run.id) == {"train/m/base"}


def test_promotion_must_reference_a_decision(sessions) -> None:
    with sessions() as session:
        run = _run(session)
        session.commit()
        with pytest.raises(IntegrityError):
            session.execute(text(
                "INSERT INTO promotions (decision_id, run_id, target_name, source_ref, source_digest, target_ref, "
                "outcome, forced, created_at) VALUES (99999, :run, 't', 's', 'd', 'x', 'promoted', false, "
                "CURRENT_TIMESTAMP)"), {"run": run.id})
            session.commit()


def test_status_check_constraint(sessions) -> None:
    with sessions() as session:
        run = _run(session)
        session.commit()
        bad = _doc("c")
        bad["status"] = "great"
        with pytest.raises(IntegrityError):
            repo.record_case_result(session, run.id, case_id="c", kind="train", model=None, variant=None, doc=bad)


def test_second_running_run_of_a_digest_is_refused(sessions) -> None:
    with sessions() as session:
        _run(session)
        session.commit()
        with pytest.raises(repo.RunConflict, match="still running"):
            _run(session)
    with sessions() as session:
        # Once the first run is finished, a new run of the same digest may start.
        first = repo.list_runs(session)[0]
        repo.finish_run(session, first, "passed")
        session.commit()
        _run(session)
        session.commit()


def test_results_of_release_for_case_and_latest_pass_for_digest(sessions) -> None:
    with sessions() as session:
        old = _run(session, tag="25.04", digest=DIGEST_B, previous=None)
        repo.record_case_result(session, old.id, case_id="train/m/base", kind="train", model="m", variant="base",
                                doc=_doc("train/m/base", tokens_per_s=9.0))
        repo.finish_run(session, old, "passed")
        repo.record_decision(session, old, "PASS", [], "p" * 64, None)
        new = _run(session, tag="25.05", digest=DIGEST_A)
        repo.record_case_result(session, new.id, case_id="train/m/base", kind="train", model="m", variant="base",
                                doc=_doc("train/m/base", tokens_per_s=10.0))
        repo.record_decision(session, new, "FAIL", [{"check": "x"}], "p" * 64, old.id)
        session.commit()
        rows = repo.results_for_release_case(session, "reg.example.com/q/img", "25.04", "train/m/base")
        assert [r.metrics["tokens_per_s"] for r in rows] == [9.0]
        assert repo.latest_pass_for_digest(session, DIGEST_B).run_id == old.id
        assert repo.latest_pass_for_digest(session, DIGEST_A) is None
        assert repo.latest_decision_for_digest(session, DIGEST_A).verdict == "FAIL"
        assert repo.baseline_run(session, "reg.example.com/q/img", "25.04").id == old.id
        # Decisions are appended, never rewritten.
        repo.record_decision(session, new, "PASS", [], "p" * 64, old.id)
        session.commit()
        assert [d.verdict for d in repo.decisions(session, new.id)] == ["FAIL", "PASS"]


def test_runs_cli_reads_the_database(db_url: str, sessions) -> None:
    with sessions() as session:
        run = _run(session)
        repo.record_case_result(session, run.id, case_id="train/m/base", kind="train", model="m", variant="base",
                                doc=_doc("train/m/base", tokens_per_s=12.5))
        session.commit()
    env = {**os.environ, "QUALIFY_DATABASE_URL": db_url}
    listed = subprocess.run([sys.executable, "-m", "qualify", "runs", "list", "--json"], env=env,
                            capture_output=True, text=True, cwd=REPO)
    assert listed.returncode == 0, listed.stderr
    assert f'"run": {run.id}' in listed.stdout
    shown = subprocess.run([sys.executable, "-m", "qualify", "runs", "show", str(run.id)], env=env,
                           capture_output=True, text=True, cwd=REPO)
    assert shown.returncode == 0, shown.stderr
    assert "train/m/base" in shown.stdout and "tokens_per_s=12.5" in shown.stdout
    missing = subprocess.run([sys.executable, "-m", "qualify", "runs", "show", "424242"], env=env,
                             capture_output=True, text=True, cwd=REPO)
    assert missing.returncode == 2 and "no run 424242" in missing.stderr


def test_alembic_check_models_match_migrations(db_url: str) -> None:
    res = subprocess.run([sys.executable, "-m", "alembic", "-c", str(REPO / "alembic.ini"), "check"],
                         env={**os.environ, "QUALIFY_DATABASE_URL": db_url}, capture_output=True, text=True,
                         cwd=REPO)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "No new upgrade operations detected" in res.stdout + res.stderr


def test_unreachable_database_is_a_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "QUALIFY_DATABASE_URL": "postgresql://nobody:secret@127.0.0.1:1/none"}
    res = subprocess.run([sys.executable, "-m", "qualify", "runs", "list"], env=env, capture_output=True,
                         text=True, cwd=REPO)
    assert res.returncode == 3
    assert "Traceback" not in res.stderr and "secret" not in res.stderr
    assert "127.0.0.1:1" in res.stderr


def test_the_images_builds_record_where_they_ran_at_once_and_none_is_lost(sessions, tmp_path: Path,
                                                                          monkeypatch) -> None:
    """A release's images built on the cluster finish at once, each recording where it ran in runs.cluster
    (pipeline.RunContext.merge_cluster): concurrent writers, one read-modify-write at a time."""
    import threading

    from support.flows import sleep_manifest

    from qualify.pipeline import open_run
    from qualify.store.models import Run

    monkeypatch.setenv("QUALIFY_DATA_DIR", str(tmp_path / "data"))
    manifest = sleep_manifest(tmp_path / "m.yaml", [{"name": "nap", "kind": "sleep"}])
    ctx = open_run(sessions, manifest)
    ctx.merge_cluster(build={"node_id": "a"}, nodes=[{"CPU": 2.0}])
    names = [f"image-{k}" for k in range(8)]
    start = threading.Barrier(len(names))

    def record(name: str) -> None:
        start.wait()
        ctx.merge_cluster(image_builds={name: {"node_id": name}})

    threads = [threading.Thread(target=record, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ctx.merge_cluster(build={"node_id": "b"})  # any other part replaces its earlier value
    with sessions() as s:
        cluster = s.get(Run, ctx.run_id).cluster
    assert cluster["image_builds"] == {name: {"node_id": name} for name in names}
    assert cluster["build"] == {"node_id": "b"} and cluster["nodes"] == [{"CPU": 2.0}]


def test_a_digests_decisions_read_as_plain_rows_match_the_orm(sessions) -> None:
    """qualify.store.digest_decisions (the gate check's read, Core into plain rows) returns what the ORM holds:
    every decision about the digest, as a run's candidate and as a run's further image, oldest first, with the
    run's release, image and (for the further image) the images the check reads; typed values (a datetime, a
    JSON list), not the database's strings. Another digest's decisions are not among them."""
    from qualify.store.digest_decisions import decisions_for_digest

    with sessions() as session:
        first = _run(session, "25.05", DIGEST_A)
        repo.finish_run(session, first, "passed")  # a digest is bound to one running run at a time
        serving = repo.get_or_create_image(session, "reg.example.com/q/serving", "25.06-rc1", DIGEST_A,
                                           builder="buildah")
        second = _run(session, "25.06", DIGEST_B)
        repo.attach_image(session, second, "serving", serving)  # DIGEST_A again, as second's further image
        other = _run(session, "25.07", "sha256:" + "c" * 64)
        reasons = [{"check": "regression", "status": "FAIL"}]
        d1 = repo.record_decision(session, first, "FAIL", reasons, "1" * 64, None)
        d2 = repo.record_decision(session, second, "PASS", [], "2" * 64, first.id)
        repo.record_decision(session, other, "PASS", [], "3" * 64, None)
        d3 = repo.record_decision(session, first, "PASS", [], "1" * 64, None)
        session.commit()
        ids = [d1.id, d2.id, d3.id]
    with sessions() as session:
        rows = decisions_for_digest(session, DIGEST_A)
        assert [d.id for d, _ in rows] == ids
        for decision, run in rows:
            orm = session.get(type(d1), decision.id)
            assert (decision.run_id, decision.digest, decision.verdict, decision.reasons, decision.policy_sha256,
                    decision.baseline_run_id) == (orm.run_id, orm.digest, orm.verdict, orm.reasons,
                                                  orm.policy_sha256, orm.baseline_run_id)
            assert isinstance(decision.decided_at, dt.datetime)
            orm_run = repo.get_run(session, run.id)
            assert (run.release_id, run.candidate_digest, run.manifest_text, run.release.name, run.release.tag,
                    run.release.repository, run.image.repository) == (
                orm_run.release_id, orm_run.candidate_digest, orm_run.manifest_text, orm_run.release.name,
                orm_run.release.tag, orm_run.release.repository, orm_run.image.repository)
        by_run = {run.id: run for _, run in rows}
        assert by_run[first.id].further_images == ()  # judged as its candidate: its further images are not read
        [further] = by_run[second.id].further_images
        assert (further.name, further.digest, further.image.repository) == (
            "serving", DIGEST_A, "reg.example.com/q/serving")
        assert rows[0][0].reasons == reasons
        assert decisions_for_digest(session, "sha256:" + "d" * 64) == []
