"""The FP8 latent cache option: per-row quantisation, write/read through the cache, block copies."""

from __future__ import annotations

import torch

from inference.config import parse_config
from inference.model import HybridCacheSpec, HybridCacheTensors
from inference.model.cache_tensors import FP8_MAX, quantize_rows_fp8
from testing.kimi_hf_mapping import tiny_kimi_linear_config
from tests.inference.kernels.helpers import assert_rel


def _cache(fp8: bool) -> HybridCacheTensors:
    spec = parse_config(tiny_kimi_linear_config(qk_rope_head_dim=16))
    cs = HybridCacheSpec.from_model_spec(spec, torch.float32, latent_fp8=fp8)
    return HybridCacheTensors.allocate(cs, 8, 16, 2, "cpu", torch.float32)


def test_quantize_rows_round_trip_within_e4m3_precision():
    rows = torch.randn(50, 48) * torch.logspace(-3, 3, 50)[:, None]  # rows of very different scale
    rows[7] = 0.0
    q, scale = quantize_rows_fp8(rows)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (50,)
    assert float(q.float().abs().max()) <= FP8_MAX
    back = q.float() * scale[:, None]
    assert torch.equal(back[7], rows[7])
    # e4m3 keeps 3 mantissa bits: each element within 1/16 of its row's max
    err = ((back - rows).abs().amax(1) / rows.abs().amax(1).clamp_min(1e-30))[rows.abs().amax(1) > 0]
    assert float(err.max()) <= 1 / 16


def test_fp8_cache_write_read_and_copy_block():
    cache = _cache(fp8=True)
    layer = cache.spec.mla_layers[0]
    assert cache.kv[layer].dtype == torch.float8_e4m3fn and layer in cache.kv_scale
    rows = torch.randn(5, cache.spec.latent_dim)
    slots = torch.tensor([16, 17, 18, 40, 41])  # block 1 rows 0-2, block 2 rows 8-9
    cache.write_latents(layer, slots, rows)
    got = cache.read_latents(layer, slots, torch.float32)
    assert_rel(got, rows, 1 / 16, "fp8 cache read-back")
    cache.copy_block(1, 5)
    assert torch.equal(cache.read_latents(layer, slots[:3] + 64, torch.float32), got[:3])


def test_fp8_option_sizes_the_pool_per_token():
    bf16 = _cache(fp8=False).spec
    fp8 = _cache(fp8=True).spec
    assert bf16.kv_bytes_per_token == bf16.latent_dim * 4 * len(bf16.mla_layers)  # fp32 model dtype here
    assert fp8.kv_bytes_per_token == (fp8.latent_dim + 4) * len(fp8.mla_layers)
    plain = _cache(fp8=False)
    assert not plain.kv_scale and plain.kv[plain.spec.mla_layers[0]].dtype == torch.float32


def _dsa_cache(fp8: bool) -> HybridCacheTensors:
    cfg = tiny_kimi_linear_config(
        qk_rope_head_dim=16, q_lora_rank=32, mla_use_nope=False, rope_theta=10000.0, index_topk=24,
        index_n_heads=8, index_head_dim=32,
    )  # fmt: skip
    cs = HybridCacheSpec.from_model_spec(parse_config(cfg), torch.float32, latent_fp8=fp8)
    return HybridCacheTensors.allocate(cs, 8, 16, 2, "cpu", torch.float32)


def test_fp8_indexer_keys_keep_their_scales_inside_the_block():
    cache = _dsa_cache(fp8=True)
    layer = cache.spec.mla_layers[0]
    d = cache.spec.index_head_dim
    raw = cache.index_k[layer]
    assert raw.dtype == torch.uint8 and raw.shape == (8, 16 * (d + 4))  # one tensor: keys | scales
    rows = torch.randn(5, d) * torch.tensor([1e-3, 1.0, 10.0, 1e3, 0.5])[:, None]
    slots = torch.tensor([16, 17, 18, 40, 41])
    cache.write_index_keys(layer, slots, rows)
    keys, scales = cache.index_keys(layer)
    assert keys.dtype == torch.float8_e4m3fn and keys.shape == (8, 16, d) and scales.shape == (8, 16)
    blk, pos = slots // 16, slots % 16
    back = keys[blk, pos].float() * scales[blk, pos][:, None]
    assert_rel(back, rows, 1 / 16, "fp8 indexer keys read-back")
    cache.copy_block(1, 5)  # block copies (and the tiers: whole block tensors) carry the scales
    assert torch.equal(keys[5].float() * scales[5][:, None], keys[1].float() * scales[1][:, None])
    assert cache.spec.kv_bytes_per_token == (cache.spec.latent_dim + 4 + d + 4) * len(cache.spec.mla_layers)


def test_model_dtype_indexer_keys_unchanged():
    cache = _dsa_cache(fp8=False)
    layer = cache.spec.mla_layers[0]
    rows = torch.randn(3, cache.spec.index_head_dim)
    cache.write_index_keys(layer, torch.tensor([0, 5, 33]), rows)
    keys, scales = cache.index_keys(layer)
    assert scales is None and keys.dtype == torch.float32
    assert torch.equal(keys.view(-1, keys.shape[-1])[torch.tensor([0, 5, 33])], rows)
