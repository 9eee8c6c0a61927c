"""Batch metadata of one model step, passed explicitly to every layer (no module globals)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ForwardMeta", "StepInputs"]


@dataclass(frozen=True)
class ForwardMeta:
    """What one `forward` call needs to know about the flat batch of new tokens.

    Tokens of all sequences are flattened in order; sequence `i` owns rows
    `cu_seqlens[i]:cu_seqlens[i+1]` of every `[T, ...]` tensor. Prefill chunks and single-token
    decodes mix freely.

    Attributes:
        positions: `[T]` int64, absolute position of each new token.
        cu_seqlens: `[N+1]` int32, offsets of each sequence's new tokens in the flat batch.
        seq_lens: `[N]` int32, total tokens of each sequence after this step (cached + new).
        block_tables: `[N, max_blocks]` int32, KV block ids of each sequence (padding unused).
        slot_mapping: `[T]` int64, `block_id * block_size + offset` where each new token's KV goes.
        state_slots: `[N]` int64, StatePool slot of each sequence (its live KDA state + conv window).
        query_lens_cpu: host copy of the per-sequence new-token counts.
        seq_lens_cpu: host copy of `seq_lens`.
        logits_indices: `[M]` rows of the flat batch to compute logits for (None = all rows).
        row_seq: `[T]` int64, the sequence of each token, set only for a step captured in a CUDA
            graph with short prefill chunks (`inference/engine/cuda_graphs.py`): the host lengths
            are not known at capture, so every layer takes its path whose shapes the tensors fix
            (MLA: each row absorbed over keys `< position + 1`; KDA: the recurrent kernel over
            `cu_seqlens`), and `query_lens_cpu` / `seq_lens_cpu` are shape stand-ins (the right
            count and total, upper bounds otherwise).
    """

    positions: Tensor
    cu_seqlens: Tensor
    seq_lens: Tensor
    block_tables: Tensor
    slot_mapping: Tensor
    state_slots: Tensor
    query_lens_cpu: tuple[int, ...]
    seq_lens_cpu: tuple[int, ...]
    logits_indices: Tensor | None = None
    row_seq: Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens_cpu)

    @property
    def context_lens_cpu(self) -> tuple[int, ...]:
        """Tokens already cached for each sequence before this step."""
        return tuple(s - q for s, q in zip(self.seq_lens_cpu, self.query_lens_cpu, strict=True))

    @property
    def is_pure_decode(self) -> bool:
        return all(q == 1 for q in self.query_lens_cpu)

    def validate(self) -> None:
        """Cheap host-side consistency checks; raises `ValueError` on a malformed batch."""
        n = len(self.query_lens_cpu)
        if len(self.seq_lens_cpu) != n:
            raise ValueError(f"seq_lens_cpu has {len(self.seq_lens_cpu)} entries for {n} sequences")
        if any(q <= 0 for q in self.query_lens_cpu):
            raise ValueError(f"every sequence needs >= 1 new token, got {self.query_lens_cpu}")
        if any(s < q for s, q in zip(self.seq_lens_cpu, self.query_lens_cpu, strict=True)):
            raise ValueError("seq_lens_cpu must count the new tokens too")
        t = self.num_tokens
        for name, tensor, length in (
            ("positions", self.positions, t),
            ("slot_mapping", self.slot_mapping, t),
            ("cu_seqlens", self.cu_seqlens, n + 1),
            ("state_slots", self.state_slots, n),
            ("seq_lens", self.seq_lens, n),
        ):
            if tensor.shape[0] != length:
                raise ValueError(f"{name} has {tensor.shape[0]} rows, expected {length}")
        if self.block_tables.dim() != 2 or self.block_tables.shape[0] != n:
            raise ValueError(
                f"block_tables must be [N={n}, max_blocks], got {tuple(self.block_tables.shape)}"
            )

    @staticmethod
    def for_sequences(
        query_lens: list[int] | tuple[int, ...],
        context_lens: list[int] | tuple[int, ...],
        block_tables: list[list[int]],
        block_size: int,
        state_slots: list[int] | tuple[int, ...],
        device: torch.device | str = "cpu",
        logits_indices: list[int] | None = None,
    ) -> ForwardMeta:
        """Build the tensors from plain lists (tests and simple callers), through `StepInputs`."""
        step = StepInputs.build(block_size, query_lens, context_lens, block_tables, state_slots)
        return step.to_meta(
            lambda data, dtype: torch.tensor(data, dtype=dtype, device=device), logits_indices
        )


@dataclass(slots=True)
class StepInputs:
    """Host lists of one step's flat batch: the one place a step's positions, KV slot mapping,
    offsets and padded block tables are computed (the model runner's eager forward and its CUDA
    graphs' batches, and `ForwardMeta.for_sequences`, all build them here).

    Sequence `i` contributes `query_lens[i]` tokens at positions `starts[i]..seq_lens[i] - 1`;
    `logit_rows` are the flat rows of the last token of each sampled sequence, `sample_seqs` those
    sequences' indices.
    """

    ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    cu_seqlens: list[int]
    query_lens: list[int]
    seq_lens: list[int]
    tables: list[list[int]]
    slots: list[int]
    logit_rows: list[int]
    sample_seqs: list[int]

    @staticmethod
    def build(
        block_size: int,
        query_lens: Sequence[int],
        starts: Sequence[int],
        tables: Sequence[list[int]],
        slots: Sequence[int],
        *,
        token_ids: Sequence[Sequence[int]] | None = None,
        sample: Sequence[bool] | None = None,
    ) -> StepInputs:
        """The lists of a step whose sequence `i` computes `query_lens[i]` tokens from position
        `starts[i]` with block table `tables[i]` and state slot `slots[i]` (`token_ids[i]`: its
        new tokens; `sample[i]`: whether its last row is sampled)."""
        B = block_size
        step = StepInputs([], [], [], [0], list(query_lens), [], list(tables), list(slots), [], [])
        for i, (n, start, table) in enumerate(zip(query_lens, starts, tables, strict=True)):
            if token_ids is not None:
                step.ids.extend(token_ids[i])
            for pos in range(start, start + n):
                step.positions.append(pos)
                step.slot_mapping.append(table[pos // B] * B + pos % B)
            step.cu_seqlens.append(step.cu_seqlens[-1] + n)
            step.seq_lens.append(start + n)
            if sample is not None and sample[i]:
                step.logit_rows.append(step.cu_seqlens[-1] - 1)
                step.sample_seqs.append(i)
        return step

    def to_meta(
        self, to: Callable[[list[int], torch.dtype], Tensor], logits_indices: list[int] | None
    ) -> ForwardMeta:
        """The step's `ForwardMeta`; `to(list, dtype)` makes each tensor (on the device, pinned
        copies or not, as the caller wants)."""
        width = max(len(t) for t in self.tables)
        flat_tables = [x for t in self.tables for x in (*t, *[0] * (width - len(t)))]
        return ForwardMeta(
            positions=to(self.positions, torch.int64),
            cu_seqlens=to(self.cu_seqlens, torch.int32),
            seq_lens=to(self.seq_lens, torch.int32),
            block_tables=to(flat_tables, torch.int32).view(len(self.tables), width),
            slot_mapping=to(self.slot_mapping, torch.int64),
            state_slots=to(self.slots, torch.int64),
            query_lens_cpu=tuple(self.query_lens),
            seq_lens_cpu=tuple(self.seq_lens),
            logits_indices=None if logits_indices is None else to(logits_indices, torch.int64),
        )
