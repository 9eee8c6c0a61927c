"""StepInputs: the one builder of a step's host inputs, for the eager forward, the graphs and tests."""

from __future__ import annotations

import torch

from inference.model.forward_meta import ForwardMeta, StepInputs

BLOCK = 4


def test_a_mixed_step_by_hand():
    # a prefill chunk of 3 tokens from position 2 (table [7, 9]) and a decode at position 5 (table [1, 3])
    step = StepInputs.build(
        BLOCK, [3, 1], [2, 5], [[7, 9], [1, 3]], [4, 6], token_ids=[[10, 11, 12], [13]], sample=[False, True]
    )
    assert step.ids == [10, 11, 12, 13]
    assert step.positions == [2, 3, 4, 5]
    assert step.slot_mapping == [7 * 4 + 2, 7 * 4 + 3, 9 * 4 + 0, 3 * 4 + 1]
    assert step.cu_seqlens == [0, 3, 4]
    assert step.seq_lens == [5, 6]
    assert step.logit_rows == [3] and step.sample_seqs == [1]


def test_meta_pads_tables_and_keeps_the_host_lengths():
    step = StepInputs.build(BLOCK, [2, 1], [0, 8], [[5], [1, 2, 3]], [0, 1], sample=[True, True])
    meta = step.to_meta(lambda data, dtype: torch.tensor(data, dtype=dtype), step.logit_rows)
    meta.validate()
    assert meta.block_tables.tolist() == [[5, 0, 0], [1, 2, 3]]
    assert meta.query_lens_cpu == (2, 1) and meta.seq_lens_cpu == (2, 9)
    assert meta.logits_indices.tolist() == [1, 2]
    assert meta.block_tables.dtype == torch.int32 and meta.slot_mapping.dtype == torch.int64


def test_for_sequences_is_the_same_builder():
    meta = ForwardMeta.for_sequences([3, 1], [2, 5], [[7, 9], [1, 3]], BLOCK, [4, 6], logits_indices=[3])
    step = StepInputs.build(BLOCK, [3, 1], [2, 5], [[7, 9], [1, 3]], [4, 6])
    assert meta.slot_mapping.tolist() == step.slot_mapping
    assert meta.positions.tolist() == step.positions
    assert meta.state_slots.tolist() == [4, 6] and meta.logits_indices.tolist() == [3]
