"""Supervision of a parallel engine's rank processes, on the driver: liveness and failure.

A rank that dies, reports an error or stays silent past a deadline fails the whole group: the
failure is recorded once (`failure`), the group is torn down (`kill_ranks`) before anyone sees it,
and every later call raises it. `RankSupervision` is the base of `ParallelRunner` (`runner.py`),
which sets the state it reads: `procs`, `conns`, `cluster`, `world_size`, `failure`, `_lock`,
`_closing`, `_hub` and `_finalizer` (a `weakref.finalize` of `kill_ranks`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from inference.parallel.cluster import ClusterHub
from inference.parallel.config import WorkerFailedError

__all__ = ["POLL_S", "RankSupervision", "kill_ranks"]

log = logging.getLogger(__name__)

POLL_S = 0.2  # how often a waiting driver re-checks the ranks' liveness


def kill_ranks(
    procs: list[Any], conns: list[Connection], closing: threading.Event, hub: ClusterHub | None
) -> None:
    """Tear a rank group down: close the pipes, stop the other nodes' launchers, end this host's
    ranks (terminate, then kill what is still alive after 2 s)."""
    closing.set()  # the monitor thread must not report the deaths this causes
    for c in conns:
        if c is not None:
            with contextlib.suppress(OSError):
                c.close()
    if hub is not None:  # the other nodes' launchers kill their ranks
        hub.close()
    procs = [p for p in procs if isinstance(p, BaseProcess)]  # this host's ranks
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 2.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)


class RankSupervision:
    """Liveness and failure of the ranks (see the module docstring for the state it reads)."""

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _fail(self, rank: int, message: str) -> WorkerFailedError:
        with self._lock:
            if self.failure is None:
                failure = WorkerFailedError(rank, message)
                log.error("%s", failure)
                self._finalizer()  # the group is torn down before anyone sees the failure
                self.failure = failure
        return self.failure

    def _death(self, rank: int) -> WorkerFailedError:
        """Fail for the death of `rank`, naming every rank found dead with it (a peer's death can
        take a rank down too; which died first is not known)."""
        p = self.procs[rank]
        p.join(0.5)  # a remote rank: until its launcher reports the exit code
        time.sleep(0.1)  # let a death caused by this one show
        also = [
            f"rank {r} (pid {q.pid}{self._where(r)}, exit code {q.exitcode})"
            for r, q in enumerate(self.procs)
            if r != rank and not q.is_alive()
        ]
        tail = f"; also gone: {', '.join(also)}" if also else ""
        return self._fail(rank, f"process {p.pid}{self._where(rank)} exited (exit code {p.exitcode}){tail}")

    def _where(self, rank: int) -> str:
        c = self.cluster
        return f" on node {c.node_of(rank, self.world_size)}" if c.nnodes > 1 else ""

    def _peer_death(self, rank: int, grace_s: float = 1.0) -> int | None:
        """A rank other than `rank` found dead within `grace_s` (a collective can fail on the
        closed connection before the dead process can be reaped), or None."""
        deadline = time.monotonic() + grace_s
        while True:
            dead = [r for r, p in enumerate(self.procs) if r != rank and not p.is_alive()]
            if dead or time.monotonic() > deadline:
                return dead[0] if dead else None
            time.sleep(0.05)

    def _local_alive(self) -> None:
        """Raise for a rank of this host that died (while waiting for the other nodes)."""
        for r, p in enumerate(self.procs):
            if isinstance(p, BaseProcess) and not p.is_alive():
                raise self._death(r)

    def _watch(self) -> None:
        """Between steps: a local rank's exit (its sentinel) or another node's launcher reporting
        one of its ranks' exit (or its own loss) fails the engine."""
        sentinels = {p.sentinel: r for r, p in enumerate(self.procs) if p.sentinel is not None}
        agents = list(self._hub.agents.values()) if self._hub is not None else []
        while not self._closing.is_set():
            try:
                ready = wait([*sentinels, *agents])
            except (OSError, ValueError):  # closed by a failure elsewhere
                return
            for obj in ready:
                if obj in sentinels:
                    rank, why = sentinels[obj], ""
                else:
                    report = self._hub.poll(obj)
                    if report is None:
                        continue
                    rank, why = report
                    if why:
                        agents.remove(obj)
                if self._closing.is_set():
                    return
                if why:
                    self._fail(rank, why)
                else:
                    self._death(rank)
                return

    def _next(self, ranks: set[int], timeout_s: float | None, what: str) -> tuple[int, tuple]:
        """`(rank, message)`: the next message of one of `ranks` (the others' wait until asked: a
        rank may have answered a later step already); a dead rank, one reporting an error (or
        `timeout_s` passing) fails the runner."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        # only the ranks asked: another may already have answered a later step (pipelining)
        watched = {c: r for r, c in enumerate(self.conns) if r in ranks}
        sentinels = {p.sentinel: r for r, p in enumerate(self.procs) if p.sentinel is not None}
        while True:
            if self.failure is not None:
                raise self.failure
            try:
                ready = wait([*watched, *sentinels], POLL_S)
            except (OSError, ValueError):  # the monitor closed the pipes of a failed group
                with self._lock:  # held until its teardown is over and the failure is set
                    pass
                if self.failure is not None:
                    raise self.failure from None
                raise
            for obj in ready:  # messages first: a rank that reported an error then exited
                if obj in watched:
                    r = watched[obj]
                    try:
                        msg = obj.recv()
                    except (EOFError, OSError):
                        raise self._death(r) from None
                    if msg[0] == "error":
                        dead = self._peer_death(r)
                        if dead is not None:  # a peer's death broke this rank's collective: blame it
                            raise self._death(dead) from None
                        raise self._fail(r, f"raised while {what}:\n{msg[1]}")
                    return r, msg
            for obj in ready:
                if obj in sentinels:
                    raise self._death(sentinels[obj])
            if deadline is not None and time.monotonic() > deadline:
                raise self._fail(min(ranks), f"no answer within {timeout_s:.0f} s while {what}")
