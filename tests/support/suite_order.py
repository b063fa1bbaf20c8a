"""The order in which `pytest -n 2 --dist loadfile` hands the suite's modules to its two workers.

1. Unit tests: the fast answer.
2. The integration tests that need no container image.
3. Those that need the base image, then those that need the vLLM image: on a fresh machine `.ci/run` builds both
   beside the suite, and a test that needs one waits for it.
4. Modules that run `alone` as a whole (support/machine_share.py), last. An `alone` module first waits for the other
   worker's current module to end, idle, then leaves the other worker idle while it runs. At the end, the modules
   before it are done, and the other worker's idleness is the suite's tail, which it would have had anyway.

pytest-xdist's file scheduler reorders modules by their number of tests (most first) unless told not to
(`--no-loadscope-reorder`): the suite ran the build tests while the base image was still building, and the alone
modules wherever their size put them. tests/conftest.py turns that off (`keep_the_suite_order`).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import pytest

UNIT, INTEGRATION, CONTAINER, VLLM, ALONE = range(5)


class Item(Protocol):
    def get_closest_marker(self, name: str) -> Any: ...

    def getparent(self, cls: type) -> Any: ...


def module_alone(item: Item) -> bool:
    """Is the item's whole module marked `alone` (its pytestmark), not just the item?"""
    module = item.getparent(pytest.Module)
    return module is not None and any(m.name == "alone" for m in module.own_markers)


def rank(item: Item) -> int:
    if item.get_closest_marker("unit"):
        return UNIT
    if module_alone(item):
        return ALONE
    if item.get_closest_marker("vllm"):
        return VLLM
    return CONTAINER if item.get_closest_marker("container") else INTEGRATION


def module_of(item: Any) -> str:
    return item.nodeid.split("::", 1)[0]


def ordered(items: Sequence[Any]) -> list[Any]:
    """The items by their module's rank: the highest of its items' (a module is one unit of xdist's file scheduler,
    placed where its first item is: test_build's image-free tests must not bring its image tests forward), stable
    within a rank (files and tests as written)."""
    ranks: dict[str, int] = {}
    for item in items:
        ranks[module_of(item)] = max(ranks.get(module_of(item), UNIT), rank(item))
    return sorted(items, key=lambda item: ranks[module_of(item)])


def keep_the_suite_order(config: pytest.Config) -> None:
    """xdist's file scheduler keeps the collection's module order (pytest_collection_modifyitems sorts it)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
