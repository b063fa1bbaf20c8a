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
    listing = "qualify-mine\nqualify-neighbour\nother-tool\n"
    assert qualify_containers(listing) == ["qualify-mine", "qualify-neighbour"]  # the whole node: qualify's
    assert qualify_containers(listing, ["qualify-mine"]) == ["qualify-mine"]
    assert qualify_containers(listing, ["qualify-gone"]) == []  # a neighbour's running container is not mine
    assert qualify_containers(listing, []) == []
    assert qualify_containers("") == []
