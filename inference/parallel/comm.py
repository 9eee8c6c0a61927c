"""Process groups of the `[pp, ep, tp]` mesh, the few collectives the sharded layers call, and the
point-to-point sends between pipeline stages.

Every collective and send also counts its calls and payload bytes in this process's `TRAFFIC`
(by `<label>.<op>`: the tensor an all-reduce sums, the part an all-gather or all-to-all sends,
the activations a stage sends or receives), which the parallel benchmark reads per step. Ops a
CUDA graph replays are counted when captured, not per replay.

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

__all__ = ["NVLINK_MULTICAST_OFF", "TRAFFIC", "Comm", "MeshGroups", "StageLink", "init_mesh", "take_traffic"]

# `<label>.<op>` -> [calls, payload bytes] of this process since `take_traffic`
TRAFFIC: dict[str, list[int]] = {}


def _count(key: str, x: Tensor) -> None:
    entry = TRAFFIC.setdefault(key, [0, 0])
    entry[0] += 1
    entry[1] += x.numel() * x.element_size()


def take_traffic() -> dict[str, list[int]]:
    """This process's counts since the last call (and start counting afresh)."""
    out = {k: list(v) for k, v in TRAFFIC.items()}
    TRAFFIC.clear()
    return out


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
            _count(f"{label}.all_reduce", x)
            with record_function(f"dayzero.{label}.all_reduce"):
                dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: Tensor, label: str) -> Tensor:
        """Concatenate every rank's `x` `[..., n]` along the last dim, in rank order."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        _count(f"{label}.all_gather", x)
        with record_function(f"dayzero.{label}.all_gather"):
            dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def all_to_all(self, x: Tensor, send: list[int], recv: list[int], label: str) -> Tensor:
        """Rows `x[sum(send[:j]) : sum(send[:j+1])]` go to rank `j`; returns the `sum(recv)` rows
        received, in rank order."""
        out = x.new_empty((sum(recv), *x.shape[1:]))
        _count(f"{label}.all_to_all", x)
        with record_function(f"dayzero.{label}.all_to_all"):
            dist.all_to_all_single(out, x.contiguous(), recv, send, group=self.group)
        return out


@dataclass(frozen=True)
class StageLink:
    """This rank's place in the pipeline: its stage, and the ranks (global) its activations come
    from and go to (None at the first / last stage)."""

    index: int = 0
    size: int = 1
    prev: int | None = None
    next: int | None = None

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.size - 1

    def send(self, x: Tensor) -> dist.Work:
        """Start sending `x` to the next stage (the caller waits on the returned work)."""
        _count("pp.send", x)
        with record_function("dayzero.pp.send"):
            return dist.isend(x.contiguous(), self.next)

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        """The previous stage's activations, `shape` known from the step every rank was sent."""
        x = torch.empty(shape, dtype=dtype, device=device)
        with record_function("dayzero.pp.recv"):
            dist.recv(x, self.prev)
        _count("pp.recv", x)
        return x


@dataclass(frozen=True)
class MeshGroups:
    """This rank's view of the mesh: its TP group, its EP group, its stage's TP x EP group (the
    whole world without pipeline parallelism), and its links to the neighbouring stages."""

    config: ParallelConfig
    rank: int
    tp: Comm
    ep: Comm
    stage: Comm
    pp: StageLink = StageLink()

    @staticmethod
    def layout_only(config: ParallelConfig, rank: int) -> MeshGroups:
        """The sizes and indices of `rank` without process groups: enough to shard a model on the
        meta device (to plan or test), not to run one."""
        p, e, t = config.coords(rank)
        return MeshGroups(
            config, rank, Comm(config.tensor_parallel_size, t), Comm(config.expert_parallel_size, e),
            Comm(config.stage_size, rank - p * config.stage_size), _link(config, rank),
        )  # fmt: skip


def _link(config: ParallelConfig, rank: int) -> StageLink:
    p, P = config.coords(rank)[0], config.pipeline_parallel_size
    return StageLink(
        p,
        P,
        config.stage_peer(rank, p - 1) if p > 0 else None,
        config.stage_peer(rank, p + 1) if p < P - 1 else None,
    )


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
    p, e, t = config.coords(rank)
    tp, ep, pp = config.tensor_parallel_size, config.expert_parallel_size, config.pipeline_parallel_size
    stages = range(pp)
    tp_groups = [config.tp_group_ranks(q, i) for q in stages for i in range(ep)]
    ep_groups = [config.ep_group_ranks(q, i) for q in stages for i in range(tp)]
    stage_groups = [config.stage_ranks(q) for q in stages]
    # a subgroup equal to the world is the default group; size-1 groups are never called
    size = config.stage_size
    tp_handle = _new_groups(tp_groups, config.tp_group_ranks(p, e), backend) if 1 < tp < world else None
    ep_handle = _new_groups(ep_groups, config.ep_group_ranks(p, t), backend) if 1 < ep < world else None
    stage_handle = _new_groups(stage_groups, stage_groups[p], backend) if 1 < size < world else None
    return MeshGroups(
        config=config,
        rank=rank,
        tp=Comm(tp, t, tp_handle),
        ep=Comm(ep, e, ep_handle),
        stage=Comm(size, rank - p * size, stage_handle),
        pp=_link(config, rank),
    )
