"""Paged MLA prefill: varlen causal attention of prefill chunks over their expanded latents."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from inference.kernels import use_fast
from inference.kernels.mla_prefill.pieces import attention_lse_reference, prefill_by_pieces
from inference.kernels.mla_prefill.reference import mla_prefill_varlen_reference

__all__ = [
    "EXPAND_LIMIT_BYTES", "PREFILL_BACKEND", "expand_in_pieces", "mla_prefill_pieces", "mla_prefill_varlen",
    "mla_prefill_varlen_reference", "pick_backend",
]  # fmt: skip

# Which fast path runs on CUDA for bf16/fp16 (fp32 has no cuDNN kernel: always Triton). Measured
# on the H200 (benchmarks/kernels.py, H=16, Dqk=192, Dv=128): with its execution plan cached, the
# cuDNN prefix + diagonal split runs 548-620 TFLOP/s on 8K-16K chunks over 32K-512K keys, our
# Triton kernel 404-484 (SDPA's lower-right causal bias, the memory-efficient backend, 117-141).
# cuDNN builds a plan per new (L, S) shape (~45 ms); with the prefix cut into fixed pieces
# (`fast.CUDNN_PIECE`) a long chunked prefill meets a handful of shapes, but every new chunk
# length still costs two or three plans, so "auto" takes cuDNN only where attention dominates a
# step: one sequence, a chunk of >= CUDNN_MIN_QUERIES queries over >= CUDNN_MIN_KEYS keys;
# Triton (compiled once for all lengths, a varlen batch in one launch) everywhere else: on an H200
# cuDNN's chunked prefill of one MLA layer is ~1.3x faster at 512K, at par at 128K, and its first
# use in a process costs more than that 128K gain (a one-time cost, paid by the first long prompt).
PREFILL_BACKEND: Literal["auto", "triton", "cudnn"] = "auto"
CUDNN_MIN_KEYS = 131072
CUDNN_MIN_QUERIES = 8192
# A step's expanded keys (`[S, H, Dnope + Dv]`) above this are expanded a piece at a time
# (`mla_prefill_pieces`): 1M keys of a 128-head layer are 64 GiB, of a 16-head layer 8 GiB.
EXPAND_LIMIT_BYTES = 8 << 30
PIECE_KEYS = 65536  # prefix keys expanded per piece (the cuDNN path's piece)


def pick_backend(q: Tensor, kv: Tensor, cu_q: Tensor) -> Literal["triton", "cudnn"]:
    """The "auto" rule, on shapes only (no device sync)."""
    long_single = cu_q.shape[0] == 2 and kv.shape[0] >= CUDNN_MIN_KEYS and q.shape[0] >= CUDNN_MIN_QUERIES
    return "cudnn" if long_single else "triton"


def mla_prefill_varlen(
    q: Tensor,
    kv: Tensor,
    k_rope: Tensor,
    cu_q: Tensor,
    cu_k: Tensor,
    *,
    max_q: int,
    scale: float,
    nope_dim: int,
    backend: Literal["auto", "triton", "cudnn"] | None = None,
) -> Tensor:
    """`[T, H, Dv]` causal attention; contract in `mla_prefill_varlen_reference`."""
    if q.dim() != 3 or kv.dim() != 3 or k_rope.dim() != 2:
        raise ValueError(
            f"need q [T,H,D], kv [S,H,D'], k_rope [S,P]; got {q.shape}, {kv.shape}, {k_rope.shape}"
        )
    if q.shape[1] != kv.shape[1] or kv.shape[0] != k_rope.shape[0]:
        raise ValueError(f"head/key counts disagree: q {tuple(q.shape)}, kv {tuple(kv.shape)}, "
                         f"k_rope {tuple(k_rope.shape)}")  # fmt: skip
    if cu_q.shape != cu_k.shape or cu_q.dim() != 1:
        raise ValueError(f"cu_q and cu_k must both be [N + 1], got {tuple(cu_q.shape)}, {tuple(cu_k.shape)}")
    kw = dict(max_q=max_q, scale=scale, nope_dim=nope_dim)
    if use_fast(q):
        from inference.kernels.mla_prefill import fast

        which = backend or PREFILL_BACKEND
        if which == "auto":
            which = pick_backend(q, kv, cu_q)
        if which == "cudnn" and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
            return fast.mla_prefill_varlen_cudnn(q, kv, k_rope, cu_q, cu_k, **kw)
        return fast.mla_prefill_varlen_triton(q, kv, k_rope, cu_q, cu_k, **kw)
    return mla_prefill_varlen_reference(q, kv, k_rope, cu_q, cu_k, **kw)


def expand_in_pieces(num_seqs: int, num_keys: int, heads: int, width: int, itemsize: int) -> bool:
    """Whether a dense prefill step expands its keys a piece at a time: one sequence (the long
    prompt case) whose `[num_keys, heads, width]` expansion exceeds `EXPAND_LIMIT_BYTES`."""
    return num_seqs == 1 and num_keys * heads * width * itemsize > EXPAND_LIMIT_BYTES


def mla_prefill_pieces(
    q: Tensor,
    expand: Callable[[int, int], Tensor],
    k_rope: Tensor,
    *,
    scale: float,
    nope_dim: int,
    piece: int = PIECE_KEYS,
) -> Tensor:
    """Causal attention of one sequence's `L` new tokens over its `S` keys, expanded a piece at a
    time: peak memory one piece's `[piece, H, Dqk]` keys, not `[S, H, ...]`.

    Args:
        q: `[L, H, nope_dim + P]`, the last `L` of the `S` positions.
        expand: `expand(a, b)` -> `[b - a, H, nope_dim + Dv]` nope keys and values of positions
            `[a, b)` (`kv_b_proj` of their latents).
        k_rope: `[S, P]` rope key shared by every head (`P = 0` allowed).
    Returns:
        `[L, H, Dv]` in `q.dtype`; cuDNN on CUDA in 16 bits, the fp32 reference elsewhere.
    """
    if q.dim() != 3 or k_rope.dim() != 2:
        raise ValueError(f"need q [L,H,D] and k_rope [S,P]; got {tuple(q.shape)}, {tuple(k_rope.shape)}")
    h = q.shape[1]
    part = attention_lse_reference
    if use_fast(q) and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        from inference.kernels.mla_prefill.fast import _cudnn as part

    def keys(a: int, b: int) -> tuple[Tensor, Tensor]:
        kv = expand(a, b)
        kr = k_rope[a:b, None, :].expand(b - a, h, k_rope.shape[-1])
        k = torch.cat([kv[..., :nope_dim], kr.to(kv.dtype)], dim=-1)
        return k.transpose(0, 1)[None], kv[..., nope_dim:].transpose(0, 1)[None]

    out = prefill_by_pieces(
        q.transpose(0, 1)[None], keys, k_rope.shape[0], scale=scale, piece=piece, part=part
    )
    return out[0].transpose(0, 1).to(q.dtype)
