"""The CLI's failure paths that need a network connection: a registry or a database that does not answer
is an infrastructure error (exit 3), one line, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli_failures import NETWORK, check_failure, make_env, row_id

from qualify.errors import ExitCode


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return make_env(tmp_path, monkeypatch)


@pytest.mark.parametrize("argv,code,text", NETWORK, ids=[row_id(r) for r in NETWORK])
def test_network_failure_paths_exit_with_the_documented_code(env: dict[str, str], argv: list[str], code: ExitCode,
                                                             text: str) -> None:
    assert code == ExitCode.INFRA
    check_failure(env, argv, code, text)
