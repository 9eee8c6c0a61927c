"""Turn a full-size model built on the meta device into this rank's shard (still on meta).

What splits how is the split rule (`split_rule.py`, torch-free; `dayzero analyze` counts a rank's
shard by the same rule); this module applies it to the model's modules, and is where each split's
run-time meaning lives:

* embedding / LM head: vocab rows (`VocabParallelEmbedding`, `ParallelLMHead`);
* token mixers (`MIXER_SPLITS`): head-split projections and per-head tensors keep this rank's
  heads; dim 1 of a linear weight (`o_proj`, `out_proj`) makes it a `RowParallelLinear` (the one
  all-reduce of the sublayer); the rest is replicated. KDA/GDN recurrent states and conv windows
  are sharded with their heads (`shard_cache_spec`). MLA's latent cache is replicated with its
  projections: every head reads the whole latent, so a split would need a gather per layer; the
  cost is a full latent cache per rank (`dayzero analyze` counts it so); the DSA indexer too (its
  keys are shared by all heads, its cost is small). GDN's conv filter is replicated (its rows are
  three head-strided segments q | k | v, which one checkpoint slice cannot name) and the rank
  reads its channels (`GatedDeltaNet.conv_rows`). GQA KV heads: split, or each rank keeps the one
  its query heads read; the paged K|V pool is sharded the same way (`shard_cache_spec`);
* dense FFN (`FFN_SPLITS`): `gate_proj`/`up_proj` column-parallel, `down_proj` row-parallel;
* MoE: `ParallelSparseMoE` (experts over EP, sliced over TP; shared expert sliced), and for
  Qwen3-Next `ParallelQwen3NextMoE` (the same, its shared-expert gate replicated).

The result is a `ShardPlan`: for each local parameter, the slice of the checkpoint tensor it holds
(`dim, start, stop`), and the names other ranks hold (skipped when loading).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from inference.config import GDN, GQA, KDA, MLA, ModelSpec
from inference.config.spec import GDNSpec, GQASpec
from inference.model.cache_tensors import HybridCacheSpec
from inference.model.kda import KimiDeltaAttention
from inference.model.kimi_linear import KimiLinearForCausalLM
from inference.model.mla import MLAttention
from inference.model.moe import DenseMLP, SparseMoE
from inference.model.qwen3_next import (
    GatedDeltaNet,
    Qwen3NextDecoderLayer,
    Qwen3NextSparseMoE,
)
from inference.parallel.comm import Comm, MeshGroups
from inference.parallel.config import ParallelConfig, ParallelConfigError, split_range
from inference.parallel.layers import ParallelLMHead, RowParallelLinear, VocabParallelEmbedding, vocab_shard
from inference.parallel.moe import ParallelQwen3NextMoE, ParallelSparseMoE
from inference.parallel.split_rule import (
    FFN_SPLITS,
    MIXER_SPLITS,
    WIDTH,
    Split,
    kv_heads_per_rank,
    mixer_units,
    shared_expert_over_world,
    split_problem,
    unit_range,
)

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
    if spec.moe is None and ep > 1:
        raise ParallelConfigError("--expert-parallel-size > 1 needs a model with routed experts")
    if spec.gqa is not None:
        kv_heads_per_rank(spec.gqa.num_kv_heads, tp)  # raises naming num_key_value_heads
    if problem := split_problem(spec, tp, ep):
        raise ParallelConfigError(
            f"{problem}: choose --tensor-parallel-size / --expert-parallel-size that divide it"
        )


def shard_cache_spec(spec: HybridCacheSpec, config: ParallelConfig, model: ModelSpec) -> HybridCacheSpec:
    """One rank's cache: KDA/GDN states and conv windows by head; MLA latents (and DSA keys)
    whole; GQA K|V rows by KV head (`kv_heads_per_rank`)."""
    tp = config.tensor_parallel_size
    if tp == 1:
        return spec
    local = replace(spec, kda_num_heads=spec.kda_num_heads // tp, conv_channels=spec.conv_channels // tp)
    if model.gqa is not None:
        local = replace(
            local, latent_dim=2 * kv_heads_per_rank(model.gqa.num_kv_heads, tp) * model.gqa.head_dim
        )
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


def _row_parallel(
    parent: nn.Module, attr: str, lo: int, hi: int, prefix: str, plan: ShardPlan, comm: Comm, label: str
) -> None:
    """`parent.attr` (an nn.Linear) becomes a `RowParallelLinear` over input columns `[lo, hi)`."""
    old = getattr(parent, attr)
    with torch.device("meta"):
        new = RowParallelLinear(hi - lo, old.out_features, comm, label).to(old.weight.dtype)
    new.weight.requires_grad_(False)
    setattr(parent, attr, new)
    plan.slices[f"{prefix}{attr}.weight"] = (1, lo, hi)


def _apply_splits(
    layer: nn.Module,
    splits: dict[str, Split],
    units: dict[str, int],
    prefix: str,
    plan: ShardPlan,
    comm: Comm,
    row_parallel: str | None,
) -> None:
    """Cut each parameter of `layer` that `splits` names to this rank's blocks. Dim 1 of a linear
    weight becomes a `RowParallelLinear` (its all-reduce labelled `row_parallel`), or with None a
    plain partial sum (the MoE adds it into its own all-reduce). A path the module lacks (MLA has
    `q_proj` or `q_b_proj`, as `q_lora_rank` says) is skipped."""
    for path, split in splits.items():
        owner_path, _, attr = path.rpartition(".")
        owner = getattr(layer, owner_path, None) if owner_path else layer
        if owner is None:
            continue
        n = units[split.unit]
        lo, hi = unit_range(n, comm.size, comm.rank, split.unit, f"{prefix}{path} {split.unit}")
        per = getattr(owner, attr).shape[split.dim] // n
        if split.dim == 1 and isinstance(owner, nn.Linear) and row_parallel is not None:
            _row_parallel(layer, owner_path, lo * per, hi * per, prefix, plan, comm, row_parallel)
        else:
            _narrow(owner, attr, split.dim, lo * per, hi * per, f"{prefix}{path}", plan)


def _shard_mixer(m: nn.Module, kind: str, spec: ModelSpec, prefix: str, plan: ShardPlan, comm: Comm) -> None:
    """Split a token mixer by `MIXER_SPLITS[kind]` and give it this rank's head counts."""
    _apply_splits(m, MIXER_SPLITS[kind], mixer_units(spec, kind), prefix, plan, comm, "attn")
    tp = comm.size
    if isinstance(m, KimiDeltaAttention):
        m.num_heads //= tp
    elif isinstance(m, MLAttention):
        m.m = replace(m.m, num_heads=m.m.num_heads // tp)
    elif isinstance(m, GatedDeltaNet):
        g: GDNSpec = m.g
        local = replace(g, num_k_heads=g.num_k_heads // tp, num_v_heads=g.num_v_heads // tp)
        q, v = local.key_dim * comm.rank, local.value_dim * comm.rank  # this rank's offsets in each segment
        m.conv_rows = (
            (q, q + local.key_dim),
            (g.key_dim + q, g.key_dim + q + local.key_dim),
            (2 * g.key_dim + v, 2 * g.key_dim + v + local.value_dim),
        )
        m.g = local
    else:
        a: GQASpec = m.a
        m.a = replace(a, num_heads=a.num_heads // tp, num_kv_heads=kv_heads_per_rank(a.num_kv_heads, tp))


def _shard_dense(mlp: DenseMLP, prefix: str, plan: ShardPlan, comm: Comm, row_parallel: bool) -> None:
    """Column/row split of a SwiGLU; `row_parallel=False` leaves `down_proj` a plain partial sum
    (the MoE adds it into its own all-reduce)."""
    units = {WIDTH: mlp.gate_proj.out_features}
    _apply_splits(mlp, FFN_SPLITS, units, prefix, plan, comm, "mlp" if row_parallel else None)


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
        weights = expert.weights()  # gate, up, down, whatever the checkpoint layout names them
        split_of = {id(w): split for w, split in zip(weights, FFN_SPLITS.values(), strict=True)}
        a, b = unit_range(weights[0].shape[0], mesh.tp.size, mesh.tp.rank, WIDTH, "moe_intermediate_size")
        for sub, linear in expert.named_modules():
            if isinstance(linear, nn.Linear):
                dim = split_of[id(linear.weight)].dim
                _narrow(linear, "weight", dim, a, b, f"{name}{sub}.weight", plan)
        mine[i] = expert
    qwen = isinstance(moe, Qwen3NextSparseMoE)
    attr = "shared_expert" if qwen else "shared_experts"
    shared, active = getattr(moe, attr), True
    if shared is not None:
        width = shared.gate_proj.out_features
        if shared_expert_over_world(width, mesh.stage.size):
            _shard_dense(shared, f"{prefix}{attr}.", plan, mesh.stage, row_parallel=False)
        else:  # sliced over the TP group; one EP replica adds it
            _shard_dense(shared, f"{prefix}{attr}.", plan, mesh.tp, row_parallel=False)
            active = mesh.ep.rank == 0
    if qwen:
        return ParallelQwen3NextMoE(moe, mine, shared, active, mesh)
    return ParallelSparseMoE(moe, mine, shared, active, mesh)


def _shard_qwen3_next_layer(
    layer: Qwen3NextDecoderLayer, spec: ModelSpec, prefix: str, plan: ShardPlan, mesh: MeshGroups
) -> None:
    if isinstance(gdn := getattr(layer, "linear_attn", None), GatedDeltaNet):
        _shard_mixer(gdn, GDN, spec, f"{prefix}linear_attn.", plan, mesh.tp)
    else:
        _shard_mixer(layer.self_attn, GQA, spec, f"{prefix}self_attn.", plan, mesh.tp)
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
    if mesh.config.stage_size == 1:  # pipeline stages alone: whole layers, nothing split
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
            _shard_qwen3_next_layer(layer, spec, prefix, plan, mesh)
            continue
        attn = layer.self_attn
        if isinstance(attn, KimiDeltaAttention | MLAttention):
            _shard_mixer(
                attn,
                KDA if isinstance(attn, KimiDeltaAttention) else MLA,
                spec,
                f"{prefix}self_attn.",
                plan,
                tp,
            )
        ffn_name = layer._ffn_name
        ffn = getattr(layer, ffn_name)
        if isinstance(ffn, SparseMoE):
            setattr(layer, ffn_name, _shard_moe(ffn, f"{prefix}{ffn_name}.", plan, mesh))
        else:
            _shard_dense(ffn, f"{prefix}{ffn_name}.", plan, tp, row_parallel=True)
    for p in model.parameters():
        p.requires_grad_(False)
    return plan
