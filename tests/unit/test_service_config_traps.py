"""Configuration traps of `qualify serve` and the database URL (issue 25 item 9)."""

from __future__ import annotations

import pytest

from qualify.cli.serve import is_loopback_host
from qualify.errors import BadInput
from qualify.settings import Settings, check_database_url, parse_protect, redact_url


@pytest.mark.parametrize("pattern", ["127.0.0.1:5600", "localhost:5600", "registry.example.com:443", "[::1]:5000"])
def test_a_registry_address_alone_is_not_read_as_repository_and_tag(pattern: str) -> None:
    with pytest.raises(BadInput, match=r"/\*"):
        parse_protect(pattern)


def test_protect_patterns_that_stay_valid() -> None:
    assert parse_protect("127.0.0.1:5600/*") == (("127.0.0.1:5600/*", "*"),)
    assert parse_protect("127.0.0.1:5600/team/*:1.*") == (("127.0.0.1:5600/team/*", "1.*"),)
    assert parse_protect("app:1") == (("app", "1"),)  # a repository without a dot keeps its numeric tag


def test_insecure_registries_are_split_on_commas_in_flags_too() -> None:
    settings = Settings.load(env={}, insecure_registries=["a:1,b:2", " c:3 "])
    assert settings.insecure_registries == ("a:1", "b:2", "c:3")


@pytest.mark.parametrize("host, loopback", [("::1", True), ("[::1]", True), ("127.0.0.2", True),
                                            ("localhost", True), ("0.0.0.0", False), ("::", False),
                                            ("example.com", False)])
def test_listen_addresses(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize("url, secret", [
    ("postgresql://u:s3cr3t@127.0.0.1/db", "s3cr3t"),
    ("postgresql+psycopg://u@127.0.0.1:5432/db?password=s3cr3t&sslmode=disable", "s3cr3t"),
    ("postgresql://u@h/db?sslmode=require&PASSWORD=s3cr3t", "s3cr3t"),
    ("postgresql://u:pa@ss@127.0.0.1/db", "ss"),
    ("postgresql://u:p/q?r@127.0.0.1/db", "p/q?r")])
def test_passwords_in_database_urls_are_never_shown(url: str, secret: str) -> None:
    shown = redact_url(url)
    assert secret not in shown and "***" in shown, shown


def test_an_unencoded_at_in_a_password_is_refused_without_showing_it() -> None:
    with pytest.raises(BadInput, match="%40") as refused:
        check_database_url("postgresql://u:pa@ss@127.0.0.1/db")
    assert "ss" not in str(refused.value).split("@", 1)[0] and "pa@ss" not in str(refused.value)
    assert check_database_url("postgresql://u:pa%40ss@127.0.0.1/db").endswith("/db")
