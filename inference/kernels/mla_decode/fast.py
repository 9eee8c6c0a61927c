"""Triton split-KV (flash-decoding) absorbed MLA attention over a paged latent cache.

One program owns one query row (all its heads, or a block of `MAX_HEAD_BLOCK` of them, or of
`heads_per_program`: MLA keys are shared by every head, so a latent tile is read once and used by
the block's query rows through the tensor cores) and one contiguous split of
its keys; a second kernel merges the splits by their log-sum-exp. Keys are gathered row by row
through the block table, so a tile may span pages and any page size works.

Launch shapes depend only on tensor shapes (rows, block-table width or index count) and the
device's SM count, never on the lengths inside the tensors: a CUDA graph captures and replays it.
"""

# ruff: noqa: SIM108  (constexpr branches inside @triton.jit stay `if` statements, as Triton lowers them)

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = [
    "MAX_HEAD_BLOCK",
    "TILES",
    "default_num_splits",
    "head_block",
    "mla_decode_paged_fast",
    "pick_tile",
]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_LOG2E = 1.4426950408889634
# keys per split at least this many: below it the merge costs more than the parallelism gains
_MIN_KEYS_PER_SPLIT = 256
_MAX_SPLITS = 128
# query heads per program at most by default (`head_block`); `heads_per_program` may ask for more
MAX_HEAD_BLOCK = 16


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sm_count_or_4(device: torch.device) -> int:
    return _sm_count(device.index or 0) if device.type == "cuda" else 4


def default_num_splits(rows: int, max_keys: int, device: torch.device) -> int:
    """Splits per row: at most two programs per SM in all (shape-only inputs).

    Rounded down, not up: a program holds ~200 KB of pipelined tiles, one or two fit an SM, so
    `rows * splits` just over a multiple of the SM count would leave a nearly empty last wave
    (measured: batch 32 at 8K, 9 splits = 2.2 waves, 35% of copy bandwidth).
    """
    want = (2 * _sm_count_or_4(device)) // max(rows, 1)
    return max(1, min(want, _MAX_SPLITS, -(-max_keys // _MIN_KEYS_PER_SPLIT)))


def rows_aligned(pool: Tensor) -> bool:
    """Whether each cached row starts 16-byte aligned, as the kernel's vector loads need (an fp8
    row of 40 latents does not: measured 'misaligned address' on the H200)."""
    return (pool.stride(1) * pool.element_size()) % 16 == 0


@triton.jit
def _split_kernel(
    q_ptr, qr_ptr, pool_ptr, kvs_ptr, bt_ptr, lens_ptr, idx_ptr, trow_ptr, o_ptr, lse_ptr,
    qk_scale, num_idx,
    s_qn, s_qh, s_rn, s_rh, s_bt, s_idx, s_on, s_os, s_oh, s_ln, s_ls,
    H: tl.constexpr, H_PAD: tl.constexpr, R: tl.constexpr, R_PAD: tl.constexpr,
    P: tl.constexpr, P_PAD: tl.constexpr, ROW: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_IDX: tl.constexpr,
    HAS_TROW: tl.constexpr, IEEE: tl.constexpr, HEAD_BLOCKS: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)
    if HEAD_BLOCKS > 1:  # this program's head block (one block: the code compiled before blocks)
        h0 = tl.program_id(2) * H_PAD
    else:
        h0 = 0
    seq_len = tl.load(lens_ptr + n).to(tl.int32)
    if HAS_TROW:
        trow = tl.load(trow_ptr + n).to(tl.int64)
    else:
        trow = n.to(tl.int64)
    if HAS_IDX:
        total = num_idx
    else:
        total = seq_len
    chunk = tl.cdiv(tl.cdiv(total, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, total)

    offs_h = h0 + tl.arange(0, H_PAD)
    offs_r = tl.arange(0, R_PAD)
    offs_p = tl.arange(0, P_PAD)
    hmask = offs_h < H
    rmask = offs_r < R
    pmask = offs_p < P
    # fp8 latents widen exactly to fp16 (one cvt per pair on sm89+; e4m3 values fit fp16), so the
    # fp8 path computes in fp16 with the row scales applied to scores and probabilities (measured
    # on the H200: dequantising each tile into bf16 first ran 1.2-2.5x slower); bf16 latents stay
    # bf16; fp32 (and the interpreter) use fp32 dots
    if IEEE:
        cdt = tl.float32
    elif HAS_SCALE:
        cdt = tl.float16
    else:
        cdt = tl.bfloat16
    q = tl.load(
        q_ptr + n * s_qn + offs_h[:, None] * s_qh + offs_r[None, :],
        mask=hmask[:, None] & rmask[None, :], other=0.0,
    ).to(cdt)  # fmt: skip
    if P > 0:
        qr = tl.load(
            qr_ptr + n * s_rn + offs_h[:, None] * s_rh + offs_p[None, :],
            mask=hmask[:, None] & pmask[None, :], other=0.0,
        ).to(cdt)  # fmt: skip

    m_i = tl.full([H_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([H_PAD], tl.float32)
    acc = tl.zeros([H_PAD, R_PAD], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        valid = offs < hi
        if HAS_IDX:
            pos = tl.load(idx_ptr + n * s_idx + offs, mask=valid, other=-1).to(tl.int32)
            valid = valid & (pos >= 0) & (pos < seq_len)
            pos = tl.where(valid, pos, 0)
        else:
            pos = offs
        blk = tl.load(bt_ptr + trow * s_bt + pos // PAGE, mask=valid, other=0).to(tl.int64)
        row = blk * PAGE + (pos % PAGE)
        if HAS_SCALE:
            kv_scale = tl.load(kvs_ptr + row, mask=valid, other=0.0)
        c = tl.load(
            pool_ptr + row[:, None] * ROW + offs_r[None, :], mask=valid[:, None] & rmask[None, :], other=0.0
        )
        c = c.to(cdt)
        if IEEE:
            s = tl.dot(q, tl.trans(c), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(c))
        if P > 0:
            kr = tl.load(
                pool_ptr + row[:, None] * ROW + R + offs_p[None, :],
                mask=valid[:, None] & pmask[None, :], other=0.0,
            ).to(cdt)  # fmt: skip
            if IEEE:
                s += tl.dot(qr, tl.trans(kr), input_precision="ieee")
            else:
                s += tl.dot(qr, tl.trans(kr))
        if HAS_SCALE:
            s = s * kv_scale[None, :]
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if HAS_SCALE:
            p = p * kv_scale[None, :]
        if IEEE:
            pv = tl.dot(p, c, input_precision="ieee")
        else:
            pv = tl.dot(p.to(cdt), c)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    has = l_i > 0.0
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    tl.store(
        o_ptr + n * s_on + split * s_os + offs_h[:, None] * s_oh + offs_r[None, :],
        out, mask=hmask[:, None] & rmask[None, :],
    )  # fmt: skip
    tl.store(lse_ptr + n * s_ln + split * s_ls + offs_h, lse, mask=hmask)


@triton.jit
def _merge_kernel(
    o_ptr, lse_ptr, out_ptr, num_splits,
    s_on, s_os, s_oh, s_ln, s_ls, s_outn, s_outh,
    R: tl.constexpr, R_PAD: tl.constexpr, S_PAD: tl.constexpr, S_BLOCK: tl.constexpr,
):  # fmt: skip
    # `S_BLOCK` splits' partial outputs are loaded at once (independent loads in flight), not one
    # split after another: a serial loop waited one memory latency per split
    n = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, S_PAD)
    offs_r = tl.arange(0, R_PAD)
    rmask = offs_r < R
    lse = tl.load(lse_ptr + n * s_ln + offs_s * s_ls + h, mask=offs_s < num_splits, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    total = tl.sum(tl.exp2(lse - m), 0)
    total = tl.where(total > 0.0, total, 1.0)
    acc = tl.zeros([R_PAD], tl.float32)
    for s0 in range(0, num_splits, S_BLOCK):
        offs_b = s0 + tl.arange(0, S_BLOCK)
        bmask = offs_b < num_splits
        w = tl.exp2(tl.load(lse_ptr + n * s_ln + offs_b * s_ls + h, mask=bmask, other=float("-inf")) - m)
        part = tl.load(
            o_ptr + n * s_on + offs_b[:, None] * s_os + h * s_oh + offs_r[None, :],
            mask=bmask[:, None] & rmask[None, :], other=0.0,
        )  # fmt: skip
        acc += tl.sum(w[:, None] * part, 0)
    tl.store(out_ptr + n * s_outn + h * s_outh + offs_r, acc / total, mask=rmask)


# Tiles (BLOCK_N, num_warps, num_stages), one decision by shape class instead of an autotuner: an
# autotuner keyed on launch sizes re-tuned mid-serving (~1 s per new key), and one tuned inside
# a decode-graph capture benchmarks the capture's padding rows (one key each), not real lengths.
# Chosen from the H200 sweep of benchmarks/kernels.py (2026-12-01, CUDA-graph replay, L2 flushed,
# bf16 latents 512 + 64, block 64; % of copy bandwidth at the default splits): SMs full, b32 x 8K
# (64, 4, 3) 68.1% vs (64, 8, 3) 66.2%, (32, 4, 2) 64.4%, (64, 4, 2) 53.9%; b32 x 16K 77.6% vs
# 71.5-71.9% (next best); b64 x 8K 78.2% vs 72.2%; b128 x 8K 84.5%, b32 x 128K 89.3% (5-stage
# tiles 62.6-84.5%). SMs not full, b1 x 128K at 128 splits: (64, 8, 5) 78.1 us (double-buffered
# tile: 5 stages) vs (64, 8, 2) 86.7-89.0 us, others 83.8-111.3 us. fp8 b32 x 8K: (64, 4, 2)
# 133.2 us, the best of 14 tiles (fp8 stays as slow as bf16 in time). Why, from Triton 3.6's
# output for sm_90 (benchmarks/kernels_compile_check.py): the fp8 tile's load is not pipelined
# (the fp8 -> fp16 convert between load and dot stops the pipeliner: plain global loads, then
# ~360 scalar shared-memory loads instead of ldmatrix), and tl.dot takes no fp16 x fp8 mix. A fix
# needs the dequantise after the shared-memory stage (a CUDA kernel) or fp8 MMAs on fp8 queries.
# Session-5 re-sweep (`sweep`, splits x tiles, both L2 flushes): the same picks and splits are the
# best measured at b32 x 8K (8 splits 102.6-103.6 us vs 119-141 at 4/6/12), b32 x 16K (8: 181 us
# vs 186-223 at 12/16), b64 x 8K (4: 180.7 vs 219-259 at 2/6), b48 x 8K (5: 150 vs 168-169 at 4/8).
TILES = {
    # (dtype class, SMs full) -> tile
    ("bf16", True): (64, 4, 3),
    ("bf16", False): (64, 8, 5),
    ("fp8", True): (64, 4, 2),
    ("fp8", False): (64, 8, 3),
    ("fp32", True): (32, 4, 2),
    ("fp32", False): (32, 4, 2),
}


def pick_tile(pool: Tensor, programs: int) -> tuple[int, int, int]:
    """The tile for this pool dtype and launch size (shape-only: graph-safe)."""
    kind = {torch.float8_e4m3fn: "fp8", torch.float32: "fp32"}.get(pool.dtype, "bf16")
    return TILES[(kind, programs >= _sm_count_or_4(pool.device))]


def _pad(x: int, least: int = 16) -> int:
    return max(least, triton.next_power_of_2(x))


def head_block(heads: int) -> int:
    """Heads per program: all of them up to `MAX_HEAD_BLOCK`, else blocks of it (a 128-head layer,
    DeepSeek-V3.2's, in 8 programs per split, each re-reading the split's latent tiles, mostly
    from L2). A program's accumulator is `[block, R]` fp32: 16 x 512 is what the tiles above were
    swept with; 128 x 512 would not fit the registers."""
    return min(_pad(heads), MAX_HEAD_BLOCK)


# DSA prefill rows (selected keys `indices`, at least one row per SM) of a layer of >= 64 heads:
# 64 heads per program and 8 warps. Measured on an H100 (`benchmarks/dsa_v32_headblocks.py`,
# `docs/results/dsa_v32_headblocks_h100.json`; 8K queries x 128 heads x top-2048, bf16 latents):
# 24.0 ms against 64.6 ms with 16-head blocks at 128K keys, 24.5 against 86.3 ms at 1M: each
# row's 2048 latent rows are read by 2 programs instead of 8. 32 heads: 37.6-42.5 ms; 64 heads on
# 4 warps: 45.6 ms (the [64, 512] accumulator spills).
SPARSE_ROWS_HEAD_BLOCK = 64
SPARSE_ROWS_TILE = (64, 8, 3)


def sparse_rows_rule(heads: int, rows: int, pool: Tensor) -> bool:
    """Whether a launch with `indices` takes `SPARSE_ROWS_HEAD_BLOCK` / `SPARSE_ROWS_TILE`: many
    heads, rows enough to fill the SMs without splits (decode batches keep `head_block`), and a
    16-bit pool (the one measured; fp32 tiles of that size would not fit shared memory)."""
    wide = pool.dtype in (torch.bfloat16, torch.float16)
    return wide and heads >= SPARSE_ROWS_HEAD_BLOCK and rows >= _sm_count_or_4(pool.device)


def _checked_head_block(heads_per_program: int, heads: int) -> int:
    """The override of `head_block`: a power of two >= 16 (`tl.dot` needs 16 rows at least), used
    up to the heads rounded up to a power of two (a larger block would only compute padding)."""
    hpp = heads_per_program
    if isinstance(hpp, bool) or not isinstance(hpp, int) or hpp < 16 or hpp & (hpp - 1):
        raise ValueError(f"heads_per_program must be a power of two >= 16, got {hpp!r}")
    return min(hpp, _pad(heads))


def mla_decode_paged_fast(
    q_latent: Tensor,
    q_rope: Tensor,
    pool: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    *,
    kv_lora_rank: int,
    scale: float,
    kv_scales: Tensor | None = None,
    indices: Tensor | None = None,
    table_rows: Tensor | None = None,
    num_splits: int | None = None,
    tile: tuple[int, int, int] | None = None,
    heads_per_program: int | None = None,
) -> Tensor:
    """Same contract as `mla_decode_paged_reference` (shapes there); returns `[N, H, R]` fp32.
    `tile` overrides `pick_tile` and `heads_per_program` `head_block` (benchmark sweeps; the two
    combine). A block's accumulator is `[block, R]` fp32: 64 x 512 is 128 KiB of registers."""
    n, h, r = q_latent.shape
    sparse_rows = heads_per_program is None and indices is not None and sparse_rows_rule(h, n, pool)
    if sparse_rows:
        heads_per_program = SPARSE_ROWS_HEAD_BLOCK
        tile = tile or SPARSE_ROWS_TILE
    hb = head_block(h) if heads_per_program is None else _checked_head_block(heads_per_program, h)
    p = pool.shape[-1] - r
    if q_rope.shape[-1] != p:
        raise ValueError(f"q_rope has {q_rope.shape[-1]} dims, the pool's rope part {p}")
    if pool.dtype == torch.float8_e4m3fn and kv_scales is None:
        raise ValueError("an fp8 latent pool needs kv_scales")
    if not pool.is_contiguous():
        raise ValueError("the latent pool must be contiguous")
    if pool.is_cuda and not rows_aligned(pool):
        raise ValueError(
            f"latent rows of {pool.stride(1) * pool.element_size()} bytes are not 16-byte aligned"
        )
    page = pool.shape[1]
    q_latent = q_latent.contiguous()
    q_rope = q_rope.contiguous() if p else q_latent
    block_tables = block_tables.contiguous()
    max_keys = indices.shape[1] if indices is not None else block_tables.shape[1] * page
    groups = triton.cdiv(h, hb)
    splits = num_splits or default_num_splits(n * groups, max_keys, pool.device)
    out = torch.empty(n, h, r, dtype=torch.float32, device=pool.device)
    if n == 0:
        return out
    # one split writes the output itself (no merge launch)
    o_part = (
        out.view(n, 1, h, r)
        if splits == 1
        else torch.empty(n, splits, h, r, dtype=torch.float32, device=pool.device)
    )
    lse = torch.empty(n, splits, h, dtype=torch.float32, device=pool.device)
    idx = indices.contiguous() if indices is not None else seq_lens
    trow = table_rows.contiguous() if table_rows is not None else seq_lens
    kvs = kv_scales.contiguous() if kv_scales is not None else pool
    # fp32 pools get exact fp32 dots; the interpreter too (Triton 3.8's interpreter returns
    # garbage from bf16 `tl.dot`, so the CPU tests check the kernel's logic in fp32)
    ieee = pool.dtype == torch.float32 or _INTERPRET
    args = (
        q_latent, q_rope, pool, kvs, block_tables, seq_lens, idx, trow, o_part, lse,
        scale * _LOG2E, indices.shape[1] if indices is not None else 0,
        q_latent.stride(0), q_latent.stride(1), q_rope.stride(0), q_rope.stride(1),
        block_tables.stride(0), idx.stride(0) if indices is not None else 0,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), lse.stride(0), lse.stride(1),
    )  # fmt: skip
    meta = dict(
        H=h, H_PAD=hb, R=r, R_PAD=_pad(r), P=p, P_PAD=_pad(max(p, 1)), ROW=r + p, PAGE=page,
        HAS_SCALE=kv_scales is not None, HAS_IDX=indices is not None,
        HAS_TROW=table_rows is not None, IEEE=ieee, HEAD_BLOCKS=groups,
    )  # fmt: skip
    block_n, warps, stages = tile or pick_tile(pool, n * splits * groups)
    if _INTERPRET:
        block_n = 32
    _split_kernel[(n, splits, groups)](*args, **meta, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
    if splits > 1:
        _merge_kernel[(n, h)](
            o_part, lse, out, splits,
            o_part.stride(0), o_part.stride(1), o_part.stride(2), lse.stride(0), lse.stride(1),
            out.stride(0), out.stride(1),
            R=r, R_PAD=_pad(r), S_PAD=_pad(splits, 2), S_BLOCK=min(8, _pad(splits, 2)),
        )  # fmt: skip
    return out
