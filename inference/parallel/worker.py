"""One rank's worker process: joins the mesh, builds its shard and a `ModelRunner`, then runs the
steps the driver sends (the same scheduler output to every rank) until told to stop.

Every rank runs the whole step (cache operations on its own pools, the forward with its
collectives, the sampler on the all-gathered logits) and answers it: the sampler rank (rank 0, or
with pipeline stages the first rank of the last stage) with the sampled tokens, the others with
their step number only, so the driver knows every rank's outcome. A pipeline stage's rank runs
the step through its own layers (`pipeline.StageRunner`, micro-batched; activations
point-to-point between stages).

An exception raised inside a step (`ModelRunner.execute`) is answered as `step_failed` and the
rank stays up: it forgets the block tables the step built (the engine's recovery recomputes those
requests) and waits for the driver, which accepts it as a failed step only when every rank failed
the same step, and then has each rank prove the group whole and in step (`_check_in_step`, a
collective on each of the rank's groups). Anything else (an exception outside a step, a failed
check) is reported as `error` and ends the process: the driver then stops the engine
(`WorkerFailedError`).

Offload tiers: the rank's `ModelRunner` has its own `TierStore` (its shard of every block and
slot, at the locations the driver's `TierIndex` chose) and runs the step's `tier_ops` as at world
size 1. Each answer carries the promotions that landed on this rank since the last one; a failed
step's answer also the promotions it never started. A tier I/O error surfaces outside the step
(in the poll) and so ends the process: the ranks' tier data would differ from then on.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from inference.analyze.stages import StagePlan
from inference.config import ModelSpec
from inference.engine.engine import EngineConfig
from inference.engine.request import SamplingParams
from inference.model.cache_tensors import HybridCacheSpec
from inference.parallel.comm import NVLINK_MULTICAST_OFF, MeshGroups
from inference.parallel.config import ParallelConfig

if TYPE_CHECKING:
    from inference.engine.model_runner import ModelRunner
    from inference.engine.scheduler import SchedulerOutput

__all__ = ["WorkerArgs", "rank_disk_url", "rank_memory", "worker_main"]


@dataclass(frozen=True, slots=True)
class WorkerArgs:
    """Everything a rank needs to build its part (picklable: sent to the spawned process)."""

    config: ParallelConfig
    spec: ModelSpec
    stages: StagePlan  # the pipeline stages' layers (one stage without pipeline parallelism)
    load_format: str
    path: str | None
    dtype: torch.dtype
    device_type: str  # "cpu" or "cuda" (rank r uses its host's cuda:r % ranks_per_node)
    seed: int
    cache_spec: (
        HybridCacheSpec  # this rank's TP-sharded cache, all layers (`rank_cache_spec` cuts its stage's)
    )
    engine_config: EngineConfig  # pool sizes (num_blocks: the configured or starting value)
    mem_fraction: float  # of each GPU, as the single-GPU plan uses it
    fixed_blocks: bool  # keep num_blocks (checked) instead of sizing the KV pool from memory
    vocab_size: int | None
    init_method: str
    collective_timeout_s: float
    threads: int
    ranks_per_node: int = 0  # rank r uses its host's device r % ranks_per_node (0: one host)
    # called as `rank_hook(model, rank)` once the rank's shard is built (instrumentation, and the
    # tests' fault injection); must be picklable (a module-level function)
    rank_hook: Callable[[torch.nn.Module, int], None] | None = None


@dataclass(frozen=True, slots=True)
class _Req:
    """What `ModelRunner.execute` reads of a request in a worker."""

    sampling: SamplingParams
    mm_inputs: Any = None


class _Profile:
    """The torch profiler around the steps between `profile_start` and `profile_stop` (rank 0)."""

    def __init__(self, cuda: bool) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.prof = profile(activities=acts)
        self.prof.__enter__()

    def stop(self) -> list[dict[str, Any]]:
        self.prof.__exit__(None, None, None)
        rows = []
        for e in self.prof.key_averages():
            rows.append(
                {
                    "name": e.key,
                    "count": e.count,
                    "cpu_total_us": e.cpu_time_total,
                    "device_total_us": getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0)),
                }
            )
        return rows


def rank_memory(model: torch.nn.Module, cache: Any) -> dict[str, int]:
    """Bytes this rank holds: weights, the KV pool (latents, FP8 scales, DSA keys), the state pool
    (states and conv windows), and what CUDA has allocated (0 on CPU)."""

    def size(tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    return {
        "weight_bytes": size(model.parameters()) + size(model.buffers()),
        "kv_pool_bytes": size([*cache.kv.values(), *cache.kv_scale.values(), *cache.index_k.values()]),
        "state_pool_bytes": size([*cache.state.values(), *cache.conv.values()]),
        "kv_bytes_per_token": cache.spec.kv_bytes_per_token,
        "state_bytes_per_slot": cache.spec.state_bytes_per_slot,
        "cuda_allocated_bytes": torch.cuda.memory_allocated() if torch.cuda.is_available() else 0,
    }


def rank_disk_url(disk_url: str, rank: int) -> str:
    """Rank `rank`'s own folder of the disk tier (a local folder or any fsspec URL): the ranks
    write the same locations, each its own shard."""
    return f"{disk_url.rstrip('/')}/rank{rank}"


class _Promotions:
    """This rank's promotions started and not yet reported landed to the driver."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.pending: set[int] = set()

    def started(self, out: SchedulerOutput, unstarted: list[int]) -> None:
        if out.tier_ops is not None:
            self.pending |= {t.id for t in out.tier_ops.transfers} - set(unstarted)

    def landed(self, wait_for: int | None = None) -> list[int]:
        """The ones on this device now (`wait_for`: block until that one is among them)."""
        ids = self.runner.poll_transfers()
        self.pending -= set(ids)
        while wait_for in self.pending:
            more = self.runner.poll_transfers(wait=True)
            if not more and not self.runner.tier_store.num_pending:
                raise RuntimeError(f"promotion {wait_for} was never started on this rank")
            self.pending -= set(more)
            ids += more
        return ids


def decode_graphs_on(args: WorkerArgs) -> bool:
    """Per-rank CUDA graphs for pure-decode steps (and short steps, where the model allows them):
    on CUDA when the engine enables them, under TP and under EP with the "local" expert dispatch. Every rank captures the same (batch, width)
    buckets at the same step, since all of them run the driver's batches, and the NCCL
    all-reduces of the forward are captured with it (a capture that fails on one rank only leaves
    that rank eager: its collectives are the same ones, in the same order). A "local" EP step of
    decode size keeps its pairs in place, sync-free (`parallel/moe.py`, `MASKED_MAX_PAIRS`);
    "all_to_all" reads its split sizes on the host, which a graph cannot replay."""
    return (
        args.device_type == "cuda"
        and args.config.pipeline_parallel_size == 1
        and args.engine_config.enable_cuda_graphs
        and (args.config.expert_parallel_size == 1 or args.config.expert_dispatch == "local")
    )


def _graph_counts(runner: ModelRunner) -> tuple[int, int] | None:
    g = runner.graphs
    return None if g is None else (g.num_captured, g.num_replays)


def worker_main(rank: int, args: WorkerArgs, conn: Connection) -> None:
    """Process entry point (spawned by `ParallelRunner`)."""
    os.environ.update(NVLINK_MULTICAST_OFF)
    torch.set_num_threads(args.threads)
    try:
        model, device, mesh = _setup(rank, args)
        if args.rank_hook is not None:
            args.rank_hook(model, rank)
        cache_spec = rank_cache_spec(args, mesh.pp.index)
        conn.send(("plan", _plan(model, args, cache_spec, device)))
        kind, num_blocks = conn.recv()  # the driver's choice: the smallest pool any rank fits
        if kind != "pools":
            raise RuntimeError(f"expected the pool size from the driver, got {kind!r}")
        runner = _runner(model, args, cache_spec, num_blocks, device, mesh)
        conn.send(("ready", rank))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    _loop(rank, runner, conn, mesh, args.device_type == "cuda")


def rank_cache_spec(args: WorkerArgs, stage: int) -> HybridCacheSpec:
    """The cache a rank of pipeline stage `stage` allocates: its stage's layers, TP-sharded."""
    from inference.parallel.pipeline import stage_cache_spec

    return stage_cache_spec(args.cache_spec, args.stages, stage)


def _runner(
    model: torch.nn.Module, args: WorkerArgs, cache_spec: HybridCacheSpec, num_blocks: int,
    device: torch.device, mesh: MeshGroups,
) -> ModelRunner:  # fmt: skip
    from inference.engine.model_runner import ModelRunner
    from inference.parallel.pipeline import StageRunner

    cfg = args.engine_config
    common = dict(
        num_blocks=num_blocks, block_size=cfg.cache.block_size, num_slots=cfg.cache.num_state_slots,
        device=device, dtype=args.dtype, vocab_size=args.vocab_size,
    )  # fmt: skip
    if args.config.pipeline_parallel_size > 1:
        micro = args.config.micro_batches
        return StageRunner(model, cache_spec, plan=args.stages, link=mesh.pp, micro_batches=micro, **common)
    return ModelRunner(
        model, cache_spec, cuda_graphs=decode_graphs_on(args), short_graph_tokens=cfg.short_graph_tokens,
        short_graph_row_keys=cfg.short_graph_row_keys, **common,
    )  # fmt: skip


def _setup(rank: int, args: WorkerArgs) -> tuple[torch.nn.Module, torch.device, MeshGroups]:
    """Join the mesh and build this rank's shard."""
    from inference.parallel.comm import init_mesh
    from inference.parallel.weights import build_sharded_model

    if args.device_type == "cuda":
        local = rank % (args.ranks_per_node or args.config.world_size)
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    mesh = init_mesh(args.config, rank, args.init_method, backend, args.collective_timeout_s)
    model = build_sharded_model(
        args.spec, mesh, load_format=args.load_format, path=Path(args.path) if args.path else None,
        dtype=args.dtype, device=device, seed=args.seed, stages=args.stages,
    )  # fmt: skip
    return model, device, mesh


def _plan(model: torch.nn.Module, args: WorkerArgs, cache_spec: HybridCacheSpec, device: torch.device) -> Any:
    """This rank's `MemoryPlan`, by the single-GPU rule (`plan_pools`: on CUDA a profiled forward
    of the largest step, run by every rank in step, and what `mem_fraction` leaves for the KV
    pool; on CPU the configured pools)."""
    from inference.engine.memory_planner import plan_pools
    from inference.tokenizer import ByteTokenizer

    _, plan = plan_pools(
        model, ByteTokenizer(), cache_spec, args.engine_config, device, args.dtype,
        mem_fraction=args.mem_fraction, fixed_blocks=args.fixed_blocks,
    )  # fmt: skip
    return plan


def _check_in_step(mesh: MeshGroups, step: int, device: torch.device) -> None:
    """After a step every rank failed: one all-reduce of `(step, 1)` on each of this rank's
    groups. It returns only if every rank of every group joins it and all count the same steps;
    a collective the failed step left half-done shows as a hang (the driver's timeout) or a wrong
    sum here, never as a later step silently mixing data of two steps."""
    from inference.parallel.comm import Comm

    comms = [Comm(mesh.config.world_size, mesh.rank)]  # the default group: every rank
    # a subgroup's None handle is the default group, checked already
    comms += [c for c in (mesh.stage, mesh.tp, mesh.ep) if c.size > 1 and c.group is not None]
    for comm in comms:
        probe = torch.tensor([step, 1], dtype=torch.int64, device=device)
        comm.all_reduce(probe, "step_check")
        if probe.tolist() != [step * comm.size, comm.size]:
            raise RuntimeError(
                f"ranks out of step after failed step {step}: group of {comm.size} summed {probe.tolist()}"
            )


def _loop(rank: int, runner, conn: Connection, mesh: MeshGroups, cuda: bool) -> None:
    sampler = mesh.config.sampler_rank
    import torch.distributed as dist

    requests: dict[str, _Req] = {}
    profile: _Profile | None = None
    step = 0  # steps received: the driver checks every rank answers the same one
    promotions = _Promotions(runner)
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # the driver is gone
                break
            kind = msg[0]
            if kind == "step":
                step += 1
                _, out, new_requests, drops, token_masks = msg
                for rid in drops:
                    runner.drop(rid)
                    requests.pop(rid, None)
                for rid, (sp, mm) in new_requests.items():
                    requests[rid] = _Req(sp, mm)
                t0, start = time.perf_counter(), time.monotonic()
                try:
                    sampled, logprobs = runner.execute(out, requests, token_masks)
                except Exception:
                    # the engine recomputes the step's requests from their start (or fails the
                    # one that ran alone): the tables this step extended must not outlive it
                    for s in out.scheduled:
                        runner.tables.pop(s.req_id, None)
                    unstarted, runner.unstarted = runner.unstarted, []
                    promotions.started(out, unstarted)
                    failure = traceback.format_exc()
                    conn.send(("step_failed", step, failure, unstarted, promotions.landed()))
                    continue
                promotions.started(out, [])
                dt = time.perf_counter() - t0
                answer = (sampled, logprobs, dt, _graph_counts(runner)) if rank == sampler else None
                span = (start, time.monotonic(), getattr(runner, "waited", 0.0))  # waited: for other stages
                conn.send(("done", step, answer, span, promotions.landed()))
            elif kind == "tiers":
                runner.attach_tiers(msg[1], rank_disk_url(msg[2], rank))
                conn.send(("tiers_ready", rank))
            elif kind == "poll":  # the engine waits for a promotion: block until it landed here
                conn.send(("polled", promotions.landed(wait_for=msg[1])))
            elif kind == "check_step":
                _check_in_step(mesh, msg[1], runner.device)
                conn.send(("in_step", msg[1]))
            elif kind == "profile_start":
                if cuda:
                    torch.cuda.synchronize()
                profile = _Profile(cuda)
            elif kind == "profile_stop":
                if cuda:
                    torch.cuda.synchronize()
                rows = profile.stop() if profile is not None else []
                profile = None
                if rank == 0:
                    conn.send(("profile", rows))
            elif kind == "memory":  # every rank answers
                conn.send(("memory", rank_memory(runner.model, runner.cache)))
            elif kind == "traffic":  # every rank answers: its counts since the last ask
                from inference.parallel.comm import take_traffic

                conn.send(("traffic", take_traffic()))
            elif kind == "stop":
                break
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if runner.tier_store is not None:
            with contextlib.suppress(Exception):  # finish queued disk writes (a graceful stop)
                runner.tier_store.close()
        if dist.is_initialized():
            with contextlib.suppress(Exception):  # a peer already gone: nothing to tear down cleanly
                dist.destroy_process_group()
