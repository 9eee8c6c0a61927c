"""Qwen3-Next (`qwen3_next`): gated DeltaNet + gated GQA attention + softmax MoE, from the shared
layers and two op families (`kernels/kda/gdn.py` on the KDA delta rule, `kernels/gqa` paged attention).

Parameter names are the published checkpoint's: `model.layers.N.linear_attn.{in_proj_qkvz,
in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj}`, `self_attn.{q_proj, k_proj, v_proj, o_proj,
q_norm, k_norm}`, `mlp.{gate, experts.N.{gate,up,down}_proj, shared_expert.*, shared_expert_gate}`.
The checkpoint's `mtp.*` tensors are skipped at load (see `text_models.ignored_prefixes`).

Cache mapping (the hybrid cache's fields are named for KDA/MLA): a GQA layer's K|V rows live in
the paged pool of width `2 * num_kv_heads * head_dim`, a GDN layer's `[Hv, K, V]` state and
`conv_dim`-channel conv window in the state slots; the checkpoint rule is unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference.config import GDN, GQA, MOE, ModelSpec, MoESpec
from inference.kernels.gqa import gqa_paged_attention, gqa_write_kv
from inference.kernels.kda.gdn import gdn_gate, gdn_varlen
from inference.kernels.moe_experts import moe_experts_reference
from inference.kernels.short_conv import short_conv_prefill
from inference.model.cache_tensors import HybridCacheTensors
from inference.model.forward_meta import ForwardMeta
from inference.model.kda import ShortConv
from inference.model.kimi_linear import KimiLinearForCausalLM
from inference.model.layers import rope_cos_sin, rope_half_split
from inference.model.moe import DeepseekExpert, DenseMLP

__all__ = ["Qwen3NextForCausalLM", "ZeroCenteredRMSNorm"]


class ZeroCenteredRMSNorm(nn.Module):
    """`(1 + weight) * rmsnorm(x)`, in fp32 and cast after the weight (Qwen3-Next's norm)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


class SiluGatedRMSNorm(nn.Module):
    """`weight * rmsnorm(x) * silu(z)` (GDN output norm; the weight applied before the cast back)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        xf = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return ((self.weight * xf.to(x.dtype)) * F.silu(z.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """GDN mixer of one layer; reads/writes its state and conv window in the cache slots."""

    def __init__(self, spec: ModelSpec, layer_idx: int) -> None:
        super().__init__()
        g, h = spec.gdn, spec.hidden_size
        self.g, self.layer_idx = g, layer_idx
        self.in_proj_qkvz = nn.Linear(h, 2 * g.key_dim + 2 * g.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(h, 2 * g.num_v_heads, bias=False)
        self.conv1d = ShortConv(g.conv_dim, g.conv_kernel_size)
        self.dt_bias = nn.Parameter(torch.empty(g.num_v_heads))
        self.A_log = nn.Parameter(torch.empty(g.num_v_heads))
        self.norm = SiluGatedRMSNorm(g.v_head_dim, eps=spec.rms_norm_eps)
        self.out_proj = nn.Linear(g.value_dim, h, bias=False)
        # a tensor-parallel rank's conv channels (`parallel/sharding.py`): `[start, stop)` row
        # ranges of the replicated filter, one per q / k / v segment; None: all of them
        self.conv_rows: tuple[tuple[int, int], ...] | None = None

    def dummy_params(self, generator: torch.Generator) -> dict[str, Tensor]:
        """As transformers initialises them: A in [0.01, 16], dt_bias ones (drawn at full size,
        so a sharded rank slices the same values)."""
        return {
            "A_log": torch.empty(self.A_log.shape).uniform_(0.01, 16.0, generator=generator).log(),
            "dt_bias": torch.ones(self.dt_bias.shape),
        }

    @torch.no_grad()
    def init_dummy(self, generator: torch.Generator) -> None:
        for name, value in self.dummy_params(generator).items():
            getattr(self, name).copy_(value)

    def _conv_weight(self) -> Tensor:
        w = self.conv1d.weight.view(self.conv1d.weight.shape[0], -1)
        if self.conv_rows is None:
            return w
        return torch.cat([w[a:b] for a, b in self.conv_rows])

    def _split(self, x: Tensor) -> tuple[Tensor, ...]:
        """The published projection layout, grouped per key head: [q | k | v-group | z-group]."""
        g, t = self.g, x.shape[0]
        r = g.num_v_heads // g.num_k_heads
        qkvz = self.in_proj_qkvz(x).view(t, g.num_k_heads, 2 * g.k_head_dim + 2 * r * g.v_head_dim)
        q, k, v, z = qkvz.split([g.k_head_dim, g.k_head_dim, r * g.v_head_dim, r * g.v_head_dim], dim=-1)
        b, a = self.in_proj_ba(x).view(t, g.num_k_heads, 2 * r).split([r, r], dim=-1)
        return (
            q,
            k,
            v.reshape(t, -1),
            z.reshape(t, g.num_v_heads, g.v_head_dim),
            b.reshape(t, -1),
            a.reshape(t, -1),
        )

    def forward(self, x: Tensor, meta: ForwardMeta, cache: HybridCacheTensors) -> Tensor:
        """x: `[T, hidden]` -> `[T, hidden]`; updates `cache.state/conv[layer][meta.state_slots]`."""
        g, t = self.g, x.shape[0]
        slots = meta.state_slots.to(x.device)
        q, k, v, z, b, a = self._split(x)
        mixed = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v], dim=-1)  # conv channels q | k | v
        conv_pool = cache.conv[self.layer_idx]
        mixed, window = short_conv_prefill(
            mixed, conv_pool.index_select(0, slots), self._conv_weight(),
            meta.cu_seqlens,
        )  # fmt: skip
        conv_pool.index_copy_(0, slots, window)
        q, k, v = mixed.split([g.key_dim, g.key_dim, g.value_dim], dim=-1)
        state_pool = cache.state[self.layer_idx]
        o, final = gdn_varlen(
            q.reshape(t, g.num_k_heads, g.k_head_dim), k.reshape(t, g.num_k_heads, g.k_head_dim),
            v.reshape(t, g.num_v_heads, g.v_head_dim), gdn_gate(a, self.A_log, self.dt_bias),
            torch.sigmoid(b.float()), state_pool.index_select(0, slots), meta.cu_seqlens, meta.query_lens_cpu,
        )  # fmt: skip
        state_pool.index_copy_(0, slots, final)
        return self.out_proj(self.norm(o, z).reshape(t, g.value_dim))


class GatedAttention(nn.Module):
    """GQA with per-head zero-centred q/k norms, partial half-split rope and a sigmoid output gate."""

    def __init__(self, spec: ModelSpec, layer_idx: int) -> None:
        super().__init__()
        a, h = spec.gqa, spec.hidden_size
        self.a, self.layer_idx = a, layer_idx
        self.q_proj = nn.Linear(h, a.num_heads * a.head_dim * 2, bias=False)
        self.k_proj = nn.Linear(h, a.num_kv_heads * a.head_dim, bias=False)
        self.v_proj = nn.Linear(h, a.num_kv_heads * a.head_dim, bias=False)
        self.o_proj = nn.Linear(a.num_heads * a.head_dim, h, bias=False)
        self.q_norm = ZeroCenteredRMSNorm(a.head_dim, spec.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(a.head_dim, spec.rms_norm_eps)

    def forward(self, x: Tensor, meta: ForwardMeta, cache: HybridCacheTensors) -> Tensor:
        """x: `[T, hidden]` -> `[T, hidden]`; writes this step's K|V into the paged pool."""
        a, t = self.a, x.shape[0]
        q, gate = self.q_proj(x).view(t, a.num_heads, 2 * a.head_dim).chunk(2, dim=-1)  # per head: q | gate
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x).view(t, a.num_kv_heads, a.head_dim))
        v = self.v_proj(x).view(t, a.num_kv_heads, a.head_dim)
        cos, sin = rope_cos_sin(meta.positions.to(x.device), a.rotary_dim, a.rope_theta)
        r = a.rotary_dim
        q = torch.cat([rope_half_split(q[..., :r], cos, sin), q[..., r:]], dim=-1)
        k = torch.cat([rope_half_split(k[..., :r], cos, sin), k[..., r:]], dim=-1)
        pool = cache.kv[self.layer_idx]
        gqa_write_kv(pool, meta.slot_mapping, k, v)
        o = gqa_paged_attention(
            q, pool, meta.block_tables, query_lens=meta.query_lens_cpu, context_lens=meta.context_lens_cpu,
            num_kv_heads=a.num_kv_heads, scale=a.head_dim**-0.5,
        )  # fmt: skip
        o = o.reshape(t, -1) * torch.sigmoid(gate.reshape(t, -1))
        return self.o_proj(o)


class SoftmaxRouter(nn.Module):
    """Softmax over all experts, top-k, optionally renormalised (`mlp.gate.weight`)."""

    def __init__(self, hidden: int, spec: MoESpec) -> None:
        super().__init__()
        self.spec = spec
        self.weight = nn.Parameter(torch.empty(spec.num_experts, hidden))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x: `[T, hidden]` -> `(weights [T, k] fp32, expert ids [T, k] int64)`."""
        probs = F.linear(x, self.weight).float().softmax(dim=-1)
        weights, ids = probs.topk(self.spec.top_k, dim=-1)
        if self.spec.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(x.dtype).float(), ids


class Qwen3NextSparseMoE(nn.Module):
    """Routed experts plus one shared expert scaled by `sigmoid(shared_expert_gate(x))`."""

    def __init__(self, hidden: int, spec: MoESpec) -> None:
        super().__init__()
        self.spec = spec
        self.gate = SoftmaxRouter(hidden, spec)
        self.experts = nn.ModuleList(
            DeepseekExpert(hidden, spec.intermediate_size) for _ in range(spec.num_experts)
        )
        self.shared_expert = DenseMLP(hidden, spec.shared_width)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        weights, ids = self.gate(x)
        gate, up, down = zip(*(e.weights() for e in self.experts), strict=True)
        out = moe_experts_reference(x, weights, ids, list(gate), list(down), list(up))
        return out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer_idx: int) -> None:
        super().__init__()
        self.kind = spec.layer_kinds[layer_idx]
        if self.kind == GDN:
            self.linear_attn = GatedDeltaNet(spec, layer_idx)
        elif self.kind == GQA:
            self.self_attn = GatedAttention(spec, layer_idx)
        else:
            raise ValueError(f"layer {layer_idx}: qwen3_next has no {self.kind!r} layers")
        if spec.mlp_kinds[layer_idx] == MOE and spec.moe is not None:
            self.mlp: nn.Module = Qwen3NextSparseMoE(spec.hidden_size, spec.moe)
        else:
            self.mlp = DenseMLP(spec.hidden_size, spec.intermediate_size)
        self.input_layernorm = ZeroCenteredRMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, x: Tensor, meta: ForwardMeta, cache: HybridCacheTensors) -> Tensor:
        mixer = self.linear_attn if self.kind == GDN else self.self_attn
        x = x + mixer(self.input_layernorm(x), meta, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3NextModel(nn.Module):
    """Embedding, decoder stack and final norm (`model.*`); same contract as `KimiLinearModel`."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(Qwen3NextDecoderLayer(spec, i) for i in range(spec.num_layers))
        self.norm = ZeroCenteredRMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, inputs_embeds: Tensor, meta: ForwardMeta, cache: HybridCacheTensors) -> Tensor:
        x = inputs_embeds
        for layer in self.layers:
            x = layer(x, meta, cache)
        return x


class Qwen3NextForCausalLM(KimiLinearForCausalLM):
    """`forward(input_ids, meta, cache) -> logits` as every text model of the engine."""

    model_cls = Qwen3NextModel  # type: ignore[assignment]

    def supports_decode_graphs(self, dtype: torch.dtype) -> bool:
        """No: the paged GQA reference and the expert loop read host lengths and counts."""
        return False
