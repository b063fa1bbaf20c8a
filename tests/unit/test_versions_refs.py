"""Version match rules and image references."""

from __future__ import annotations

import pytest

from qualify.imageref import InvalidReference, parse_reference
from qualify.versions import matches


@pytest.mark.parametrize(("rule", "expected", "actual", "ok"), [
    ("public", "2.6.0+ppu1.5.1", "2.6.0.7.post1+ppu1.5.1", True),   # the release note's torch
    ("public", "2.6.0+ppu1.5.1", "2.6.0.7.post1", False),            # label missing
    ("public", "2.6.0+ppu1.5.1", "2.6.0+ppu1.4.0", False),           # wrong label
    ("public", "2.6.0", "2.6.1", False),
    ("public", "0.15.4+ali", "0.15.4+ali", True),
    ("public", "1.5.0", "1.5.0-9", True),                              # non-PEP 440 (ACCL-P)
    ("prefix", "2.6", "2.6.0", True),
    ("prefix", "2.6", "2.60", False),
    ("prefix", "ubuntu 24.04", "ubuntu 24.04", True),
    ("prefix", "3.11", "3.11.7", True),
    ("exact", "0.0.29.post1", "0.0.29.post1", True),
    ("exact", "0.0.29.post1", "0.0.29", False),
    ("min", "1.1.0", "1.5.1", True),
    ("min", "1.1.0", "1.0.9", False),
    ("min", "1.1.0", "550.54.15", True),
])
def test_match_rules(rule: str, expected: str, actual: str, ok: bool) -> None:
    assert matches(rule, expected, actual)[0] is ok


def test_missing_component_is_a_reason_not_an_exception() -> None:
    assert matches("public", "2.6.0", None) == (False, "not found in the image")


def test_references() -> None:
    ref = parse_reference("egslingjun-registry.cn-wulanchabu.cr.aliyuncs.com/egslingjun/training-xpu-pytorch:25.05")
    assert (ref.registry, ref.repository, ref.tag) == (
        "egslingjun-registry.cn-wulanchabu.cr.aliyuncs.com", "egslingjun/training-xpu-pytorch", "25.05")
    digest = "sha256:" + "ab" * 32
    ref = parse_reference(f"127.0.0.1:5000/q/img@{digest}")
    assert ref.registry == "127.0.0.1:5000" and ref.digest == digest and ref.reference == digest
    assert parse_reference("ubuntu:24.04").registry == "docker.io"
    for bad in ("", "UPPER/x:1", "a b:1", "x:" + "t" * 200, "x@sha256:short"):
        with pytest.raises(InvalidReference):
            parse_reference(bad)
