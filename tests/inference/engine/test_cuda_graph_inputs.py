"""Host-side layout of the decode CUDA graphs: buckets and the padded input buffer (the capture
and replay themselves run on the GPU benchmark, `benchmarks/engine.py`)."""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.cuda_graphs import (
    DecodeBatch,
    HostInputs,
    padded_inputs,
    pick_bucket,
    width_bucket,
)


def test_buckets():
    assert [pick_bucket(n, (1, 2, 4, 8)) for n in (1, 2, 3, 8)] == [1, 2, 4, 8]
    assert pick_bucket(9, (1, 2, 4, 8)) is None
    assert [width_bucket(w) for w in (1, 2, 3, 5, 8, 9, 11, 16, 17, 258)] == [
        1,
        2,
        4,
        8,
        8,
        10,
        12,
        16,
        20,
        320,
    ]
    for w in range(1, 5000):  # always enough, never more than 25% padding past 8
        b = width_bucket(w)
        assert w <= b <= max(8, 1.25 * w), (w, b)


def test_padded_inputs_layout():
    batch = DecodeBatch(
        ids=[11, 12], positions=[5, 9], slot_mapping=[4 * 3 + 1, 7 * 4 + 1], seq_lens=[6, 10],
        tables=[[2, 3], [6, 5, 7]], state_slots=[0, 3],
    )  # fmt: skip
    scratch_block, scratch_slot, bs = 9, 4, 4
    buf = padded_inputs(batch, rows=4, width=4, scratch_block=9, scratch_slot=4, block_size=bs)
    r = 4
    assert buf[0:r] == [11, 12, 0, 0]  # ids
    assert buf[r : 2 * r] == [5, 9, 0, 0]  # positions
    assert buf[2 * r : 3 * r] == [13, 29, scratch_block * bs, scratch_block * bs]  # KV writes
    assert buf[3 * r : 4 * r] == [0, 3, scratch_slot, scratch_slot]  # state slots
    assert buf[4 * r : 5 * r] == [6, 10, 1, 1]  # lengths
    tables = [buf[5 * r + i * 4 : 5 * r + (i + 1) * 4] for i in range(r)]
    assert tables == [[2, 3, 9, 9], [6, 5, 7, 9], [9] * 4, [9] * 4]
    assert len(buf) == 5 * r + r * 4


def test_padded_inputs_refuses_what_does_not_fit():
    batch = DecodeBatch([1], [0], [0], [1], [[0, 1, 2]], [0])
    with pytest.raises(ValueError, match="does not fit"):
        padded_inputs(batch, rows=1, width=2, scratch_block=5, scratch_slot=1, block_size=4)
    with pytest.raises(ValueError, match="does not fit"):
        padded_inputs(DecodeBatch([1, 2], [0, 0], [0, 0], [1, 1], [[0], [1]], [0, 1]), 1, 4, 5, 1, 4)


def test_host_inputs_rewrite_only_changed_rows_and_match_a_fresh_fill():
    """Fills in place over a run of steps (tables extended as new lists, rows reassigned, the
    batch shrinking and growing) always equal a fresh `padded_inputs` of the same batch; a row
    holding the same list is not rewritten."""
    rows, width, sb, ss, bs = 4, 6, 9, 4, 4
    array = np.zeros(5 * rows + rows * width, dtype=np.int64)
    host = HostInputs(rows, width, array)
    a, b, c = [1, 2], [3], [5, 6, 7]
    steps = [
        [a, b, c],
        [a, b, c],
        [[*a, 8], b, c],
        [c, [*a, 8]],
        [b],
        [b, c, a, [0, 4, 4, 4, 4, 4]],
        [],
    ]
    for tables in steps:
        n = len(tables)
        batch = DecodeBatch(
            ids=list(range(n)), positions=[7] * n, slot_mapping=[3] * n, seq_lens=[8] * n,
            tables=tables, state_slots=list(range(n)),
        )  # fmt: skip
        host.fill(batch, sb, ss, bs)
        assert array.tolist() == padded_inputs(batch, rows, width, sb, ss, bs)
    same = DecodeBatch([0], [7], [3], [8], [b], [0])
    host.fill(same, sb, ss, bs)
    array[5 * rows] = -1  # a row holding the list it held is left as it is
    host.fill(same, sb, ss, bs)
    assert array[5 * rows] == -1
    host.fill(DecodeBatch([0], [7], [3], [8], [list(b)], [0]), sb, ss, bs)  # an equal new list: rewritten
    assert array[5 * rows] == b[0]


def test_short_step_inputs_layout_pads_tokens_into_their_own_sequence():
    # two sequences of 3 and 1 new tokens in a 4-row, 8-token buffer: tokens 4..7 are sequence 2's
    batch = DecodeBatch(
        [5, 6, 7, 8], [10, 11, 12, 3], [20, 21, 22, 7], [13, 4], [[2, 3], [1]], [0, 1], [3, 1]
    )
    rows, width, tokens, sb, ss, bs = 4, 2, 8, 9, 5, 8
    a = padded_inputs(batch, rows, width, sb, ss, bs, tokens)
    t = tokens
    assert a[:t] == [5, 6, 7, 8, 0, 0, 0, 0]  # ids
    assert a[t : 2 * t] == [10, 11, 12, 3, 0, 0, 0, 0]  # positions
    assert a[2 * t : 3 * t] == [20, 21, 22, 7] + [sb * bs] * 4  # slot mapping
    assert a[3 * t : 3 * t + rows] == [0, 1, ss, ss]  # state slots
    assert a[3 * t + rows : 3 * t + 2 * rows] == [13, 4, 1, 1]  # seq lens
    tables = 3 * t + 2 * rows
    assert a[tables : tables + rows * width] == [2, 3, 1, sb, sb, sb, sb, sb]
    extra = tables + rows * width
    assert a[extra : extra + t] == [0, 0, 0, 1, 2, 2, 2, 2]  # row_seq
    assert a[extra + t : extra + t + rows + 1] == [0, 3, 4, 8, 8]  # cu_seqlens
    assert a[extra + t + rows + 1 :] == [2, 3, 0, 0]  # logit rows: each sequence's last token
    with pytest.raises(ValueError, match="does not fit"):  # no row left for the padding tokens
        padded_inputs(batch, 2, width, sb, ss, bs, tokens)
    with pytest.raises(ValueError, match="one new token"):
        padded_inputs(batch, rows, width, sb, ss, bs)


def test_a_short_step_through_its_padded_buffer_equals_the_dense_eager_step():
    """A mixed step (a prefill chunk over a cached context, a decode, a fresh prompt) run from a
    short-step graph's padded buffer (`ForwardMeta.row_seq`: absorbed rows, device lengths)
    gives the dense eager step's logits and leaves the same KV and KDA state behind (CPU, fp32)."""
    import torch

    from inference.engine.cuda_graphs import DecodeInputs
    from inference.engine.engine import EngineConfig
    from inference.engine.factory import build_engine
    from inference.model.forward_meta import ForwardMeta

    bs = 8
    eng = build_engine(
        engine_config=EngineConfig.of(block_size=bs, num_blocks=32, num_state_slots=4, max_model_len=128)
    )
    model, cache = eng.runner.model, eng.runner.cache
    scratch_block, scratch_slot = 32, 4
    gen = torch.Generator().manual_seed(3)
    tables = [[0, 1, 2, 3, 4, 5, 6], [8, 9, 10], [12, 13]]
    ctx = [30, 17, 0]
    with torch.inference_mode():
        for slot in range(3):
            cache.zero_slot(slot)
        first = ForwardMeta.for_sequences(ctx[:2], [0, 0], tables[:2], bs, [0, 1])
        model(torch.randint(0, 256, (sum(ctx),), generator=gen), first, cache)
        q_lens = [20, 1, 9]
        ids = torch.randint(0, 256, (sum(q_lens),), generator=gen)
        saved = {k: v.clone() for k, v in cache.state.items()}, {k: v.clone() for k, v in cache.conv.items()}
        kv = {k: v.clone() for k, v in cache.kv.items()}
        dense = ForwardMeta.for_sequences(q_lens, ctx, tables, bs, [0, 1, 2], logits_indices=[19, 20, 29])
        want = model(ids, dense, cache)
        after = (
            {k: v[:3].clone() for k, v in cache.state.items()},
            {k: v.clone() for k, v in cache.kv.items()},
        )
        for k in cache.state:
            cache.state[k].copy_(saved[0][k])
            cache.conv[k].copy_(saved[1][k])
        for k in cache.kv:
            cache.kv[k].copy_(kv[k])
        g = DecodeInputs(8, 8, bs, torch.device("cpu"), scratch_block, scratch_slot, tokens=48)
        g.load(DecodeBatch(
            ids.tolist(), dense.positions.tolist(), dense.slot_mapping.tolist(),
            [c + q for c, q in zip(ctx, q_lens, strict=True)], tables, [0, 1, 2], q_lens,
        ))  # fmt: skip
        got = model(g.ids, g.meta, cache)[:3]
    assert g.meta.row_seq is not None
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for k in cache.state:
        torch.testing.assert_close(cache.state[k][:3], after[0][k], rtol=1e-4, atol=1e-5)
    used = [b for t in tables for b in t]
    for k in cache.kv:
        torch.testing.assert_close(cache.kv[k][used], after[1][k][used])


def test_a_short_shape_is_captured_the_second_time_it_occurs():
    import torch

    from inference.engine.cuda_graphs import DecodeGraphs

    g = DecodeGraphs(
        None, None, device=torch.device("cpu"), block_size=8, scratch_block=0, scratch_slot=0,
        max_graphs=2, short_tokens=64, short_row_keys=1 << 20,
    )  # fmt: skip
    a, b = (2, 8, 64), (4, 8, 64)
    assert [g._worth_capturing(k) for k in (a, b, a, b)] == [False, False, True, True]
    assert not g._short_seen  # counted shapes leave the table once they are captured
    for i in range(9):  # at most 4 x max_graphs shapes are remembered, the oldest forgotten
        g._worth_capturing((i + 1, 8, 16))
    assert len(g._short_seen) == 8 and (1, 8, 16) not in g._short_seen
    assert DecodeGraphs(
        None, None, device=torch.device("cpu"), block_size=8, scratch_block=0, scratch_slot=0,
        short_tokens=64, short_capture_after=1,
    )._worth_capturing(a)  # fmt: skip
