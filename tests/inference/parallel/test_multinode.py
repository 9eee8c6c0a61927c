"""Two "nodes" on 127.0.0.1: the driver's engine is node 0, `dayzero infer-node --node-rank 1` (a
separate process group) launches node 1's ranks. Greedy fp32 tokens equal the single-process
engine's (pipeline stages across the nodes, with chunked prefill and prefix hits); a rank killed on
node 1 stops the engine with an error naming it; the launcher exits with its ranks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from inference.engine.factory import build_engine
from inference.parallel import ParallelConfigError, WorkerFailedError
from inference.parallel.cluster import ClusterSpec
from testing.ports import free_port_pair

from .test_parallel_engine import CONFIG, GREEDY, ROUND1, _run

KEY = "test-cluster-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(port: int) -> int | None:
    """The launcher's `GET /health` status (None: nothing listening)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _launch_node(port: int, node_rank: int, health_port: int) -> subprocess.Popen:
    env = {**os.environ, "DAYZERO_CLUSTER_KEY": KEY, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    cmd = [sys.executable, "-m", "orchestrator.cli", "infer-node", "--nnodes", "2"]
    cmd += ["--node-rank", str(node_rank), "--health-port", str(health_port)]
    return subprocess.Popen(cmd, env=env, start_new_session=True)  # its own process group: another "host"


@pytest.fixture
def cluster_key(monkeypatch) -> None:
    monkeypatch.setenv("DAYZERO_CLUSTER_KEY", KEY)


@pytest.fixture(scope="module")
def reference() -> tuple:
    return _run(build_engine(engine_config=CONFIG))


@pytest.mark.parametrize("tp", [1, 2], ids=["pp2", "pp2xtp2"])
def test_two_nodes_match_single_process_and_a_killed_remote_rank_stops_the_engine(
    reference, cluster_key, tp: int
) -> None:
    port, health = free_port_pair(), _free_port()
    node1 = _launch_node(port, 1, health)
    try:
        engine = build_engine(
            engine_config=CONFIG, pipeline_parallel_size=2, tensor_parallel_size=tp,
            cluster=ClusterSpec(nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=port),
        )  # fmt: skip
        runner = engine.runner
        try:
            assert _health(health) == 200  # node 1's ranks run
            assert _run(engine) == reference
            victim = runner.world_size - 1  # the last stage's last rank: on node 1
            assert runner.cluster.node_of(victim, runner.world_size) == 1
            os.kill(runner.pids[victim], signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(
                WorkerFailedError, match=rf"rank {victim}: process \d+ on node 1 exited"
            ) as err:
                engine.generate([ROUND1[0]], GREEDY)
            assert time.monotonic() - t0 < 10
            assert err.value.rank == victim
            assert _health(health) != 200  # node 1's launcher says so too (503, or gone)
            with pytest.raises(WorkerFailedError):  # the engine stays stopped
                engine.recover_after_failed_step()
        finally:
            runner.close()
        assert node1.wait(timeout=20) != 0  # the launcher ends with its ranks, reporting the kill
    finally:
        if node1.poll() is None:
            os.killpg(node1.pid, signal.SIGKILL)
            node1.wait()


def test_cluster_settings_are_checked_before_any_process_starts(monkeypatch) -> None:
    monkeypatch.delenv("DAYZERO_CLUSTER_KEY", raising=False)
    with pytest.raises(ParallelConfigError, match="--node-rank 2"):
        ClusterSpec(nnodes=2, node_rank=2, master_port=1234)
    with pytest.raises(ParallelConfigError, match="--master-port"):
        ClusterSpec(nnodes=2, node_rank=0)
    # torchrun's names
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("NNODES", "2")
    monkeypatch.setenv("MASTER_PORT", "2345")
    assert ClusterSpec.from_env(master_addr="10.0.0.1") == ClusterSpec(2, 1, "10.0.0.1", 2345)
    with pytest.raises(ParallelConfigError, match="DAYZERO_CLUSTER_KEY"):
        build_engine(
            engine_config=CONFIG, pipeline_parallel_size=2,
            cluster=ClusterSpec(nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=2345),
        )  # fmt: skip
    with pytest.raises(ParallelConfigError, match="does not split over 2 nodes"):
        build_engine(
            engine_config=CONFIG, pipeline_parallel_size=3,
            cluster=ClusterSpec(nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=2345),
        )  # fmt: skip
