"""Sharding without processes: every rank's shard (dummy-filled or loaded slice by slice from
safetensors) is exactly its slice of the full model, the shards cover the full model, and the
per-rank cache figures are the ones `dayzero analyze` plans with."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from inference.analyze.params import cache_bytes
from inference.analyze.plan import _kv_per_gpu
from inference.config import load_config, parse_config
from inference.engine.factory import small_model_config
from inference.loader import WeightLoadError, load_weights_sharded, save_sharded
from inference.model.cache_tensors import HybridCacheSpec
from inference.model.factory import build_model
from inference.parallel.comm import MeshGroups
from inference.parallel.config import ParallelConfig
from inference.parallel.sharding import shard_cache_spec, shard_model
from inference.parallel.weights import _meta_model, fill_dummy_shard

CONFIGS = {"kimi": small_model_config(), "dsa": None, "odd_vocab": small_model_config(vocab_size=321)}
FILES = {
    "dsa": "tiny_deepseek_v32.json",
    "qwen3_next": "tiny_qwen3_next.json",
    "qwen3_next_80b": "qwen3_next_80b_a3b.json",
}


def _spec(name: str):
    if name == "qwen3_next_kv1":  # one KV head: a copy on every TP rank
        return parse_config(
            {
                **json.loads(Path("inference/configs", FILES["qwen3_next"]).read_text()),
                "num_key_value_heads": 1,
            }
        )
    if name in FILES:
        return load_config(Path("inference/configs") / FILES[name])
    return parse_config(CONFIGS[name])


def _mesh(config: ParallelConfig, rank: int) -> MeshGroups:
    return MeshGroups.layout_only(config, rank)


def _shard(spec, config, rank):
    model = _meta_model(spec, torch.float32)
    plan = shard_model(model, _mesh(config, rank))
    model = model.to_empty(device="cpu")
    model.tie_weights()
    return model, plan


def _expected(full: dict[str, torch.Tensor], name: str, plan, local: torch.Tensor) -> torch.Tensor:
    """The slice `local` must hold; rows past the vocab (the last rank's padding) must be zero."""
    value = full[name]
    if name not in plan.slices:
        return value
    dim, start, stop = plan.slices[name]
    want = value.narrow(dim, start, stop - start)
    pad = local.shape[dim] - want.shape[dim]
    if pad:
        want = torch.cat([want, want.new_zeros((pad, *want.shape[1:]))], dim=dim)
    return want


@pytest.mark.parametrize("name", ["kimi", "dsa", "odd_vocab", "qwen3_next", "qwen3_next_kv1"])
@pytest.mark.parametrize(("tp", "ep"), [(2, 1), (1, 2), (2, 2)])
def test_shards_are_slices_of_the_full_model_and_cover_it(
    tmp_path: Path, name: str, tp: int, ep: int
) -> None:
    spec = _spec(name)
    full_model = build_model(spec, seed=3)
    full = dict(full_model.state_dict())
    save_sharded(full_model.state_dict(), tmp_path, max_shard_bytes=200_000)
    config = ParallelConfig(tp, ep)
    held: dict[str, int] = {}  # elements of each full tensor held, summed over ranks
    for rank in range(config.world_size):
        dummy, plan = _shard(spec, config, rank)
        fill_dummy_shard(dummy, _meta_model(spec, torch.float32), plan, seed=3)
        loaded, _ = _shard(spec, config, rank)
        load_weights_sharded(loaded, tmp_path, plan.slices, plan.elsewhere)
        for pname, local in dummy.state_dict().items():
            want = _expected(full, pname, plan, local)
            assert torch.equal(local, want), pname
            assert torch.equal(loaded.state_dict()[pname], want), pname
            # a tensor split over TP is held once per EP replica; replicated ones by every rank
            dim, start, stop = plan.slices.get(pname, (0, 0, full[pname].shape[0]))
            held[pname] = held.get(pname, 0) + want.numel() // want.shape[dim] * (stop - start)
        assert not set(plan.elsewhere) & set(dummy.state_dict())
    for pname, value in full.items():
        copies = held.get(pname, 0) / value.numel()
        assert copies >= 1 and copies == int(copies), pname  # every element is held somewhere


def test_a_missing_slice_is_reported(tmp_path: Path) -> None:
    spec = _spec("kimi")
    state = build_model(spec).state_dict()
    del state["model.layers.1.self_attn.q_proj.weight"]
    save_sharded(state, tmp_path)
    model, plan = _shard(spec, ParallelConfig(2, 1), 0)
    with pytest.raises(WeightLoadError, match="missing"):
        load_weights_sharded(model, tmp_path, plan.slices, plan.elsewhere)


@pytest.mark.parametrize(
    ("name", "tp"),
    [
        ("kimi", 1),
        ("kimi", 2),
        ("dsa", 1),
        ("dsa", 2),
        ("qwen3_next", 2),
        ("qwen3_next_kv1", 2),
        ("qwen3_next_80b", 8),
    ],
)
def test_per_rank_cache_figures_agree_with_analyze(name: str, tp: int) -> None:
    """The runtime allocates exactly what `dayzero analyze` plans per GPU (bf16): the MLA latent
    (and DSA keys) whole on every rank, the KDA/GDN state and conv window split by head, GQA K|V
    by KV head (Qwen3-Next-80B at TP=8: 2 KV heads, one copy per four ranks)."""
    spec = _spec(name)
    local = shard_cache_spec(
        HybridCacheSpec.from_model_spec(spec, torch.bfloat16), ParallelConfig(tp, 1), spec
    )
    _, state_per_seq = cache_bytes(spec)
    assert local.kv_bytes_per_token == _kv_per_gpu(spec, tp)
    assert local.state_bytes_per_slot == math.ceil(state_per_seq / tp)


def test_shared_expert_sliced_over_the_world_or_the_tp_group() -> None:
    """Width divisible by the world: every rank adds its slice; else TP slices, EP rank 0 adds."""
    from inference.parallel.moe import ParallelSparseMoE

    config = ParallelConfig(2, 2)
    for width, active in ((32, [True] * 4), (6, [True, True, False, False])):
        spec = parse_config({**small_model_config(), "moe_intermediate_size": width})
        got = []
        for rank in range(4):
            model = _meta_model(spec, torch.float32)
            shard_model(model, _mesh(config, rank))
            moe = model.model.layers[1].block_sparse_moe
            assert isinstance(moe, ParallelSparseMoE)
            got.append(moe.shared_active)
            assert moe.shared_experts.gate_proj.out_features == width // (4 if width % 4 == 0 else 2)
        assert got == active


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_per_rank_weights_agree_with_analyze(tp: int) -> None:
    """Kimi-Linear-48B at TP (experts sliced over TP, as analyze's EP == TP splits them): the
    shard the runtime builds holds analyze's per-GPU weights (its count of the split and the
    replicated parts) to within 1% (the fp32 tensors of a bf16 model; the counts are equal)."""
    from inference.analyze.plan import rank_params
    from inference.parallel.weights import rank_weight_bytes

    spec = load_config(Path("inference/configs/kimi_linear_48b_a3b.json"))
    planned = rank_params(spec, tp) * 2  # analyze's bf16 weights per GPU (pp = 1)
    runtime = rank_weight_bytes(spec, ParallelConfig(tp, 1), torch.bfloat16)
    assert planned <= runtime <= planned * 1.01


def test_gqa_kv_heads_that_do_not_split_are_refused() -> None:
    from inference.parallel.config import ParallelConfigError
    from inference.parallel.sharding import check_shardable

    cfg = json.loads(Path("inference/configs/tiny_qwen3_next.json").read_text())
    check_shardable(parse_config(cfg), ParallelConfig(2, 1))  # 4 query heads, 2 KV heads: split
    odd = parse_config({**cfg, "num_attention_heads": 6, "num_key_value_heads": 3})
    with pytest.raises(ParallelConfigError, match="num_key_value_heads=3"):
        check_shardable(odd, ParallelConfig(2, 1))


def test_qwen3_next_per_rank_weights_agree_with_analyze() -> None:
    """Qwen3-Next-80B at TP=8 (its 2 KV heads copied over 4 ranks each, the GDN conv filters,
    norms, routers and shared-expert gates replicated): analyze's per-GPU weights to within 1%
    (both 18.65 GiB)."""
    from inference.analyze.plan import rank_params
    from inference.parallel.weights import rank_weight_bytes

    spec = _spec("qwen3_next_80b")
    planned = rank_params(spec, 8) * 2
    runtime = rank_weight_bytes(spec, ParallelConfig(8, 1), torch.bfloat16)
    assert planned <= runtime <= planned * 1.01
