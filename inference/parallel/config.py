"""Parallel layout of one engine: a `[pp, ep, tp]` mesh of ranks, and the errors of the parallel runtime.

Rank `r = (p * ep + e) * tp + t` has pipeline stage `p` (a contiguous run of decoder layers, with
their KV blocks and recurrent states: `stage_plan.py`), expert-parallel index `e` (routed experts
are split `ep` ways) and tensor-parallel index `t` (attention heads, dense FFN columns, vocab rows
and each expert's intermediate columns are split `tp` ways). Everything that is not an expert is
replicated over `e`: with `ep > 1` each EP group of `tp` ranks runs the same attention (no
data-parallel attention). A stage's `ep * tp` ranks are consecutive, so with `ep * tp` GPUs per
host every stage is one host and only the stage-to-stage activations cross hosts.
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
    """`--tensor-parallel-size` x `--expert-parallel-size` x `--pipeline-parallel-size` ranks
    (world size = their product)."""

    tensor_parallel_size: int = 1
    expert_parallel_size: int = 1
    # how routed tokens reach the experts' ranks (`parallel/moe.py`): "local" selection from the
    # replicated tokens, or an "all_to_all" exchange of token rows between EP ranks
    expert_dispatch: str = "local"
    pipeline_parallel_size: int = 1
    # micro-batches each step is split into through the pipeline stages; the engine also keeps
    # one step per stage in flight (`pipeline.PipelinedEngine`), which is what fills the stages
    # in steady decode, so 1 is the default: more split a step of many prefills further
    micro_batches: int = 1

    def __post_init__(self) -> None:
        sizes = (self.tensor_parallel_size, self.expert_parallel_size, self.pipeline_parallel_size)
        if min(sizes) < 1:
            raise ParallelConfigError(f"parallel sizes must be >= 1, got tp, ep, pp = {sizes}")
        if self.micro_batches < 1:
            raise ParallelConfigError(f"micro_batches must be >= 1, got {self.micro_batches}")
        if self.expert_dispatch not in EXPERT_DISPATCH:
            raise ParallelConfigError(
                f"expert_dispatch must be one of {EXPERT_DISPATCH}, got {self.expert_dispatch!r}"
            )

    @property
    def stage_size(self) -> int:
        """Ranks of one pipeline stage (its TP x EP group)."""
        return self.tensor_parallel_size * self.expert_parallel_size

    @property
    def world_size(self) -> int:
        return self.stage_size * self.pipeline_parallel_size

    def rank_of(self, pp_index: int, ep_index: int, tp_index: int) -> int:
        """The one rank layout: `(p * ep + e) * tp + t`."""
        return (pp_index * self.expert_parallel_size + ep_index) * self.tensor_parallel_size + tp_index

    def coords(self, rank: int) -> tuple[int, int, int]:
        """`(pp index, ep index, tp index)` of `rank`."""
        p, rest = divmod(rank, self.stage_size)
        e, t = divmod(rest, self.tensor_parallel_size)
        return p, e, t

    def stage_ranks(self, pp_index: int) -> list[int]:
        return [pp_index * self.stage_size + i for i in range(self.stage_size)]

    def tp_group_ranks(self, pp_index: int, ep_index: int) -> list[int]:
        return [self.rank_of(pp_index, ep_index, t) for t in range(self.tensor_parallel_size)]

    def ep_group_ranks(self, pp_index: int, tp_index: int) -> list[int]:
        return [self.rank_of(pp_index, e, tp_index) for e in range(self.expert_parallel_size)]

    def stage_peer(self, rank: int, pp_index: int) -> int:
        """The rank of stage `pp_index` at `rank`'s `(e, t)`: where its activations go (or come
        from). Every rank of a stage holds the whole hidden state (replicated over TP and EP), so
        each sends to its own counterpart and no gather is needed."""
        _, e, t = self.coords(rank)
        return self.rank_of(pp_index, e, t)

    @property
    def sampler_rank(self) -> int:
        """The rank whose sampled tokens the driver reads: the first rank of the last stage (every
        rank of that stage samples the same tokens from the all-gathered logits)."""
        return self.stage_ranks(self.pipeline_parallel_size - 1)[0]


def split_range(n: int, parts: int, index: int, what: str) -> tuple[int, int]:
    """`[start, stop)` of part `index` of `n` items split evenly `parts` ways (or raise)."""
    if n % parts:
        raise ParallelConfigError(f"{what} ({n}) is not divisible by {parts}; choose a size that divides it")
    size = n // parts
    return index * size, (index + 1) * size
