"""Process groups of the `[ep, tp]` mesh and the few collectives the sharded layers call.

Every collective goes through `Comm`, so a size-1 group costs nothing (no call at all) and each op
carries a `record_function` label the benchmark's profiler reports per collective.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor
from torch.profiler import record_function

from inference.parallel.config import ParallelConfig

__all__ = ["NVLINK_MULTICAST_OFF", "Comm", "MeshGroups", "init_mesh"]

# The GPU machines run with NVLink multicast (NVLS / symmetric-memory multicast) off; so do we.
NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


@dataclass(frozen=True)
class Comm:
    """One process group as the layers see it: `size`, this process's `rank` in it, the handle."""

    size: int
    rank: int
    group: dist.ProcessGroup | None = None  # None: size 1 (or the default group when size > 1)

    def all_reduce(self, x: Tensor, label: str) -> Tensor:
        """Sum `x` over the group in place (and return it)."""
        if self.size > 1:
            with record_function(f"dayzero.{label}.all_reduce"):
                dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: Tensor, label: str) -> Tensor:
        """Concatenate every rank's `x` `[..., n]` along the last dim, in rank order."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        with record_function(f"dayzero.{label}.all_gather"):
            dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def all_to_all(self, x: Tensor, send: list[int], recv: list[int], label: str) -> Tensor:
        """Rows `x[sum(send[:j]) : sum(send[:j+1])]` go to rank `j`; returns the `sum(recv)` rows
        received, in rank order."""
        out = x.new_empty((sum(recv), *x.shape[1:]))
        with record_function(f"dayzero.{label}.all_to_all"):
            dist.all_to_all_single(out, x.contiguous(), recv, send, group=self.group)
        return out


@dataclass(frozen=True)
class MeshGroups:
    """This rank's view of the mesh: its TP group, its EP group, and the whole world."""

    config: ParallelConfig
    rank: int
    tp: Comm
    ep: Comm
    world: Comm

    @staticmethod
    def layout_only(config: ParallelConfig, rank: int) -> MeshGroups:
        """The sizes and indices of `rank` without process groups: enough to shard a model on the
        meta device (to plan or test), not to run one."""
        e, t = config.coords(rank)
        return MeshGroups(
            config, rank, Comm(config.tensor_parallel_size, t), Comm(config.expert_parallel_size, e),
            Comm(config.world_size, rank),
        )  # fmt: skip


def _new_groups(all_ranks: list[list[int]], mine: list[int], backend: str | None) -> dist.ProcessGroup | None:
    """Create every group of one kind (all ranks must create all of them, in the same order)."""
    handle = None
    for ranks in all_ranks:
        g = dist.new_group(ranks, backend=backend)
        if ranks == mine:
            handle = g
    return handle


def init_mesh(
    config: ParallelConfig, rank: int, init_method: str, backend: str, timeout_s: float
) -> MeshGroups:
    """Join the default group (`gloo` on CPU, `nccl` on GPU) and build the TP and EP subgroups.

    `timeout_s` bounds every collective: a rank that stops answering fails its peers' collectives
    instead of hanging them (the driver usually notices the dead process first).
    """
    for k, v in NVLINK_MULTICAST_OFF.items():
        os.environ[k] = v
    world = config.world_size
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )
    e, t = config.coords(rank)
    tp, ep = config.tensor_parallel_size, config.expert_parallel_size
    tp_groups = [config.tp_group_ranks(i) for i in range(ep)]
    ep_groups = [config.ep_group_ranks(i) for i in range(tp)]
    # a subgroup equal to the world is the default group; size-1 groups are never called
    tp_handle = _new_groups(tp_groups, tp_groups[e], backend) if 1 < tp < world else None
    ep_handle = _new_groups(ep_groups, ep_groups[t], backend) if 1 < ep < world else None
    return MeshGroups(
        config=config,
        rank=rank,
        tp=Comm(tp, t, tp_handle),
        ep=Comm(ep, e, ep_handle),
        world=Comm(world, rank, None),
    )
