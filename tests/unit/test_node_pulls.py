"""Images pulled once per node before the cases (issue 28): which nodes pull, the engine's pull command, what the
run's views say. The pulls themselves run in tests/integration/test_pulls.py (real Ray nodes, a real registry)."""

from __future__ import annotations

from qualify.execution import pulls
from qualify.executors.container import ContainerExecutor
from qualify.manifest import Resources
from qualify.report.views import pull_line

IMAGE = "127.0.0.1:5000/q/img@sha256:" + "a" * 64


def _node(node_id: str, cpus: float, gpus: float = 0.0, alive: bool = True) -> dict:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": f"10.0.0.{node_id}",
            "Resources": {"CPU": cpus, "GPU": gpus}}


def test_only_the_nodes_that_can_hold_a_case_pull() -> None:
    nodes = [_node("1", 64, 8), _node("2", 64, 0), _node("3", 2, 8), _node("4", 64, 8, alive=False)]
    # an 8-GPU case and a 1-GPU case: node 2 (no GPU) runs neither, node 3 (2 CPUs) neither, node 4 is gone
    chosen = pulls.nodes_for([Resources(cpus=16, gpus=8), Resources(cpus=8, gpus=1)], nodes)
    assert [n["NodeID"] for n in chosen] == ["1"]
    # a CPU case fits the GPU-less node too
    chosen = pulls.nodes_for([Resources(cpus=16, gpus=8), Resources(cpus=4)], nodes)
    assert [n["NodeID"] for n in chosen] == ["1", "2"]
    assert pulls.nodes_for([], nodes) == []


def test_the_pull_is_by_digest_into_qualifys_store_and_plain_http_only_where_allowed() -> None:
    ex = ContainerExecutor(image=IMAGE, storage_root="/s/root", storage_runroot="/s/run", tls_verify=False)
    argv = ex.pull_argv()
    assert argv[:3] == ["podman", "--root", "/s/root"] and argv[-1] == IMAGE and "pull" in argv
    assert "--tls-verify=false" in argv and "--quiet" in argv
    assert "--tls-verify=false" not in ContainerExecutor(image=IMAGE).pull_argv()
    docker = ContainerExecutor(image=IMAGE, runtime="docker").pull_argv()
    assert docker == ["docker", "pull", IMAGE]


def test_a_failed_pull_is_infrastructure_and_carries_every_node() -> None:
    from qualify.errors import ExitCode

    done = [pulls.NodePull("1", "10.0.0.1", IMAGE, 12.5, True),
            pulls.NodePull("2", "10.0.0.2", IMAGE, 0.1, False, "exit 125: manifest unknown")]
    exc = pulls.PullFailed("image could not be pulled", done)
    assert exc.exit_code == ExitCode.INFRA and exc.pulls == done


def test_the_run_views_say_where_the_pulls_went() -> None:
    assert pull_line([]) is None
    line = pull_line([pulls.NodePull("1", "10.0.0.1", IMAGE, 12.54, True).to_dict(),
                      pulls.NodePull("2", "10.0.0.2", IMAGE, 0.31, True).to_dict()])
    assert line == f"pulls: {IMAGE} on 2 node(s) before the cases: 10.0.0.1 12.5 s, 10.0.0.2 0.3 s"
