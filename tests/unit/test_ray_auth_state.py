"""execution/ray_auth.py: a local Ray's token mode does not outlive it; the environment is put back as it was."""

from __future__ import annotations

import os

import pytest

from qualify.execution import ray_auth

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _nothing_remembered():
    ray_auth.restore()  # no start remembered by an earlier test
    yield
    ray_auth.restore()


def test_an_unset_mode_is_unset_again_after_the_local_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ray_auth.AUTH_MODE_ENV, raising=False)
    ray_auth.remember()
    os.environ[ray_auth.AUTH_MODE_ENV] = "token"  # what ray.init does for a local cluster: the variable, and
    ray_auth.refresh()  # its process-wide config re-read (ray._private.authentication's _enable_token_auth)
    assert ray_auth.token_mode_cached()
    ray_auth.restore()
    assert ray_auth.AUTH_MODE_ENV not in os.environ
    assert not ray_auth.token_mode_cached()  # Ray's cached config re-read from the environment


def test_the_users_own_mode_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ray_auth.AUTH_MODE_ENV, "disabled")
    ray_auth.remember()
    os.environ[ray_auth.AUTH_MODE_ENV] = "token"
    ray_auth.restore()
    assert os.environ[ray_auth.AUTH_MODE_ENV] == "disabled"


def test_the_first_start_is_what_is_remembered_and_restore_is_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ray_auth.AUTH_MODE_ENV, raising=False)
    ray_auth.remember()
    os.environ[ray_auth.AUTH_MODE_ENV] = "token"
    ray_auth.remember()  # a second start while the first is up: the state before the first stays the one
    ray_auth.restore()
    assert ray_auth.AUTH_MODE_ENV not in os.environ
    os.environ[ray_auth.AUTH_MODE_ENV] = "token"  # set by someone else later: no start remembered, left alone
    ray_auth.restore()
    assert os.environ[ray_auth.AUTH_MODE_ENV] == "token"


def test_the_cached_mode_follows_the_environment_on_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ray_auth.AUTH_MODE_ENV, "token")
    assert ray_auth.refresh()
    assert ray_auth.token_mode_cached()
    monkeypatch.delenv(ray_auth.AUTH_MODE_ENV)
    assert ray_auth.refresh()
    assert not ray_auth.token_mode_cached()
