"""The order in which `pytest -n 2 --dist loadfile` hands the suite's modules to its two workers.

1. Unit tests: the fast answer.
2. The integration tests that need no container image.
3. Those that need the base image, then those that need the vLLM image: on a fresh machine `.ci/run` builds both
   beside the suite, and a test that needs one waits for it.
4. The short image-free modules (under FILLER_BELOW_S seconds), as fillers: see below.
5. Modules that run `alone` as a whole (support/machine_share.py), last. An `alone` module first waits for the other
   worker's current test to end (a shared module lets it in between two tests), idle, then leaves the other worker
   idle while it runs. At the end, the modules before it are done, and the other worker's idleness is the suite's
   tail, which it would have had anyway.

Within each group the longest module goes first (support/module_seconds.py: seconds measured in a CI run), the rule
that keeps two machines' ends close when jobs are handed out as machines free up. The groups of long modules end
with the vLLM engine's (165 s) while the other worker may already have run out of shared modules: an `alone` module
taken then waited, idle, for the other worker's whole current module (in the CI run of 2026-12-07 on an Intel Xeon:
147, 108 and 52 s of such waits); it now waits for that worker's current test. Ending the shared part with many
short modules still leaves each worker little to wait for.

pytest-xdist's file scheduler reorders modules by their number of tests (most first) unless told not to
(`--no-loadscope-reorder`): the suite ran the build tests while the base image was still building, and the alone
modules wherever their size put them. tests/conftest.py turns that off (`keep_the_suite_order`).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, Protocol, Sequence

import pytest

from support.module_seconds import SECONDS, UNKNOWN_S

UNIT, INTEGRATION, CONTAINER, VLLM, ALONE = range(5)
# The groups in the suite's order: an image-free module shorter than FILLER_BELOW_S goes after the image modules.
LONG, FILLER = "long", "filler"
GROUPS = (UNIT, (INTEGRATION, LONG), CONTAINER, VLLM, (INTEGRATION, FILLER), ALONE)
FILLER_BELOW_S = 40.0


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


def seconds_of(module: str) -> float:
    """The module's measured seconds (support/module_seconds.py), UNKNOWN_S for one not measured yet."""
    return SECONDS.get(PurePosixPath(module).stem, UNKNOWN_S)


def group(module_rank: int, module: str) -> int:
    """The module's place in GROUPS: its rank, an image-free module split into long ones and fillers."""
    if module_rank == INTEGRATION:
        return GROUPS.index((INTEGRATION, LONG if seconds_of(module) >= FILLER_BELOW_S else FILLER))
    return GROUPS.index(module_rank)


def module_ranks(items: Sequence[Any]) -> dict[str, int]:
    """Each module's rank: the highest of its items' (a module is one unit of xdist's file scheduler, placed where
    its first item is: test_build's image-free tests must not bring its image tests forward)."""
    ranks: dict[str, int] = {}
    for item in items:
        ranks[module_of(item)] = max(ranks.get(module_of(item), UNIT), rank(item))
    return ranks


def ordered(items: Sequence[Any]) -> list[Any]:
    """The items by their module's group, the longest module first within a group (the unit tests as written:
    seconds each), each module whole, its tests as written."""
    ranks = module_ranks(items)

    def key(item: Any) -> tuple[int, float]:
        module = module_of(item)
        place = group(ranks[module], module)
        return place, 0.0 if place == GROUPS.index(UNIT) else -seconds_of(module)

    return sorted(items, key=key)


def keep_the_suite_order(config: pytest.Config) -> None:
    """xdist's file scheduler keeps the collection's module order (pytest_collection_modifyitems sorts it)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
