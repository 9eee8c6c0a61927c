"""The ranks of one engine on several hosts: the rendezvous, the node launcher, the driver's hub.

Node 0 runs the driver (the engine, its scheduler and cache bookkeeping) and spawns its own ranks
as on one host; every other node runs `dayzero infer-node` (`node_main`), which connects to the
driver, receives the ranks' build arguments, spawns its ranks and watches them. Node `k` holds the
consecutive ranks `[k * R, (k + 1) * R)`, `R = world / nnodes` (with `R = ep * tp`, every pipeline
stage is one node and only the stage-to-stage activations cross hosts). The settings are the
standard rendezvous: `--nnodes`, `--node-rank`, `--master-addr`, `--master-port` (defaults from
`NNODES`, `NODE_RANK` or torchrun's `GROUP_RANK`, `MASTER_ADDR`, `MASTER_PORT`). `torch.distributed`
meets at `tcp://MASTER_ADDR:MASTER_PORT`; the driver's control channel (each rank's step messages,
the launchers' reports) listens on `MASTER_PORT + 1`, authenticated with the shared secret in
`DAYZERO_CLUSTER_KEY` (`multiprocessing.connection`'s HMAC handshake).

Supervision is as on one host: every rank answers every step over its own connection, so a rank
that dies on another node closes that connection and fails the step at once; its launcher also
reports the exit code (`("died", rank, code)`), which the driver's monitor thread turns into the
same `WorkerFailedError` between steps. A launcher that loses the driver kills its ranks and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing import get_context
from multiprocessing.connection import Client, Connection, Listener, wait
from typing import Any

from inference.parallel.config import ParallelConfigError, WorkerFailedError

__all__ = [
    "ClusterHub",
    "ClusterSpec",
    "RemoteRank",
    "add_cluster_arguments",
    "cluster_from_args",
    "cluster_key",
    "node_main",
]

log = logging.getLogger(__name__)

KEY_ENV = "DAYZERO_CLUSTER_KEY"


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """Where the ranks of one engine run: `nnodes` hosts, this process on `node_rank`."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0  # 0 on one host: a free port is picked

    def __post_init__(self) -> None:
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ParallelConfigError(f"--node-rank {self.node_rank} must be in [0, --nnodes {self.nnodes})")
        if self.nnodes > 1 and not 0 < self.master_port < 65535:
            raise ParallelConfigError("several nodes need --master-port (the driver's host's port)")

    @staticmethod
    def from_env(**given: Any) -> ClusterSpec:
        """The settings given (None: unset), else the environment's (torchrun's names), else one host."""
        env = os.environ
        nnodes = given.get("nnodes") or int(env.get("NNODES", "1"))
        node_rank = given.get("node_rank")
        if node_rank is None:
            node_rank = int(env.get("NODE_RANK", env.get("GROUP_RANK", "0")))
        addr = given.get("master_addr") or env.get("MASTER_ADDR", "127.0.0.1")
        port = given.get("master_port") or int(env.get("MASTER_PORT", "0"))
        return ClusterSpec(nnodes, node_rank, addr, port)

    def ranks_per_node(self, world: int) -> int:
        if world % self.nnodes:
            raise ParallelConfigError(f"world size {world} does not split over {self.nnodes} nodes")
        return world // self.nnodes

    def ranks_of(self, node: int, world: int) -> list[int]:
        r = self.ranks_per_node(world)
        return list(range(node * r, (node + 1) * r))

    def node_of(self, rank: int, world: int) -> int:
        return rank // self.ranks_per_node(world)

    @property
    def init_method(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"

    @property
    def control_address(self) -> tuple[str, int]:
        return self.master_addr, self.master_port + 1


def add_cluster_arguments(p: argparse.ArgumentParser, *, pipeline: bool = True) -> None:
    """The multi-node rendezvous flags (`dayzero infer serve` on node 0, `dayzero infer-node` on the
    others) and, with `pipeline`, the pipeline-parallel ones (serve only: the driver decides)."""
    if pipeline:
        p.add_argument(
            "--pipeline-parallel-size", type=int, default=1,
            help="pipeline stages splitting the layers (world size = tensor x expert x pipeline parallel size; default: %(default)s)",
        )  # fmt: skip
        p.add_argument(
            "--micro-batches", type=int, default=1,
            help="micro-batches each step is split into through the pipeline stages, steps overlap there anyway (default: %(default)s)",
        )  # fmt: skip
    p.add_argument("--nnodes", type=int, default=None, help="hosts the ranks run on (default NNODES, else 1)")
    p.add_argument(
        "--node-rank", type=int, default=None,
        help="this host's index; node 0 runs the driver (default NODE_RANK, else torchrun's GROUP_RANK, else 0)",
    )  # fmt: skip
    p.add_argument("--master-addr", default=None, help="node 0's address (default MASTER_ADDR)")
    p.add_argument(
        "--master-port", type=int, default=None,
        help="node 0's rendezvous port; the control channel uses the next one (default MASTER_PORT)",
    )  # fmt: skip


def cluster_from_args(args: argparse.Namespace) -> ClusterSpec:
    return ClusterSpec.from_env(
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
    )


def cluster_key() -> bytes:
    """The shared secret of the control channel (`DAYZERO_CLUSTER_KEY`, the same on every node)."""
    key = os.environ.get(KEY_ENV, "")
    if not key:
        raise ParallelConfigError(f"several nodes need the shared secret {KEY_ENV} set on every node")
    return key.encode()


class RemoteRank:
    """A rank on another node, as the driver's supervision sees a local `Process`: its pid (from
    its hello), alive until its launcher reports its exit (or the launcher is lost)."""

    def __init__(self, rank: int, node: int, pid: int) -> None:
        self.rank, self.node, self.pid = rank, node, pid
        self.exitcode: int | None = None
        self.sentinel = None  # no local handle: its launcher reports the exit
        self._gone = threading.Event()

    def exited(self, code: int | None) -> None:
        self.exitcode = code
        self._gone.set()

    def is_alive(self) -> bool:
        return not self._gone.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._gone.wait(timeout)

    def terminate(self) -> None:
        """Its launcher kills it when the driver closes the launcher's connection (`ClusterHub.close`)."""

    kill = terminate


class ClusterHub:
    """The driver's side of a multi-node engine: listens on the control port, hands each node's
    launcher the ranks' arguments, takes each remote rank's connection, and reads the launchers'
    exit reports (`poll`, from the runner's monitor thread)."""

    def __init__(self, cluster: ClusterSpec, world: int) -> None:
        self.cluster = cluster
        self.world = world
        self.agents: dict[int, Connection] = {}
        self.remote: dict[int, RemoteRank] = {}
        self._listener = Listener(("0.0.0.0", cluster.control_address[1]), authkey=cluster_key())
        self._accepted: queue.Queue[Connection | BaseException] = queue.Queue()
        self._accepting = threading.Thread(target=self._accept, name="dayzero-cluster-accept", daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                self._accepted.put(self._listener.accept())
            except OSError as exc:  # closed: start-up is over (or failed)
                self._accepted.put(exc)
                return
            except Exception as exc:  # a failed handshake (wrong key): keep listening
                log.warning("refused a control connection: %s", exc)

    def connect(self, args: Any, procs: list[Any], conns: list[Any], timeout_s: float, alive) -> None:
        """Wait for every other node's launcher and every remote rank (filling `procs` and `conns`
        at their ranks); `alive()` raises when a local rank died meanwhile."""
        nodes = set(range(1, self.cluster.nnodes))
        ranks = {r for n in nodes for r in self.cluster.ranks_of(n, self.world)}
        deadline = time.monotonic() + timeout_s
        while nodes or ranks:
            alive()
            try:
                conn = self._accepted.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > deadline:
                    missing = ", ".join(
                        [f"node {n}" for n in sorted(nodes)] + [f"rank {r}" for r in sorted(ranks)]
                    )
                    raise WorkerFailedError(
                        min(ranks or {0}), f"not connected within {timeout_s:.0f} s: {missing}"
                    ) from None
                continue
            if isinstance(conn, BaseException):
                raise conn
            hello = conn.recv()
            if hello[0] == "node" and hello[1] in nodes:
                node = hello[1]
                nodes.discard(node)
                self.agents[node] = conn
                conn.send(("start", args, self.cluster.ranks_of(node, self.world)))
            elif hello[0] == "rank" and hello[1] in ranks:
                rank, pid = hello[1], hello[2]
                ranks.discard(rank)
                self.remote[rank] = procs[rank] = RemoteRank(
                    rank, self.cluster.node_of(rank, self.world), pid
                )
                conns[rank] = conn
            else:
                conn.close()
                log.warning("ignored an unexpected control connection: %r", hello[:2])
        self._listener.close()

    def poll(self, conn: Connection) -> tuple[int, str] | None:
        """Read one report of a launcher: `(rank, why)` of a rank it saw exit, or None."""
        node = next(n for n, c in self.agents.items() if c is conn)
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            first = self.cluster.ranks_of(node, self.world)[0]
            for r in self.cluster.ranks_of(node, self.world):
                self.remote[r].exited(None)
            return first, f"the launcher of node {node} is gone (its ranks with it)"
        if msg[0] == "died":
            _, rank, code = msg
            self.remote[rank].exited(code)
            return rank, ""
        return None

    def close(self) -> None:
        """Close the launchers' connections: each then kills its ranks and exits."""
        with contextlib.suppress(OSError):
            self._listener.close()
        for c in self.agents.values():
            with contextlib.suppress(OSError):
                c.close()


def _connect(address: tuple[str, int], key: bytes, timeout_s: float) -> Connection:
    """Connect to the driver's control port, retrying while it is not up yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Client(address, authkey=key)
        except (ConnectionRefusedError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def remote_worker_main(rank: int, args: Any, address: tuple[str, int], key: bytes) -> None:
    """Process entry of a rank on a node other than the driver's: its messages go over a socket."""
    from inference.parallel.worker import worker_main

    conn = _connect(address, key, 60.0)
    conn.send(("rank", rank, os.getpid()))
    worker_main(rank, args, conn)


class _Health:
    """`GET /health` of a non-driver node (its pod's probes): 200 while its ranks run, else 503."""

    def __init__(self, port: int) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.ok = False
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the http.server hook
                good = self.path == "/health" and health.ok
                self.send_response(200 if good else 503)
                self.end_headers()
                self.wfile.write(b'{"status": "ok"}' if good else b'{"status": "not running"}')

            def log_message(self, *args: Any) -> None:  # probes every few seconds: not logged
                pass

        self.server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        threading.Thread(target=self.server.serve_forever, name="dayzero-node-health", daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def node_main(cluster: ClusterSpec, connect_timeout_s: float = 600.0, health_port: int | None = None) -> int:
    """A non-driver node's launcher (`dayzero infer-node`): connect, spawn this node's ranks, report
    each one's exit to the driver, and kill them all when the driver is gone. Returns 0 when every
    rank exited cleanly. `health_port`: serve `GET /health` there (200 while the ranks run)."""
    if cluster.node_rank == 0:
        raise ParallelConfigError("node 0 runs the driver (`dayzero infer serve`), not `infer-node`")
    health = _Health(health_port) if health_port else None
    try:
        return _launch(cluster, connect_timeout_s, health)
    finally:
        if health is not None:
            health.close()


def _launch(cluster: ClusterSpec, connect_timeout_s: float, health: _Health | None) -> int:
    key = cluster_key()
    conn = _connect(cluster.control_address, key, connect_timeout_s)
    conn.send(("node", cluster.node_rank))
    kind, args, ranks = conn.recv()
    if kind != "start":
        raise RuntimeError(f"expected the ranks' arguments from the driver, got {kind!r}")
    args = replace(args, init_method=cluster.init_method)
    ctx = get_context("spawn")
    procs = {
        r: ctx.Process(
            target=remote_worker_main, args=(r, args, cluster.control_address, key), name=f"dayzero-rank{r}"
        )
        for r in ranks
    }
    for p in procs.values():
        p.start()
    log.info("node %d: ranks %s started (pids %s)", cluster.node_rank, ranks, [p.pid for p in procs.values()])
    codes: dict[int, int | None] = {}
    if health is not None:
        health.ok = True
    try:
        while len(codes) < len(procs):
            watched = {p.sentinel: r for r, p in procs.items() if r not in codes}
            ready = wait([conn, *watched])
            if conn in ready:
                with contextlib.suppress(EOFError, OSError):
                    conn.recv()  # nothing is sent after "start": any message or EOF ends the node
                break
            for obj in ready:
                r = watched[obj]
                if health is not None:
                    health.ok = False
                procs[r].join()
                codes[r] = procs[r].exitcode
                with contextlib.suppress(OSError):
                    conn.send(("died", r, codes[r]))
    finally:
        _stop(procs, codes)
        with contextlib.suppress(OSError):
            conn.close()
    return 0 if all(c == 0 for c in codes.values()) else 1


def _stop(procs: dict[int, Any], codes: dict[int, int | None], grace_s: float = 3.0) -> None:
    """End this node's ranks: a rank the driver stopped (or lost) exits by itself within
    `grace_s`; one stuck in a collective with a dead peer is terminated."""
    deadline = time.monotonic() + grace_s
    for p in procs.values():
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs.values():
        if p.is_alive():
            p.terminate()
    for r, p in procs.items():
        p.join(5.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)
        codes.setdefault(r, p.exitcode)
