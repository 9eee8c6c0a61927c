"""Gated DeltaNet (Qwen3-Next's linear attention) on the KDA delta-rule ops (family `kda`).

Gated DeltaNet's decay is one scalar per value head and step; KDA's is one per key channel. A
scalar decay broadcast over the key channels *is* a per-channel decay, so GDN runs exactly on
`kda_varlen` (chunked / recurrent PyTorch reference, fla's `chunk_kda` on CUDA in 16-bit) with
`g` expanded: no new recurrence to write or to trust. (fla's dedicated
`chunk_gated_delta_rule` would save the expanded `g` read; a later fast path.)

The query/key heads are shared by `num_v_heads // num_k_heads` value heads, as in transformers:
they are repeated to one per value head before the recurrence.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from inference.kernels.kda import kda_varlen

__all__ = ["gdn_gate", "gdn_varlen"]


def gdn_gate(a: Tensor, a_log: Tensor, dt_bias: Tensor) -> Tensor:
    """`[T, Hv]` log decay `-exp(A_log) * softplus(a + dt_bias)` in fp32 (all <= 0)."""
    return -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())


def gdn_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    states: Tensor,
    cu_seqlens: Tensor,
    query_lens_cpu: tuple[int, ...],
) -> tuple[Tensor, Tensor]:
    """Gated delta rule over a flat batch, each sequence continuing its own state.

    Args:
        q, k: `[T, Hk, K]` raw (l2-normalised and scaled inside); v: `[T, Hv, V]`, `Hv % Hk == 0`.
        g: `[T, Hv]` fp32 log decay (`gdn_gate`); beta: `[T, Hv]` in (0, 1).
        states: `[N, Hv, K, V]` fp32 initial states.
        cu_seqlens, query_lens_cpu: batch layout.
    Returns:
        `(o [T, Hv, V] in q.dtype, final_states [N, Hv, K, V] fp32)`.
    """
    hk, hv = q.shape[1], v.shape[1]
    if hv % hk or k.shape != q.shape or g.shape != v.shape[:2] or beta.shape != v.shape[:2]:
        raise ValueError(
            f"shapes q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} g {tuple(g.shape)} beta {tuple(beta.shape)}"
        )
    if hv != hk:
        q, k = (x.repeat_interleave(hv // hk, dim=1) for x in (q, k))
    g_channels = g.float()[..., None].expand(*g.shape, q.shape[-1]).contiguous()
    return kda_varlen(q, k, v, g_channels, beta.float(), states, cu_seqlens, query_lens_cpu)
