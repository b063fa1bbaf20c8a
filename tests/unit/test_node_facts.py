"""The accelerator driver is the node's, read on the host side (qualify.execution.node_facts), never the
candidate's claim. No GPU here: the NVIDIA and AMD module files are written into a folder that
stands for the host's root, and a GPU node's facts are given as data."""

from __future__ import annotations

from pathlib import Path

from qualify.manifest import Component
from qualify.execution.node_facts import driver_facts
from qualify.verify import UNKNOWN_DRIVER, compare_components


def test_driver_facts_come_from_the_host_kernel_module_or_are_unknown(tmp_path: Path) -> None:
    nvidia = tmp_path / "proc/driver/nvidia/version"
    nvidia.parent.mkdir(parents=True)
    nvidia.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n")
    assert driver_facts(tmp_path, which=lambda _: None) == {
        "driver": "550.54.15", "driver_vendor": "nvidia", "driver_source": "/proc/driver/nvidia/version"}
    amd = tmp_path / "amd"
    (amd / "sys/module/amdgpu").mkdir(parents=True)
    (amd / "sys/module/amdgpu/version").write_text("6.7.0\n")
    assert driver_facts(amd, which=lambda _: None)["driver"] == "6.7.0"
    assert driver_facts(tmp_path / "none", which=lambda _: None)["driver"] is None


def test_a_driver_claimed_by_the_candidate_is_ignored() -> None:
    # Issue 12: the probe took the driver from the image's own variable; an image could claim
    # its driver. Only the node's host-side facts count; without them it is unknown, not a pass.
    component = Component(name="driver", source="driver", expected="550.54", match="prefix")
    claim = {"driver": "550.54.15", "env": {"NVIDIA_DRIVER_VERSION": "550.54.15"}}
    [check] = compare_components([component], claim, node={"driver": None, "host": "vm",
                                                           "driver_source": "no accelerator driver answered"})
    assert check["ok"] is False and check["actual"] is None and UNKNOWN_DRIVER in check["detail"]
    [check] = compare_components([component], claim)  # no node facts at all
    assert check["ok"] is False and UNKNOWN_DRIVER in check["detail"]
    # Simulated GPU node (no GPU here): the host side read 535; the image's 550 claim changes nothing.
    [check] = compare_components([component], claim, node={"driver": "535.161.08", "host": "gpu-1",
                                                           "driver_source": "/proc/driver/nvidia/version"})
    assert check["ok"] is False and check["actual"] == "535.161.08" and "gpu-1" in check["detail"]
    [check] = compare_components([component], {}, node={"driver": "550.54.15", "host": "gpu-1"})
    assert check["ok"] is True
