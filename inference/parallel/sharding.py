"""Turn a full-size model built on the meta device into this rank's shard (still on meta).

One function per layer kind says how it splits (the only place that decides it):

* embedding / LM head: vocab rows (`VocabParallelEmbedding`, `ParallelLMHead`);
* KDA: heads. q/k/v projections, their conv filters, `b_proj`, `f_b_proj`, `g_b_proj`, `A_log`
  and `dt_bias` keep this rank's heads; the low-rank gate inputs `f_a_proj`/`g_a_proj` and the
  per-head output norm are replicated; `o_proj` is row-parallel. The recurrent state and conv
  window pools are sharded with the heads (`shard_cache_spec`).
* MLA: heads. `q_proj` / `q_b_proj` and `kv_b_proj` keep this rank's heads, `o_proj` is
  row-parallel; the latent projections (`q_a_proj`, `kv_a_proj_with_mqa`) and their norms are
  replicated, and so is the latent cache: every head reads the whole latent, so a split would
  need a gather per layer; the cost is a full latent cache per rank (`dayzero analyze` counts it
  so). The DSA indexer is replicated too (its keys are shared by all heads, its cost is small).
* GDN (Qwen3-Next's gated DeltaNet): key heads, with their value heads. `in_proj_qkvz` and
  `in_proj_ba` are laid out per key head, so they keep this rank's rows; `A_log`, `dt_bias` keep
  its value heads; `out_proj` is row-parallel; the output norm is replicated. The conv filter is
  replicated (its rows are three head-strided segments q | k | v, which one checkpoint slice
  cannot name; `conv_dim * kernel` values per layer) and the rank reads its channels of it
  (`GatedDeltaNet.conv_rows`); the state and conv window pools are sharded with the heads.
* GQA (Qwen3-Next's gated attention): query heads (`q_proj`, query and gate per head) split,
  `o_proj` row-parallel, q/k norms replicated; KV heads split when TP divides them, else (TP a
  multiple of them) each rank keeps the one KV head its query heads read, a copy per
  `tp / num_kv_heads` ranks: the paged K|V pool is sharded the same way (`shard_cache_spec`),
  as `dayzero analyze` plans it.
* dense FFN: `gate_proj`/`up_proj` column-parallel, `down_proj` row-parallel;
* MoE: `ParallelSparseMoE` (experts over EP, sliced over TP; shared expert sliced), and for
  Qwen3-Next `ParallelQwen3NextMoE` (the same, its shared-expert gate replicated).

The result is a `ShardPlan`: for each local parameter, the slice of the checkpoint tensor it holds
(`dim, start, stop`), and the names other ranks hold (skipped when loading).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from inference.config import ModelSpec
from inference.config.spec import GDNSpec, GQASpec
from inference.model.cache_tensors import HybridCacheSpec
from inference.model.kda import KimiDeltaAttention
from inference.model.kimi_linear import KimiLinearForCausalLM
from inference.model.mla import MLAttention
from inference.model.moe import DenseMLP, SparseMoE
from inference.model.qwen3_next import (
    GatedAttention,
    GatedDeltaNet,
    Qwen3NextDecoderLayer,
    Qwen3NextSparseMoE,
)
from inference.parallel.comm import Comm, MeshGroups
from inference.parallel.config import ParallelConfig, ParallelConfigError, split_range
from inference.parallel.layers import ParallelLMHead, RowParallelLinear, VocabParallelEmbedding, vocab_shard
from inference.parallel.moe import ParallelQwen3NextMoE, ParallelSparseMoE

__all__ = ["ShardPlan", "check_shardable", "shard_cache_spec", "shard_model"]


@dataclass
class ShardPlan:
    """Checkpoint slices of this rank's parameters; unlisted local parameters are whole."""

    slices: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # name -> (dim, start, stop)
    elsewhere: set[str] = field(default_factory=set)  # checkpoint names other ranks hold


def check_shardable(spec: ModelSpec, config: ParallelConfig) -> None:
    """Raise `ParallelConfigError` naming what does not split (before any process starts)."""
    tp, ep = config.tensor_parallel_size, config.expert_parallel_size
    if config.world_size == 1:
        return
    if spec.gdn is not None:
        split_range(spec.gdn.num_k_heads, tp, 0, "GDN key heads (linear_num_key_heads)")
    if spec.gqa is not None:
        split_range(spec.gqa.num_heads, tp, 0, "GQA heads (num_attention_heads)")
        _gqa_kv_heads(spec.gqa, tp)
    if spec.kda is not None:
        split_range(spec.kda.num_heads, tp, 0, "KDA heads")
    if spec.mla is not None:
        split_range(spec.mla.num_heads, tp, 0, "MLA heads")
    split_range(spec.intermediate_size, tp, 0, "intermediate_size")
    if spec.moe is not None:
        split_range(spec.moe.num_experts, ep, 0, "routed experts (over --expert-parallel-size)")
        split_range(spec.moe.intermediate_size, tp, 0, "moe_intermediate_size")
        if spec.moe.num_shared_experts:
            split_range(spec.moe.shared_width, tp, 0, "shared expert width")
    elif ep > 1:
        raise ParallelConfigError("--expert-parallel-size > 1 needs a model with routed experts")


def _gqa_kv_heads(a: GQASpec, tp: int) -> int:
    """KV heads one rank holds: `num_kv_heads / tp`, or 1 (a copy) when TP is a multiple of them."""
    kv = a.num_kv_heads
    if kv % tp == 0:
        return kv // tp
    if tp % kv == 0:
        return 1
    raise ParallelConfigError(
        f"GQA KV heads (num_key_value_heads={kv}) neither divide nor are divided by "
        f"--tensor-parallel-size {tp}: choose a size that divides or is a multiple of {kv}"
    )


def shard_cache_spec(spec: HybridCacheSpec, config: ParallelConfig, model: ModelSpec) -> HybridCacheSpec:
    """One rank's cache: KDA/GDN states and conv windows by head; MLA latents (and DSA keys)
    whole; GQA K|V rows by KV head (`_gqa_kv_heads`)."""
    tp = config.tensor_parallel_size
    if tp == 1:
        return spec
    local = replace(spec, kda_num_heads=spec.kda_num_heads // tp, conv_channels=spec.conv_channels // tp)
    if model.gqa is not None:
        local = replace(local, latent_dim=2 * _gqa_kv_heads(model.gqa, tp) * model.gqa.head_dim)
    return local


def _meta(shape: tuple[int, ...], like: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=like.dtype, device="meta"), requires_grad=False)


def _narrow(
    module: nn.Module, attr: str, dim: int, start: int, stop: int, name: str, plan: ShardPlan
) -> None:
    """Replace `module.attr` by its `[start, stop)` slice along `dim` (recorded under `name`)."""
    p = getattr(module, attr)
    shape = list(p.shape)
    shape[dim] = stop - start
    setattr(module, attr, _meta(tuple(shape), p))
    if isinstance(module, nn.Linear):
        module.out_features, module.in_features = module.weight.shape
    plan.slices[name] = (dim, start, stop)


def _heads(
    module: nn.Module, attr: str, prefix: str, plan: ShardPlan, heads: int, comm: Comm, dim: int = 0
) -> None:
    """Keep this rank's heads of a tensor whose `dim` is `heads` equal blocks."""
    n = getattr(module, attr).shape[dim]
    lo, hi = split_range(heads, comm.size, comm.rank, f"{prefix}{attr} heads")
    per = n // heads
    _narrow(module, attr, dim, lo * per, hi * per, f"{prefix}{attr}", plan)


def _linear_heads(parent: nn.Module, attr: str, prefix: str, plan: ShardPlan, heads: int, comm: Comm) -> None:
    _heads(getattr(parent, attr), "weight", f"{prefix}{attr}.", plan, heads, comm)


def _row_parallel(parent: nn.Module, attr: str, prefix: str, plan: ShardPlan, comm: Comm, label: str) -> None:
    """`parent.attr` (an nn.Linear) becomes a `RowParallelLinear` over its input columns."""
    old = getattr(parent, attr)
    lo, hi = split_range(old.in_features, comm.size, comm.rank, f"{prefix}{attr} input")
    with torch.device("meta"):
        new = RowParallelLinear(hi - lo, old.out_features, comm, label).to(old.weight.dtype)
    new.weight.requires_grad_(False)
    setattr(parent, attr, new)
    plan.slices[f"{prefix}{attr}.weight"] = (1, lo, hi)


def _shard_kda(m: KimiDeltaAttention, prefix: str, plan: ShardPlan, comm: Comm) -> None:
    h = m.num_heads
    for attr in ("q_proj", "k_proj", "v_proj", "f_b_proj", "g_b_proj", "b_proj"):
        _linear_heads(m, attr, prefix, plan, h, comm)
    for attr in ("q_conv1d", "k_conv1d", "v_conv1d"):
        _heads(getattr(m, attr), "weight", f"{prefix}{attr}.", plan, h, comm)
    _heads(m, "A_log", prefix, plan, h, comm, dim=2)
    _heads(m, "dt_bias", prefix, plan, h, comm)
    _row_parallel(m, "o_proj", prefix, plan, comm, "attn")
    m.num_heads = h // comm.size


def _shard_mla(m: MLAttention, prefix: str, plan: ShardPlan, comm: Comm) -> None:
    h = m.m.num_heads
    _linear_heads(m, "q_proj" if m.m.q_lora_rank is None else "q_b_proj", prefix, plan, h, comm)
    _linear_heads(m, "kv_b_proj", prefix, plan, h, comm)
    _row_parallel(m, "o_proj", prefix, plan, comm, "attn")
    m.m = replace(m.m, num_heads=h // comm.size)


def _shard_gdn(m: GatedDeltaNet, prefix: str, plan: ShardPlan, comm: Comm) -> None:
    g: GDNSpec = m.g
    _linear_heads(m, "in_proj_qkvz", prefix, plan, g.num_k_heads, comm)
    _linear_heads(m, "in_proj_ba", prefix, plan, g.num_k_heads, comm)
    _heads(m, "A_log", prefix, plan, g.num_v_heads, comm)
    _heads(m, "dt_bias", prefix, plan, g.num_v_heads, comm)
    _row_parallel(m, "out_proj", prefix, plan, comm, "attn")
    local = replace(g, num_k_heads=g.num_k_heads // comm.size, num_v_heads=g.num_v_heads // comm.size)
    q, v = local.key_dim * comm.rank, local.value_dim * comm.rank  # this rank's offsets in each segment
    m.conv_rows = (
        (q, q + local.key_dim),
        (g.key_dim + q, g.key_dim + q + local.key_dim),
        (2 * g.key_dim + v, 2 * g.key_dim + v + local.value_dim),
    )
    m.g = local


def _shard_gqa(m: GatedAttention, prefix: str, plan: ShardPlan, comm: Comm) -> None:
    a: GQASpec = m.a
    _linear_heads(m, "q_proj", prefix, plan, a.num_heads, comm)  # per head: query | gate
    kv = _gqa_kv_heads(a, comm.size)
    if kv * comm.size == a.num_kv_heads:
        _linear_heads(m, "k_proj", prefix, plan, a.num_kv_heads, comm)
        _linear_heads(m, "v_proj", prefix, plan, a.num_kv_heads, comm)
    else:  # the KV head this rank's query heads read (its group of tp / num_kv_heads ranks')
        head = comm.rank * a.num_kv_heads // comm.size
        lo, hi = head * a.head_dim, (head + 1) * a.head_dim
        for attr in ("k_proj", "v_proj"):
            _narrow(getattr(m, attr), "weight", 0, lo, hi, f"{prefix}{attr}.weight", plan)
    _row_parallel(m, "o_proj", prefix, plan, comm, "attn")
    m.a = replace(a, num_heads=a.num_heads // comm.size, num_kv_heads=kv)


def _shard_dense(mlp: DenseMLP, prefix: str, plan: ShardPlan, comm: Comm, row_parallel: bool) -> None:
    """Column/row split of a SwiGLU; `row_parallel=False` leaves `down_proj` a plain partial sum
    (the MoE adds it into its own all-reduce)."""
    width = mlp.gate_proj.out_features
    lo, hi = split_range(width, comm.size, comm.rank, f"{prefix} width")
    _narrow(mlp.gate_proj, "weight", 0, lo, hi, f"{prefix}gate_proj.weight", plan)
    _narrow(mlp.up_proj, "weight", 0, lo, hi, f"{prefix}up_proj.weight", plan)
    if row_parallel:
        _row_parallel(mlp, "down_proj", prefix, plan, comm, "mlp")
    else:
        _narrow(mlp.down_proj, "weight", 1, lo, hi, f"{prefix}down_proj.weight", plan)


def _shard_moe(
    moe: SparseMoE | Qwen3NextSparseMoE, prefix: str, plan: ShardPlan, mesh: MeshGroups
) -> ParallelSparseMoE:
    n = moe.spec.num_experts
    lo, hi = split_range(n, mesh.ep.size, mesh.ep.rank, "routed experts")
    mine: dict[int, nn.Module] = {}
    for i, expert in enumerate(moe.experts):
        name = f"{prefix}experts.{i}."
        if not lo <= i < hi:
            plan.elsewhere.update(name + p for p, _ in expert.named_parameters())
            continue
        gate, _up, down = expert.weights()
        inter = gate.shape[0]
        a, b = split_range(inter, mesh.tp.size, mesh.tp.rank, "moe_intermediate_size")
        for sub, param in expert.named_modules():
            if not isinstance(param, nn.Linear):
                continue
            dim = 1 if param.weight is down else 0
            _narrow(param, "weight", dim, a, b, f"{name}{sub}.weight", plan)
        mine[i] = expert
    qwen = isinstance(moe, Qwen3NextSparseMoE)
    attr = "shared_expert" if qwen else "shared_experts"
    shared, active = getattr(moe, attr), True
    if shared is not None:
        width = shared.gate_proj.out_features
        if width % mesh.world.size == 0:  # sliced over every rank
            _shard_dense(shared, f"{prefix}{attr}.", plan, mesh.world, row_parallel=False)
        else:  # sliced over the TP group; one EP replica adds it
            _shard_dense(shared, f"{prefix}{attr}.", plan, mesh.tp, row_parallel=False)
            active = mesh.ep.rank == 0
    if qwen:
        return ParallelQwen3NextMoE(moe, mine, shared, active, mesh)
    return ParallelSparseMoE(moe, mine, shared, active, mesh)


def _shard_qwen3_next_layer(
    layer: Qwen3NextDecoderLayer, prefix: str, plan: ShardPlan, mesh: MeshGroups
) -> None:
    if isinstance(gdn := getattr(layer, "linear_attn", None), GatedDeltaNet):
        _shard_gdn(gdn, f"{prefix}linear_attn.", plan, mesh.tp)
    else:
        _shard_gqa(layer.self_attn, f"{prefix}self_attn.", plan, mesh.tp)
    if isinstance(layer.mlp, Qwen3NextSparseMoE):
        layer.mlp = _shard_moe(layer.mlp, f"{prefix}mlp.", plan, mesh)
    else:
        _shard_dense(layer.mlp, f"{prefix}mlp.", plan, mesh.tp, row_parallel=True)


def shard_model(model: KimiLinearForCausalLM, mesh: MeshGroups) -> ShardPlan:
    """Reshape `model` (meta tensors) into this rank's shard in place; returns its `ShardPlan`."""
    if not isinstance(model, KimiLinearForCausalLM):
        raise ParallelConfigError(
            f"{type(model).__name__} is not sharded (the text KDA/MLA/GDN/GQA/MoE models are)"
        )
    check_shardable(model.spec, mesh.config)
    plan = ShardPlan()
    tp = mesh.tp
    spec = model.spec
    if mesh.config.world_size == 1:
        return plan
    emb = model.model.embed_tokens
    start, stop, _ = vocab_shard(spec.vocab_size, tp)
    with torch.device("meta"):
        model.model.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, tp).to(
            emb.weight.dtype
        )
        head = ParallelLMHead(spec.hidden_size, spec.vocab_size, tp).to(model.lm_head.weight.dtype)
    model.lm_head = head
    plan.slices["model.embed_tokens.weight"] = (0, start, stop)
    plan.slices["lm_head.weight"] = (0, start, stop)
    for i, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{i}."
        if isinstance(layer, Qwen3NextDecoderLayer):
            _shard_qwen3_next_layer(layer, prefix, plan, mesh)
            continue
        attn = layer.self_attn
        if isinstance(attn, KimiDeltaAttention):
            _shard_kda(attn, f"{prefix}self_attn.", plan, tp)
        elif isinstance(attn, MLAttention):
            _shard_mla(attn, f"{prefix}self_attn.", plan, tp)
        ffn_name = layer._ffn_name
        ffn = getattr(layer, ffn_name)
        if isinstance(ffn, SparseMoE):
            setattr(layer, ffn_name, _shard_moe(ffn, f"{prefix}{ffn_name}.", plan, mesh))
        else:
            _shard_dense(ffn, f"{prefix}{ffn_name}.", plan, tp, row_parallel=True)
    for p in model.parameters():
        p.requires_grad_(False)
    return plan
