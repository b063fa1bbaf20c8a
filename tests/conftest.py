"""Shared fixtures: databases on SQLite and PostgreSQL, caches, paths."""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# pytest caches its assertion-rewritten test modules only where bytecode may be written. These machines set
# PYTHONDONTWRITEBYTECODE, so every test worker rewrote and compiled all ~200 test modules on every run: 2.5 s of
# the unit tests' 6 s collection, in each worker. The cache lives in the checkout's (ignored) __pycache__ folders;
# the processes the tests start keep the environment's setting.
sys.dont_write_bytecode = False
# benchmarks/ holds measurement code some tests reuse (e.g. the gate's simulation).
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from support import suite_order, timeline  # noqa: E402
from support.db import PG_ADMIN_URL, psycopg_dsn  # noqa: E402

pytest_plugins = ["support.registry", "support.service"]
_TIMELINE: list[Path | None] = [None]  # QUALIFY_TEST_TIMELINE, on the controller only (support/timeline.py)


@pytest.fixture(scope="session", autouse=True)
def _persistent_caches() -> None:
    # DeepSpeed op builds and torch.compile caches survive between test sessions (CI pays once).
    cache = Path(os.environ.setdefault("QUALIFY_CACHE_DIR", str(Path.home() / ".cache" / "qualify")))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache / "torch_extensions"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(autouse=True)
def _environment_restored_after_each_test():
    """What one test's in-process code puts in os.environ (Ray's single-machine switch, set when a
    flow starts a local cluster in this process, say) must not change how the next test's
    subprocesses behave: a `ray start --address` inheriting that switch refuses to join."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)
        if "ray" in sys.modules:  # and Ray's cached config (its authentication mode) re-read from it
            from qualify.execution import ray_auth

            ray_auth.refresh()


def postgres_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(psycopg_dsn(), connect_timeout=3):
            return True
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture(scope="session")
def pg_server() -> str:
    if not postgres_available():
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is not answering on 127.0.0.1:5432 (CI must start it)")
        pytest.skip("PostgreSQL is not answering on 127.0.0.1:5432")
    return PG_ADMIN_URL


def _new_pg_database(admin_url: str) -> tuple[str, str]:
    import psycopg

    name = f"qualify_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(psycopg_dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, admin_url.rsplit("/", 1)[0] + f"/{name}"


def _drop_pg_database(name: str) -> None:
    import psycopg

    with psycopg.connect(psycopg_dsn(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty, migrated database URL: a SQLite file, or a fresh PostgreSQL database."""
    from qualify.store.engine import upgrade

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'qualify.db'}"
        upgrade(url)
        yield url
        return
    admin = request.getfixturevalue("pg_server")
    name, url = _new_pg_database(admin)
    try:
        upgrade(url)
        yield url
    finally:
        from sqlalchemy import create_engine  # noqa: F401 - engines are disposed by the tests

        _drop_pg_database(name)


@pytest.fixture
def sessions(db_url: str):
    from qualify.store.engine import open_database

    engine, factory = open_database(db_url, migrate=False)
    yield factory
    engine.dispose()


@pytest.fixture(scope="module", autouse=True)
def _machine_share(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Under `pytest -n 2`: a module marked `alone` has the machine to itself, the others share it two at a time
    (support/machine_share.py). One process (no xdist): nothing to share."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield None
        return
    from support.machine_share import MachineShare

    share = MachineShare(tmp_path_factory.getbasetemp().parent / "machine-share")
    alone = any(m.name == "alone" for m in request.node.iter_markers())
    share.alone() if alone else share.shared()
    try:
        yield None if alone else share
    finally:
        share.close()


_NEXT_ITEM = pytest.StashKey["pytest.Item | None"]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    item.stash[_NEXT_ITEM] = nextitem  # _alone_test: does this worker's next test keep the machine?
    return (yield)


def _alone_in_shared_module(item: pytest.Item) -> bool:
    return any(m.name == "alone" for m in item.own_markers)


@pytest.fixture(autouse=True)
def _alone_test(request: pytest.FixtureRequest, _machine_share):
    """A test marked `alone` in a module that shares the machine has it to itself while it runs. The spell lasts
    over the module's consecutive `alone` tests (each hand-over would wait for the other worker's next module),
    and after the module's last test until the module lets go (taking a shared hold back first would wait for
    whatever `alone` module the other worker queued meanwhile)."""
    if _machine_share is None:
        yield
        return
    if not _alone_in_shared_module(request.node):
        _machine_share.let_an_alone_holder_in()  # before the test's own fixtures: the module's are up, idle
        yield
        return
    _machine_share.begin_alone_spell()
    try:
        yield
    finally:
        following = request.node.stash.get(_NEXT_ITEM, None)
        if following is not None and following.module is request.node.module and \
                not _alone_in_shared_module(following):
            _machine_share.end_alone_spell()


def pytest_configure(config: pytest.Config) -> None:
    suite_order.keep_the_suite_order(config)
    # The controller (or a run without workers) writes the timeline; a worker's reports reach it anyway. Taken out
    # of the environment before the workers start, so that a pytest a test runs never writes into it.
    path = os.environ.pop("QUALIFY_TEST_TIMELINE", None)
    _TIMELINE[0] = Path(path) if path and not hasattr(config, "workerinput") else None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _TIMELINE[0] is not None and (phase := timeline.phase_of(report)) is not None:
        timeline.append(_TIMELINE[0], phase)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _TIMELINE[0] is not None:
        for line in timeline.summary(timeline.read(_TIMELINE[0])):
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test is `unit` or `integration` by the folder it lives in (`-m unit` is the fast path); the order
    is support/suite_order.py's (stable within each group: files and tests as written). The images build meanwhile
    (`.ci/run` starts scripts/base-image.sh and scripts/vllm-image.sh beside the suite; a test's own call of the
    script waits on the script's lock and finds the image made)."""
    for item in items:
        parts = Path(str(item.fspath)).parts
        item.add_marker(pytest.mark.unit if "unit" in parts else pytest.mark.integration)
    items[:] = suite_order.ordered(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the imports and the collection made (torch, Prefect, Ray, pydantic models: millions of objects) is moved
    out of the garbage collector's sight: every full collection, automatic or a gc.collect() in the code under test,
    scanned all of it again (0.3 s a call in the vLLM adapter's tests)."""
    import gc

    gc.freeze()
