"""Bad values are bad input, named, never an infrastructure error (issues 24.10-24.12)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from qualify.cli.outputs import output_dir, output_file
from qualify.cli.pipes import ClosedPipeSafe
from qualify.errors import BadInput, InfraError
from qualify.imageref import InvalidReference, parse_reference
from qualify.store import repo
from qualify.store.engine import check_url, make_engine
from qualify.store.models import Base

UNICODE_TAGS = ["ṫäg٣", "täg", "tag٣", "١٢", "ｔａｇ", "tag\u200b", "ß"]


@pytest.mark.parametrize("url", ["foo", "", "mysql://u@h/db", "mysql+pymysql://u@h/db", "oracle://h",
                                 "mssql://h/db", "sqlite://", "http://example/db", "postgresql"])
def test_a_database_url_that_qualify_cannot_use_is_bad_input(url: str) -> None:
    with pytest.raises(BadInput) as info:
        check_url(url)
    assert repr(url) in str(info.value) or url == ""


@pytest.mark.parametrize("url", ["sqlite:///x.db", "sqlite:////abs/x.db", "postgresql://u@127.0.0.1/db",
                                 "postgresql+psycopg://u:p@127.0.0.1:5432/db"])
def test_the_databases_qualify_uses_pass(url: str) -> None:
    assert check_url(url).get_backend_name() in ("sqlite", "postgresql")


def test_a_password_in_a_bad_url_is_not_shown() -> None:
    with pytest.raises(BadInput) as info:
        check_url("mysql://user:s3cret@127.0.0.1/db")
    assert "s3cret" not in str(info.value)


def test_a_read_only_open_never_creates_the_file_or_its_folders(tmp_path: Path) -> None:
    path = tmp_path / "fresh" / "data" / "qualify.db"
    with pytest.raises(InfraError, match="no results database"):
        make_engine(f"sqlite:///{path}", create=False)
    assert not (tmp_path / "fresh").exists()


@pytest.mark.parametrize("run_id", [0, -1, 2**31, 10**19, 99999999999999999999, -(10**30)])
def test_a_run_id_out_of_range_is_no_run(run_id: int) -> None:
    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        assert repo.get_run(session, run_id) is None


@pytest.mark.parametrize("tag", UNICODE_TAGS)
def test_a_tag_outside_ascii_is_refused_in_a_reference(tag: str) -> None:
    with pytest.raises(InvalidReference):
        parse_reference(f"127.0.0.1:5000/q/x:{tag}")


@pytest.mark.parametrize("tag", UNICODE_TAGS)
def test_a_tag_outside_ascii_is_refused_in_a_manifest(tag: str) -> None:
    import yaml

    from qualify.manifest.load import ManifestError, load_manifest_text

    text = yaml.safe_dump({"release": {"name": "r", "repository": "127.0.0.1:5000/q/r", "tag": tag,
                                       "candidate_tag": "1-rc1", "previous_tag": "0"},
                           "custom_cases": [{"name": "nap", "kind": "sleep"}]}, allow_unicode=True)
    with pytest.raises(ManifestError) as info:
        load_manifest_text(text, "m.yaml")
    assert [p.field for p in info.value.problems] == ["release.tag"]


def test_an_existing_file_is_not_an_output_folder(tmp_path: Path) -> None:
    existing = tmp_path / "report.html"
    existing.write_text("x")
    with pytest.raises(BadInput, match="--out .*is a file"):
        output_dir(existing, "--out")
    with pytest.raises(BadInput, match="--out"):
        output_dir(existing / "below", "--out")
    assert existing.read_text() == "x"


def test_a_folder_is_not_an_output_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="--png .*is a folder"):
        output_file(tmp_path, "--png")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(BadInput, match="--png"):
        output_file(blocker / "chart.png", "--png")


class _Closed(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_pipe_drops_the_rest_quietly() -> None:
    stream = ClosedPipeSafe(_Closed())
    assert stream.write("x" * 10) == 10 and stream.closed_by_reader
    stream.flush()
    assert stream.write("more") == 4
