"""A release of several images (issue 28) promoted with the real registry and database: each image to its own
targets, all or none; `gate check` answers each image's digest in its own repository only."""

from __future__ import annotations

import uuid

import pytest
from support.gate import manifest_text, seed_run
from support.registry import RegistryProcess, skopeo_digest

from qualify.gate.judging import evaluate_and_commit
from qualify.gate.push_check import check_push
from qualify.imageref import parse_reference
from qualify.promote import exit_code, promote_run
from qualify.store import repo

pytestmark = pytest.mark.registry


class TwoImages:
    """A release whose training image and serving image were both qualified by one PASS run."""

    def __init__(self, sessions, registry: RegistryProcess, make_image, *, serving_registry=None,
                 serving_target_host: str | None = None) -> None:
        self.ns = "m" + uuid.uuid4().hex[:8]
        self.registry = registry
        host = serving_target_host or registry.host
        self.targets = {"public": registry.ref(f"{self.ns}/pub/demo", "1.1"),
                        "serving/public": f"{host}/{self.ns}/pub/demo-serving:1.1"}
        serving_repo = registry.ref(f"{self.ns}/demo-serving")
        self.text = manifest_text(
            release_extra={"repository": registry.ref(f"{self.ns}/demo"), "previous_tag": None},
            images=[{"name": "serving", "repository": serving_repo,
                     "build": {"builder": "buildah", "containerfile": "serving/Containerfile"},
                     "targets": [{"name": "public", "reference": self.targets["serving/public"]}]}],
            promotion={"targets": [{"name": "public", "reference": self.targets["public"]}],
                       "insecure_registries": sorted({registry.host, host})})
        self.digest = make_image(registry, f"{self.ns}/demo", "1.1-rc1", b"training")
        self.serving = make_image(registry, f"{self.ns}/demo-serving", "1.1-rc1", b"serving")
        with sessions() as s:
            run = seed_run(s, self.text, digest=self.digest, further={"serving": self.serving})
            s.commit()
            self.run_id = run.id
        assert evaluate_and_commit(sessions, self.run_id).judgement.verdict == "PASS"


def test_each_image_goes_to_its_own_targets_and_gate_check_binds_each_digest_to_its_repository(
        sessions, registry, make_image):
    st = TwoImages(sessions, registry, make_image)
    outcomes = promote_run(sessions, st.run_id, actor="tester")
    assert [(o.target, o.outcome) for o in outcomes] == [("public", "promoted"), ("serving/public", "promoted")]
    assert exit_code(outcomes) == 0
    assert skopeo_digest(st.targets["public"]) == st.digest
    assert skopeo_digest(st.targets["serving/public"]) == st.serving
    with sessions() as s:
        ok = check_push(s, parse_reference(st.targets["serving/public"]), st.serving, tag_digest=st.serving)
        assert ok.ok and ok.run == st.run_id, ok.to_dict()
        # The serving image's digest is not qualified as the training image (nor the other way round).
        wrong = check_push(s, parse_reference(registry.ref(f"{st.ns}/demo", "1.1")), st.serving)
        assert not wrong.ok and "is not where" in wrong.problems[0], wrong.to_dict()
        assert "demo-serving" in wrong.problems[0]
        assert repo.find_runs(s, digest=st.serving)[0].id == st.run_id


def test_one_image_that_would_be_refused_holds_every_image_back(sessions, registry, make_image):
    st = TwoImages(sessions, registry, make_image)
    other = make_image(registry, f"{st.ns}/pub/demo-serving", "1.1", b"someone else's")
    outcomes = promote_run(sessions, st.run_id, actor="tester")
    by = {o.target: o for o in outcomes}
    assert by["serving/public"].outcome == "refused" and "never moved" in by["serving/public"].detail
    assert by["public"].outcome == "refused" and "held back (all or none): serving/public" in by["public"].detail
    assert exit_code(outcomes) == 1
    assert skopeo_digest(st.targets["public"]) is None  # nothing was copied
    assert skopeo_digest(st.targets["serving/public"]) == other
    with sessions() as s:
        assert {(p.target_name, p.outcome) for p in repo.promotions(s, st.run_id)} == {
            ("public", "refused"), ("serving/public", "refused")}


def test_a_copy_that_fails_undoes_what_the_promotion_wrote(sessions, registry, registry_factory, make_image):
    # The serving image's target registry answers reads and refuses every write (Distribution's read-only
    # maintenance mode): the checks before copying pass, its copy fails after the training image's landed.
    readonly = registry_factory()
    readonly.stop()
    readonly.readonly = True
    readonly.start()
    st = TwoImages(sessions, registry, make_image, serving_target_host=readonly.host)
    old = make_image(registry, f"{st.ns}/pub/demo", "1.1", b"the tag's old image")
    outcomes = promote_run(sessions, st.run_id, actor="tester", force=True, reason="re-publishing 1.1 on purpose")
    by = {o.target: o for o in outcomes}
    assert by["serving/public"].outcome == "failed" and "405" in by["serving/public"].detail, \
        by["serving/public"]
    assert by["public"].outcome == "failed" and "undone" in by["public"].detail, by["public"]
    assert f"points to {old} again" in by["public"].detail
    assert exit_code(outcomes) == 3
    assert skopeo_digest(st.targets["public"]) == old  # the moved tag is back where it was
    assert skopeo_digest(st.targets["serving/public"]) is None


def test_a_new_tag_the_promotion_wrote_is_deleted_when_another_image_fails(sessions, registry, registry_factory,
                                                                          make_image):
    readonly = registry_factory()
    readonly.stop()
    readonly.readonly = True
    readonly.start()
    st = TwoImages(sessions, registry, make_image, serving_target_host=readonly.host)
    outcomes = promote_run(sessions, st.run_id, actor="tester")
    by = {o.target: o for o in outcomes}
    assert by["public"].outcome == "failed" and "the new tag is deleted" in by["public"].detail, by["public"]
    assert skopeo_digest(st.targets["public"]) is None


def test_each_image_is_attested_as_itself_and_verifies_only_in_its_own_repositories(
        sessions, registry, make_image, tmp_path, monkeypatch):
    from support.attest import key_pair
    from support.cli import run_cli

    private, public = key_pair(tmp_path / "keys")
    monkeypatch.setenv("QUALIFY_ATTEST_KEY_FILE", str(private))
    monkeypatch.delenv("QUALIFY_ATTEST_KEY", raising=False)
    st = TwoImages(sessions, registry, make_image)  # the decision is attested as it is committed
    assert {o.outcome for o in promote_run(sessions, st.run_id, actor="tester")} == {"promoted"}

    def verify(reference: str):
        return run_cli("verify", reference, "--key", str(public), "--insecure-registry", registry.host)

    serving_candidate = registry.ref(f"{st.ns}/demo-serving", "1.1-rc1")
    for reference, digest in ((serving_candidate, st.serving), (st.targets["serving/public"], st.serving),
                              (registry.ref(f"{st.ns}/demo", "1.1-rc1"), st.digest),
                              (st.targets["public"], st.digest)):
        proc = verify(reference)
        assert proc.returncode == 0 and proc.stdout.startswith("PASS:") and digest in proc.stdout, (
            reference, proc.stdout, proc.stderr)
    # The serving image's signed statement names its own repositories only (a digest copied under the training
    # image's repository is refused, from the attestation as from the database).
    from qualify.attest import oci
    from qualify.attest.check import collect
    from qualify.attest.signing import load_public_key
    from qualify.imageref import ImageRef
    from qualify.registry import RegistryClient

    with RegistryClient([registry.host]) as client:
        layers = oci.read(client, ImageRef(registry.host, f"{st.ns}/demo-serving"), st.serving)
        client.copy(parse_reference(registry.ref(f"{st.ns}/demo-serving", digest=st.serving)),
                    parse_reference(registry.ref(f"{st.ns}/demo", "smuggled")))
    found, rejected = collect(layers, st.serving, load_public_key(public))
    [pred] = {a.predicate.model_dump_json(): a.predicate for a in found if a.predicate}.values()
    assert pred.candidate.endswith("/demo-serving:1.1-rc1") and not rejected
    assert sorted(pred.qualified_repositories) == sorted({registry.ref(f"{st.ns}/demo-serving"),
                                                          registry.ref(f"{st.ns}/pub/demo-serving")})
    proc = verify(registry.ref(f"{st.ns}/demo", "smuggled"))
    assert proc.returncode != 0, proc.stdout + proc.stderr
