"""Which containers a caller may call its leftovers: the engine's store is the node's, shared with whatever else runs
there (CI was red once because a test that shares the node counted another test's running container as its own)."""

from __future__ import annotations

import pytest

from qualify.executors.container import ContainerExecutor, container_name, qualify_containers

pytestmark = pytest.mark.unit


def test_the_name_is_read_from_the_command_the_executor_ran() -> None:
    case = {"case_id": "c", "kind": "synthetic", "params": {}, "env": {}, "timeout_s": 60}
    argv = ContainerExecutor(image="img", cache_root=None).run_argv(case, "qualify-0123abcd")
    assert container_name(argv) == "qualify-0123abcd"
    assert container_name(["podman", "run", "img"]) is None
    assert container_name(["podman", "run", "--name"]) is None  # a flag with no value names nothing


def test_leftovers_of_named_containers_ignore_the_nodes_other_containers() -> None:
    listing = "qualify-mine img:1\nqualify-neighbour img:1\nother-tool img:1\n"
    assert qualify_containers(listing) == ["qualify-mine", "qualify-neighbour"]  # the whole node: qualify's
    assert qualify_containers(listing, ["qualify-mine"]) == ["qualify-mine"]
    assert qualify_containers(listing, ["qualify-gone"]) == []  # a neighbour's running container is not mine
    assert qualify_containers(listing, []) == []
    assert qualify_containers("") == []


def test_leftovers_of_a_repository_are_its_images_by_tag_or_digest_only() -> None:
    # A `qualify run` in containers names its containers itself: the test that ran it asks for those of its image.
    mine = "127.0.0.1:5555/qualify/cpu-image"
    listing = "\n".join([
        f"qualify-a {mine}@sha256:{'1' * 64}",
        f"qualify-b {mine}:0.1-rc1",
        f"qualify-c {mine}",
        f"qualify-d {mine}-other:0.1",            # a longer repository name, not mine
        "qualify-e 127.0.0.1:5556/qualify/cpu-image:0.1",  # another registry (another test's)
        "qualify-f localhost/qualify/vllm-cpu:3c5d",
        f"tool-g {mine}:0.1",                     # not qualify's
    ])
    assert qualify_containers(listing, repository=mine) == ["qualify-a", "qualify-b", "qualify-c"]
    assert qualify_containers(listing, ["qualify-b", "qualify-f"], repository=mine) == ["qualify-b"]
    assert len(qualify_containers(listing)) == 6
