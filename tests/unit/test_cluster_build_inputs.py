"""Builds on the cluster (issue 28): what travels to the builder node, and what the driver decides before anything is
shipped. The build itself on a two-node loopback cluster: tests/integration/test_cluster_build.py."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import yaml

from qualify.build.base import BuildInputError
from qualify.build.containers import BuildLog
from qualify.execution import builds
from qualify.manifest.load import ManifestError, load_manifest_text

pytestmark = pytest.mark.unit


def _manifest(build: dict) -> object:
    data = {"apiVersion": "qualify/v1",
            "release": {"name": "c", "repository": "127.0.0.1:5000/q/c", "tag": "1.0", "candidate_tag": "1.0-rc1"},
            "build": {"builder": "buildah", "containerfile": "image/Containerfile", "on": "cluster", **build},
            "execution": {"executor": "container"},
            "custom_cases": [{"name": "s", "kind": "sleep", "params": {"seconds": 1}}],
            "gate": {"regression": {"enabled": False}}}
    return load_manifest_text(yaml.safe_dump(data), check_expiry=False).release


def _repo(tmp: Path) -> Path:
    (tmp / ".git").mkdir()
    (tmp / "image" / "sub").mkdir(parents=True)
    (tmp / "image" / "Containerfile").write_text("FROM scratch\nCOPY sub/a.txt /a\n")
    (tmp / "image" / "sub" / "a.txt").write_text("a\n")
    (tmp / "extra").mkdir()
    (tmp / "extra" / "b.txt").write_text("b\n")
    (tmp / "unrelated.txt").write_text("never shipped\n")
    (tmp / "releases").mkdir()
    return tmp / "releases"


def _names(archive: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {m.name for m in tar.getmembers()}


def test_only_the_files_the_build_reads_travel_by_their_place_in_the_repository(tmp_path: Path) -> None:
    manifest_dir = _repo(tmp_path)
    manifest = _manifest({"containerfile": "../image/Containerfile", "build_args": {"context:extra": "../extra"}})
    archive, rel = builds.pack_build_inputs(manifest, manifest_dir, BuildLog(tmp_path / "data", "c"))
    names = _names(archive)
    assert {"image/Containerfile", "image/sub/a.txt", "extra/b.txt"} <= names
    assert "unrelated.txt" not in names and not any(n.startswith(".git") for n in names)
    assert rel == "releases"
    # Unpacked on the builder node, the same relative layout, the tree its own repository (paths stay confined).
    into = tmp_path / "unpacked"
    into.mkdir()
    builds._unpack(archive, into)
    assert (into / "image" / "sub" / "a.txt").read_text() == "a\n" and (into / ".git").is_dir()


def test_bad_build_input_is_said_on_the_driver_before_anything_is_shipped(tmp_path: Path) -> None:
    manifest_dir = _repo(tmp_path)
    with pytest.raises(BuildInputError, match="not found"):
        builds.pack_build_inputs(_manifest({"containerfile": "../image/Nope"}), manifest_dir,
                                 BuildLog(tmp_path / "data", "c"))
    with pytest.raises(BuildInputError, match="outside the manifest's repository"):
        builds.pack_build_inputs(_manifest({"containerfile": "../../Containerfile"}), manifest_dir,
                                 BuildLog(tmp_path / "data", "c"))


def test_a_context_too_heavy_to_ship_is_refused_with_the_way_out(tmp_path: Path, monkeypatch) -> None:
    manifest_dir = _repo(tmp_path)
    (tmp_path / "image" / "big.bin").write_bytes(b"\0" * 4096)
    monkeypatch.setattr(builds, "MAX_ARCHIVE_BYTES", 1024)
    with pytest.raises(BuildInputError, match="build.on: driver"):
        builds.pack_build_inputs(_manifest({"containerfile": "../image/Containerfile"}), manifest_dir,
                                 BuildLog(tmp_path / "data", "c"))


def test_a_symlink_in_the_context_travels_as_the_symlink_a_local_build_would_copy(tmp_path: Path) -> None:
    manifest_dir = _repo(tmp_path)
    (tmp_path / "image" / "sub" / "lib").symlink_to("/usr/lib")
    (tmp_path / "image" / "sub" / "here").symlink_to("a.txt")
    archive, _ = builds.pack_build_inputs(_manifest({"containerfile": "../image/Containerfile"}), manifest_dir,
                                          BuildLog(tmp_path / "data", "c"))
    into = tmp_path / "unpacked"
    into.mkdir()
    builds._unpack(archive, into)
    assert (into / "image" / "sub" / "lib").is_symlink() and str((into / "image" / "sub" / "lib").readlink()) == "/usr/lib"
    assert (into / "image" / "sub" / "here").read_text() == "a\n"


def test_an_archive_cannot_write_outside_its_folder(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    into = tmp_path / "in"
    into.mkdir()
    with pytest.raises(tarfile.TarError):
        builds._unpack(buffer.getvalue(), into)
    assert not (tmp_path / "escaped.txt").exists()
    # Nor through a link that leads out: a symlink to the parent, then a file written "inside" it.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        link = tarfile.TarInfo("out")
        link.type, link.linkname = tarfile.SYMTYPE, str(tmp_path)
        tar.addfile(link)
        info = tarfile.TarInfo("out/through.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.TarError):
        builds._unpack(buffer.getvalue(), into)
    assert not (tmp_path / "through.txt").exists()


def test_only_alive_nodes_that_declare_the_builder_resource_build() -> None:
    nodes = [{"NodeID": "a", "Alive": True, "Resources": {"CPU": 8}},
             {"NodeID": "b", "Alive": False, "Resources": {"CPU": 8, "builder": 1}},
             {"NodeID": "c", "Alive": True, "Resources": {"CPU": 8, "builder": 1}}]
    assert [n["NodeID"] for n in builds.builder_nodes(nodes)] == ["c"]


def test_no_builder_node_is_infrastructure_naming_the_resource(tmp_path: Path) -> None:
    with pytest.raises(builds.NoBuilderNode, match="declares the 'builder' resource") as err:
        builds.build_on_cluster(_manifest({}), data_dir=tmp_path, manifest_dir=tmp_path,
                                nodes=[{"NodeID": "a", "Alive": True, "Resources": {"CPU": 8}}])
    assert err.value.exit_code == 3


@pytest.mark.parametrize("builder", ["local", "prebuilt"])
def test_a_builder_that_builds_no_image_cannot_build_on_the_cluster(builder: str) -> None:
    extra = {"reference": "127.0.0.1:5000/q/c:1"} if builder == "prebuilt" else {}
    with pytest.raises(ManifestError, match="on: cluster builds an image on a builder node"):
        _manifest({"builder": builder, **extra})
