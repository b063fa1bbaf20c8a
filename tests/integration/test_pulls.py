"""Images pulled once per node before the cases (issue 28), for real: a two-node Ray cluster on loopback, a
Distribution registry on loopback holding a tiny image, and podman pulling it by digest into qualify's store on
every node that will run cases. A digest the registry does not hold is infrastructure, said per node."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.containers import require_tools
from support.ray_cluster import CLIENT_ENV, loopback_cluster
from support.registry import push_image

from qualify.build.containers import container_store
from qualify.execution import pulls
from qualify.executors.container import ContainerExecutor
from qualify.manifest import Resources

pytestmark = [pytest.mark.ray, pytest.mark.registry, pytest.mark.container]


def _executor(image: str, cache: Path) -> ContainerExecutor:
    store = container_store(cache)  # podman refuses a runroot path over 50 characters: a short cache folder
    return ContainerExecutor(image=image, tls_verify=False, storage_root=store.root,
                             storage_runroot=store.runroot, containers_conf=store.conf)


def test_each_node_that_will_run_cases_pulls_the_image_by_digest_once_before_them(tmp_path: Path, registry) -> None:
    import ray

    require_tools("podman")
    digest = push_image(registry, "q/pulled", "1.0", workdir=tmp_path)
    image = f"{registry.host}/q/pulled@{digest}"
    import shutil
    import tempfile

    cache = Path(tempfile.mkdtemp(prefix="qp-", dir="/tmp"))
    ex = _executor(image, cache)
    os.environ.update(CLIENT_ENV)  # a client of the single-machine cluster (the conftest restores os.environ)
    with loopback_cluster(tmp_path / "cluster.log", head={"num_cpus": 1, "resources": {"head_node": 1}},
                          nodes=[{"num_cpus": 1, "resources": {"second_node": 1}}]) as cluster:
        from qualify.execution.ray import bind_local_cluster_to_loopback

        bind_local_cluster_to_loopback()  # this client's own addresses on loopback too, as the cluster's
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        try:
            done = pulls.pull_on_nodes(ex, [Resources(cpus=1)], timeout_s=120)
            assert len(done) == 2 and all(p.ok and p.image == image for p in done), done
            assert len({p.node_id for p in done}) == 2 and all(p.seconds > 0 for p in done)
            # the image is in qualify's store now: a case's `podman run --pull missing` finds it local
            exists = subprocess.run([*ex.engine_argv(), "image", "exists", image], env=ex.engine_env(),
                                    capture_output=True, text=True, timeout=60)
            assert exists.returncode == 0, exists.stderr
            # only the nodes that can hold a case pull: a case that needs the second node's resource
            only = pulls.pull_on_nodes(ex, [Resources(cpus=1, custom={"second_node": 1})], timeout_s=120)
            assert len(only) == 1 and only[0].ok
            # a digest the registry does not hold: infrastructure, every node's failure in the record
            missing = _executor(f"{registry.host}/q/pulled@sha256:{'0' * 64}", cache)
            with pytest.raises(pulls.PullFailed) as info:
                pulls.pull_on_nodes(missing, [Resources(cpus=1)], timeout_s=120)
            assert "could not be pulled on 2 of 2 node(s)" in str(info.value)
            assert len(info.value.pulls) == 2 and not any(p.ok for p in info.value.pulls)
            assert all(p.error and p.error.startswith("exit ") for p in info.value.pulls), info.value.pulls
        finally:
            ray.shutdown()
            subprocess.run([*ex.engine_argv(), "system", "reset", "--force"], env=ex.engine_env(),
                           capture_output=True, timeout=120)
            shutil.rmtree(cache, ignore_errors=True)
