"""The DeepSeek-V3.2 architecture built from the shared layers vs transformers'
`DeepseekV32ForCausalLM` on identical random weights (fp32, CPU): prefill + decode through the
paged latent/indexer cache, with the DSA indexer selecting fewer keys than the context holds."""

from __future__ import annotations

import pytest
import torch

from inference.config import parse_config
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, build_model
from inference.model.deepseek_v32 import DeepseekForCausalLM, mtp_prefixes
from testing.deepseek_hf_mapping import hf_config, published_to_hf, tiny_deepseek_v32_config
from testing.kimi_hf_mapping import FP32_REL_TOL, assert_close_rel

PROMPT, DECODE, BLOCK = 40, 12, 8  # 52 tokens > index_topk 16: the sparse selection matters


@pytest.fixture(scope="module")
def models():
    import transformers

    cfg = tiny_deepseek_v32_config()
    spec = parse_config(cfg)
    ours = build_model(spec, seed=0)
    ref = transformers.DeepseekV32ForCausalLM(hf_config(cfg)).eval()
    ref.load_state_dict(published_to_hf(ours.state_dict()), strict=True)  # every tensor, both ways
    return spec, ours, ref


def test_layout_is_the_published_one(models):
    spec, ours, _ = models
    assert isinstance(ours, DeepseekForCausalLM) and spec.kda is None and spec.mtp.num_layers == 1
    names = set(ours.state_dict())
    assert "model.layers.0.mlp.gate_proj.weight" in names  # first_k_dense_replace = 1
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in names
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in names
    assert "model.layers.2.self_attn.indexer.wq_b.weight" in names
    assert not any("block_sparse_moe" in n for n in names)
    assert mtp_prefixes(spec) == ("model.layers.3.",)


@torch.no_grad()
def test_prefill_then_decode_matches_transformers(models):
    spec, ours, ref = models
    ids = torch.randint(0, spec.vocab_size, (PROMPT + DECODE,), generator=torch.Generator().manual_seed(1))
    # The reference runs on exactly the tokens each of our steps has seen. A key whose ReLU'd
    # score is zero in every indexer head scores exactly 0; where such ties sit at the top-k
    # boundary, which key is kept depends on the row length, in transformers as in ours. With
    # 4 indexer heads that happened on these weights (1 key in 16 is all-negative); the tiny
    # config has 16 heads (1 in 65536), as the published 64-head indexer makes it rare too.
    want = [ref(ids[None, :PROMPT]).logits[0]]
    want += [ref(ids[None, : pos + 1]).logits[0, -1:] for pos in range(PROMPT, PROMPT + DECODE)]
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, torch.float32), 16, BLOCK, 1, "cpu", torch.float32
    )
    table = [9, 2, 14, 5, 0, 11, 7]  # scattered blocks
    meta = ForwardMeta.for_sequences([PROMPT], [0], [table], BLOCK, [0])
    assert_close_rel(ours(ids[:PROMPT], meta, cache), want[0], FP32_REL_TOL, "prefill logits")
    for step, pos in enumerate(range(PROMPT, PROMPT + DECODE)):
        meta = ForwardMeta.for_sequences([1], [pos], [table], BLOCK, [0])
        got = ours(ids[pos : pos + 1], meta, cache)
        assert_close_rel(got, want[step + 1], FP32_REL_TOL, f"decode at {pos}")


def test_checkpoint_with_mtp_layers_loads(tmp_path, models):
    """A published checkpoint also ships `model.layers.{N}.*` (MTP): skipped, everything else strict."""
    from inference.loader import save_sharded

    spec, ours, _ = models
    state = dict(ours.state_dict())
    state["model.layers.3.eh_proj.weight"] = torch.zeros(64, 128)
    save_sharded(state, tmp_path, max_shard_bytes=200_000)
    loaded = build_model(spec, load_format="safetensors", path=tmp_path)
    for name, t in loaded.state_dict().items():
        assert torch.equal(t, state[name]), name


def test_kimi_k25_wrapper_serves_the_deepseek_text_model():
    """Kimi-K2.5's layout: a `kimi_k2` text_config (DeepSeek-V3 architecture) under MoonViT."""
    from inference.analyze import parameter_counts
    from inference.engine.factory import small_vl_model_config
    from inference.model.multimodal import KimiVLForConditionalGeneration

    text = {k: v for k, v in tiny_deepseek_v32_config().items() if not k.startswith("index_")}
    cfg = dict(
        small_vl_model_config(), text_config=dict(text, model_type="kimi_k2"), projection_hidden_size=32
    )
    spec = parse_config(cfg)
    model = build_model(spec)
    assert isinstance(model, KimiVLForConditionalGeneration) and isinstance(
        model.language_model, DeepseekForCausalLM
    )
    assert "language_model.model.layers.1.mlp.experts.0.gate_proj.weight" in model.state_dict()
    stored = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    assert parameter_counts(spec)[0]["total"] == stored
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, torch.float32), 4, BLOCK, 1, "cpu", torch.float32
    )
    with torch.no_grad():
        logits = model(torch.arange(5), ForwardMeta.for_sequences([5], [0], [[0]], BLOCK, [0]), cache)
    assert logits.shape == (5, spec.vocab_size) and torch.isfinite(logits).all()
