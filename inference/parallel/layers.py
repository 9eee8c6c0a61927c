"""Sharded building blocks: row-parallel linear, vocab-parallel embedding and LM head.

Column-parallel projections need no class of their own: an `nn.Linear` holding its rank's output
rows computes its slice of the output with no communication. A row-parallel projection (its rank's
input columns) produces a partial sum, completed by one all-reduce: that is the one collective of
each attention / dense-FFN sublayer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference.parallel.comm import Comm
from inference.parallel.split_rule import vocab_range

__all__ = ["ParallelLMHead", "RowParallelLinear", "VocabParallelEmbedding", "vocab_shard"]


def vocab_shard(vocab: int, comm: Comm) -> tuple[int, int, int]:
    """`(start, stop, rows)`: this rank's vocab ids `[start, stop)` in `rows = ceil(vocab / size)`
    local rows (the last rank's tail rows are padding, zero and never sampled): `split_rule`'s."""
    return vocab_range(vocab, comm.size, comm.rank)


class RowParallelLinear(nn.Linear):
    """`y = all_reduce(x_local @ W_local^T)`: this rank holds input columns of `W` (no bias)."""

    def __init__(self, in_local: int, out_features: int, comm: Comm, label: str) -> None:
        super().__init__(in_local, out_features, bias=False)
        self.comm = comm
        self.label = label

    def forward(self, x: Tensor) -> Tensor:
        return self.comm.all_reduce(F.linear(x, self.weight), self.label)


class VocabParallelEmbedding(nn.Module):
    """Rows `[start, stop)` of the embedding; ids elsewhere look up zeros, and the all-reduce adds
    the one rank that holds each id (an exact sum: the others add 0)."""

    def __init__(self, vocab: int, hidden: int, comm: Comm) -> None:
        super().__init__()
        self.start, self.stop, rows = vocab_shard(vocab, comm)
        self.comm = comm
        self.weight = nn.Parameter(torch.empty(rows, hidden))

    def forward(self, ids: Tensor) -> Tensor:
        if self.comm.size == 1:
            return F.embedding(ids, self.weight)
        outside = (ids < self.start) | (ids >= self.stop)
        x = F.embedding((ids - self.start).masked_fill(outside, 0), self.weight)
        x = x.masked_fill(outside[:, None], 0.0)
        return self.comm.all_reduce(x, "embedding")


class ParallelLMHead(nn.Module):
    """Vocab-parallel LM head: each rank's logits for its vocab rows, all-gathered into the full
    `[M, vocab]` on every rank (every rank runs the same sampler; the driver reads rank 0's)."""

    def __init__(self, hidden: int, vocab: int, comm: Comm) -> None:
        super().__init__()
        _, _, rows = vocab_shard(vocab, comm)
        self.vocab = vocab
        self.comm = comm
        self.weight = nn.Parameter(torch.empty(rows, hidden))

    def forward(self, x: Tensor) -> Tensor:
        logits = self.comm.all_gather_last(F.linear(x, self.weight), "lm_head")
        return logits[:, : self.vocab] if logits.shape[-1] != self.vocab else logits
