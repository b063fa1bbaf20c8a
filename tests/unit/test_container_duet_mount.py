"""Duet with the container executor: each side's container gets the barrier folder the duet runner made, mounted
at the same path, and nothing else a case document could name."""

from __future__ import annotations

import pytest

from qualify.executors.container import ContainerExecutor

pytestmark = pytest.mark.unit


def _argv(duet: object) -> list[str]:
    case = {"case_id": "c", "kind": "synthetic", "params": {}, "env": {}, "timeout_s": 60,
            **({"duet": duet} if duet is not None else {})}
    return ContainerExecutor(image="img", cache_root=None).run_argv(case, "qualify-t")


def test_a_duet_side_gets_its_barrier_folder_mounted_at_the_same_path() -> None:
    argv = _argv({"dir": "/tmp/qualify-duet-ab12cd", "side": 0, "cpus": [0]})
    assert argv[argv.index("/tmp/qualify-duet-ab12cd:/tmp/qualify-duet-ab12cd") - 1] == "--volume"
    assert not any("qualify-duet" in a for a in _argv(None))  # a case that is no duet side mounts nothing of it


@pytest.mark.parametrize("folder", ["/etc", "relative/qualify-duet-x", "/tmp/qualify-duet-x/../../etc",
                                    "/tmp/qualify-duet-x:/etc", "/tmp/qualify-duet-x,ro", "/tmp/other", 42])
def test_anything_but_a_duet_barrier_folder_is_refused_never_mounted(folder: object) -> None:
    with pytest.raises(ValueError, match="not a duet barrier folder"):
        _argv({"dir": folder, "side": 0})
