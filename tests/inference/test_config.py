"""Config parsing: the published Kimi-Linear config, DSA fields, the vision wrapper, clear refusals."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest

from inference.config import DENSE, KDA, MLA, MOE, ConfigError, QuantSpec, load_config, parse_config

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


# ------------------------------------------------------------------ the other families' readers

CONFIGS = PUBLISHED.parent


def _load(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


def test_deepseek_v3_reader():
    spec = parse_config(_load("deepseek_v3_671b.json"))
    assert spec.model_type == "deepseek_v3" and spec.kda is None and spec.layer_kinds == (MLA,) * 61
    assert spec.mlp_kinds[:3] == (DENSE,) * 3 and set(spec.mlp_kinds[3:]) == {MOE}
    m, e = spec.mla, spec.moe
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim, m.use_rope) == (1536, 512, 64, True)
    assert dict(m.rope_scaling)["factor"] == 40 and dict(m.rope_scaling)["type"] == "yarn"
    assert (e.num_experts, e.top_k, e.num_groups, e.topk_groups, e.num_shared_experts) == (256, 8, 8, 4, 1)
    assert e.scoring == "sigmoid" and e.renormalize and e.routed_scaling_factor == 2.5
    assert spec.mtp.num_layers == 1 and spec.dsa is None
    assert spec.quantization == QuantSpec("fp8", 8, block=(128, 128))


def test_deepseek_v32_reader_adds_the_indexer():
    spec = parse_config(_load("deepseek_v32_exp.json"))
    assert spec.model_type == "deepseek_v32" and (spec.dsa.topk, spec.dsa.num_heads, spec.dsa.head_dim) == (
        2048,
        64,
        128,
    )
    cfg = {k: v for k, v in _load("deepseek_v32_exp.json").items() if not k.startswith("index_")}
    with pytest.raises(ConfigError, match="index_topk"):
        parse_config(cfg)  # a V3.2 config without its indexer is a misread, not a V3


def test_kimi_k2_and_k25_readers():
    k2 = parse_config(_load("kimi_k2_instruct.json"))
    assert k2.model_type == "kimi_k2" and k2.moe.num_experts == 384 and k2.moe.num_groups == 1
    assert k2.mla.num_heads == 64 and k2.mlp_kinds.count(DENSE) == 1 and k2.vocab_size == 163840
    k25 = parse_config(_load("kimi_k25.json"))
    assert (
        k25.wrapper_type == "kimi_k25" and k25.model_type == "kimi_k2" and k25.quantization.method == "int4"
    )
    assert k25.quantization.group_size == 32 and "re:.*self_attn.*" in k25.quantization.ignore
    assert k25.vision.num_layers == 27 and k25.vision.merged_dim == 4608 and k25.image_token_id == 163605
    assert replace(k25.mla, rope_scaling=k2.mla.rope_scaling) == k2.mla  # same text model, 256K YaRN


def test_qwen3_next_reader():
    spec = parse_config(_load("qwen3_next_80b_a3b.json"))
    assert spec.model_type == "qwen3_next" and spec.mla is None and spec.kda is None
    assert spec.gqa_layers == tuple(range(3, 48, 4)) and len(spec.gdn_layers) == 36
    g, a, e = spec.gdn, spec.gqa, spec.moe
    assert (g.num_k_heads, g.num_v_heads, g.k_head_dim, g.v_head_dim, g.conv_dim) == (16, 32, 128, 128, 8192)
    assert (a.num_heads, a.num_kv_heads, a.head_dim, a.rotary_dim, a.output_gate) == (16, 2, 256, 64, True)
    assert (e.num_experts, e.top_k, e.scoring, e.shared_width, e.shared_expert_gate) == (
        512,
        10,
        "softmax",
        512,
        True,
    )
    assert set(spec.mlp_kinds) == {MOE}
    # transformers-5 exports spell the layer kinds out; the same model either way
    listed = dict(_load("qwen3_next_80b_a3b.json"), layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 12)  # fmt: skip
    del listed["full_attention_interval"]
    assert parse_config(listed) == spec
    dense_first = parse_config(dict(_load("qwen3_next_80b_a3b.json"), mlp_only_layers=[0]))
    assert dense_first.mlp_kinds[0] == DENSE and dense_first.mlp_kinds[1] == MOE


FAMILY_BAD = [
    ("deepseek_v3_671b.json", "n_routed_experts_x", 3, "n_routed_experts_x"),  # unknown field
    ("deepseek_v3_671b.json", "topk_method", "greedy", "topk_method"),
    ("deepseek_v3_671b.json", "scoring_func", "softmax", "scoring_func"),
    ("deepseek_v3_671b.json", "rope_scaling", {"type": "dynamic", "factor": 2}, "rope_scaling"),
    ("deepseek_v3_671b.json", "rope_scaling", {"type": "yarn"}, "rope_scaling.factor"),
    (
        "deepseek_v3_671b.json",
        "rope_scaling",
        {"type": "yarn", "factor": 4, "original_max_position_embeddings": 8, "ntk_alpha": 2},
        "rope_scaling.ntk_alpha",
    ),
    (
        "deepseek_v3_671b.json",
        "rope_scaling",
        {"type": "yarn", "factor": 0.5, "original_max_position_embeddings": 8},
        "rope_scaling.factor",
    ),
    ("deepseek_v3_671b.json", "n_group", 7, "n_group"),
    ("deepseek_v3_671b.json", "rope_interleave", False, "rope_interleave"),
    ("deepseek_v3_671b.json", "mlp_layer_types", ["sparse"] * 61, "mlp_layer_types"),
    ("deepseek_v3_671b.json", "quantization_config", {"quant_method": "gptq"}, "quant_method"),
    ("deepseek_v3_671b.json", "quantization_config.activation_scheme", "static", "activation_scheme"),
    ("deepseek_v3_671b.json", "quantization_config.weight_block_size", [128], "weight_block_size"),
    ("deepseek_v3_671b.json", "quantization_config.fmt", "e5m2", "fmt"),
    ("kimi_k25.json", "text_config.quantization_config.format", "int-quantized", "format"),
    (
        "kimi_k25.json",
        "text_config.quantization_config.config_groups.group_0.weights.symmetric",
        False,
        "symmetric",
    ),
    (
        "kimi_k25.json",
        "text_config.quantization_config.config_groups.group_0.weights.num_bits",
        8,
        "num_bits",
    ),
    (
        "kimi_k25.json",
        "text_config.quantization_config.config_groups.group_0.weights.group_size",
        0,
        "group_size",
    ),
    (
        "kimi_k25.json",
        "text_config.quantization_config.config_groups.group_0.input_activations",
        {"num_bits": 8},
        "input_activations",
    ),
    ("deepseek_v32_exp.json", "q_lora_rank", None, "q_lora_rank"),
    ("kimi_k2_instruct.json", "num_key_value_heads", 8, "num_key_value_heads"),
    ("qwen3_next_80b_a3b.json", "linear_num_value_heads", 24, "linear_num_value_heads"),
    ("qwen3_next_80b_a3b.json", "num_key_value_heads", 3, "num_key_value_heads"),
    ("qwen3_next_80b_a3b.json", "use_sliding_window", True, "use_sliding_window"),
    ("qwen3_next_80b_a3b.json", "layer_types", ["full_attention"] * 47, "layer_types"),
    ("qwen3_next_80b_a3b.json", "mlp_only_layers", [48], "mlp_only_layers"),
    ("qwen3_next_80b_a3b.json", "partial_rotary_factor", 0.0, "partial_rotary_factor"),
    ("qwen3_next_80b_a3b.json", "linear_attn_config", {}, "linear_attn_config"),  # another family's field
    ("kimi_k25.json", "text_config.model_type", "llama", "text_config.model_type"),
    ("kimi_k25.json", "text_config.mla_use_nope", True, "text_config.mla_use_nope"),
]


@pytest.mark.parametrize(
    ("name", "path", "value", "field"),
    FAMILY_BAD,
    ids=[f"{n.split('_')[0]}:{p}={v!r}"[:60] for n, p, v, _ in FAMILY_BAD],
)
def test_family_bad_fields_are_named(name, path, value, field):
    with pytest.raises(ConfigError) as info:
        parse_config(_mutate(_load(name), path, value))
    assert field in str(info.value)


def test_known_ignored_fields_change_nothing():
    """Training knobs and provenance are listed as known-and-ignored, so they may take any value."""
    base = parse_config(_load("deepseek_v3_671b.json"))
    for key, value in (("aux_loss_alpha", 0.5), ("seq_aux", False), ("ep_size", 64), ("pretraining_tp", 4)):
        assert parse_config(dict(_load("deepseek_v3_671b.json"), **{key: value})) == base
    q = parse_config(dict(_load("qwen3_next_80b_a3b.json"), router_aux_loss_coef=0.1, sliding_window=4096))
    assert q == parse_config(_load("qwen3_next_80b_a3b.json"))


def test_transformers5_rope_parameters_spelling():
    cfg = _load("kimi_k2_instruct.json")
    yarn = dict(cfg.pop("rope_scaling"), rope_theta=cfg.pop("rope_theta"))
    yarn["rope_type"] = yarn.pop("type")
    spec = parse_config(dict(cfg, rope_parameters=yarn))
    assert spec.mla.rope_theta == 50000.0 and dict(spec.mla.rope_scaling)["factor"] == 32.0
