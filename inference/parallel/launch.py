"""Build an `Engine` whose model runs over `tensor_parallel_size * expert_parallel_size *
pipeline_parallel_size` ranks."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from inference.analyze.stages import StagePlan, plan_stages
from inference.cache.tiers import TierConfig
from inference.config import ModelSpec
from inference.engine.engine import Engine, EngineConfig
from inference.engine.memory_plan import MemoryPlan, check_pools
from inference.model.cache_tensors import HybridCacheSpec
from inference.parallel.cluster import ClusterSpec, cluster_key
from inference.parallel.config import ParallelConfig, ParallelConfigError
from inference.parallel.pipeline import PipelinedEngine, stage_cache_spec
from inference.parallel.runner import ParallelRunner
from inference.parallel.sharding import check_shardable, shard_cache_spec
from inference.parallel.weights import build_vision_encoder
from inference.parallel.worker import WorkerArgs

__all__ = ["build_parallel_engine", "rank_memory_plan", "rank_tiers"]

log = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT_S = 300.0  # a collective that long is a lost peer, not a slow step


def rank_memory_plan(
    cache_spec: HybridCacheSpec,
    config: EngineConfig,
    parallel: ParallelConfig,
    spec: ModelSpec,
    stages: StagePlan | None = None,
) -> MemoryPlan:
    """The fullest rank's pools (every rank allocates the same block and slot counts): the
    configured counts at the sharded per-rank sizes (KDA/GDN state by head, MLA latent whole, GQA
    K|V by KV head) of the pipeline stage whose layers keep the most, the figures `dayzero
    analyze` reports."""
    stages = stages or plan_stages(spec, 1)
    local = shard_cache_spec(cache_spec, parallel, spec)
    parts = [stage_cache_spec(local, stages, p) for p in range(stages.num_stages)]
    fullest = max(parts, key=lambda c: (c.kv_bytes_per_token, c.state_bytes_per_slot))
    plan = MemoryPlan(
        config.cache.block_size,
        config.cache.num_blocks,
        config.cache.num_state_slots,
        fullest.kv_bytes_per_token * config.cache.block_size,
        fullest.state_bytes_per_slot,
    )
    return check_pools(plan, config.scheduler.max_model_len)


def rank_tiers(tiers: TierConfig, world_size: int) -> TierConfig:
    """One rank's share of the offload tiers: `--kv-offload-host-gb` / `--kv-offload-disk-gb` are
    the host's (its pinned memory and disk are shared by all its ranks), split evenly. Every rank
    then has the same location counts, which the driver's one `TierIndex` hands out: each rank
    stores its own shard of a block or slot at the same location (`worker.rank_disk_url`)."""
    return replace(
        tiers, host_bytes=tiers.host_bytes // world_size, disk_bytes=tiers.disk_bytes // world_size
    )


def build_parallel_engine(
    spec: ModelSpec,
    tokenizer: Any,
    cache_spec: HybridCacheSpec,
    config: EngineConfig,
    *,
    tensor_parallel_size: int,
    expert_parallel_size: int,
    expert_dispatch: str = "local",
    pipeline_parallel_size: int = 1,
    micro_batches: int = 1,
    cluster: ClusterSpec | None = None,
    model_dir: str | Path | None,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    mem_fraction: float = 0.8,
    fixed_blocks: bool = False,
    rank_hook: Callable[[torch.nn.Module, int], None] | None = None,
) -> Engine:
    """Check the split, verify the checkpoint manifest once, start the ranks, wrap them in an Engine.

    Pools: each rank plans its own by the single-GPU rule (on CUDA, profiled and sized from
    `mem_fraction` unless `fixed_blocks`; on CPU the configured ones) and all allocate the
    smallest of those KV pools, so the scheduler's one block count is valid on every rank.
    `rank_hook(model, rank)` runs in each rank on its shard once built (see `WorkerArgs`).
    `cluster`: the ranks' hosts (`cluster.py`: this process is node 0's driver)."""
    from inference.loader import verify_manifest

    parallel = ParallelConfig(
        tensor_parallel_size, expert_parallel_size, expert_dispatch, pipeline_parallel_size, micro_batches
    )
    check_shardable(spec, parallel)
    try:
        stages = plan_stages(spec, pipeline_parallel_size)
    except ValueError as exc:
        raise ParallelConfigError(str(exc)) from None
    world = parallel.world_size
    config = config.evolve(tiers=rank_tiers(config.cache.tiers, world))
    cluster = cluster or ClusterSpec()
    if cluster.node_rank != 0:
        raise ParallelConfigError("the engine's driver runs on node 0; other nodes run `dayzero infer-node`")
    local = cluster.ranks_per_node(world)
    if cluster.nnodes > 1:
        cluster_key()  # refuse a missing shared secret before starting anything
    if device.type == "cuda" and torch.cuda.device_count() < local:
        raise ParallelConfigError(
            f"world size {world} over {cluster.nnodes} node(s) needs {local} GPUs per node, "
            f"this host has {torch.cuda.device_count()}"
        )
    if device.type not in ("cpu", "cuda"):
        raise ParallelConfigError(f"parallel ranks run on cpu (gloo) or cuda (nccl), not {device.type}")
    if model_dir is not None:
        verify_manifest(model_dir)  # once, here; the ranks read their slices unverified
    # a stage cannot run the whole-model forward the CUDA memory profile takes: configured pools
    fixed_blocks = fixed_blocks or pipeline_parallel_size > 1
    if device.type == "cpu" or fixed_blocks:  # the configured pools: refuse before starting
        rank_memory_plan(cache_spec, config, parallel, spec, stages)
    threads = int(os.environ.get("DAYZERO_RANK_THREADS", "1" if device.type == "cpu" else "4"))
    args = WorkerArgs(
        config=parallel,
        spec=spec,
        stages=stages,
        load_format="dummy" if model_dir is None else "safetensors",
        path=None if model_dir is None else str(model_dir),
        dtype=dtype,
        device_type=device.type,
        seed=seed,
        cache_spec=shard_cache_spec(cache_spec, parallel, spec),
        engine_config=config,
        mem_fraction=mem_fraction,
        fixed_blocks=fixed_blocks or device.type != "cuda",
        vocab_size=tokenizer.vocab_size,
        init_method="",
        collective_timeout_s=COLLECTIVE_TIMEOUT_S,
        threads=threads,
        rank_hook=rank_hook,
    )
    # a vision-language model's image side stays in the driver, built before the ranks start (on
    # CUDA, rank 0's memory plan then sees its weights): the ranks get its embeddings per request
    encoder = None
    if spec.vision is not None:
        encoder = build_vision_encoder(
            spec, load_format=args.load_format, path=args.path, dtype=dtype, device=device, seed=seed
        )
    runner = ParallelRunner(args, model=encoder, cluster=cluster)
    plan = runner.plan
    config = config.evolve(num_blocks=plan.num_blocks)
    log.info(
        "parallel engine tp=%d ep=%d pp=%d (%s), per-rank memory plan: %s",
        tensor_parallel_size,
        expert_parallel_size,
        pipeline_parallel_size,
        stages.describe(),
        plan.describe(),
    )
    if pipeline_parallel_size > 1:  # steps overlap through the stages
        engine = PipelinedEngine(
            None, tokenizer, config, cache_spec=args.cache_spec, device=device, dtype=dtype, runner=runner,
            depth=pipeline_parallel_size,
        )  # fmt: skip
    else:
        engine = Engine(
            None, tokenizer, config, cache_spec=args.cache_spec, device=device, dtype=dtype, runner=runner
        )
    engine.memory_plan = plan
    return engine
