"""fp32 PyTorch reference of varlen causal MLA prefill attention (the kernels' oracle, CPU path)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["mla_prefill_varlen_reference"]

_QUERY_BLOCK = 512  # queries per score block: bounds the [H, block, S] scores this path holds


def mla_prefill_varlen_reference(
    q: Tensor,
    kv: Tensor,
    k_rope: Tensor,
    cu_q: Tensor,
    cu_k: Tensor,
    *,
    max_q: int,
    scale: float,
    nope_dim: int,
) -> Tensor:
    """Causal attention of each sequence's new tokens over its (cached + new) expanded keys.

    Sequence `n` owns query rows `cu_q[n]:cu_q[n+1]` (`L_n` tokens) and key rows
    `cu_k[n]:cu_k[n+1]` (`S_n >= L_n` keys, the new tokens last), so its query `i` sits at
    position `S_n - L_n + i` and sees keys `j <= S_n - L_n + i`.

    Args:
        q: `[T, H, nope_dim + P]` queries (nope part, then rope part).
        kv: `[S_total, H, nope_dim + Dv]` per-head expanded keys (nope part) and values, as
            `kv_b_proj` of the latents produces them.
        k_rope: `[S_total, P]` rope key shared by every head (`P = 0` allowed).
        cu_q, cu_k: `[N + 1]` int offsets.
        max_q: the largest `L_n` (the kernels size their grid with it).
        scale: softmax scale.
        nope_dim: width of the nope part of `q` and `kv`.
    Returns:
        `[T, H, Dv]` in `q.dtype`.
    """
    del max_q
    dv = kv.shape[-1] - nope_dim
    out = torch.empty(q.shape[0], q.shape[1], dv, dtype=q.dtype, device=q.device)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for n in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[n], cq[n + 1], ck[n], ck[n + 1]
        ctx = (k1 - k0) - (q1 - q0)
        kn = kv[k0:k1, :, :nope_dim].float()
        v = kv[k0:k1, :, nope_dim:].float()
        kr = k_rope[k0:k1].float()
        keys = torch.arange(k1 - k0, device=q.device)
        for b0 in range(q0, q1, _QUERY_BLOCK):
            b1 = min(b0 + _QUERY_BLOCK, q1)
            qb = q[b0:b1].float()
            s = torch.einsum("lhd,shd->hls", qb[..., :nope_dim], kn)
            if kr.shape[-1]:
                s = s + torch.einsum("lhp,sp->hls", qb[..., nope_dim:], kr)
            qpos = torch.arange(b0 - q0, b1 - q0, device=q.device)[:, None] + ctx
            s = (s * scale).masked_fill(~(keys[None, :] <= qpos)[None], float("-inf"))
            out[b0:b1] = torch.einsum("hls,shv->lhv", torch.softmax(s, dim=-1), v).to(q.dtype)
    return out
