"""The standard-library helpers both sides share: the process-group killer and the merge."""

from __future__ import annotations

import os

from qualify.workloads.merge import deep_merge


def test_deep_merge_merges_nested_dicts_and_shares_nothing():
    base = {"zero_optimization": {"stage": 2, "overlap_comm": True}, "bf16": {"enabled": True}, "x": [1]}
    top = {"zero_optimization": {"stage": 3}, "bf16": False, "y": {"z": [2]}}
    out = deep_merge(base, top)
    assert out == {"zero_optimization": {"stage": 3, "overlap_comm": True}, "bf16": False, "x": [1],
                   "y": {"z": [2]}}
    out["zero_optimization"]["stage"] = 0
    out["x"].append(9)
    out["y"]["z"].append(9)
    assert base == {"zero_optimization": {"stage": 2, "overlap_comm": True}, "bf16": {"enabled": True}, "x": [1]}
    assert top == {"zero_optimization": {"stage": 3}, "bf16": False, "y": {"z": [2]}}


# ---------------------------------------------------------------- settings

def test_settings_defaults_from_an_empty_environment():
    import dataclasses

    import pytest

    from qualify.workloads.settings import WorkloadSettings

    s = WorkloadSettings.from_env({})
    home_cache = os.path.join(os.path.expanduser("~"), ".cache", "qualify")
    assert (s.cache_dir, s.models_dir, s.hostfile, s.visible_devices, s.rank_result_dir) == (
        home_cache, None, None, None, None)
    assert s.cache_env() == {"TORCH_EXTENSIONS_DIR": os.path.join(home_cache, "torch_extensions"),
                             "TORCHINDUCTOR_CACHE_DIR": os.path.join(home_cache, "inductor")}
    assert (s.launched, s.rank, s.local_rank, s.world_size, s.local_world_size) == (False, 0, 0, 1, 1)
    assert dict(s.rendezvous) == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.rank = 1  # type: ignore[misc]


def test_settings_read_every_variable():
    import pytest

    from qualify.workloads.settings import WorkloadSettings

    env = {"QUALIFY_CACHE_DIR": "/c", "TORCH_EXTENSIONS_DIR": "/ext", "TORCHINDUCTOR_CACHE_DIR": "",
           "QUALIFY_MODELS_DIR": "/models", "QUALIFY_HOSTFILE": "/hosts", "RANK": "3", "LOCAL_RANK": "1",
           "WORLD_SIZE": "8", "MASTER_ADDR": "h0", "CUDA_VISIBLE_DEVICES": "0,1",
           "QUALIFY_RANK_RESULT_DIR": "/scratch/ranks", "UNRELATED": "x"}
    s = WorkloadSettings.from_env(env)
    assert (s.cache_dir, s.models_dir, s.hostfile) == ("/c", "/models", "/hosts")
    # An empty cache variable counts as unset.
    assert s.cache_env() == {"TORCH_EXTENSIONS_DIR": "/ext", "TORCHINDUCTOR_CACHE_DIR": "/c/inductor"}
    assert (s.launched, s.rank, s.local_rank, s.world_size, s.local_world_size) == (True, 3, 1, 8, 8)
    assert WorkloadSettings.from_env({**env, "LOCAL_WORLD_SIZE": "4"}).local_world_size == 4
    assert dict(s.rendezvous) == {"MASTER_ADDR": "h0", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}
    assert (s.visible_devices, s.rank_result_dir) == ("0,1", "/scratch/ranks")
    assert not hasattr(s, "accelerator_driver_version")  # the image cannot claim its own driver
    assert WorkloadSettings.from_env({"QUALIFY_TRAIN_LAUNCHED": "1"}).launched
    assert not WorkloadSettings.from_env({"RANK": "0", "WORLD_SIZE": "1"}).launched
    with pytest.raises(ValueError, match="LOCAL_RANK: expected an integer, got 'a'"):
        WorkloadSettings.from_env({"LOCAL_RANK": "a"})


