"""DSA prefill's sparse attention by heads per program and tile (`dsa_v32 --parts headblocks`).

The sparse attention of `prefill_split`'s chunk (the same 8K queries at the end of `ctx` keys and
the same top-2048 selection; 128 heads, latent 512 + rope 64, bf16) timed alone. By default a
program owns 16 heads (`head_block`), so the 8 programs of a query row each read its 2048 latent
rows (1152 bytes each): 32 or 64 heads per program read them 4 or 2 times, if the `[heads, 512]`
fp32 accumulator fits the registers. Each configuration's output is compared with the default's
(16 heads, `pick_tile`'s tile); one that fails (e.g. shared memory over the limit) is recorded
with its error, not timed.

    python -m benchmarks.dsa_v32 --parts headblocks --contexts 131072,1048576
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import torch

from benchmarks.dsa_v32 import CHUNK, DN, SCALE, TOPK, H, P, R, prefill_chunk
from benchmarks.kernels_setup import bench

HEADS_PER_PROGRAM = (16, 32, 64)
# (BLOCK_N, num_warps, num_stages): the production bf16 tiles and the smaller ones that leave
# shared memory and registers to a larger head block
SWEEP_TILES = ((64, 4, 3), (64, 8, 3), (32, 8, 3), (32, 4, 2), (64, 8, 2))
REPS = 5

Config = tuple[int | None, tuple[int, int, int] | None]
Call = Callable[[int | None, tuple[int, int, int] | None], torch.Tensor]


def configs() -> list[Config]:
    """The default first (the reference), then heads per program x tiles."""
    return [(None, None)] + [(hb, tile) for hb in HEADS_PER_PROGRAM for tile in SWEEP_TILES]


def sweep(
    call: Call, cases: Sequence[Config], timer: Callable[[Callable[[], Any]], float]
) -> list[dict[str, Any]]:
    """`call(heads_per_program, tile)` for each case: ms per call by `timer` (seconds) and the max
    abs difference from the first case's output (the reference; None where that one failed)."""
    ref: torch.Tensor | None = None
    rows: list[dict[str, Any]] = []
    for i, (hpp, tile) in enumerate(cases):
        row: dict[str, Any] = {"heads_per_program": hpp, "tile": list(tile) if tile else None}
        out = None
        try:
            out = call(hpp, tile)  # compiles; a tile that does not fit fails here
            ref = out if i == 0 else ref
            row["ms"] = round(1e3 * timer(lambda hpp=hpp, tile=tile: call(hpp, tile)), 3)
            row["max_abs_err"] = float((out - ref).abs().max()) if ref is not None else None
        except Exception as exc:  # any failure (compile, resources) is a result of the sweep
            row["error"] = repr(exc)[:300]
        del out  # one output besides the reference at a time (2 GiB each at 8K x 128 x 512)
        rows.append(row)
        print(f"[headblocks] {json.dumps(row)}", flush=True)
    return rows


def headblocks(ctx: int) -> dict[str, Any]:
    """The sweep on `prefill_split`'s chunk at `ctx` keys (needs CUDA: CUDA-event timing)."""
    if not torch.cuda.is_available():
        raise RuntimeError("headblocks times CUDA kernels: it needs a CUDA device and torch sees none")
    from inference.kernels.mla_decode.fast import head_block, mla_decode_paged_fast

    c = prefill_chunk(ctx)

    def call(hpp: int | None, tile: tuple[int, int, int] | None) -> torch.Tensor:
        # the same call as prefill_split's `sparse` piece, with the overrides
        return mla_decode_paged_fast(c.q_lat, c.q[..., DN:], c.layer.pool, c.layer.tables, c.lens, kv_lora_rank=R,
                                     scale=SCALE, indices=c.idx, table_rows=c.trows, tile=tile,
                                     heads_per_program=hpp)  # fmt: skip

    rows = sweep(call, configs(), lambda fn: bench(fn, REPS))
    flops = 2 * CHUNK * H * min(TOPK, ctx) * (R + P + R)
    for row in rows:
        if "ms" in row:
            hb = row["heads_per_program"] or head_block(H)
            # latent bytes the programs read (from L2 mostly): each head block reads its row's keys
            row["key_reads_GB"] = round(CHUNK * (H // hb) * min(TOPK, ctx) * (R + P) * 2 / 1e9, 1)
            row["TFLOPs"] = round(flops / (row["ms"] / 1e3) / 1e12, 1)
    timed = [r for r in rows if "ms" in r]
    best = min(timed, key=lambda r: r["ms"]) if timed else None
    return {"ctx": ctx, "queries": CHUNK, "topk": TOPK, "configs": rows, "best": best}
