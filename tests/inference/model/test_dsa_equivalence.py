"""Our MLA+DSA layer vs transformers' `deepseek_v32` indexer + sparse attention (fp32, CPU)."""

from __future__ import annotations

import importlib

import pytest
import torch

from inference.config import parse_config
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, init_dummy_weights
from inference.model.mla import MLAttention, dsa_topk_indices
from testing.kimi_hf_mapping import FP32_REL_TOL, assert_close_rel, tiny_kimi_linear_config

mod = importlib.import_module("transformers.models.deepseek_v32.modeling_deepseek_v32")
from transformers import DeepseekV32Config  # noqa: E402

SEQ, TOPK, BLOCK = 64, 16, 8


@pytest.fixture(scope="module")
def layers():
    cfg = tiny_kimi_linear_config(
        q_lora_rank=32, mla_use_nope=False, rope_theta=10000.0, index_topk=TOPK, index_n_heads=8, index_head_dim=16,
        linear_attn_config={"kda_layers": [], "full_attn_layers": [1, 2, 3, 4], "num_heads": 2, "head_dim": 16},
    )  # fmt: skip
    spec = parse_config(cfg)
    ours = MLAttention(spec, layer_idx=0)
    init_dummy_weights(ours, seed=5)
    hcfg = DeepseekV32Config(
        vocab_size=256, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        index_topk=TOPK, index_n_heads=8, index_head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    hcfg._attn_implementation = "eager"
    ref = mod.DeepseekV32Attention(hcfg, layer_idx=0).eval()
    ref.load_state_dict(ours.state_dict(), strict=True)  # published names are shared
    return spec, ours.eval(), ref, mod.DeepseekV32RotaryEmbedding(hcfg)


@torch.no_grad()
def _reference(ref, rotary, x):
    pos = torch.arange(x.shape[0])[None]
    mask = torch.full((x.shape[0], x.shape[0]), torch.finfo(x.dtype).min).triu(1)[None, None]
    out, _ = ref(x[None], rotary(x[None], pos), mask, position_ids=pos)
    return out[0]


@torch.no_grad()
def test_dsa_prefill_and_decode_match_deepseek_v32(layers):
    spec, ours, ref, rotary = layers
    x = torch.randn(SEQ, 64, generator=torch.Generator().manual_seed(3))
    want = _reference(ref, rotary, x)
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, torch.float32), 16, BLOCK, 1, "cpu", torch.float32
    )
    table = [[7, 3, 11, 0, 5, 9, 2, 14]]
    prompt = 40
    meta = ForwardMeta.for_sequences([prompt], [0], table, BLOCK, [0])
    got = [ours(x[:prompt], meta, cache)]
    for pos in range(prompt, SEQ):
        meta = ForwardMeta.for_sequences([1], [pos], table, BLOCK, [0])
        got.append(ours(x[pos : pos + 1], meta, cache))
    assert_close_rel(torch.cat(got), want, FP32_REL_TOL, "DSA layer output (prefill 40 + 24 decodes)")


@torch.no_grad()
def test_indexer_selects_the_same_keys(layers):
    _, ours, ref, rotary = layers
    x = torch.randn(SEQ, 64, generator=torch.Generator().manual_seed(4))
    pos = torch.arange(SEQ)[None]
    cos, sin = rotary(x[None], pos)
    mask = torch.full((SEQ, SEQ), torch.finfo(x.dtype).min).triu(1)[None]
    q_latent = ref.q_a_layernorm(ref.q_a_proj(x[None]))
    want = ref.indexer(x[None], q_latent, (cos, sin), mask, pos)[0].long()  # [S, topk]
    from inference.model.layers import rope_cos_sin

    c, s = rope_cos_sin(pos[0], 8, 10000.0)
    iq, ik, iw = ours.indexer.project(x, q_latent[0], c, s)
    idx, valid = dsa_topk_indices(iq, ik, iw, 0, TOPK)
    for row in range(TOPK, SEQ):  # rows with more visible keys than topk: a real selection
        assert set(idx[row].tolist()) == set(want[row].tolist()), f"query {row} selected other keys"
    assert bool(valid[TOPK:].all()) and not bool(valid[0, 1:].any())
