"""Promotion with the real registry and the real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid

import pytest
from support.gate import good_doc, manifest_text, seed_run
from support.registry import RegistryProcess, skopeo_digest

from qualify.gate.judging import evaluate_and_commit
from qualify.promote import PromotionError, PromotionRefused, exit_code, promote_run
from qualify.store import repo

pytestmark = pytest.mark.registry


class Setup:
    """A release on `registry` with targets; the candidate pushed and its run evaluated."""

    def __init__(self, sessions, registry: RegistryProcess, make_image, *, targets=None, docs=None,
                 builder: str = "buildah", insecure: list[str] | None = None, evaluate: bool = True) -> None:
        self.ns = "t" + uuid.uuid4().hex[:8]
        self.registry = registry
        self.repository = registry.ref(f"{self.ns}/demo")
        targets = targets if targets is not None else [
            {"name": "public", "reference": registry.ref(f"{self.ns}/public/demo", "1.1")},
            {"name": "vpc", "template": f"{registry.host}/{self.ns}/vpc-{{region-id}}/{{image:tag}}",
             "regions": ["cn-beijing", "cn-shanghai"]},
        ]
        self.text = manifest_text(
            release_extra={"repository": self.repository, "previous_tag": None},  # a first release
            promotion={"targets": targets, "insecure_registries": insecure or [registry.host]})
        self.digest = make_image(registry, f"{self.ns}/demo", "1.1-rc1")
        with sessions() as s:
            run = seed_run(s, self.text, digest=self.digest, builder=builder, docs=docs(self) if docs else None)
            s.commit()
            self.run_id = run.id
        if evaluate:
            self.verdict = evaluate_and_commit(sessions, self.run_id).judgement.verdict

    def target_refs(self) -> dict[str, str]:
        return {"public": self.registry.ref(f"{self.ns}/public/demo", "1.1"),
                "vpc-cn-beijing": self.registry.ref(f"{self.ns}/vpc-cn-beijing/demo", "1.1"),
                "vpc-cn-shanghai": self.registry.ref(f"{self.ns}/vpc-cn-shanghai/demo", "1.1")}


def rows(sessions, run_id):
    with sessions() as s:
        return [(p.target_name, p.outcome, p.forced, p.reason) for p in repo.promotions(s, run_id)]


def test_pass_run_is_promoted_to_every_target_then_idempotent(sessions, registry, make_image):
    st = Setup(sessions, registry, make_image)
    assert st.verdict == "PASS"
    outcomes = promote_run(sessions, st.run_id, actor="tester")
    assert [(o.target, o.outcome) for o in outcomes] == [
        ("public", "promoted"), ("vpc-cn-beijing", "promoted"), ("vpc-cn-shanghai", "promoted")]
    assert exit_code(outcomes) == 0
    for name, ref in st.target_refs().items():
        assert skopeo_digest(ref) == st.digest, name  # independent check of the digest
    again = promote_run(sessions, st.run_id, actor="tester")
    assert {o.outcome for o in again} == {"skipped"} and exit_code(again) == 0
    recorded = rows(sessions, st.run_id)
    assert [r[1] for r in recorded] == ["promoted"] * 3 + ["skipped"] * 3
    with sessions() as s:
        p = repo.promotions(s, st.run_id)[0]
        assert p.source_digest == st.digest and p.source_ref == f"{st.repository}:1.1-rc1"
        assert p.promoted_by == "tester" and p.decision_id == repo.latest_decision(s, st.run_id).id


def test_dry_run_changes_nothing(sessions, registry, make_image):
    st = Setup(sessions, registry, make_image)
    outcomes = promote_run(sessions, st.run_id, dry_run=True)
    assert {o.outcome for o in outcomes} == {"dry-run"} and {o.planned for o in outcomes} == {"copy"}
    assert all(st.digest in o.source_digest for o in outcomes)
    assert rows(sessions, st.run_id) == []
    assert all(skopeo_digest(ref) is None for ref in st.target_refs().values())


def test_target_selection(sessions, registry, make_image):
    st = Setup(sessions, registry, make_image)
    assert [o.target for o in promote_run(sessions, st.run_id, target="vpc", dry_run=True)] == [
        "vpc-cn-beijing", "vpc-cn-shanghai"]
    outcomes = promote_run(sessions, st.run_id, target="public")
    assert [(o.target, o.outcome) for o in outcomes] == [("public", "promoted")]
    assert skopeo_digest(st.target_refs()["vpc-cn-beijing"]) is None
    with pytest.raises(PromotionError, match="no promotion target 'nope'"):
        promote_run(sessions, st.run_id, target="nope")


def test_fail_run_is_refused_and_recorded(sessions, registry, make_image):
    def broken(st):
        from qualify.manifest.cases import expand
        from qualify.manifest.load import load_manifest_text

        docs = {c.case_id: good_doc(c) for c in expand(load_manifest_text(st.text, check_expiry=False).release)}
        docs["train/tiny/base"] = {**docs["train/tiny/base"], "status": "error", "error_class": "crash",
                                   "error": "segfault"}
        return docs

    st = Setup(sessions, registry, make_image, docs=broken)
    assert st.verdict == "FAIL"
    with pytest.raises(PromotionRefused, match="is FAIL, not PASS") as info:
        promote_run(sessions, st.run_id)
    assert {o.outcome for o in info.value.outcomes} == {"refused"}
    assert {r[1] for r in rows(sessions, st.run_id)} == {"refused"}
    assert all(skopeo_digest(ref) is None for ref in st.target_refs().values())


def test_run_without_decision_is_refused(sessions, registry, make_image):
    st = Setup(sessions, registry, make_image, evaluate=False)
    with pytest.raises(PromotionRefused, match="no gate decision"):
        promote_run(sessions, st.run_id)
    assert rows(sessions, st.run_id) == []


def test_moved_candidate_tag_is_refused(sessions, registry, make_image):
    st = Setup(sessions, registry, make_image)
    moved = make_image(registry, f"{st.ns}/demo", "1.1-rc1")  # someone pushed over the candidate tag
    assert moved != st.digest
    with pytest.raises(PromotionRefused, match="moved") as info:
        promote_run(sessions, st.run_id)
    assert moved in str(info.value) and st.digest in str(info.value)
    assert all(skopeo_digest(ref) is None for ref in st.target_refs().values())


def test_local_build_cannot_be_promoted(sessions, registry, make_image):
    st = Setup(sessions, registry, make_image, builder="local")
    assert st.verdict == "PASS"
    with pytest.raises(PromotionRefused, match="not built into a registry"):
        promote_run(sessions, st.run_id)


def test_existing_destination_is_never_moved_without_force(sessions, registry, make_image):
    st = Setup(sessions, registry, make_image)
    public = st.target_refs()["public"]
    other = make_image(registry, f"{st.ns}/public/demo", "1.1")
    plan = {o.target: o for o in promote_run(sessions, st.run_id, dry_run=True)}
    assert plan["public"].planned == "refuse" and plan["vpc-cn-beijing"].planned == "copy"
    assert exit_code(list(plan.values())) == 1
    plan = promote_run(sessions, st.run_id, dry_run=True, force=True, reason="test")
    assert plan[0].planned == "force-move" and exit_code(plan) == 0
    outcomes = {o.target: o for o in promote_run(sessions, st.run_id)}
    assert outcomes["public"].outcome == "refused" and other in outcomes["public"].detail
    assert outcomes["vpc-cn-beijing"].outcome == "promoted"  # the others are not held back
    assert exit_code(list(outcomes.values())) == 1
    assert skopeo_digest(public) == other
    with pytest.raises(PromotionError, match="--reason"):
        promote_run(sessions, st.run_id, force=True)
    forced = {o.target: o for o in promote_run(sessions, st.run_id, force=True, reason="rebuild of a bad 1.1")}
    assert forced["public"].outcome == "promoted" and forced["public"].forced
    assert forced["vpc-cn-beijing"].outcome == "skipped" and not forced["vpc-cn-beijing"].forced
    assert skopeo_digest(public) == st.digest
    recorded = [r for r in rows(sessions, st.run_id) if r[0] == "public"]
    assert recorded[-1] == ("public", "promoted", True, "rebuild of a bad 1.1")
    assert recorded[0][1] == "refused"


def test_one_target_down_is_recorded_and_completed_on_retry(sessions, registry, registry_factory, make_image):
    # the public target lives in the candidate's registry, the mirror in a second registry process
    mirror = registry_factory()
    targets = [{"name": "public", "reference": registry.ref(f"t{uuid.uuid4().hex[:8]}/public/demo", "1.1")},
               {"name": "mirror", "reference": mirror.ref("mirror/demo", "1.1")}]
    st = Setup(sessions, registry, make_image, targets=targets, insecure=[registry.host, mirror.host])
    mirror.stop()
    first = {o.target: o for o in promote_run(sessions, st.run_id)}
    assert first["public"].outcome == "promoted"
    assert first["mirror"].outcome == "failed" and mirror.host in first["mirror"].detail
    assert exit_code(list(first.values())) == 3
    assert skopeo_digest(targets[0]["reference"]) == st.digest
    mirror.start()
    second = {o.target: o for o in promote_run(sessions, st.run_id)}
    assert second["public"].outcome == "skipped" and second["mirror"].outcome == "promoted"
    assert skopeo_digest(mirror.ref("mirror/demo", "1.1")) == st.digest
    assert [(r[0], r[1]) for r in rows(sessions, st.run_id)] == [
        ("public", "promoted"), ("mirror", "failed"), ("public", "skipped"), ("mirror", "promoted")]


def test_a_fail_recorded_during_a_copy_stops_the_remaining_targets(sessions, registry, make_image):
    """promote re-checks the digest's latest decision right before each target's copy."""
    from qualify.registry import RegistryClient

    st = Setup(sessions, registry, make_image)
    assert st.verdict == "PASS"

    class FailsAfterFirstCopy(RegistryClient):
        """A real client; after its first copy another process records a FAIL about the digest."""

        copies = 0

        def copy(self, source, target):  # type: ignore[no-untyped-def]
            result = super().copy(source, target)
            FailsAfterFirstCopy.copies += 1
            if FailsAfterFirstCopy.copies == 1:
                with sessions() as s:
                    run = repo.get_run(s, st.run_id)
                    repo.record_decision(s, run, "FAIL", [], "0" * 64, None)
                    s.commit()
            return result

    with FailsAfterFirstCopy([registry.host]) as client:
        outcomes = promote_run(sessions, st.run_id, client=client, actor="tester")
    assert [(o.target, o.outcome) for o in outcomes] == [
        ("public", "promoted"), ("vpc-cn-beijing", "refused"), ("vpc-cn-shanghai", "refused")]
    assert "is FAIL" in outcomes[1].detail and exit_code(outcomes) == 1
    refs = st.target_refs()
    assert skopeo_digest(refs["public"]) == st.digest and skopeo_digest(refs["vpc-cn-beijing"]) is None
    # and now the digest is refused outright
    with pytest.raises(PromotionRefused, match="is FAIL, not PASS"):
        promote_run(sessions, st.run_id)
