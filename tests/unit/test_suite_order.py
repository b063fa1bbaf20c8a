"""The suite's own order survives pytest-xdist (tests/support/suite_order.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from support import suite_order


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

    items = [item("b.py::image_free", "integration"), item("b.py::needs_the_image", "integration", "container"),
             item("c.py::image_free", "integration"), item("a.py::unit", "unit")]
    assert [i.nodeid for i in suite_order.ordered(items)] == [
        "a.py::unit", "c.py::image_free", "b.py::image_free", "b.py::needs_the_image"]


def test_the_suite_as_collected_is_in_that_order(request: pytest.FixtureRequest) -> None:
    modules = [suite_order.module_of(item) for item in request.session.items]
    starts = [m for k, m in enumerate(modules) if k == 0 or modules[k - 1] != m]
    assert len(starts) == len(set(starts)), "a module is split in the collection"
    ranks: dict[str, int] = {}
    for item in request.session.items:
        ranks[suite_order.module_of(item)] = max(ranks.get(suite_order.module_of(item), 0), suite_order.rank(item))
    assert [ranks[m] for m in starts] == sorted(ranks[m] for m in starts)
