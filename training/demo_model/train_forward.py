"""A differentiable full-sequence forward through the model's own layers, for training.

The engine's `forward` is built for serving: it reads fused weight buffers (`concat_params`, made
under `no_grad`) and writes every step into the paged cache, so no gradient reaches the
parameters. This forward walks the same modules and calls the same ops (`causal_conv_varlen`,
`kda_gate`, `kda_varlen`, `mla_prefill_attention`'s masking rule via SDPA, the router and
`moe_experts_reference`) on each module's own parameters, over a padded batch `[B, L]` of whole
sequences starting from empty state. `tests/inference/demo_model` checks that it gives the
engine's logits on the same weights, so the two cannot drift apart.

KDA: with `kda="fla"` (CUDA, bf16) fla's `chunk_kda` runs forward and backward; with `kda="ref"`
the fp32 chunked reference runs with the batch folded into the head axis (sequences of one padded
length are independent heads), which autograd differentiates on any device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference.kernels.kda import causal_conv_varlen, kda_chunk_ref, kda_gate, kda_varlen, l2norm
from inference.kernels.moe_experts import moe_experts_reference
from inference.model.kda import KimiDeltaAttention
from inference.model.kimi_linear import DecoderLayer, KimiLinearForCausalLM
from inference.model.mla import MLAttention
from inference.model.moe import DenseMLP, SparseMoE

__all__ = ["KDA_MODES", "text_model", "train_hidden", "train_logits"]

KDA_MODES = ("fla", "ref")
# The reference's cost per token grows with the chunk (its decay tensor is [H, C, C, K]); small
# chunks are several times cheaper on a CPU. On a GPU the loop over chunks (a dozen small kernels
# per chunk and layer) is what costs, so larger chunks are faster there (`ref_chunk`).
REF_CHUNK = 8


def text_model(model: nn.Module) -> KimiLinearForCausalLM:
    """The causal LM inside a vision-language model (or the model itself)."""
    return getattr(model, "language_model", model)


def _kda_rows(
    layer: KimiDeltaAttention,
    x: Tensor,
    b: int,
    length: int,
    kda: str,
    start: tuple[Tensor, Tensor] | None,
    ref_chunk: int = REF_CHUNK,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """`b` rows of `length` tokens, each continuing `start = (conv window [C, W], state [H, K, V])`
    (empty when None). Returns the output and the final (window, state) of row 0."""
    t = x.shape[0]
    h, d = layer.num_heads, layer.head_dim
    mixed = torch.cat([layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)], dim=-1)
    conv = torch.cat([layer.q_conv1d.weight, layer.k_conv1d.weight, layer.v_conv1d.weight])
    conv = conv.view(3 * h * d, -1)
    if start is None:
        window = x.new_zeros(b, 3 * h * d, conv.shape[1] - 1, dtype=torch.float32)
        states = x.new_zeros(b, h, d, d, dtype=torch.float32)
    else:
        window, states = start[0].expand(b, -1, -1), start[1].expand(b, -1, -1, -1)
    cu = torch.arange(b + 1, device=x.device, dtype=torch.int32) * length
    mixed, new_window = causal_conv_varlen(mixed, window, conv, cu)
    gate = layer.g_b_proj(layer.g_a_proj(x)).view(t, h, d)
    g = kda_gate(layer.f_b_proj(layer.f_a_proj(x)).view(t, h, d), layer.A_log, layer.dt_bias)
    beta = torch.sigmoid(layer.b_proj(x)).float()
    q, k, v = (z.reshape(t, h, d) for z in mixed.split(h * d, dim=-1))
    if kda == "fla":
        o, final = kda_varlen(q, k, v, g, beta, states.contiguous(), cu, (length,) * b, use_fla=True)
    else:  # [B*L, H, *] -> [L, B*H, *]: one chunked reference call for the whole batch

        def fold(z: Tensor) -> Tensor:
            return z.reshape(b, length, h, -1).transpose(0, 1).reshape(length, b * h, -1)

        qn = l2norm(q.float()) * d**-0.5
        o, final = kda_chunk_ref(
            fold(qn), fold(l2norm(k.float())), fold(v.float()), fold(g),
            beta.reshape(b, length, h).transpose(0, 1).reshape(length, b * h),
            states.reshape(b * h, d, d), chunk=ref_chunk,
        )  # fmt: skip
        o = o.reshape(length, b, h, d).transpose(0, 1).reshape(t, h, d).to(q.dtype)
        final = final.view(b, h, d, d)
    out = layer.o_proj(layer.o_norm(o, gate).reshape(t, h * d))
    return out, (new_window[0], final[0])


def _mla_rows(
    layer: MLAttention, x: Tensor, b: int, length: int, start: tuple[Tensor, Tensor] | None
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """`b` rows of `length` tokens, each attending causally to itself after the shared keys and
    values `start = (k [P, H, Dqk], v [P, H, Dv])` (none when None). Returns the output and row 0's
    keys and values (with `start`'s in front)."""
    m = layer.m
    if m.use_rope:
        raise ValueError("the training forward covers NoPE MLA (Kimi-Linear's); this config uses rope")
    t = x.shape[0]
    lora = m.q_lora_rank is not None
    q = layer.q_b_proj(layer.q_a_layernorm(layer.q_a_proj(x))) if lora else layer.q_proj(x)
    q = q.view(b, length, m.num_heads, m.qk_head_dim)
    c, k_rope = layer.kv_a_proj_with_mqa(x).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
    kv = layer.kv_b_proj(layer.kv_a_layernorm(c)).view(b, length, m.num_heads, -1)
    k_nope, v = kv.split([m.qk_nope_head_dim, m.v_head_dim], dim=-1)
    k_rope = k_rope.view(b, length, 1, m.qk_rope_head_dim).expand(b, length, m.num_heads, m.qk_rope_head_dim)
    k = torch.cat([k_nope, k_rope.to(k_nope.dtype)], dim=-1)
    p = 0 if start is None else start[0].shape[0]
    if start is not None:
        k = torch.cat([start[0].to(k.dtype).expand(b, -1, -1, -1), k], dim=1)
        v = torch.cat([start[1].to(v.dtype).expand(b, -1, -1, -1), v], dim=1)
    # `mla_prefill_attention`'s rule with context_len p: query i sees keys 0 .. p + i
    mask = (
        torch.arange(p + length, device=x.device)[None, :]
        <= torch.arange(length, device=x.device)[:, None] + p
    )
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=layer.scale
    )
    return layer.o_proj(out.transpose(1, 2).reshape(t, -1)), (k[0], v[0])


def _dense(mlp: DenseMLP, x: Tensor) -> Tensor:
    return mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))


def _experts_dense(x: Tensor, weights: Tensor, ids: Tensor, moe: SparseMoE) -> Tensor:
    """Every expert on every token, combined with the routing weights (zero for unchosen experts):
    the reference's sum, without its per-expert loop and host sync. On a GPU this tiny model's
    16x extra arithmetic is free and the kernel launches it saves are not."""
    w1 = torch.stack([e.w1.weight for e in moe.experts])  # [E, I, H]
    w3 = torch.stack([e.w3.weight for e in moe.experts])
    w2 = torch.stack([e.w2.weight for e in moe.experts])  # [E, H, I]
    h = F.silu(torch.einsum("th,eih->eti", x, w1)) * torch.einsum("th,eih->eti", x, w3)
    y = torch.einsum("eti,ehi->eth", h, w2)
    combine = x.new_zeros(x.shape[0], w1.shape[0], dtype=weights.dtype).scatter_add(1, ids, weights)
    return torch.einsum("eth,te->th", y, combine.to(y.dtype)).to(x.dtype)


def _moe(moe: SparseMoE, x: Tensor, loads: list[Tensor] | None) -> Tensor:
    weights, ids = moe.gate(x)
    if loads is not None:
        loads.append(torch.bincount(ids.flatten(), minlength=moe.spec.num_experts))
    if x.is_cuda:
        out = _experts_dense(x, weights, ids, moe)
    else:
        out = moe_experts_reference(
            x, weights, ids,
            [e.w1.weight for e in moe.experts], [e.w2.weight for e in moe.experts],
            [e.w3.weight for e in moe.experts],
        )  # fmt: skip
    if moe.shared_experts is not None:
        out = out + _dense(moe.shared_experts, x)
    return out


def _layer(
    layer: DecoderLayer,
    x: Tensor,
    b: int,
    length: int,
    kda: str,
    loads: list[Tensor] | None,
    start: tuple[Tensor, Tensor] | None,
    ref_chunk: int = REF_CHUNK,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    y = layer.input_layernorm(x)
    if isinstance(layer.self_attn, KimiDeltaAttention):
        mixed, end = _kda_rows(layer.self_attn, y, b, length, kda, start, ref_chunk)
    else:
        mixed, end = _mla_rows(layer.self_attn, y, b, length, start)
    x = x + mixed
    y = layer.post_attention_layernorm(x)
    ffn = getattr(layer, layer._ffn_name)
    return x + (_moe(ffn, y, loads) if isinstance(ffn, SparseMoE) else _dense(ffn, y)), end


def train_hidden(
    model: nn.Module,
    input_ids: Tensor,
    *,
    prefix: Tensor | None = None,
    kda: str = "ref",
    expert_loads: list[Tensor] | None = None,
    ref_chunk: int = REF_CHUNK,
    zero_token_id: int | None = None,
) -> Tensor:
    """Final normalised hidden states `[B, L, hidden]` of rows `input_ids` `[B, L]`, each one
    sequence `prefix + row` from empty state.

    `prefix` `[P]` (optional): tokens every row starts with (the tools declaration), computed once
    and continued by every row (KDA state and conv window, MLA keys and values), which is what the
    engine's prefix cache does at serving time. `expert_loads`, when given, receives each MoE
    layer's per-expert token counts (for the router-bias balancing update). `ref_chunk`: the
    chunk length of the `kda="ref"` path (the result does not depend on it beyond rounding).
    `zero_token_id`: a token whose input embedding is zero (the image placeholder: the demo model's
    projector is zero, so every image embedding the engine feeds in is zero too).
    """
    if kda not in KDA_MODES:
        raise ValueError(f"kda must be one of {KDA_MODES}, got {kda!r}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, L], got {tuple(input_ids.shape)}")
    if prefix is not None and (prefix.dim() != 1 or prefix.shape[0] == 0):
        raise ValueError(f"prefix must be a non-empty [P], got {tuple(prefix.shape)}")
    lm = text_model(model)
    if lm.spec.dsa is not None:
        raise ValueError("the training forward does not cover the DSA indexer; train the MLA config")
    b, length = input_ids.shape
    starts: list[tuple[Tensor, Tensor] | None] = [None] * len(lm.model.layers)
    if prefix is not None:
        xp = lm.model.embed_tokens(prefix)
        for i, layer in enumerate(lm.model.layers):
            xp, starts[i] = _layer(layer, xp, 1, prefix.shape[0], kda, None, None, ref_chunk)
    x = lm.model.embed_tokens(input_ids.reshape(-1))
    if zero_token_id is not None:
        x = x.masked_fill((input_ids.reshape(-1) == zero_token_id)[:, None], 0.0)
    for i, layer in enumerate(lm.model.layers):
        x, _ = _layer(layer, x, b, length, kda, expert_loads, starts[i], ref_chunk)
    return lm.model.norm(x).view(b, length, -1)


def train_logits(model: nn.Module, input_ids: Tensor, **kwargs: object) -> Tensor:
    """`train_hidden` through the LM head: logits `[B, L, vocab]`."""
    return text_model(model).lm_head(train_hidden(model, input_ids, **kwargs))  # type: ignore[arg-type]
