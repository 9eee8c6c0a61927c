"""CUDA graphs for decode steps and for short steps (small prefill chunks, decodes beside them).

A decode step of a small model is a few hundred tiny kernels; launched one by one from Python the
GPU idles between them. Here each (batch bucket, block-table width bucket) gets one captured graph
of the whole model forward. A step pads its batch up to the bucket: padding rows write their KV
into a scratch block and their KDA state into a scratch slot that no request ever owns, so they
compute harmless garbage. All step inputs live in one int64 device buffer per graph, filled by a
single host-to-device copy, and the logits come back in the graph's static output.

A short step (an agent's next turn: ~65 new tokens over a long cached context, maybe beside
decodes) is the same host-bound shape: ~7 ms of GPU work under ~50 ms of Python launching it.
Opt-in (`short_tokens`), steps of at most that many new tokens replay graphs keyed by (sequence
bucket, token bucket, width bucket) too: the padding tokens form one extra sequence of their
own, every attention row is absorbed latent attention over its own keys (`ForwardMeta.row_seq`),
and the KDA layers run the recurrent kernel over `cu_seqlens`. Absorbed rows each read their
whole context, so a step whose rows x keys exceeds `short_row_keys` runs eagerly (the dense
prefill path expands the keys once for all rows of a sequence).

What may be captured is decided by the model (`supports_decode_graphs`,
`supports_short_step_graphs`): the forward must be free of host syncs and its shapes fixed by the
tensors alone. Other steps run eagerly.
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

from inference.kernels.kda import RECURRENT_MAX_TOKENS
from inference.model.cache_tensors import HybridCacheTensors
from inference.model.forward_meta import ForwardMeta

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_BATCH_BUCKETS", "DEFAULT_TOKEN_BUCKETS", "DecodeBatch", "DecodeGraphs", "DecodeInputs", "HostInputs",
    "padded_inputs", "pick_bucket",
]  # fmt: skip

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# new-token buckets of short-step graphs (each bucket x sequence bucket x width is one capture)
DEFAULT_TOKEN_BUCKETS = (16, 32, 48, 64, 80, 96, 128)


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """Host lists of one graph step: per token `ids`, `positions`, `slot_mapping`; per sequence
    `seq_lens`, `tables`, `state_slots` and `query_lens` (None: one new token each, a decode)."""

    ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    seq_lens: list[int]
    tables: list[list[int]]
    state_slots: list[int]
    query_lens: list[int] | None = None


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
    """One (rows, width[, tokens]) input buffer's host side, written in place in `padded_inputs'`
    layout.

    A row's block table is rewritten only when the row holds another list than at the last fill.
    The runner keeps a sequence's table list while the sequence gains no block and builds a new
    one when it does, so a steady decode step writes the five short per-row fields and almost no
    table entry (at batch 32 x 16K a step has 8K of them: ~0.5-0.9 ms of host time each step when
    they went through `torch.tensor`, with the GPU idle meanwhile). Contract: a table list passed
    in is not mutated afterwards.

    `tokens` (a short step's token bucket; None: a decode buffer, one token per row) adds each
    token's sequence, the sequence offsets and the logit rows after the tables.
    """

    def __init__(self, rows: int, width: int, array: np.ndarray, tokens: int | None = None) -> None:
        size = buffer_size(rows, width, tokens)
        if array.shape != (size,) or array.dtype != np.int64:
            raise ValueError(f"need an int64 array of {size} entries, got {array.shape}")
        self.rows, self.width, self.tokens, self.array = rows, width, tokens, array
        self._held: list[tuple[list[int], int] | None] = [None] * rows  # (table, its length) per row

    def fill(self, batch: DecodeBatch, scratch_block: int, scratch_slot: int, block_size: int) -> None:
        rows, width, a = self.rows, self.width, self.array
        tokens = rows if self.tokens is None else self.tokens
        n, t = len(batch.seq_lens), len(batch.ids)
        if self.tokens is None and (batch.query_lens is not None or t != n):
            raise ValueError("a decode graph takes one new token per sequence")
        # a short step's padding tokens are one extra sequence: it needs a row of its own
        if (
            n + (t < tokens and self.tokens is not None) > rows
            or t > tokens
            or any(len(x) > width for x in batch.tables)
        ):
            raise ValueError(
                f"a batch of {n} rows, {t} tokens does not fit a {rows}x{width} graph of {tokens} tokens"
            )
        fields = (
            (batch.ids, 0, tokens), (batch.positions, 0, tokens),
            (batch.slot_mapping, scratch_block * block_size, tokens),
            (batch.state_slots, scratch_slot, rows), (batch.seq_lens, 1, rows),
        )  # fmt: skip
        off = 0
        for values, pad, size in fields:
            a[off : off + len(values)] = values
            a[off + len(values) : off + size] = pad
            off += size
        for i in range(rows):
            table = batch.tables[i] if i < n else _PADDING_ROW
            held = self._held[i]
            if held is not None and held[0] is table and held[1] == len(table):
                continue
            at = off + i * width
            a[at : at + len(table)] = table
            a[at + len(table) : at + width] = scratch_block
            self._held[i] = (table, len(table))
        if self.tokens is None:
            return
        off += rows * width
        q_lens = batch.query_lens or [1] * n
        cu = np.zeros(rows + 1, dtype=np.int64)
        np.cumsum(q_lens, out=cu[1 : n + 1])
        cu[n + 1 :] = tokens  # the padding tokens: sequence n; the rows after it hold none
        a[off : off + tokens] = n  # row_seq of the padding tokens, then each real token's
        a[off : off + t] = np.repeat(np.arange(n, dtype=np.int64), q_lens)
        off += tokens
        a[off : off + rows + 1] = cu
        off += rows + 1
        a[off : off + rows] = 0
        a[off : off + n] = cu[1 : n + 1] - 1  # each sequence's last token: its logits


def buffer_size(rows: int, width: int, tokens: int | None = None) -> int:
    """Entries of a (rows, width) decode buffer, or of a short step's with `tokens`."""
    if tokens is None:
        return 5 * rows + rows * width
    return 3 * tokens + 2 * rows + rows * width + tokens + (rows + 1) + rows


def padded_inputs(
    batch: DecodeBatch,
    rows: int,
    width: int,
    scratch_block: int,
    scratch_slot: int,
    block_size: int,
    tokens: int | None = None,
) -> list[int]:
    """The graph's input buffer for `batch`, padded to `rows` sequences and `width` table entries
    (and `tokens` new tokens for a short step).

    Layout: ids | positions | slot_mapping (each `tokens`, = `rows` for a decode) | state_slots |
    seq_lens (each `rows`) | block tables (`rows * width`, row-major); a short step's buffer goes on
    with row_seq (`tokens`) | cu_seqlens (`rows + 1`) | logit rows (`rows`). Padding rows decode
    token 0 at position 0 of the scratch block into the scratch slot; short tables are padded with
    the scratch block; a short step's padding tokens are all of sequence `len(seq_lens)`.
    """
    array = np.zeros(buffer_size(rows, width, tokens), dtype=np.int64)
    HostInputs(rows, width, array, tokens).fill(batch, scratch_block, scratch_slot, block_size)
    return array.tolist()


class DecodeInputs:
    """The fixed input buffer of one (rows, width[, tokens]) step shape and the `ForwardMeta`
    viewing it."""

    def __init__(
        self,
        rows: int,
        width: int,
        block_size: int,
        device: torch.device,
        scratch_block: int,
        scratch_slot: int,
        tokens: int | None = None,
    ) -> None:
        self.rows, self.width, self.tokens = rows, width, tokens
        self.block_size, self.scratch_block, self.scratch_slot = block_size, scratch_block, scratch_slot
        size = buffer_size(rows, width, tokens)
        cuda = device.type == "cuda"
        self.host = torch.zeros(size, dtype=torch.int64, pin_memory=cuda)
        self.host_inputs = HostInputs(rows, width, self.host.numpy(), tokens)
        self.buf = torch.zeros(size, dtype=torch.int64, device=device)
        self.copied = torch.cuda.Event() if cuda else None
        if self.copied is not None:
            self.copied.record()
        b = self.buf
        t = rows if tokens is None else tokens
        tables = 3 * t + 2 * rows
        extra = tables + rows * width
        self.ids = b[0:t]
        if tokens is None:
            cu, q_lens, short = torch.arange(rows + 1, dtype=torch.int32, device=device), (1,) * rows, {}
        else:
            cu = b[extra + t : extra + t + rows + 1]
            # shape stand-ins (ForwardMeta.row_seq): the bucket's sequence count and token total
            q_lens = (t - rows + 1,) + (1,) * (rows - 1)
            short = dict(logits_indices=b[extra + t + rows + 1 :], row_seq=b[extra : extra + t])
        self.meta = ForwardMeta(
            positions=b[t : 2 * t],
            cu_seqlens=cu,
            seq_lens=b[3 * t + rows : tables],
            block_tables=b[tables:extra].view(rows, width),
            slot_mapping=b[2 * t : 3 * t],
            state_slots=b[3 * t : 3 * t + rows],
            query_lens_cpu=q_lens,
            # an upper bound: the captured paths read lengths from the device tensors only
            seq_lens_cpu=(width * block_size + t,) * rows,
            **short,
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
    """One captured forward over its inputs, and its static output."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # DecodeInputs' arguments
        super().__init__(*args, **kwargs)
        self.graph = torch.cuda.CUDAGraph()
        self.logits: Tensor | None = None
        self.greedy: Tensor | None = None  # argmax over the sampled vocabulary, per row


# (batch bucket, width bucket, token bucket or None for a decode graph)
_Key = tuple[int, int, int | None]


class DecodeGraphs:
    """Captures lazily, one graph per (batch bucket, width bucket[, token bucket]); replays
    pure-decode steps and, with `short_tokens`, short steps.

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
        short_tokens: int = 0,
        short_row_keys: int = 0,
        short_capture_after: int = 2,
    ) -> None:
        """`vocab_size`: the sampled vocabulary (the greedy tokens' argmax ignores padded
        embedding rows past it); None: all logits. `short_tokens`: steps of at most this many new
        tokens (<= `RECURRENT_MAX_TOKENS`) replay short-step graphs (0: decode steps only) when
        their rows read at most `short_row_keys` (row, key) pairs of attention.
        `short_capture_after`: a short-step shape is captured the time it occurs this often and
        runs eagerly before: short shapes are many (sequences x tokens x width), a capture stalls
        every request of the step for ~0.1-0.3 s, and a one-off shape would never repay it."""
        if short_tokens > RECURRENT_MAX_TOKENS:
            raise ValueError(f"short_tokens must be <= {RECURRENT_MAX_TOKENS}, got {short_tokens}")
        self.model, self.cache = model, cache
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.scratch_block, self.scratch_slot = scratch_block, scratch_slot
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.token_buckets = tuple(b for b in DEFAULT_TOKEN_BUCKETS if b < short_tokens) + (
            (short_tokens,) if short_tokens else ()
        )
        self.short_row_keys = short_row_keys
        self.short_capture_after = short_capture_after
        self._short_seen: OrderedDict[_Key, int] = OrderedDict()  # uncaptured short shapes -> times seen
        self.max_graphs = max_graphs
        self.device = device
        self.pool: tuple[int, int] | None = None  # shared by all graphs, made at the first capture
        self.graphs: OrderedDict[_Key, _Graph] = OrderedDict()
        self.num_replays = 0
        self.num_short_replays = 0
        self.disabled = False  # decode graphs failed to capture
        self.short_disabled = not self.token_buckets
        self.capture_s = 0.0

    @property
    def num_captured(self) -> int:
        return len(self.graphs)

    @property
    def max_short_tokens(self) -> int:
        """The most new tokens a short-step graph takes (0: none are captured)."""
        return 0 if self.short_disabled else self.token_buckets[-1]

    def _shape(self, batch: DecodeBatch) -> _Key | None:
        """The graph `batch` replays in, or None when none may (run eagerly)."""
        n, t = len(batch.seq_lens), len(batch.ids)
        tokens = None
        if batch.query_lens is not None:
            # absorbed rows each read their whole context: past the budget, dense prefill wins
            row_keys = sum(q * s for q, s in zip(batch.query_lens, batch.seq_lens, strict=True))
            tokens = pick_bucket(t, self.token_buckets)
            if tokens is None or row_keys > self.short_row_keys:
                return None
            n += t < tokens  # the padding tokens' own sequence
        rows = pick_bucket(n, self.batch_buckets)
        if rows is None:
            return None
        return rows, width_bucket(max(len(x) for x in batch.tables)), tokens

    def run(self, batch: DecodeBatch) -> tuple[Tensor, Tensor] | None:
        """`(logits [n, vocab], greedy tokens [n])` of the step's `n = len(batch.seq_lens)`
        sequences, or None when no graph fits (run eagerly). The greedy tokens (argmax, first
        index on ties, as the sampler's) are computed inside the graph, so an all-greedy step
        reads back only them."""
        key = self._shape(batch)
        if key is None:
            return None
        g = self.graphs.get(key)
        if g is not None:
            self.graphs.move_to_end(key)
        elif (self.disabled if key[2] is None else self.short_disabled) or (
            key[2] is not None and not self._worth_capturing(key)
        ):
            return None  # no new captures after one failed, nor of a short shape seen once
        elif not self.capture_shape(key):
            return None
        else:
            g = self.graphs[key]
        g.load(batch)
        logits, greedy = self._replay(g)
        self.num_replays += 1
        self.num_short_replays += key[2] is not None
        n = len(batch.seq_lens)
        return logits[:n], greedy[:n]

    def capture_shape(self, key: _Key) -> bool:
        """Capture the graph of `key` (dropping the least recently used one when full); False when
        the capture failed, which turns off new captures of its kind (the model serves eagerly)."""
        if len(self.graphs) >= self.max_graphs:
            _, old = self.graphs.popitem(last=False)
            old.graph.reset()
        try:
            self._capture(*key)
        except Exception:  # a model that is not capturable after all: serve on eagerly
            log.exception("graph capture failed (rows=%d width=%d tokens=%s); running eagerly", *key)
            if key[2] is None:
                self.disabled = True
            else:
                self.short_disabled = True
            return False
        return True

    def _worth_capturing(self, key: _Key) -> bool:
        """Count an uncaptured short shape; True the time it reaches `short_capture_after`."""
        seen = self._short_seen.pop(key, 0) + 1
        if seen >= self.short_capture_after:
            return True
        self._short_seen[key] = seen
        if len(self._short_seen) > 4 * self.max_graphs:  # forget the oldest shapes seen
            self._short_seen.popitem(last=False)
        return False

    def outputs(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """A captured forward's outputs: the logits and their greedy tokens over the sampled
        vocabulary (captured with the forward, so they are computed inside the graph)."""
        return logits, logits[:, : self.vocab_size].argmax(dim=-1)

    def _replay(self, g: _Graph) -> tuple[Tensor, Tensor]:
        g.graph.replay()
        assert g.logits is not None and g.greedy is not None
        return g.logits, g.greedy

    def _capture(self, rows: int, width: int, tokens: int | None = None) -> _Graph:
        t0 = time.perf_counter()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        g = _Graph(rows, width, self.block_size, self.device, self.scratch_block, self.scratch_slot, tokens)
        g.load(DecodeBatch([], [], [], [], [], [], None if tokens is None else []))
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
        self.graphs[(rows, width, tokens)] = g
        self.capture_s += time.perf_counter() - t0
        log.info(
            "captured graph rows=%d width=%d tokens=%s in %.2fs",
            rows,
            width,
            tokens,
            time.perf_counter() - t0,
        )
        return g
