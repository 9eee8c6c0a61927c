"""CUDA graphs for pure-decode steps.

A decode step of a small model is a few hundred tiny kernels; launched one by one from Python the
GPU idles between them. Here each (batch bucket, block-table width bucket) gets one captured graph
of the whole model forward. A step pads its batch up to the bucket: padding rows write their KV
into a scratch block and their KDA state into a scratch slot that no request ever owns, so they
compute harmless garbage. All step inputs live in one int64 device buffer per graph, filled by a
single host-to-device copy, and the logits come back in the graph's static output.

What may be captured is decided by the model (`supports_decode_graphs`): the forward must be free
of host syncs and its shapes fixed by the tensors alone. Prefill and mixed steps run eagerly.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from inference.model.cache_tensors import HybridCacheTensors
from inference.model.forward_meta import ForwardMeta

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_BATCH_BUCKETS", "DecodeBatch", "DecodeGraphs", "DecodeInputs", "HostInputs", "padded_inputs", "pick_bucket",
]  # fmt: skip

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """Host lists of one step in which every sequence has exactly one new token."""

    ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    seq_lens: list[int]
    tables: list[list[int]]
    state_slots: list[int]


def pick_bucket(n: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket >= n (None when n exceeds them all)."""
    return next((b for b in buckets if b >= n), None)


def width_bucket(width: int) -> int:
    """Block-table width rounded up: powers of two to 8, then quarter-octave steps 10, 12, 14, 16,
    20, 24, ...

    Decode attention reads the whole padded width, so padding past 8 blocks is work (at most 25%
    here); each new bucket costs one capture (~0.1-0.3 s), four per doubling of the context.
    """
    if width <= 8:
        return 1 << max(0, (width - 1).bit_length())
    step = 1 << (width.bit_length() - 3)
    return -(-width // step) * step


_PADDING_ROW: list[int] = []  # the table of a padding row (all scratch); one object, compared by identity


class HostInputs:
    """One (rows, width) input buffer's host side, written in place in `padded_inputs`' layout.

    A row's block table is rewritten only when the row holds another list than at the last fill.
    The runner keeps a sequence's table list while the sequence gains no block and builds a new
    one when it does, so a steady decode step writes the five short per-row fields and almost no
    table entry (at batch 32 x 16K a step has 8K of them: ~0.5-0.9 ms of host time each step when
    they went through `torch.tensor`, with the GPU idle meanwhile). Contract: a table list passed
    in is not mutated afterwards.
    """

    def __init__(self, rows: int, width: int, array: np.ndarray) -> None:
        if array.shape != (5 * rows + rows * width,) or array.dtype != np.int64:
            raise ValueError(f"need an int64 array of {5 * rows + rows * width} entries, got {array.shape}")
        self.rows, self.width, self.array = rows, width, array
        self._held: list[tuple[list[int], int] | None] = [None] * rows  # (table, its length) per row

    def fill(self, batch: DecodeBatch, scratch_block: int, scratch_slot: int, block_size: int) -> None:
        rows, width, a = self.rows, self.width, self.array
        n = len(batch.ids)
        if n > rows or any(len(t) > width for t in batch.tables):
            raise ValueError(f"a batch of {n} rows does not fit a {rows}x{width} decode graph")
        fields = (
            (batch.ids, 0), (batch.positions, 0), (batch.slot_mapping, scratch_block * block_size),
            (batch.state_slots, scratch_slot), (batch.seq_lens, 1),
        )  # fmt: skip
        for k, (values, pad) in enumerate(fields):
            a[k * rows : k * rows + n] = values
            a[k * rows + n : (k + 1) * rows] = pad
        for i in range(rows):
            table = batch.tables[i] if i < n else _PADDING_ROW
            held = self._held[i]
            if held is not None and held[0] is table and held[1] == len(table):
                continue
            off = 5 * rows + i * width
            a[off : off + len(table)] = table
            a[off + len(table) : off + width] = scratch_block
            self._held[i] = (table, len(table))


def padded_inputs(
    batch: DecodeBatch, rows: int, width: int, scratch_block: int, scratch_slot: int, block_size: int
) -> list[int]:
    """The graph's input buffer for `batch`, padded to `rows` sequences and `width` table entries.

    Layout: ids | positions | slot_mapping | state_slots | seq_lens (each `rows`) | block tables
    (`rows * width`, row-major). Padding rows decode token 0 at position 0 of the scratch block
    into the scratch slot; short tables are padded with the scratch block.
    """
    array = np.zeros(5 * rows + rows * width, dtype=np.int64)
    HostInputs(rows, width, array).fill(batch, scratch_block, scratch_slot, block_size)
    return array.tolist()


class DecodeInputs:
    """The fixed input buffer of one (rows, width) decode shape and the `ForwardMeta` viewing it."""

    def __init__(
        self,
        rows: int,
        width: int,
        block_size: int,
        device: torch.device,
        scratch_block: int,
        scratch_slot: int,
    ) -> None:
        self.rows, self.width = rows, width
        self.block_size, self.scratch_block, self.scratch_slot = block_size, scratch_block, scratch_slot
        size = 5 * rows + rows * width
        cuda = device.type == "cuda"
        self.host = torch.zeros(size, dtype=torch.int64, pin_memory=cuda)
        self.host_inputs = HostInputs(rows, width, self.host.numpy())
        self.buf = torch.zeros(size, dtype=torch.int64, device=device)
        self.copied = torch.cuda.Event() if cuda else None
        if self.copied is not None:
            self.copied.record()
        b = self.buf
        self.ids = b[0:rows]
        self.meta = ForwardMeta(
            positions=b[rows : 2 * rows],
            cu_seqlens=torch.arange(rows + 1, dtype=torch.int32, device=device),
            seq_lens=b[4 * rows : 5 * rows],
            block_tables=b[5 * rows :].view(rows, width),
            slot_mapping=b[2 * rows : 3 * rows],
            state_slots=b[3 * rows : 4 * rows],
            query_lens_cpu=(1,) * rows,
            # an upper bound: the captured decode path reads lengths from `seq_lens` only
            seq_lens_cpu=(width * block_size,) * rows,
        )

    def load(self, batch: DecodeBatch) -> None:
        """Fill the buffer with `batch`, padded (`padded_inputs`' layout; one host-to-device copy)."""
        if self.copied is not None:
            self.copied.synchronize()  # the previous step's copy has left the pinned buffer
        self.host_inputs.fill(batch, self.scratch_block, self.scratch_slot, self.block_size)
        self.buf.copy_(self.host, non_blocking=True)
        if self.copied is not None:
            self.copied.record()


class _Graph(DecodeInputs):
    """One captured decode forward over its inputs, and its static output."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # DecodeInputs' arguments
        super().__init__(*args, **kwargs)
        self.graph = torch.cuda.CUDAGraph()
        self.logits: Tensor | None = None
        self.greedy: Tensor | None = None  # argmax over the sampled vocabulary, per row


class DecodeGraphs:
    """Captures lazily, one graph per (batch bucket, width bucket); replays pure-decode steps.

    At most `max_graphs` are kept (least recently used dropped), bounding capture memory and time.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cache: HybridCacheTensors,
        *,
        device: torch.device,
        block_size: int,
        scratch_block: int,
        scratch_slot: int,
        batch_buckets: tuple[int, ...] = DEFAULT_BATCH_BUCKETS,
        max_graphs: int = 64,
        vocab_size: int | None = None,
    ) -> None:
        """`vocab_size`: the sampled vocabulary (the greedy tokens' argmax ignores padded
        embedding rows past it); None: all logits."""
        self.model, self.cache = model, cache
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.scratch_block, self.scratch_slot = scratch_block, scratch_slot
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.max_graphs = max_graphs
        self.device = device
        self.pool: tuple[int, int] | None = None  # shared by all graphs, made at the first capture
        self.graphs: OrderedDict[tuple[int, int], _Graph] = OrderedDict()
        self.num_replays = 0
        self.disabled = False
        self.capture_s = 0.0

    @property
    def num_captured(self) -> int:
        return len(self.graphs)

    def run(self, batch: DecodeBatch) -> tuple[Tensor, Tensor] | None:
        """`(logits [n, vocab], greedy tokens [n])` of the step's `n = len(batch.ids)` rows, or
        None when no graph fits (run eagerly). The greedy tokens (argmax, first index on ties, as
        the sampler's) are computed inside the graph, so an all-greedy step reads back only them."""
        rows = pick_bucket(len(batch.ids), self.batch_buckets)
        if rows is None:
            return None
        width = width_bucket(max(len(t) for t in batch.tables))
        g = self.graphs.get((rows, width))
        if g is not None:
            self.graphs.move_to_end((rows, width))
        else:
            if self.disabled:
                return None
            if len(self.graphs) >= self.max_graphs:  # drop the least recently used graph
                _, old = self.graphs.popitem(last=False)
                old.graph.reset()
            try:
                g = self._capture(rows, width)
            except Exception:  # a model that is not capturable after all: serve on eagerly
                log.exception("decode graph capture failed (rows=%d width=%d); running eagerly", rows, width)
                self.disabled = True
                return None
        g.load(batch)
        logits, greedy = self._replay(g)
        self.num_replays += 1
        return logits[: len(batch.ids)], greedy[: len(batch.ids)]

    def outputs(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """A decode forward's outputs: the logits and their greedy tokens over the sampled
        vocabulary (captured with the forward, so they are computed inside the graph)."""
        return logits, logits[:, : self.vocab_size].argmax(dim=-1)

    def _replay(self, g: _Graph) -> tuple[Tensor, Tensor]:
        g.graph.replay()
        assert g.logits is not None and g.greedy is not None
        return g.logits, g.greedy

    def _capture(self, rows: int, width: int) -> _Graph:
        t0 = time.perf_counter()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        g = _Graph(rows, width, self.block_size, self.device, self.scratch_block, self.scratch_slot)
        g.load(DecodeBatch([], [], [], [], [], []))
        # warm-up on a side stream (Triton autotuning, cuBLAS handles) before capturing
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.model(g.ids, g.meta, self.cache)
        torch.cuda.current_stream().wait_stream(side)
        # thread_local: the server encodes images on the GPU from other threads meanwhile
        with torch.cuda.graph(g.graph, pool=self.pool, capture_error_mode="thread_local"):
            g.logits, g.greedy = self.outputs(self.model(g.ids, g.meta, self.cache))
        self.graphs[(rows, width)] = g
        self.capture_s += time.perf_counter() - t0
        log.info("captured decode graph rows=%d width=%d in %.2fs", rows, width, time.perf_counter() - t0)
        return g
