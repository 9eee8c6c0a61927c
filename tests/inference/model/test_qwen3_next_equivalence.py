"""Qwen3-Next from the shared layers (gated DeltaNet on the KDA delta rule, paged gated GQA,
softmax MoE with a gated shared expert) vs transformers' `Qwen3NextForCausalLM` on identical
random weights (fp32, CPU), prefill + decode through the hybrid cache; the ops against their
references."""

from __future__ import annotations

import pytest
import torch

from inference.config import GDN, GQA, parse_config
from inference.kernels.gqa import gqa_paged_attention, gqa_write_kv
from inference.kernels.kda import l2norm
from inference.kernels.kda.gdn import gdn_varlen
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, build_model
from inference.model.qwen3_next import Qwen3NextForCausalLM
from inference.model.text_models import NotServableError, ignored_prefixes
from testing.kimi_hf_mapping import FP32_REL_TOL, assert_close_rel
from testing.qwen3_next_hf_mapping import hf_config, published_to_hf, tiny_qwen3_next_config

PROMPT, DECODE, BLOCK = 36, 8, 8


@pytest.fixture(scope="module")
def models():
    import transformers

    cfg = tiny_qwen3_next_config()
    spec = parse_config(cfg)
    ours = build_model(spec, seed=0)
    ref = transformers.Qwen3NextForCausalLM(hf_config(cfg)).eval()
    ref.load_state_dict(published_to_hf(ours.state_dict()), strict=True)
    return spec, ours, ref


def _cache(spec, slots: int = 3) -> HybridCacheTensors:
    return HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, torch.float32), 16, BLOCK, slots, "cpu", torch.float32
    )


def test_layout_and_cache_mapping(models):
    spec, ours, _ = models
    assert isinstance(ours, Qwen3NextForCausalLM) and spec.layer_kinds == (GDN, GQA, GDN, GQA)
    names = set(ours.state_dict())
    assert {"model.layers.0.linear_attn.in_proj_qkvz.weight", "model.layers.0.mlp.gate_proj.weight",
            "model.layers.1.self_attn.q_norm.weight", "model.layers.1.mlp.shared_expert_gate.weight",
            "model.layers.2.mlp.experts.7.down_proj.weight", "model.layers.2.linear_attn.conv1d.weight"} <= names  # fmt: skip
    cs = HybridCacheSpec.from_model_spec(spec, torch.bfloat16)
    assert cs.mla_layers == (1, 3) and cs.latent_dim == 2 * 2 * 16  # GQA K|V rows in the paged pool
    assert cs.kda_layers == (0, 2) and (cs.kda_num_heads, cs.kda_head_dim, cs.conv_channels) == (
        4,
        16,
        2 * 32 + 64,
    )
    from inference.analyze import cache_bytes

    assert cache_bytes(spec) == (cs.kv_bytes_per_token, cs.state_bytes_per_slot)  # analysis == runtime
    assert ignored_prefixes(spec) == ("mtp.",)


def test_counts_equal_the_built_model(models):
    from inference.analyze import parameter_counts

    spec, ours, _ = models
    assert parameter_counts(spec)[0]["total"] == sum(p.numel() for p in ours.parameters())


@torch.no_grad()
def test_prefill_then_decode_matches_transformers(models):
    spec, ours, ref = models
    ids = torch.randint(0, spec.vocab_size, (PROMPT + DECODE,), generator=torch.Generator().manual_seed(1))
    want = ref(ids[None], use_cache=False).logits[0]
    cache = _cache(spec)
    table = [3, 1, 4, 0, 5, 6]  # scattered blocks
    meta = ForwardMeta.for_sequences([PROMPT], [0], [table], BLOCK, [1])
    assert_close_rel(ours(ids[:PROMPT], meta, cache), want[:PROMPT], FP32_REL_TOL, "prefill logits")
    for pos in range(PROMPT, PROMPT + DECODE):
        meta = ForwardMeta.for_sequences([1], [pos], [table], BLOCK, [1])
        assert_close_rel(
            ours(ids[pos : pos + 1], meta, cache), want[pos : pos + 1], FP32_REL_TOL, f"decode at {pos}"
        )


@torch.no_grad()
def test_batched_chunked_step_equals_each_alone(models):
    spec, ours, _ = models
    a, b = (torch.randint(0, 320, (n,), generator=torch.Generator().manual_seed(n)) for n in (30, 17))
    tables = [[0, 1, 2, 3], [8, 9, 10]]

    def alone(ids, table, slot):
        cache = _cache(spec)
        return ours(ids, ForwardMeta.for_sequences([len(ids)], [0], [table], BLOCK, [slot]), cache)

    cache = _cache(spec)
    out1 = ours(
        torch.cat([a[:20], b[:16]]), ForwardMeta.for_sequences([20, 16], [0, 0], tables, BLOCK, [0, 2]), cache
    )
    out2 = ours(
        torch.cat([a[20:], b[16:]]),
        ForwardMeta.for_sequences([10, 1], [20, 16], tables, BLOCK, [0, 2]),
        cache,
    )
    assert_close_rel(
        torch.cat([out1[:20], out2[:10]]), alone(a, tables[0], 0), FP32_REL_TOL, "a chunked+batched"
    )
    assert_close_rel(torch.cat([out1[20:], out2[10:]]), alone(b, tables[1], 2), FP32_REL_TOL, "b batched")


def test_gdn_on_the_kda_rule_equals_a_scalar_decay_recurrence():
    """The broadcast is the whole trick: check it against a per-head scalar-decay recurrence."""
    gen = torch.Generator().manual_seed(0)
    t, hk, hv, d = 12, 2, 4, 8
    q, k = torch.randn(t, hk, d, generator=gen), torch.randn(t, hk, d, generator=gen)
    v = torch.randn(t, hv, d, generator=gen)
    g = -torch.rand(t, hv, generator=gen)
    beta = torch.rand(t, hv, generator=gen)
    s0 = torch.randn(1, hv, d, d, generator=gen)
    o, final = gdn_varlen(q, k, v, g, beta, s0, torch.tensor([0, t]), (t,))
    qr, kr = (l2norm(x.repeat_interleave(2, dim=1)) for x in (q, k))
    s = s0[0].clone()
    want = []
    for i in range(t):  # S <- exp(g) S; S += k (beta (v - k S)); o = q S
        s = s * g[i].exp()[:, None, None]
        u = beta[i][:, None] * (v[i] - torch.einsum("hk,hkv->hv", kr[i], s))
        s = s + kr[i][..., None] * u[:, None, :]
        want.append(torch.einsum("hk,hkv->hv", qr[i] * d**-0.5, s))
    assert_close_rel(o, torch.stack(want), FP32_REL_TOL, "gdn output")
    assert_close_rel(final[0], s, FP32_REL_TOL, "gdn final state")


def test_gqa_paged_attention_matches_dense_causal_attention():
    gen = torch.Generator().manual_seed(1)
    h, hkv, d, bs = 4, 2, 8, 4
    pool = torch.full((8, bs, 2 * hkv * d), float("nan"))  # unwritten rows must never be read
    k, v, q = (
        torch.randn(10, hkv, d, generator=gen),
        torch.randn(10, hkv, d, generator=gen),
        torch.randn(10, h, d, generator=gen),
    )
    table = torch.tensor([[5, 2, 7]])
    slots = torch.tensor([table[0, i // bs] * bs + i % bs for i in range(10)])
    gqa_write_kv(pool, slots, k, v)
    got = gqa_paged_attention(
        q[6:], pool, table, query_lens=(4,), context_lens=(6,), num_kv_heads=hkv, scale=d**-0.5
    )
    kk, vv = (x.repeat_interleave(2, dim=1).transpose(0, 1) for x in (k, v))
    mask = torch.ones(10, 10, dtype=torch.bool).tril()[6:]
    want = torch.nn.functional.scaled_dot_product_attention(
        q[6:].transpose(0, 1), kk, vv, attn_mask=mask
    ).transpose(0, 1)
    assert_close_rel(got, want, FP32_REL_TOL, "paged GQA")
    with pytest.raises(ValueError, match="kv heads"):
        gqa_paged_attention(q, pool, table, query_lens=(10,), context_lens=(0,), num_kv_heads=3, scale=1.0)


def test_non_square_gdn_states_are_refused():
    cfg = tiny_qwen3_next_config(linear_value_head_dim=32)
    with pytest.raises(NotServableError, match="linear_key_head_dim"):
        build_model(parse_config(cfg))
