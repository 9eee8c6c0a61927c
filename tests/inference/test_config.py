"""Config parsing: the published Kimi-Linear config, DSA fields, the vision wrapper, clear refusals."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from inference.config import DENSE, KDA, MLA, MOE, ConfigError, load_config, parse_config

PUBLISHED = Path(__file__).resolve().parents[2] / "inference" / "configs" / "kimi_linear_48b_a3b.json"


@pytest.fixture
def published() -> dict:
    return json.loads(PUBLISHED.read_text())


def test_published_kimi_linear_config(published):
    spec = parse_config(published)
    assert spec.num_layers == 27 and spec.hidden_size == 2304 and spec.vocab_size == 163840
    assert spec.mla_layers == (3, 7, 11, 15, 19, 23, 26)  # 1-based [4, 8, ..., 27]
    assert len(spec.kda_layers) == 20 and spec.layer_kinds[0] == KDA and spec.layer_kinds[3] == MLA
    assert spec.mlp_kinds[0] == DENSE and set(spec.mlp_kinds[1:]) == {MOE}
    assert spec.kda.num_heads == 32 and spec.kda.head_dim == 128 and spec.kda.conv_kernel_size == 4
    m = spec.mla
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (
        None,
        512,
        128,
        64,
        128,
    )
    assert not m.use_rope  # mla_use_nope
    e = spec.moe
    assert (e.num_experts, e.top_k, e.intermediate_size, e.num_shared_experts) == (256, 8, 1024, 1)
    assert e.routed_scaling_factor == pytest.approx(2.446) and e.renormalize
    assert spec.dsa is None and spec.vision is None
    assert load_config(PUBLISHED) == spec


def test_dsa_fields_add_an_indexer(published):
    cfg = dict(published, q_lora_rank=1536, index_topk=2048, index_n_heads=64, index_head_dim=128)
    spec = parse_config(cfg)
    assert (spec.dsa.topk, spec.dsa.num_heads, spec.dsa.head_dim) == (2048, 64, 128)


def test_vision_wrapper(published):
    cfg = {
        "model_type": "kimi_k25",
        "text_config": published,
        "vision_config": {"patch_size": 14, "hidden_size": 1152, "intermediate_size": 4304, "num_attention_heads": 16,
                          "num_hidden_layers": 27, "merge_kernel_size": [2, 2], "hidden_act": "gelu_pytorch_tanh"},
        "image_token_id": 163605,
        "projection_hidden_size": 1152,
    }  # fmt: skip
    spec = parse_config(cfg)
    assert (
        spec.vision.patch_size == 14 and spec.vision.merge_kernel == (2, 2) and spec.vision.merged_dim == 4608
    )
    assert spec.image_token_id == 163605 and spec.num_layers == 27


def _mutate(cfg: dict, path: str, value) -> dict:
    cfg = copy.deepcopy(cfg)
    node = cfg
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return cfg


_DELETE = object()

BAD = [
    ("mla_use_output_gate", True, "mla_use_output_gate"),
    ("hidden_act", "situ", "hidden_act"),
    ("linear_attn_config.full_attn_layers", [0, 4], "full_attn_layers"),
    ("linear_attn_config.full_attn_layers", [3, 4, 8, 12, 16, 20, 24, 27], "kda_layers"),
    ("linear_attn_config.kda_layers", [1, 2, 3], "linear_attn_config"),
    ("linear_attn_config.gate_lower_bound", -5.0, "gate_lower_bound"),
    ("num_experts_per_token", 300, "num_experts_per_token"),
    ("num_expert_group", 3, "num_expert_group"),
    ("num_key_value_heads", 8, "num_key_value_heads"),
    ("kv_lora_rank", _DELETE, "kv_lora_rank"),
    ("hidden_size", "2304", "hidden_size"),
    ("moe_router_activation_func", "softmax", "moe_router_activation_func"),
    ("rope_scaling", {"type": "yarn"}, "rope_scaling"),
    ("index_topk", 2048, "index_n_heads"),
    ("model_type", "llama", "model_type"),
]


@pytest.mark.parametrize(("path", "value", "field"), BAD, ids=[f"{p}={v!r}"[:48] for p, v, _ in BAD])
def test_bad_fields_are_named(published, path, value, field):
    with pytest.raises(ConfigError) as info:
        parse_config(_mutate(published, path, value))
    assert field in str(info.value)


def test_dsa_needs_q_lora(published):
    with pytest.raises(ConfigError, match="q_lora_rank"):
        parse_config(dict(published, index_topk=64, index_n_heads=4, index_head_dim=64))


def test_unreadable_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path)


K25_VISION = {  # the published Kimi-K2.5 spellings
    "init_pos_emb_height": 64, "init_pos_emb_time": 4, "init_pos_emb_width": 64, "merge_kernel_size": [2, 2],
    "merge_type": "sd2_tpool", "mm_hidden_size": 1152, "mm_projector_type": "patchmerger", "model_type": "",
    "patch_size": 14, "pos_emb_type": "divided_fixed", "projector_hidden_act": "gelu", "projector_ln_eps": 1e-05,
    "text_hidden_size": 2304, "video_attn_type": "spatial_temporal", "vt_hidden_size": 1152,
    "vt_intermediate_size": 4304, "vt_num_attention_heads": 16, "vt_num_hidden_layers": 27,
}  # fmt: skip


def test_published_vision_spellings_equal_transformers_spellings(published):
    wrap = {"model_type": "kimi_k25", "text_config": published, "media_placeholder_token_id": 163605}
    native = parse_config({**wrap, "vision_config": K25_VISION})
    hf = parse_config(
        {**wrap, "vision_config": {"hidden_size": 1152, "intermediate_size": 4304, "num_attention_heads": 16,
                                   "num_hidden_layers": 27, "pos_emb_height": 64, "pos_emb_width": 64}}
    )  # fmt: skip
    assert native == hf and native.vision.num_layers == 27 and native.image_token_id == 163605


@pytest.mark.parametrize(
    ("key", "value"),
    [("mm_projector_type", "patchmergerv2"), ("text_hidden_size", 7168), ("mm_hidden_size", 1024)],
)
def test_unsupported_vision_variants_are_named(published, key, value):
    cfg = {"model_type": "kimi_k25", "text_config": published, "image_token_id": 163605,
           "vision_config": {**K25_VISION, key: value}}  # fmt: skip
    with pytest.raises(ConfigError, match=key):
        parse_config(cfg)
