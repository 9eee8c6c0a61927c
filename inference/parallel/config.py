"""Parallel layout of one engine: a `[ep, tp]` mesh of ranks, and the errors of the parallel runtime.

Rank `r = e * tp + t` has tensor-parallel index `t` (attention heads, dense FFN columns, vocab
rows and each expert's intermediate columns are split `tp` ways) and expert-parallel index `e`
(routed experts are split `ep` ways). Everything that is not an expert is replicated over `e`:
with `ep > 1` each EP group of `tp` ranks runs the same attention (no data-parallel attention).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EXPERT_DISPATCH", "ParallelConfig", "ParallelConfigError", "StepFailedError", "WorkerFailedError"]


class ParallelConfigError(ValueError):
    """The model cannot be split as asked (a size does not divide, or the family is not sharded)."""


class WorkerFailedError(RuntimeError):
    """A rank's worker process died or raised: the process group is gone and the engine with it.

    Restart the engine (a collective cannot be resumed once a rank is lost)."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(f"parallel worker rank {rank}: {message}; the engine has stopped, restart it")
        self.rank = rank


class StepFailedError(RuntimeError):
    """Every rank raised in the same step and the group is still whole and in step: the step's
    effects were dropped on the ranks, the engine goes on (`Engine.recover_after_failed_step`
    fails the request that broke it, as at world size 1)."""

    def __init__(self, step: int, traceback: str) -> None:
        super().__init__(f"step {step} raised on every parallel rank (rank 0's traceback):\n{traceback}")
        self.step = step
        self.traceback = traceback


EXPERT_DISPATCH = ("local", "all_to_all")


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """`--tensor-parallel-size` x `--expert-parallel-size` ranks (world size = their product)."""

    tensor_parallel_size: int = 1
    expert_parallel_size: int = 1
    # how routed tokens reach the experts' ranks (`parallel/moe.py`): "local" selection from the
    # replicated tokens, or an "all_to_all" exchange of token rows between EP ranks
    expert_dispatch: str = "local"

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1 or self.expert_parallel_size < 1:
            raise ParallelConfigError(
                f"parallel sizes must be >= 1, got tp={self.tensor_parallel_size} ep={self.expert_parallel_size}"
            )
        if self.expert_dispatch not in EXPERT_DISPATCH:
            raise ParallelConfigError(
                f"expert_dispatch must be one of {EXPERT_DISPATCH}, got {self.expert_dispatch!r}"
            )

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.expert_parallel_size

    def coords(self, rank: int) -> tuple[int, int]:
        """`(ep index, tp index)` of `rank`."""
        return divmod(rank, self.tensor_parallel_size)

    def tp_group_ranks(self, ep_index: int) -> list[int]:
        tp = self.tensor_parallel_size
        return [ep_index * tp + t for t in range(tp)]

    def ep_group_ranks(self, tp_index: int) -> list[int]:
        tp = self.tensor_parallel_size
        return [e * tp + tp_index for e in range(self.expert_parallel_size)]


def split_range(n: int, parts: int, index: int, what: str) -> tuple[int, int]:
    """`[start, stop)` of part `index` of `n` items split evenly `parts` ways (or raise)."""
    if n % parts:
        raise ParallelConfigError(f"{what} ({n}) is not divisible by {parts}; choose a size that divides it")
    size = n // parts
    return index * size, (index + 1) * size
