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
