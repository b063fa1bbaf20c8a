"""The suite's own order survives pytest-xdist (tests/support/suite_order.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from support import suite_order
from support.module_seconds import SECONDS


def test_xdist_keeps_the_collection_order_of_modules(pytestconfig: pytest.Config) -> None:
    # xdist's file scheduler sorted modules by their number of tests: container tests ran while the image built.
    if not hasattr(pytestconfig.option, "loadscopereorder"):
        pytest.skip("pytest-xdist is not installed")
    assert pytestconfig.option.loadscopereorder is False


def _item(*marks: str, module_marks: tuple[str, ...] = ()) -> SimpleNamespace:
    module = SimpleNamespace(own_markers=[SimpleNamespace(name=m) for m in module_marks])
    every = set(marks) | set(module_marks)
    return SimpleNamespace(get_closest_marker=lambda name: name if name in every else None,
                           getparent=lambda cls: module if cls is pytest.Module else None)


def test_unit_then_image_free_then_images_then_alone_modules() -> None:
    items = {
        "alone module": _item("integration", module_marks=("alone", "slow")),
        "vllm": _item("integration", "vllm", "container"),
        "unit": _item("unit"),
        "container": _item("integration", "container"),
        "alone test of a shared module": _item("integration", "alone"),
        "image-free": _item("integration"),
        "alone container module": _item("integration", module_marks=("alone", "container")),
    }
    ranked = sorted(items, key=lambda name: suite_order.rank(items[name]))
    assert ranked == ["unit", "alone test of a shared module", "image-free", "container", "vllm", "alone module",
                      "alone container module"]


def test_a_module_goes_where_its_highest_ranked_test_goes_and_stays_whole() -> None:
    def item(nodeid: str, *marks: str) -> SimpleNamespace:
        got = _item(*marks)
        got.nodeid = nodeid
        return got

    # test_multinode is long and image-free (support/module_seconds.py): it goes before any image module.
    items = [item("b.py::image_free", "integration"), item("b.py::needs_the_image", "integration", "container"),
             item("test_multinode.py::image_free", "integration"), item("a.py::unit", "unit")]
    assert [i.nodeid for i in suite_order.ordered(items)] == [
        "a.py::unit", "test_multinode.py::image_free", "b.py::image_free", "b.py::needs_the_image"]


def test_short_image_free_modules_fill_in_after_the_image_modules_and_the_longest_go_first() -> None:
    def item(module: str, *marks: str, module_marks: tuple[str, ...] = ()) -> SimpleNamespace:
        got = _item(*marks, module_marks=module_marks)
        got.nodeid = f"tests/integration/{module}.py::t"
        return got

    # Seconds from support/module_seconds.py: multinode 191, flow 127, paired_e2e 54, store 12, a new module 20.
    items = [item("test_store", "integration"), item("test_alone", module_marks=("alone",)),
             item("test_vllm_engine", "integration", "vllm"), item("test_flow", "integration"),
             item("test_never_measured", "integration"), item("test_build", "integration", "container"),
             item("test_multinode", "integration"), item("test_system_image", "integration", "container"),
             item("test_paired_e2e", "integration"), item("a", "unit"), item("b", "unit")]
    assert [i.nodeid.split("/")[-1].split(".")[0] for i in suite_order.ordered(items)] == [
        "a", "b",  # the unit tests as written
        "test_multinode", "test_flow", "test_paired_e2e",  # long image-free modules, longest first
        "test_system_image", "test_build", "test_vllm_engine",  # the image modules, longest first
        "test_never_measured", "test_store",  # the fillers, longest first (a new module: UNKNOWN_S)
        "test_alone"]
    assert suite_order.seconds_of("tests/integration/test_never_measured.py") == suite_order.UNKNOWN_S
    assert suite_order.UNKNOWN_S < suite_order.FILLER_BELOW_S  # a new module is a filler until measured


def test_every_measured_module_exists() -> None:
    """A figure for a module that was renamed or removed would order nothing: the table follows the suite."""
    folder = Path(__file__).resolve().parents[1] / "integration"
    assert sorted(m for m in SECONDS if not (folder / f"{m}.py").exists()) == []


def test_the_suite_as_collected_is_in_that_order(request: pytest.FixtureRequest) -> None:
    modules = [suite_order.module_of(item) for item in request.session.items]
    starts = [m for k, m in enumerate(modules) if k == 0 or modules[k - 1] != m]
    assert len(starts) == len(set(starts)), "a module is split in the collection"
    ranks = suite_order.module_ranks(request.session.items)
    places = [suite_order.group(ranks[m], m) for m in starts]
    assert places == sorted(places)
    for k in range(1, len(starts)):  # within a group (the unit tests aside), the longest first
        if places[k] == places[k - 1] and places[k] != suite_order.GROUPS.index(suite_order.UNIT):
            assert suite_order.seconds_of(starts[k - 1]) >= suite_order.seconds_of(starts[k]), starts[k - 1:k + 1]
