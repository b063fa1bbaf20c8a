"""Several images per release (issue 28): the manifest's `images:`, each case's image, and one image's view."""

from __future__ import annotations

import copy

import pytest
import yaml
from support.gate import manifest_dict

from qualify.manifest import fingerprint
from qualify.manifest.cases import expand
from qualify.manifest.load import ManifestError, load_manifest_text

SERVING = {"name": "serving", "repository": "127.0.0.1:5000/qualify/demo-serving",
           "build": {"builder": "buildah", "containerfile": "serving/Containerfile"},
           "components": [{"name": "vllm", "expected": "0.9", "match": "prefix"}],
           "targets": [{"name": "public", "reference": "127.0.0.1:5000/pub/demo-serving:1.1"},
                       {"name": "vpc", "template": "vpc.{region-id}.example/x/{image:tag}", "regions": ["r1"]}]}


def load(data):
    return load_manifest_text(yaml.safe_dump(data, sort_keys=False), check_expiry=False).release


def with_serving(**image_extra):
    data = manifest_dict(images=[{**copy.deepcopy(SERVING), **image_extra}])
    data["inference"]["models"][0]["image"] = "serving"
    return data


def problems(data) -> str:
    with pytest.raises(ManifestError) as info:
        load(data)
    return "\n".join(str(p) for p in info.value.problems)


def test_each_case_runs_in_the_image_its_model_names_and_the_release_image_is_the_default():
    rel = load(with_serving())
    assert rel.image_names == ["demo", "serving"]
    images = {c.case_id: c.image for c in expand(rel)}
    assert images == {"train/tiny/base": None, "train/tiny/compile": None,
                      "infer/tq/none": "serving", "infer/tq/w8a8": "serving"}


def test_naming_the_release_image_is_the_same_as_naming_none_so_its_fingerprints_do_not_move():
    plain = {c.case_id: c for c in expand(load(manifest_dict()))}
    data = manifest_dict()
    data["training"]["models"][0]["image"] = "demo"
    named = {c.case_id: c for c in expand(load(data))}
    for case_id, case in plain.items():
        assert named[case_id].image is None
        assert fingerprint.of_case(named[case_id], {}) == fingerprint.of_case(case, {})
        assert named[case_id].to_dict() == case.to_dict()


def test_a_case_in_another_image_is_compared_with_its_like_only():
    cases = {c.case_id: c for c in expand(load(with_serving()))}
    fp = fingerprint.of_case(cases["infer/tq/none"], {})
    assert fp["image"] == "serving"
    assert "image" not in fingerprint.of_case(cases["train/tiny/base"], {})


def test_one_images_view_puts_its_repository_tags_build_components_and_targets_in_the_releases_places():
    rel = load(with_serving(candidate_tag="1.1-rc2"))
    view = rel.for_image("serving")
    assert view.release.repository == SERVING["repository"] and view.release.candidate_tag == "1.1-rc2"
    assert view.release.previous_tag == "1.0"  # inherited from the release
    assert view.build.containerfile == "serving/Containerfile"
    assert [c.name for c in view.components] == ["vllm"]
    assert [(t.name, t.reference) for t in view.expanded_targets()] == [
        ("public", "127.0.0.1:5000/pub/demo-serving:1.1"), ("vpc-r1", "vpc.r1.example/x/demo-serving:1.1")]
    assert view.images == [] and view.gate == rel.gate and view.release.name == "demo"
    assert rel.for_image(None) is rel and rel.for_image("demo") is rel
    with pytest.raises(KeyError):
        rel.for_image("nope")


@pytest.mark.parametrize("change, words", [
    (lambda d: d["inference"]["models"][0].update(image="servng"),
     ["inference.models[0].image", "'servng'", "demo, serving"]),
    (lambda d: d["custom_cases"].__setitem__(0, {"name": "x", "kind": "sleep", "image": "other"}),
     ["custom_cases[0].image", "'other'"]),
    (lambda d: d["images"][0].update(name="demo"), ["images[0].name", "'demo'", "release.name"]),
    (lambda d: d["images"].append({**copy.deepcopy(SERVING), "repository": "127.0.0.1:5000/qualify/b"}),
     ["images[1].name", "'serving'"]),
    (lambda d: d["images"][0].update(repository="127.0.0.1:5000/qualify/demo"),
     ["images[0].repository", "another image's repository"]),
    (lambda d: d["images"][0].update(repository="127.0.0.1:5000/qualify/x:1"), ["repository", "without tag"]),
    (lambda d: d["images"][0].update(candidate_tag="bad tag"), ["candidate_tag", "not a valid image tag"]),
    (lambda d: d["images"][0].update(build={"builder": "buildah"}), ["needs 'containerfile'"]),
    (lambda d: d["images"][0].update(targets=[{"name": "t", "reference": "127.0.0.1:5000/x@sha256:" + "a" * 64}]),
     ["must end in a tag"]),
    (lambda d: d["images"][0].update(colour="blue"), ["colour"]),
    (lambda d: d["images"][0].pop("build"), ["build"]),
])
def test_a_wrong_image_is_refused_with_its_field_and_value(change, words):
    data = with_serving()
    data.setdefault("custom_cases", [{"name": "x", "kind": "sleep"}])
    change(data)
    text = problems(data)
    for word in words:
        assert word in text, text


def test_the_verdict_checks_each_images_components_in_that_image_only():
    from qualify.gate.checks import ComponentData
    from qualify.gate.evaluate import evaluate
    from support.gate import TODAY, good_results

    data = with_serving()
    data["release"]["previous_tag"] = None  # a first release: the components decide alone
    data["gate"]["regression"]["baseline"] = "optional"
    rel = load(data)
    cases = expand(rel)
    own = [ComponentData("torch", True, "2.13.0", "2.13.0"), ComponentData("apex", True, "0.1", "0.1")]
    serving_ok = ComponentData("vllm", True, "0.9", "0.9.2", rule="prefix", image="serving")

    def verdict(components):
        return evaluate(rel.gate, cases, good_results(rel), components, None, today=TODAY,
                        expected_components=rel.components, previous_named=False,
                        image_components={i.name: i.components for i in rel.images})

    assert verdict(own + [serving_ok]).verdict == "PASS"
    # The serving image's vllm checked in the training image does not count for the serving image.
    judged = verdict(own + [ComponentData("vllm", True, "0.9", "0.9.2", rule="prefix")])
    [missing] = [r for r in judged.reasons if r.check == "component:serving/vllm"]
    assert missing.status == "INCOMPLETE" and judged.verdict == "INCOMPLETE"
    wrong = ComponentData("vllm", False, "0.9", "0.8.5", rule="prefix", image="serving")
    judged = verdict(own + [wrong])
    [failed] = [r for r in judged.reasons if r.status == "FAIL"]
    assert failed.check == "component:serving/vllm" and "serving/vllm: expected 0.9" in failed.message
    assert judged.verdict == "FAIL"
