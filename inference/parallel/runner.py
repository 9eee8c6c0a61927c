"""The driver side of a parallel engine: starts one worker process per rank, supervises them,
and stands in for `ModelRunner` in `Engine` (same `execute` / `drop` / `tables` / `graphs`: under
TP on CUDA each rank replays its own decode graphs, `worker.decode_graphs_on`).

The scheduler and cache bookkeeping stay in the driver; each step its `SchedulerOutput` (ints
and lists) is pickled once and sent to every rank, with the sampling parameters (and image
embeddings, from the driver's vision tower) of requests the workers have not seen and the ids
they can forget. Every rank answers (its step number), the sampler rank (`ParallelConfig.
sampler_rank`: rank 0, or the first rank of the last pipeline stage) with the sampled tokens.

Supervision: the driver never joins a collective, so it never blocks in one. It waits for every
rank's answer to a step with `multiprocessing.connection.wait` over every rank's pipe and process
sentinel, so a rank that dies (or reports an exception outside a step) fails the step at once
with `WorkerFailedError`; a monitor thread does the same between steps. Either way the other
ranks (possibly stuck in a collective with the dead one) are killed, and every later call raises
the same error.

Offload tiers (host and disk, `inference/cache/tiers.py`): the driver's one `TierIndex` decides
every store, move, drop and promotion as ints and lists, sent in the step's `tier_ops`; each rank
moves its own shard of those blocks and slots with its own `TierStore` (`worker.py`), the same
locations on every rank, so KV and recurrent state move together on all of them. A promotion is
done only once every rank has it on its device: the ranks report the ones that landed with each
step's answer (or, when the engine has nothing else to run, on a `poll` that waits for the
oldest), and `poll_transfers` returns those all ranks reported.

A step that raises (a request whose input breaks the forward or the sampler) is isolated as at
world size 1 only when it raised the same way everywhere: every rank answers `step_failed` for
the same step number, then every rank passes a check collective on each of its groups
(`worker._check_in_step`); `execute` then raises `StepFailedError` and the ranks stay up for the
engine's recovery. If only some ranks fail the step (the others answer `done`, or do not answer
within `agree_timeout_s`: typically waiting in a collective the failed rank never joined), or the
check does not pass in time, the engine fails with `WorkerFailedError`. A failure at the same
point on every rank leaves no collective half-done; one at different points can (a rank blocked
in an all-reduce its peers abandoned), which is why anything short of that agreement is fatal.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import socket
import tempfile
import threading
import weakref
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from multiprocessing import get_context
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from inference.cache.tiers import TierCapacity
from inference.engine.model_runner import MMInputs
from inference.engine.request import Request, TokenLogprob
from inference.engine.scheduler import SchedulerOutput
from inference.parallel.cluster import ClusterHub, ClusterSpec
from inference.parallel.config import StepFailedError, WorkerFailedError
from inference.parallel.supervision import RankSupervision, kill_ranks
from inference.parallel.worker import WorkerArgs, decode_graphs_on, worker_main

__all__ = ["ParallelRunner"]

log = logging.getLogger(__name__)

# once one rank failed a step, how long the others get to fail it too (and then to pass the
# check): a deterministic failure reaches every rank within the same forward, so a rank still
# silent after this is stuck in a collective, not slow
AGREE_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(slots=True)
class RankGraphs:
    """Rank 0's decode-graph counts, as `DecodeGraphs` shows them to `Engine.stats`."""

    num_captured: int = 0
    num_replays: int = 0


class ParallelRunner(RankSupervision):
    """`ModelRunner`'s interface over `world_size` worker processes (see module docstring)."""

    # the language model lives in the ranks; `model` is the driver's image side of a
    # vision-language model (`VisionEncoder`, read by `server.images`), else None

    def __init__(
        self,
        args: WorkerArgs,
        *,
        start_timeout_s: float = 600.0,
        agree_timeout_s: float = AGREE_TIMEOUT_S,
        model: torch.nn.Module | None = None,
        cluster: ClusterSpec | None = None,
    ) -> None:
        """`cluster`: the ranks' hosts (`cluster.py`); this process is node 0's driver and spawns
        node 0's ranks, the other nodes' launchers spawn theirs."""
        world = args.config.world_size
        self.cluster = cluster = cluster or ClusterSpec()
        self.model = model
        self.device = torch.device(args.device_type)
        self.world_size = world
        self.sampler_rank = args.config.sampler_rank  # the rank that answers with the tokens
        self.forward_time = 0.0
        # rank 0's decode-graph counts, for `Engine.stats` (None: the ranks run eagerly)
        self.graphs: RankGraphs | None = RankGraphs() if decode_graphs_on(args) else None
        # block tables live in the workers, which drop a failed step's themselves; the engine's
        # requeue-after-failure pop of this dict has nothing to reach
        self.tables: dict[str, list[int]] = {}
        self.agree_timeout_s = agree_timeout_s
        self._step = 0  # steps sent: every rank must answer each one, with this number
        self.failure: WorkerFailedError | None = None
        # promotions of a failed step that no rank started (the engine's recovery undoes them)
        self.unstarted: list[int] = []
        self._in_flight: list[int] = []  # promotions sent, in order, not yet on every rank
        self._landed: Counter[int] = Counter()  # promotion -> ranks that reported it landed
        self._tmp: tempfile.TemporaryDirectory | None = None  # the disk tier's default folder
        self._known: set[str] = set()  # requests whose sampling params the workers have
        self._sent: deque[int] = deque()  # steps submitted, not collected
        self._stash: dict[int, dict[int, tuple]] = {}  # answers read ahead of their collect
        # each rank's recent steps: (step, monotonic start, end, seconds waiting for other stages)
        self.spans: list[deque[tuple[int, float, float, float]]] = [deque(maxlen=512) for _ in range(world)]
        self._drops: list[str] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        ctx = get_context("spawn")  # CUDA cannot be forked; spawn everywhere for one behaviour
        init = cluster.init_method if cluster.nnodes > 1 else f"tcp://127.0.0.1:{_free_port()}"
        args = replace(
            args, init_method=args.init_method or init, ranks_per_node=cluster.ranks_per_node(world)
        )
        # the other nodes' launchers connect here (before any rank can try to)
        self._hub = ClusterHub(cluster, world) if cluster.nnodes > 1 else None
        self.procs: list[Any] = [None] * world  # a local Process, or a `RemoteRank`
        self.conns: list[Connection] = [None] * world
        self._finalizer = weakref.finalize(self, kill_ranks, self.procs, self.conns, self._closing, self._hub)
        for rank in cluster.ranks_of(0, world):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=worker_main, args=(rank, args, child), name=f"dayzero-rank{rank}", daemon=True
            )
            p.start()
            child.close()
            self.procs[rank] = p
            self.conns[rank] = parent
        try:
            if self._hub is not None:
                self._hub.connect(args, self.procs, self.conns, start_timeout_s, self._local_alive)
            plans = self._gather("plan", start_timeout_s, "starting")
            # every rank allocates the same pools: the smallest any of them fits
            self.plan = min(plans, key=lambda p: p.num_blocks)
            for c in self.conns:
                c.send(("pools", self.plan.num_blocks))
            self._gather("ready", start_timeout_s, "allocating its pools")
        except BaseException:
            self.close()
            raise
        self._monitor = threading.Thread(target=self._watch, name="dayzero-rank-monitor", daemon=True)
        self._monitor.start()
        log.info("parallel engine: %d ranks ready (pids %s)", world, [p.pid for p in self.procs])

    def _gather(self, kind: str, timeout_s: float, what: str) -> list[Any]:
        """Every rank's next message, which must be `kind`: their payloads in rank order (the
        answers to steps still in flight come first: read ahead for their `collect`)."""
        self._read_ahead()
        got: dict[int, Any] = {}
        while len(got) < self.world_size:  # ranks answer in any order
            rank, msg = self._next(set(range(self.world_size)) - set(got), timeout_s, what)
            if msg[0] != kind:
                raise self._fail(rank, f"sent {msg[0]!r} while {what}")
            got[rank] = msg[1]
        return [got[r] for r in range(self.world_size)]

    def _wait(self, rank: int, timeout_s: float | None, what: str) -> tuple:
        self._read_ahead()
        return self._next({rank}, timeout_s, what)[1]

    def _read_ahead(self) -> None:
        """Take every rank's answers to the steps still in flight (each rank answers in order)."""
        for step in self._sent:
            if step not in self._stash:
                self._stash[step] = self._step_answers(step)

    def _broadcast(self, msg: tuple) -> None:
        if self.failure is not None:
            raise self.failure
        payload = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        for r, c in enumerate(self.conns):
            try:
                c.send_bytes(payload)
            except (BrokenPipeError, OSError):
                raise self._death(r) from None

    # -- ModelRunner's interface -------------------------------------------------------------
    def attach_tiers(self, capacity: TierCapacity, disk_url: str = "") -> None:
        """Give every rank its host and disk tiers of `capacity` (one rank's share; each rank's
        disk files under its own folder of `disk_url`, by default a temporary folder the driver
        removes on `close`, also when a rank was killed)."""
        if capacity.disk_bytes and not disk_url:
            self._tmp = tempfile.TemporaryDirectory(prefix="dayzero-kv-")
            disk_url = self._tmp.name
        self._broadcast(("tiers", capacity, disk_url))
        self._gather("tiers_ready", 120.0, "allocating its offload tiers")

    def _landed_everywhere(self) -> list[int]:
        done = [t for t in self._in_flight if self._landed[t] == self.world_size]
        for t in done:
            del self._landed[t]
        if done:
            finished = set(done)
            self._in_flight = [t for t in self._in_flight if t not in finished]
        return done

    def poll_transfers(self, wait: bool = False) -> list[int]:
        """Promotions on every rank's device now; `wait`: block until at least the oldest one is."""
        done = self._landed_everywhere()
        if done or not wait or not self._in_flight:
            return done
        self._broadcast(("poll", self._in_flight[0]))
        for ids in self._gather("polled", None, "waiting for a promotion from the offload tiers"):
            self._landed.update(ids)
        return self._landed_everywhere()

    def drop(self, req_id: str) -> None:
        self.tables.pop(req_id, None)
        if req_id in self._known:
            self._known.discard(req_id)
            self._drops.append(req_id)

    @torch.inference_mode()
    def execute(
        self, out: SchedulerOutput, requests: Mapping[str, Request], token_masks: Any = None
    ) -> tuple[dict[str, int], dict[str, TokenLogprob]]:
        """Run one scheduled step on every rank; the sampler rank's tokens (and logprobs)."""
        self.submit(out, requests, token_masks)
        return self.collect()

    def submit(self, out: SchedulerOutput, requests: Mapping[str, Request], token_masks: Any = None) -> None:
        """Send one step to every rank without waiting for it (`collect` takes the answers, in
        order): pipeline stages then work on several steps at once. `token_masks`: the grammar
        masks of its constrained requests (or a callable giving them), which travel with it."""
        new = {}
        for s in out.scheduled:
            if s.req_id not in self._known:
                req = requests[s.req_id]
                mm = req.mm_inputs  # image embeddings (the driver's tower): sent once, from host memory
                new[s.req_id] = (
                    req.sampling,
                    None if mm is None else MMInputs(mm.embeds.cpu(), mm.positions.cpu()),
                )
                self._known.add(s.req_id)
        drops, self._drops = self._drops, []
        masks = token_masks() if callable(token_masks) else token_masks
        self._broadcast(("step", out, new, drops, masks or None))
        if out.tier_ops is not None:
            self._in_flight += [t.id for t in out.tier_ops.transfers]
        self._step += 1
        self._sent.append(self._step)

    @torch.inference_mode()
    def collect(self) -> tuple[dict[str, int], dict[str, TokenLogprob]]:
        """The oldest submitted step's outcome: the sampler rank's tokens, or `StepFailedError`
        (after the steps sent behind it were answered too, so the check collective is next in
        every rank's queue)."""
        step = self._sent.popleft()
        answers = self._stash.pop(step, None) or self._step_answers(step)
        for a in answers.values():
            self._landed.update(a[-1])
        failed = {r: a for r, a in answers.items() if a[0] == "step_failed"}
        if failed:
            self._read_ahead()
            self._check_in_step(step, failed[min(failed)][2])
            self._unstarted_after_failure(step, {r: a[3] for r, a in failed.items()})
            raise StepFailedError(step, failed[min(failed)][2])
        for r, a in answers.items():
            self.spans[r].append((step, *a[3]))
        sampled, logprobs, seconds, counts = answers[self.sampler_rank][2]
        self.forward_time += seconds
        if self.graphs is not None and counts is not None:
            self.graphs.num_captured, self.graphs.num_replays = counts
        return sampled, logprobs

    def _step_answers(self, step: int) -> dict[int, tuple]:
        """Every rank's answer to `step` (`done` or `step_failed`); fails the runner when ranks
        disagree or one is out of step. No time limit until a rank reports a failure (steps may
        be long), then `agree_timeout_s` for the rest."""
        answers: dict[int, tuple] = {}
        timeout: float | None = None
        what = f"running step {step}"
        while len(answers) < self.world_size:
            rank, msg = self._next(set(range(self.world_size)) - set(answers), timeout, what)
            if msg[0] not in ("done", "step_failed") or msg[1] != step:
                raise self._fail(rank, f"answered {msg[0]!r} for step {msg[1]!r} while {what}")
            answers[rank] = msg
            if msg[0] == "step_failed" and timeout is None:
                timeout = self.agree_timeout_s
                last = msg[2].strip().splitlines()[-1]
                what = (
                    f"running step {step}, which rank {rank} failed ({last}); a rank that does not "
                    "fail it too is out of step with it (waiting in a collective it left)"
                )
        kinds = {a[0] for a in answers.values()}
        if len(kinds) > 1:
            bad = sorted(r for r, a in answers.items() if a[0] == "step_failed")
            good = sorted(r for r, a in answers.items() if a[0] == "done")
            raise self._fail(
                bad[0],
                f"step {step} raised on ranks {bad} but not on {good}, so the ranks have diverged:\n"
                f"{answers[bad[0]][2]}",
            )
        return answers

    def _unstarted_after_failure(self, step: int, unstarted: dict[int, list[int]]) -> None:
        """The failed step's promotions no rank started (for the engine to undo). Ranks that
        disagree hold different tier data from now on: that is a diverged group, not a failed step."""
        if len({tuple(u) for u in unstarted.values()}) > 1:
            raise self._fail(
                min(unstarted), f"step {step} failed at different tier copies on the ranks: {unstarted}"
            )
        self.unstarted = list(unstarted[min(unstarted)])
        gone = set(self.unstarted)
        self._in_flight = [t for t in self._in_flight if t not in gone]

    def _check_in_step(self, step: int, traceback: str) -> None:
        """Every rank failed `step`: have them prove the group whole and in step, or fail."""
        self._broadcast(("check_step", step))
        what = f"checking the ranks are in step after step {step} failed on all of them:\n{traceback}"
        for rank, got in enumerate(self._gather("in_step", self.agree_timeout_s, what)):
            if got != step:
                raise self._fail(rank, f"checked step {got}, not {step}")

    def profile(self, steps) -> list[dict[str, Any]]:
        """Run `steps()` (a callable driving the engine) under the torch profiler in every rank;
        rank 0's `key_averages` rows."""
        self._broadcast(("profile_start",))
        steps()
        self._broadcast(("profile_stop",))
        return self._wait(0, 300.0, "profiling")[1]

    def memory(self) -> list[dict[str, int]]:
        """Every rank's `rank_memory` figures, in rank order."""
        self._broadcast(("memory",))
        return self._gather("memory", 60.0, "reporting memory")

    def traffic(self) -> list[dict[str, list[int]]]:
        """Every rank's collective and point-to-point `[calls, payload bytes]` by `<label>.<op>`
        since the last call (`comm.take_traffic`), in rank order."""
        self._broadcast(("traffic",))
        return self._gather("traffic", 60.0, "reporting its traffic")

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        self._closing.set()
        if self.failure is None:
            for c in self.conns:
                if c is not None:
                    with contextlib.suppress(OSError):
                        c.send(("stop",))
            for p in self.procs:  # this host's; the other nodes' launchers reap theirs
                if isinstance(p, BaseProcess):
                    p.join(5.0)
        self._finalizer()
        if self._tmp is not None:  # after the ranks stopped: none writes into it any more
            self._tmp.cleanup()
            self._tmp = None
