"""Multi-head latent attention (optionally with the DSA indexer) over the paged latent cache.

Parameter names follow the published checkpoints (`q_proj` or `q_a_proj/q_a_layernorm/q_b_proj`,
`kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`, and `indexer.*` for DSA).
Kimi-Linear runs MLA without rope (NoPE); DeepSeek-style configs rotate the shared rope key.

Per step: the new tokens' latents are written at `meta.slot_mapping`; sequences decoding one token
take the absorbed path (attention in latent space, no key expansion: the paged split-KV decode
kernel); dense prefill chunks of all sequences expand their latents and attend causally in one
varlen call. With DSA every row (decode or prefill) is absorbed attention over the keys the
indexer selected for it.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference.config import ModelSpec
from inference.kernels.dsa import dsa_topk_paged
from inference.kernels.mla_decode import mla_decode_paged
from inference.kernels.mla_prefill import expand_in_pieces, mla_prefill_pieces, mla_prefill_varlen
from inference.model.cache_tensors import HybridCacheTensors
from inference.model.forward_meta import ForwardMeta
from inference.model.fused_params import concat_params
from inference.model.layers import RMSNorm, rope_half_split, rope_interleaved
from inference.model.rope import RotaryAngles

__all__ = ["DSAIndexer", "MLAttention", "dsa_topk_indices"]

# (indexer queries [T, Hi, D], indexer weights [T, Hi], indexer key pool of this layer, its FP8
# scales or None)
_IndexInputs = tuple[Tensor, Tensor, Tensor, Tensor | None]


def dsa_topk_indices(
    q_index: Tensor, k_index: Tensor, weights: Tensor, context_len: int, topk: int
) -> tuple[Tensor, Tensor]:
    """Lightning-indexer selection over dense keys `k_index` `[S, D]` for `L` queries at
    positions `context_len + l`: `(indices [L, k] int64, valid [L, k] bool)`, `k = min(topk, S)`.

    The paged op with the keys as one block of one sequence (`-1` entries become `valid=False`).
    """
    length, s = q_index.shape[0], k_index.shape[0]
    pool = k_index[None]  # one block of S rows
    tables = torch.zeros(1, 1, dtype=torch.int32, device=k_index.device)
    lens = torch.arange(length, device=k_index.device) + context_len + 1
    rows = torch.zeros(length, dtype=torch.long, device=k_index.device)
    idx = dsa_topk_paged(q_index, weights, pool, tables, lens.clamp(max=s), topk=topk, table_rows=rows)
    valid = idx >= 0
    return idx.clamp(min=0), valid


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
        return self.finish(self.wq_b(q_latent), self.wk(x), self.weights_proj(x), cos, sin)

    def finish(
        self, q: Tensor, k: Tensor, w: Tensor, cos: Tensor | None, sin: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """`project` from the outputs of `wq_b` `[T, Hi * D]`, `wk` `[T, D]`, `weights_proj`
        `[T, Hi]` (the MLA layer computes them inside its fused GEMMs)."""
        q = q.view(q.shape[0], self.num_heads, self.head_dim)
        k = self.k_norm(k)
        if self.rope_dim and cos is not None and sin is not None:
            r = self.rope_dim
            q = torch.cat([rope_half_split(q[..., :r], cos, sin), q[..., r:]], dim=-1)
            k = torch.cat([rope_half_split(k[..., :r], cos, sin), k[..., r:]], dim=-1)
        return q, k, w.float() * self.num_heads**-0.5


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
        # YaRN (rope_scaling) changes the angles and the softmax temperature; plain rope neither
        self.rope = RotaryAngles.for_mla(m) if m.use_rope and m.qk_rope_head_dim else None
        self.scale = m.qk_head_dim**-0.5 * (self.rope.softmax_factor if self.rope is not None else 1.0)
        self._x_w: Tensor | None = None  # every projection of x, back to back (`concat_params`)
        self._q_w: Tensor | None = None  # q_b_proj | indexer.wq_b (DSA)

    def _projections(self, x: Tensor) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor, Tensor] | None]:
        """x `[T, hidden]` -> (q `[T, H, Dqk]`, the latent | shared rope key `[T, R + P]`, and with
        DSA the indexer's `(wq_b, wk, weights_proj)` outputs).

        Every projection of x (q_proj or q_a_proj, kv_a_proj_with_mqa, the indexer's wk and
        weights_proj) is one GEMM, and so is every projection of the query latent (q_b_proj and
        the indexer's wq_b), each output a column slice of the one result (a contiguous row at
        one token; at more, the indexer's key LayerNorm copies its strided slice: still one GEMM
        launch less for a cheaper copy). Under TP the head-split q_proj / q_b_proj sit beside
        replicated weights; all read the same whole input, so their local rows stack alike."""
        first = self.q_proj if self.m.q_lora_rank is None else self.q_a_proj
        x_w = [first.weight, self.kv_a_proj_with_mqa.weight]
        if self.indexer is not None:
            x_w += [self.indexer.wk.weight, self.indexer.weights_proj.weight]
        self._x_w = concat_params(x_w, self._x_w)
        outs = F.linear(x, self._x_w.view(-1, x.shape[-1])).split([w.shape[0] for w in x_w], -1)
        q, ckv = outs[0], outs[1]
        index = None
        if self.m.q_lora_rank is not None:
            q_latent = self.q_a_layernorm(q)
            if self.indexer is None:
                q = self.q_b_proj(q_latent)
            else:
                q_w = [self.q_b_proj.weight, self.indexer.wq_b.weight]
                self._q_w = concat_params(q_w, self._q_w)
                q_all = F.linear(q_latent, self._q_w.view(-1, q_latent.shape[-1]))
                q, iq = q_all.split([w.shape[0] for w in q_w], -1)
                index = (iq, outs[2], outs[3])
        return q.view(x.shape[0], self.m.num_heads, self.m.qk_head_dim), ckv, index

    def forward(self, x: Tensor, meta: ForwardMeta, cache: HybridCacheTensors) -> Tensor:
        """x: `[T, hidden]` -> `[T, hidden]`; writes this step's latents into the paged cache."""
        m = self.m
        q, ckv, index_proj = self._projections(x)
        c, k_rope = ckv.split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        c = self.kv_a_layernorm(c)
        cos = sin = None
        if self.rope is not None:
            cos, sin = self.rope.cos_sin(meta.positions.to(x.device))
            q = torch.cat(
                [q[..., : m.qk_nope_head_dim], rope_interleaved(q[..., m.qk_nope_head_dim :], cos, sin)], -1
            )
            k_rope = rope_interleaved(k_rope, cos, sin)
        slots = meta.slot_mapping.to(x.device)
        cache.write_latents(self.layer_idx, slots, torch.cat([c, k_rope], -1))
        index = None
        if self.indexer is not None and index_proj is not None:
            iq, ik, iw = self.indexer.finish(*index_proj, cos, sin)
            cache.write_index_keys(self.layer_idx, slots, ik)
            index = (iq, iw, *cache.index_keys(self.layer_idx))
        out = torch.empty(x.shape[0], m.num_heads, m.v_head_dim, dtype=x.dtype, device=x.device)
        self._attend(q, meta, cache, index, out)
        return self.o_proj(out.reshape(x.shape[0], -1))

    def _attend(
        self, q: Tensor, meta: ForwardMeta, cache: HybridCacheTensors, index: _IndexInputs | None, out: Tensor
    ) -> None:
        """Fill `out` `[T, H, Dv]`: absorbed latent attention for one-token decodes (and for every
        DSA row, and every row of a captured short step), expanded keys for dense prefill chunks."""
        if meta.row_seq is not None:  # a captured short step: lengths on the device only
            sub = None if index is None else (index[0], index[1])
            lens = meta.positions.to(q.device) + 1
            self._absorbed(q, meta, cache, index, sub, lens, meta.row_seq, out, slice(None))
            return
        starts = [0]
        for n in meta.query_lens_cpu:
            starts.append(starts[-1] + n)
        decode = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
        prefill = [i for i, n in enumerate(meta.query_lens_cpu) if n > 1]
        if decode:
            if len(decode) == meta.num_seqs:
                # pure decode: the batch tensors as they are, lengths read on the device (shapes
                # fixed by the tensors alone, not by host lengths: a CUDA graph replays it)
                rows, lens, table_rows = slice(None), meta.seq_lens.to(q.device), None
            else:
                rows = torch.tensor([starts[i] for i in decode], device=q.device)
                lens = torch.tensor([meta.seq_lens_cpu[i] for i in decode], device=q.device)
                table_rows = torch.tensor(decode, device=q.device)
            sub = None if index is None else tuple(t[rows] for t in index[:2])
            self._absorbed(q[rows], meta, cache, index, sub, lens, table_rows, out, rows)
        if not prefill:
            return
        if index is not None:  # DSA: every prefill row attends only to its selected keys
            q_rows = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in prefill]).to(q.device)
            pos = meta.positions.to(q.device)[q_rows]
            seq_of_row = torch.cat(
                [torch.full((meta.query_lens_cpu[i],), i, dtype=torch.long) for i in prefill]
            ).to(q.device)
            sub = (index[0][q_rows], index[1][q_rows])
            self._absorbed(q[q_rows], meta, cache, index, sub, pos + 1, seq_of_row, out, q_rows, prefill=True)
            return
        self._prefill_dense(q, meta, cache, prefill, starts, out)

    def _absorbed(
        self,
        q: Tensor,
        meta: ForwardMeta,
        cache: HybridCacheTensors,
        index: _IndexInputs | None,
        index_rows: tuple[Tensor, Tensor] | None,
        lens: Tensor,
        table_rows: Tensor | None,
        out: Tensor,
        rows: Tensor | slice,
        *,
        prefill: bool = False,
    ) -> None:
        """Rows attending in latent space: `q` `[N, H, Dqk]`, row `j` sees keys `< lens[j]` of
        block-table row `table_rows[j]` (or only the DSA-selected ones of those); `prefill`: the
        rows come in runs per sequence (the indexer then shares key reads between them)."""
        m = self.m
        w = self.kv_b_proj.weight.view(m.num_heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
        w_uk, w_uv = w[:, : m.qk_nope_head_dim], w[:, m.qk_nope_head_dim :]
        indices = None
        if index is not None and index_rows is not None:
            indices = dsa_topk_paged(
                index_rows[0], index_rows[1], index[2], meta.block_tables, lens,
                topk=self.indexer.topk, table_rows=table_rows, index_scales=index[3], prefill=prefill,
            )  # fmt: skip
        q_lat = torch.einsum("nhd,hdr->nhr", q[..., : m.qk_nope_head_dim], w_uk)
        o_lat = mla_decode_paged(
            q_lat, q[..., m.qk_nope_head_dim :], cache.kv[self.layer_idx], meta.block_tables, lens,
            kv_lora_rank=m.kv_lora_rank, scale=self.scale, kv_scales=cache.kv_scale.get(self.layer_idx),
            indices=indices, table_rows=table_rows,
        )  # fmt: skip
        # `.to(out.dtype)`: an index-put (mixed decode + prefill step) does not cast like a copy does
        out[rows] = torch.einsum("nhr,hvr->nhv", o_lat.to(w_uv.dtype), w_uv).to(out.dtype)

    def _prefill_dense(
        self,
        q: Tensor,
        meta: ForwardMeta,
        cache: HybridCacheTensors,
        seqs: list[int],
        starts: list[int],
        out: Tensor,
    ) -> None:
        """All prefill chunks of the step in one varlen attention over their expanded latents."""
        m = self.m
        dev = q.device
        k_lens = [meta.seq_lens_cpu[i] for i in seqs]
        q_lens = [meta.query_lens_cpu[i] for i in seqs]
        total = sum(k_lens)
        cu_k = torch.tensor([0, *itertools.accumulate(k_lens)], dtype=torch.int32, device=dev)
        cu_q = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=dev)
        seg = torch.repeat_interleave(
            torch.arange(len(seqs), device=dev), torch.tensor(k_lens, device=dev), output_size=total
        )
        pos = torch.arange(total, device=dev) - cu_k[seg].long()
        tables = meta.block_tables.to(dev)[torch.tensor(seqs, device=dev)]
        page = cache.block_size
        rows = tables.long()[seg, pos // page] * page + pos % page
        lat = cache.read_latents(self.layer_idx, rows, q.dtype)  # [S_total, R + P]
        r = m.kv_lora_rank
        if expand_in_pieces(
            len(seqs), total, m.num_heads, m.qk_nope_head_dim + m.v_head_dim, q.element_size()
        ):
            own = torch.arange(starts[seqs[0]], starts[seqs[0] + 1], device=dev)
            out[own] = mla_prefill_pieces(
                q[own], lambda a, b: self.kv_b_proj(lat[a:b, :r]).view(b - a, m.num_heads, -1), lat[:, r:],
                scale=self.scale, nope_dim=m.qk_nope_head_dim,
            )  # fmt: skip
            return
        kv = self.kv_b_proj(lat[:, :r]).view(total, m.num_heads, -1)
        if len(seqs) == meta.num_seqs:
            q_rows: Tensor | slice = slice(None)
        else:
            q_rows = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in seqs]).to(dev)
        out[q_rows] = mla_prefill_varlen(
            q[q_rows], kv, lat[:, r:], cu_q, cu_k,
            max_q=max(q_lens), scale=self.scale, nope_dim=m.qk_nope_head_dim,
        )  # fmt: skip
