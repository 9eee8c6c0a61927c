"""YaRN rope scaling in the MLA layer vs transformers (fp32, CPU).

1. The angles and both temperature factors equal transformers' `_compute_yarn_parameters` and
   `yarn_apply_mscale` for the published DeepSeek-V3/V3.2 and Kimi-K2/K2.5 configs and for
   variants that take the other branches (mscale only, attention_factor given, no truncation,
   a one-channel ramp).
2. Whole models, `deepseek_v32` (+DSA indexer, whose rope sees the same scaled cos/sin) and
   `deepseek_v3`, prefill then decode past `original_max_position_embeddings`, on identical
   random weights: logits within 1e-4 relative of transformers'.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from inference.config import parse_config
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, build_model
from inference.model.rope import RotaryAngles
from testing.deepseek_hf_mapping import hf_config, published_to_hf, tiny_deepseek_v32_config
from testing.kimi_hf_mapping import FP32_REL_TOL, assert_close_rel, rel_err

CONFIGS = Path(__file__).resolve().parents[3] / "inference" / "configs"
PUBLISHED = ["deepseek_v3_671b.json", "deepseek_v32_exp.json", "kimi_k2_instruct.json", "kimi_k25.json"]


def _text(name: str) -> dict:
    cfg = json.loads((CONFIGS / name).read_text())
    return cfg.get("text_config", cfg)


def _hf_yarn(cfg: dict) -> tuple[torch.Tensor, float, float]:
    """transformers' (inv_freq, attention_scaling, softmax scale) for a DeepSeek-layout config."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    keep = {
        k: v for k, v in cfg.items()
        if k in ("hidden_size", "num_attention_heads", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                 "rope_theta", "rope_scaling", "max_position_embeddings", "kv_lora_rank", "q_lora_rank")
    }  # fmt: skip
    hc = transformers.DeepseekV3Config(**keep)
    inv, attention = ROPE_INIT_FUNCTIONS["yarn"](hc, "cpu")
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    return inv, attention, yarn_apply_mscale(hc.rope_parameters, qk**-0.5)


def _variants() -> list[tuple[str, dict]]:
    out = [(name, _text(name)) for name in PUBLISHED]
    v3 = _text("deepseek_v3_671b.json")
    base = dict(v3["rope_scaling"])
    for label, change in [
        ("mscale only", {"mscale_all_dim": 0}),  # cos/sin carry yarn_mscale(factor), softmax untouched
        ("mscale != mscale_all_dim", {"mscale": 0.707, "mscale_all_dim": 1.0}),
        ("attention_factor given", {"attention_factor": 1.3}),
        ("no truncation", {"truncate": False, "beta_fast": 24, "beta_slow": 2}),
        ("one-channel ramp", {"beta_fast": 1.0, "beta_slow": 1.0}),
        ("defaults (beta 0 means default)", {"beta_fast": 0, "beta_slow": 0, "mscale": None}),
    ]:
        scaling = {k: v for k, v in {**base, **change}.items() if v is not None}
        out.append((label, dict(v3, rope_scaling=scaling)))
    return out


@pytest.mark.parametrize(("label", "cfg"), _variants(), ids=[v[0] for v in _variants()])
def test_angles_and_temperatures_equal_transformers(label, cfg):
    m = parse_config(cfg).mla
    ours = RotaryAngles.for_mla(m)
    inv, attention, softmax = _hf_yarn(cfg)
    assert torch.equal(ours.inv_freq(), inv.float()), label  # same fp32 ops, bit for bit
    assert ours.cos_sin_factor == pytest.approx(attention, rel=1e-12), label
    assert m.qk_head_dim**-0.5 * ours.softmax_factor == pytest.approx(softmax, rel=1e-12), label


def test_published_deepseek_v3_temperature():
    """DeepSeek-V3: factor 40, mscale = mscale_all_dim = 1: cos/sin unscaled, softmax x (0.1 ln 40 + 1)^2."""
    angles = RotaryAngles.for_mla(parse_config(_text("deepseek_v3_671b.json")).mla)
    assert angles.cos_sin_factor == 1.0
    assert angles.softmax_factor == pytest.approx((0.1 * math.log(40) + 1) ** 2)
    inv = angles.inv_freq()
    plain = RotaryAngles(64, 10000.0).inv_freq()
    assert torch.equal(inv[:10], plain[:10])  # fast channels keep the trained frequency
    assert torch.allclose(inv[-5:], plain[-5:] / 40)  # slow ones are interpolated


# A tiny config whose ramp blends channels (low 0, high 2 of 4 pairs) and whose cos/sin factor is
# not 1 (mscale != mscale_all_dim): every YaRN term is exercised, at positions 3x the trained length.
TINY_YARN = {
    "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 4.0, "beta_slow": 0.25,
    "mscale": 0.707, "mscale_all_dim": 1.0,
}  # fmt: skip
PROMPT, DECODE, BLOCK = 40, 12, 8


def _tiny(model_type: str) -> dict:
    cfg = tiny_deepseek_v32_config(rope_scaling=TINY_YARN, max_position_embeddings=64)
    if model_type == "deepseek_v3":
        cfg = {k: v for k, v in cfg.items() if not k.startswith("index_")}
        cfg.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"])
    return cfg


def _reference(model_type: str, cfg: dict):
    import transformers

    if model_type == "deepseek_v32":
        return transformers.DeepseekV32ForCausalLM(hf_config(cfg)).eval()
    hc = transformers.DeepseekV3Config(
        **{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}
    )
    hc._attn_implementation = "eager"
    return transformers.DeepseekV3ForCausalLM(hc).eval()


@pytest.mark.parametrize("model_type", ["deepseek_v32", "deepseek_v3"])
@torch.no_grad()
def test_model_with_yarn_matches_transformers_past_the_trained_length(model_type):
    cfg = _tiny(model_type)
    spec = parse_config(cfg)
    angles = RotaryAngles.for_mla(spec.mla)
    assert (angles.low, angles.high) == (0, 2)  # pair 0 kept, pair 1 blended half-half, 2-3 divided by 4
    assert angles.cos_sin_factor != 1.0 and angles.softmax_factor != 1.0
    ours = build_model(spec, seed=0)
    ref = _reference(model_type, cfg)
    ref.load_state_dict(published_to_hf(ours.state_dict()), strict=True)
    ids = torch.randint(0, spec.vocab_size, (PROMPT + DECODE,), generator=torch.Generator().manual_seed(1))
    want = [ref(ids[None, :PROMPT]).logits[0]]
    want += [ref(ids[None, : pos + 1]).logits[0, -1:] for pos in range(PROMPT, PROMPT + DECODE)]
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, torch.float32), 16, BLOCK, 1, "cpu", torch.float32
    )
    table = [9, 2, 14, 5, 0, 11, 7]
    got = ours(ids[:PROMPT], ForwardMeta.for_sequences([PROMPT], [0], [table], BLOCK, [0]), cache)
    assert_close_rel(got, want[0], FP32_REL_TOL, "prefill logits")
    for step, pos in enumerate(range(PROMPT, PROMPT + DECODE)):  # positions 40..51 > 16 trained
        got = ours(ids[pos : pos + 1], ForwardMeta.for_sequences([1], [pos], [table], BLOCK, [0]), cache)
        assert_close_rel(got, want[step + 1], FP32_REL_TOL, f"decode at {pos}")
    # and YaRN matters here: transformers without rope scaling gives other logits
    plain = _reference(model_type, {**cfg, "rope_scaling": None})
    plain.load_state_dict(published_to_hf(ours.state_dict()), strict=True)
    assert rel_err(plain(ids[None, :PROMPT]).logits[0], want[0]) > 100 * FP32_REL_TOL
