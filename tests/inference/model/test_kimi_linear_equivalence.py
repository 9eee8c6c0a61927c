"""Our hybrid model vs transformers' `KimiLinearForCausalLM` on identical random weights (fp32, CPU)."""

from __future__ import annotations

import importlib

import pytest
import torch

from inference.config import parse_config
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, build_model
from testing.kimi_hf_mapping import (
    FP32_REL_TOL,
    assert_close_rel,
    published_to_hf,
    tiny_kimi_linear_config,
)

transformers = importlib.import_module("transformers")

PROMPT, DECODE, BLOCK = 256, 20, 16


@pytest.fixture(scope="module")
def models():
    cfg = tiny_kimi_linear_config()
    spec = parse_config(cfg)
    ours = build_model(spec, seed=0)
    hcfg = transformers.KimiLinearConfig(**cfg)
    hcfg._attn_implementation = "eager"
    ref = transformers.KimiLinearForCausalLM(hcfg).eval()
    ref.load_state_dict(published_to_hf(ours.state_dict()), strict=True)
    return spec, ours, ref


def _cache(spec, num_slots: int = 6) -> HybridCacheTensors:
    cs = HybridCacheSpec.from_model_spec(spec, torch.float32)
    return HybridCacheTensors.allocate(
        cs, num_blocks=64, block_size=BLOCK, num_slots=num_slots, device="cpu", dtype=torch.float32
    )


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _reference(ref, ids: torch.Tensor, prompt: int) -> list[torch.Tensor]:
    out = ref(ids[None, :prompt], use_cache=True)
    logits, pkv = [out.logits[0]], out.past_key_values
    for i in range(prompt, ids.shape[0]):
        out = ref(ids[None, i : i + 1], past_key_values=pkv, use_cache=True)
        pkv = out.past_key_values
        logits.append(out.logits[0])
    return logits


@torch.no_grad()
def test_prefill_then_decode_matches_transformers(models):
    spec, ours, ref = models
    ids = _ids(PROMPT + DECODE, 1)
    expected = _reference(ref, ids, PROMPT)
    cache = _cache(spec)
    table = list(range(40, 40 - (PROMPT + DECODE) // BLOCK - 1, -1))  # scattered, descending blocks
    meta = ForwardMeta.for_sequences([PROMPT], [0], [table], BLOCK, [3])
    assert_close_rel(ours(ids[:PROMPT], meta, cache), expected[0], FP32_REL_TOL, "prefill logits")
    for step in range(DECODE):
        pos = PROMPT + step
        meta = ForwardMeta.for_sequences([1], [pos], [table], BLOCK, [3])
        got = ours(ids[pos : pos + 1], meta, cache)
        assert_close_rel(got, expected[step + 1], FP32_REL_TOL, f"decode step {step}")


@torch.no_grad()
def test_batched_chunked_mixed_step_equals_each_alone(models):
    """Two sequences of different lengths, chunked prefill and decodes mixed in one forward."""
    spec, ours, _ = models
    a, b = _ids(150, 2), _ids(70, 3)
    tables = [list(range(0, 12)), list(range(20, 32))]

    def alone(ids, table, slot):
        cache = _cache(spec)
        meta = ForwardMeta.for_sequences([ids.shape[0] - 1], [0], [table], BLOCK, [slot])
        first = ours(ids[:-1], meta, cache)
        meta = ForwardMeta.for_sequences([1], [ids.shape[0] - 1], [table], BLOCK, [slot])
        return torch.cat([first, ours(ids[-1:], meta, cache)])

    want_a, want_b = alone(a, tables[0], 1), alone(b, tables[1], 4)
    cache = _cache(spec)
    got_a, got_b = [], []
    # step 1: a prefill chunk of 100 with b's whole prompt but one token
    meta = ForwardMeta.for_sequences([100, 69], [0, 0], tables, BLOCK, [1, 4])
    out = ours(torch.cat([a[:100], b[:69]]), meta, cache)
    got_a.append(out[:100]), got_b.append(out[100:])
    # step 2: a's second chunk (49 tokens) beside b's single-token decode
    meta = ForwardMeta.for_sequences([49, 1], [100, 69], tables, BLOCK, [1, 4])
    out = ours(torch.cat([a[100:149], b[69:70]]), meta, cache)
    got_a.append(out[:49]), got_b.append(out[49:])
    # step 3: a decodes alone, with logits for just that row
    meta = ForwardMeta.for_sequences([1], [149], [tables[0]], BLOCK, [1], logits_indices=[0])
    got_a.append(ours(a[149:150], meta, cache))
    assert_close_rel(torch.cat(got_a), want_a, FP32_REL_TOL, "sequence a, batched+chunked vs alone")
    assert_close_rel(torch.cat(got_b), want_b, FP32_REL_TOL, "sequence b, batched vs alone")


@torch.no_grad()
def test_untouched_state_slots_and_blocks_stay_bit_identical(models):
    spec, ours, _ = models
    cache = _cache(spec)
    for t in (*cache.state.values(), *cache.conv.values(), *cache.kv.values()):
        t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(9)))
    before = {k: {i: t.clone() for i, t in getattr(cache, k).items()} for k in ("state", "conv", "kv")}
    meta = ForwardMeta.for_sequences([5, 1], [0, 7], [[2], [5]], BLOCK, [1, 4])
    cache.zero_slot(1)
    ours(_ids(6, 4), meta, cache)
    for i, t in cache.state.items():
        others = [s for s in range(t.shape[0]) if s not in (1, 4)]
        assert torch.equal(t[others], before["state"][i][others]), f"state of layer {i} leaked"
        assert torch.equal(cache.conv[i][others], before["conv"][i][others]), f"conv of layer {i} leaked"
    for i, t in cache.kv.items():
        others = [blk for blk in range(t.shape[0]) if blk not in (2, 5)]
        assert torch.equal(t[others], before["kv"][i][others]), f"kv of layer {i} leaked"


def test_copy_slot_snapshots_every_kda_layer(models):
    spec, _, _ = models
    cache = _cache(spec)
    for t in (*cache.state.values(), *cache.conv.values()):
        t.normal_()
    cache.copy_slot(2, 5)
    for i in spec.kda_layers:
        assert torch.equal(cache.state[i][5], cache.state[i][2])
        assert torch.equal(cache.conv[i][5], cache.conv[i][2])
    cache.zero_slot(5)
    assert all(int(cache.state[i][5].abs().sum()) == 0 for i in spec.kda_layers)


def test_cache_spec_bytes(models):
    spec, _, _ = models
    cs = HybridCacheSpec.from_model_spec(spec, torch.bfloat16)
    assert cs.kv_bytes_per_token == (32 + 8) * 2 * 1  # one MLA layer, bf16 latent + rope key
    state = 2 * 16 * 16 * 4 + 3 * 32 * 3 * 2  # fp32 state + bf16 conv window, per KDA layer
    assert cs.state_bytes_per_slot == state * 3


def test_forward_rejects_wrong_token_count(models):
    spec, ours, _ = models
    meta = ForwardMeta.for_sequences([4], [0], [[0]], BLOCK, [0])
    with pytest.raises(ValueError, match="input_ids"):
        ours(_ids(3, 0), meta, _cache(spec))


@torch.no_grad()
def test_variant_q_lora_grouped_routing_two_shared_experts():
    """Other published knobs: query low-rank, 4 expert groups keeping 2, 2 shared experts, 2 dense layers."""
    cfg = tiny_kimi_linear_config(
        q_lora_rank=24, num_expert_group=4, topk_group=2, num_shared_experts=2, first_k_dense_replace=2,
        num_experts_per_token=3, routed_scaling_factor=1.0, moe_renormalize=False,
    )  # fmt: skip
    spec = parse_config(cfg)
    ours = build_model(spec, seed=11)
    hcfg = transformers.KimiLinearConfig(**cfg)
    hcfg._attn_implementation = "eager"
    ref = transformers.KimiLinearForCausalLM(hcfg).eval()
    ref.load_state_dict(published_to_hf(ours.state_dict()), strict=True)
    ids = _ids(69, 5)
    expected = _reference(ref, ids, 64)
    cache, table = _cache(spec), [5, 9, 1, 7, 3]
    got = [ours(ids[:64], ForwardMeta.for_sequences([64], [0], [table], BLOCK, [0]), cache)]
    for pos in range(64, 69):
        got.append(
            ours(ids[pos : pos + 1], ForwardMeta.for_sequences([1], [pos], [table], BLOCK, [0]), cache)
        )
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert_close_rel(a, b, FP32_REL_TOL, f"variant model, step {step}")
