"""Multi-head latent attention (optionally with the DSA indexer) over the paged latent cache.

Parameter names follow the published checkpoints (`q_proj` or `q_a_proj/q_a_layernorm/q_b_proj`,
`kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`, and `indexer.*` for DSA).
Kimi-Linear runs MLA without rope (NoPE); DeepSeek-style configs rotate the shared rope key.

Per step: the new tokens' latents are written at `meta.slot_mapping`; sequences decoding one token
take the absorbed path (attention in latent space, no key expansion); prefill chunks expand their
sequence's latents and attend causally.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from inference.config import ModelSpec
from inference.model.cache_tensors import HybridCacheTensors
from inference.model.forward_meta import ForwardMeta
from inference.model.layers import RMSNorm, rope_cos_sin, rope_half_split, rope_interleaved
from inference.model.ops.mla import (
    dsa_topk_indices,
    gather_paged,
    mla_decode_absorbed,
    mla_prefill_attention,
    topk_to_mask,
)

__all__ = ["DSAIndexer", "MLAttention"]

# (indexer queries [T, Hi, D], indexer weights [T, Hi], indexer key pool of this layer)
_IndexInputs = tuple[Tensor, Tensor, Tensor]


class DSAIndexer(nn.Module):
    """DeepSeek-V3.2 lightning indexer: low-cost scores that pick the keys each query attends."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        dsa, mla = spec.dsa, spec.mla
        if dsa is None or mla.q_lora_rank is None:
            raise ValueError("DSAIndexer needs a DSA spec and q_lora_rank")
        self.num_heads, self.head_dim, self.topk = dsa.num_heads, dsa.head_dim, dsa.topk
        self.rope_dim = mla.qk_rope_head_dim if mla.use_rope else 0
        self.wq_b = nn.Linear(mla.q_lora_rank, dsa.num_heads * dsa.head_dim, bias=False)
        self.wk = nn.Linear(spec.hidden_size, dsa.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(dsa.head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(spec.hidden_size, dsa.num_heads, bias=False)

    def project(
        self, x: Tensor, q_latent: Tensor, cos: Tensor | None, sin: Tensor | None
    ) -> tuple[Tensor, ...]:
        """x: `[T, hidden]`, q_latent: `[T, q_lora_rank]` -> (q `[T, Hi, D]`, k `[T, D]`, w `[T, Hi]`)."""
        t = x.shape[0]
        q = self.wq_b(q_latent).view(t, self.num_heads, self.head_dim)
        k = self.k_norm(self.wk(x))
        if self.rope_dim and cos is not None and sin is not None:
            r = self.rope_dim
            q = torch.cat([rope_half_split(q[..., :r], cos, sin), q[..., r:]], dim=-1)
            k = torch.cat([rope_half_split(k[..., :r], cos, sin), k[..., r:]], dim=-1)
        w = self.weights_proj(x).float() * self.num_heads**-0.5
        return q, k, w


class MLAttention(nn.Module):
    """MLA mixer for one full-attention layer."""

    def __init__(self, spec: ModelSpec, layer_idx: int) -> None:
        super().__init__()
        m = spec.mla
        self.layer_idx = layer_idx
        self.m = m
        hidden, h = spec.hidden_size, m.num_heads
        if m.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, h * m.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, m.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank)
            self.q_b_proj = nn.Linear(m.q_lora_rank, h * m.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, m.latent_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank)
        self.kv_b_proj = nn.Linear(m.kv_lora_rank, h * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * m.v_head_dim, hidden, bias=False)
        self.indexer = DSAIndexer(spec) if spec.dsa is not None else None
        self.scale = m.qk_head_dim**-0.5

    def _queries(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        m = self.m
        if m.q_lora_rank is None:
            return self.q_proj(x).view(x.shape[0], m.num_heads, m.qk_head_dim), None
        q_latent = self.q_a_layernorm(self.q_a_proj(x))
        return self.q_b_proj(q_latent).view(x.shape[0], m.num_heads, m.qk_head_dim), q_latent

    def forward(self, x: Tensor, meta: ForwardMeta, cache: HybridCacheTensors) -> Tensor:
        """x: `[T, hidden]` -> `[T, hidden]`; writes this step's latents into the paged cache."""
        m = self.m
        q, q_latent = self._queries(x)
        ckv = self.kv_a_proj_with_mqa(x)
        c, k_rope = ckv.split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        c = self.kv_a_layernorm(c)
        cos = sin = None
        if m.use_rope and m.qk_rope_head_dim:
            cos, sin = rope_cos_sin(meta.positions.to(x.device), m.qk_rope_head_dim, m.rope_theta)
            q = torch.cat(
                [q[..., : m.qk_nope_head_dim], rope_interleaved(q[..., m.qk_nope_head_dim :], cos, sin)], -1
            )
            k_rope = rope_interleaved(k_rope, cos, sin)
        pool = cache.kv[self.layer_idx]
        pool.view(-1, pool.shape[-1]).index_copy_(
            0, meta.slot_mapping.to(x.device), torch.cat([c, k_rope], -1).to(pool.dtype)
        )
        index = None
        if self.indexer is not None:
            iq, ik, iw = self.indexer.project(x, q_latent, cos, sin)
            ipool = cache.index_k[self.layer_idx]
            ipool.view(-1, ipool.shape[-1]).index_copy_(0, meta.slot_mapping.to(x.device), ik.to(ipool.dtype))
            index = (iq, iw, ipool)
        out = torch.empty(x.shape[0], m.num_heads, m.v_head_dim, dtype=x.dtype, device=x.device)
        self._attend(q, meta, pool, index, out)
        return self.o_proj(out.reshape(x.shape[0], -1))

    def _dsa_mask(
        self, index: _IndexInputs | None, seq: int, rows: slice, meta: ForwardMeta
    ) -> Tensor | None:
        """`[L, S]` bool: keys the indexer selected for the rows of sequence `seq` (None without DSA)."""
        if index is None:
            return None
        iq, iw, ipool = index
        s = meta.seq_lens_cpu[seq]
        keys = gather_paged(ipool, meta.block_tables[seq : seq + 1], [s])[0]
        idx, valid = dsa_topk_indices(iq[rows], keys, iw[rows], meta.context_lens_cpu[seq], self.indexer.topk)
        return topk_to_mask(idx, valid, s)

    def _attend(
        self, q: Tensor, meta: ForwardMeta, pool: Tensor, index: _IndexInputs | None, out: Tensor
    ) -> None:
        """Fill `out` `[T, H, Dv]`: absorbed form for one-token decodes, expanded keys for prefill chunks."""
        m = self.m
        w = self.kv_b_proj.weight.view(m.num_heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
        w_uk, w_uv = w[:, : m.qk_nope_head_dim], w[:, m.qk_nope_head_dim :]
        starts = [0]
        for n in meta.query_lens_cpu:
            starts.append(starts[-1] + n)
        decode = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
        if decode:
            lens = [meta.seq_lens_cpu[i] for i in decode]
            if len(decode) == len(meta.query_lens_cpu):
                # pure decode: the batch tensors as they are, and the whole block-table width read
                # (shapes fixed by the tensors alone, not by host lengths: a CUDA graph replays it)
                rows, tables, lens_t = slice(None), meta.block_tables, meta.seq_lens.to(q.device)
                num_rows = tables.shape[1] * pool.shape[1]
            else:
                rows = torch.tensor([starts[i] for i in decode], device=q.device)
                tables, lens_t = meta.block_tables[decode], torch.tensor(lens, device=q.device)
                num_rows = max(lens)
            latents = gather_paged(pool, tables, [num_rows])
            allowed = None
            if index is not None:  # DSA: the absorbed kernel sees only the selected keys
                allowed = torch.zeros(len(decode), num_rows, dtype=torch.bool, device=q.device)
                for j, i in enumerate(decode):
                    allowed[j, : lens[j]] = self._dsa_mask(index, i, slice(starts[i], starts[i] + 1), meta)[0]
            qd = q[rows]
            q_lat = torch.einsum("nhd,hdr->nhr", qd[..., : m.qk_nope_head_dim].float(), w_uk.float())
            # `.to(out.dtype)`: an index-put (mixed decode + prefill step) does not cast like a copy does
            out[rows] = mla_decode_absorbed(
                q_lat, qd[..., m.qk_nope_head_dim :], latents,
                lens_t, w_uv, m.kv_lora_rank, self.scale, allowed,
            ).to(out.dtype)  # fmt: skip
        done = set(decode)
        for i, n in enumerate(meta.query_lens_cpu):
            if i in done:
                continue
            rows = slice(starts[i], starts[i] + n)
            s = meta.seq_lens_cpu[i]
            lat = gather_paged(pool, meta.block_tables[i : i + 1], [s])[0].to(q.dtype)
            kv = self.kv_b_proj(lat[:, : m.kv_lora_rank]).view(s, m.num_heads, -1)
            k_nope, v = kv.split([m.qk_nope_head_dim, m.v_head_dim], dim=-1)
            k_rope = lat[:, None, m.kv_lora_rank :].expand(s, m.num_heads, m.qk_rope_head_dim)
            k = torch.cat([k_nope, k_rope], dim=-1)
            allowed = self._dsa_mask(index, i, rows, meta)
            out[rows] = mla_prefill_attention(q[rows], k, v, meta.context_lens_cpu[i], self.scale, allowed)
