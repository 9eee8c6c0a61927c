"""Start-up capture of the common decode and short-step CUDA-graph shapes.

`DecodeGraphs` captures lazily: a decode shape the first time it occurs, a short-step shape (an
agent's next turn) the second time. Each first capture of a shape class also compiles its kernels,
so an agent's third turn paid ~1.3 s (`benchmarks/engine.py`'s `ttft` section) where the later
turns took ~11 ms. The warm-up captures, before the first request,
the shapes of single conversations and small batches at a few typical context lengths:

- decode: `decode_rows` sequences (up to the scheduler's `max_num_seqs`);
- short steps: one sequence of `short_tokens` new tokens (its graph has 2 rows: the padding
  tokens are a sequence of their own), only where the graphs would take it (within the graphs'
  token buckets and `short_row_keys`);

each at the block-table width bucket a conversation just past each of `contexts` tokens falls
in (`width_bucket(context // block_size + 1)`). Shapes go in that order (context, then decode
before short steps), and the warm-up stops at `time_budget_s`, at `memory_budget_mib` of growth of
the CUDA allocator's reserved memory (the graphs' shared pool and input buffers), or at half of
the graphs' LRU capacity (the rest stays for the shapes serving meets).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

__all__ = ["GraphWarmup", "WarmupReport", "warm_up", "warmup_shapes"]

# (batch bucket, width bucket, token bucket or None for a decode graph), as `DecodeGraphs` keys them
Shape = tuple[int, int, int | None]


@dataclass(frozen=True, slots=True)
class GraphWarmup:
    """What the start-up warm-up captures and its bounds; `time_budget_s <= 0` turns it off."""

    time_budget_s: float = 0.0
    memory_budget_mib: int = 2048
    contexts: tuple[int, ...] = (4096, 16384, 65536)
    decode_rows: tuple[int, ...] = (1, 2, 4, 8)
    # every token bucket from 17 to 128 new tokens: an agent's turn is a message of any length (a
    # 64-token message is a 65-token step, the 80-token bucket: left out, it was captured at turn
    # 3); 3 contexts x (4 decode + 6 short) = 30 shapes, within half the default graph capacity
    short_tokens: tuple[int, ...] = (32, 48, 64, 80, 96, 128)

    @property
    def enabled(self) -> bool:
        return self.time_budget_s > 0


@dataclass(slots=True)
class WarmupReport:
    """What a warm-up did: shapes captured, seconds, reserved-memory growth, and why it stopped
    (`done`, `time`, `memory`, `capacity` or `failed`)."""

    captured: list[Shape] = field(default_factory=list)
    seconds: float = 0.0
    memory_mib: float = 0.0
    stopped_by: str = "done"
    planned: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "captured": len(self.captured), "planned": self.planned, "seconds": round(self.seconds, 3),
            "memory_mib": round(self.memory_mib, 1), "stopped_by": self.stopped_by,
        }  # fmt: skip


class _Graphs(Protocol):  # the part of `DecodeGraphs` the warm-up uses
    batch_buckets: tuple[int, ...]
    token_buckets: tuple[int, ...]
    short_row_keys: int
    short_disabled: bool
    disabled: bool
    max_graphs: int
    graphs: Any

    def capture_shape(self, key: Shape) -> bool: ...


def warmup_shapes(
    cfg: GraphWarmup, graphs: _Graphs, block_size: int, max_num_seqs: int, max_model_len: int
) -> list[Shape]:
    """The graph keys the warm-up captures, in order, without repeats (see the module); contexts
    the engine cannot hold (`>= max_model_len`) are left out."""
    # imported here (and torch below): the serve CLI builds a `GraphWarmup` without importing torch
    from inference.engine.cuda_graphs import pick_bucket, width_bucket

    shapes: list[Shape] = []
    for ctx in (c for c in cfg.contexts if c < max_model_len):
        width = width_bucket(ctx // block_size + 1)
        for n in cfg.decode_rows:
            rows = pick_bucket(n, graphs.batch_buckets)
            if n <= max_num_seqs and rows is not None:
                shapes.append((rows, width, None))
        if graphs.short_disabled:
            continue
        rows = pick_bucket(2, graphs.batch_buckets)  # the sequence and the padding tokens' own
        for t in cfg.short_tokens:
            tokens = pick_bucket(t, graphs.token_buckets)
            if rows is None or tokens is None:
                continue
            # serving replays this shape for any step of `lo..tokens` new tokens whose rows x keys
            # fit `short_row_keys`: warm it if the smallest such step fits (a 65-token turn at 16K
            # takes the 96-token graph although 96 x 16.5K would not fit)
            lo = max((b for b in graphs.token_buckets if b < tokens), default=0) + 1
            if lo * (ctx + lo) <= graphs.short_row_keys:
                shapes.append((rows, width, tokens))
    return list(dict.fromkeys(shapes))


def _reserved() -> int:
    import torch

    return torch.cuda.memory_reserved() if torch.cuda.is_available() else 0


def warm_up(
    cfg: GraphWarmup, graphs: _Graphs, block_size: int, max_num_seqs: int, max_model_len: int
) -> WarmupReport:
    """Capture `warmup_shapes` until done or a bound is reached (see the module)."""
    shapes = warmup_shapes(cfg, graphs, block_size, max_num_seqs, max_model_len)
    report = WarmupReport(planned=len(shapes))
    t0, mem0 = time.perf_counter(), _reserved()
    for key in shapes:
        if time.perf_counter() - t0 >= cfg.time_budget_s:
            report.stopped_by = "time"
            break
        if _reserved() - mem0 >= cfg.memory_budget_mib << 20:
            report.stopped_by = "memory"
            break
        if len(graphs.graphs) >= graphs.max_graphs // 2:
            report.stopped_by = "capacity"
            break
        if key in graphs.graphs:
            continue
        if not graphs.capture_shape(key):  # capture failed: the graphs are off for that kind now
            report.stopped_by = "failed"
            break
        report.captured.append(key)
    report.seconds = time.perf_counter() - t0
    report.memory_mib = (_reserved() - mem0) / (1 << 20)
    log.info("graph warm-up: %s", report.as_dict())
    return report
