"""`dayzero analyze`: parameter totals of the published Kimi-Linear-48B-A3B, bytes, plans, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.analyze import analyze, cache_bytes, parameter_counts, plan_parallel
from inference.config import load_config

PUBLISHED = Path(__file__).resolve().parents[2] / "inference" / "configs" / "kimi_linear_48b_a3b.json"


@pytest.fixture(scope="module")
def spec():
    return load_config(PUBLISHED)


def test_published_totals_match_the_model_name(spec):
    head, comp = parameter_counts(spec)
    # "48B" total: the non-embedding count (embedding table and LM head excluded) is the match.
    assert abs(head["total_non_embedding"] / 48e9 - 1) < 0.02, head
    assert abs(head["total"] / 48e9 - 1) < 0.03, head  # 49.12B with both vocab matrices
    # "A3B": what a token multiplies with (selected experts, shared parts, LM head); see the report.
    assert abs(head["active"] / 3e9 - 1) < 0.04, head
    assert comp["routed_experts"] == 26 * 256 * 3 * 2304 * 1024


def test_published_total_equals_transformers_own_model(spec):
    """An independent count: transformers' KimiLinearForCausalLM built (on the meta device, no
    memory) from the published config.json holds exactly the parameters + buffers we count."""
    import torch
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    cfg = json.loads(PUBLISHED.read_text())
    hc = KimiLinearConfig(**{k: v for k, v in cfg.items() if k not in ("auto_map", "architectures")})
    with torch.device("meta"):
        hf = KimiLinearForCausalLM(hc)
    n = sum(p.numel() for p in hf.parameters()) + sum(b.numel() for b in hf.buffers())
    assert parameter_counts(spec)[0]["total"] == n == 49_122_681_728


def test_counts_equal_the_built_model():
    import torch

    from inference.config import parse_config
    from inference.model import HybridCacheSpec, build_model
    from testing.kimi_hf_mapping import tiny_kimi_linear_config

    for cfg in (
        tiny_kimi_linear_config(),
        tiny_kimi_linear_config(
            q_lora_rank=24, index_topk=8, index_n_heads=2, index_head_dim=16, mla_use_nope=False
        ),
        json.loads((PUBLISHED.parent / "tiny_hybrid_vl.json").read_text()),  # DSA + vision tower + projector
    ):
        s = parse_config(cfg)
        model = build_model(s)
        n = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
        assert parameter_counts(s)[0]["total"] == n
        cs = HybridCacheSpec.from_model_spec(s, torch.bfloat16)
        assert cache_bytes(s) == (cs.kv_bytes_per_token, cs.state_bytes_per_slot)


def test_kv_and_state_bytes(spec):
    kv, state = cache_bytes(spec)
    assert kv == 7 * (512 + 64) * 2
    assert state == 20 * (32 * 128 * 128 * 4 + 3 * 4096 * 3 * 2)


def test_plans_keep_headroom_and_refuse_what_cannot_fit(spec):
    (best, *_) = plan_parallel(spec, 1, 141.0, 131072)
    assert best.fits and best.weight_bytes_per_gpu + best.kv_bytes_per_gpu <= 0.8 * 141 * 1024**3
    (small, *_) = plan_parallel(spec, 1, 80.0, 131072)
    assert not small.fits  # 91.5 GiB of bf16 weights > 64 GiB usable
    a = analyze(spec, gpu_mem_gib=80.0, context=131072)
    assert a.plan.fits and a.plan.gpus == 2
    assert analyze(spec, gpu_mem_gib=80.0, weight_dtype="fp8").plan.gpus == 1


def test_cli_text_and_json(capsys):
    from orchestrator.cli import main

    assert main(["analyze", str(PUBLISHED), "--gpus", "2", "--gpu-mem", "80", "--context", "65536"]) == 0
    text = capsys.readouterr().out
    assert "TP=2" in text and "active per token" in text and "operators [kda]" in text
    assert main(["analyze", str(PUBLISHED), "--gpus", "1", "--json"]) == 1  # does not fit one 80 GiB GPU
    data = json.loads(capsys.readouterr().out)
    assert data["params"]["total"] > 4.9e10 and data["plan"]["fits"] is False


def test_cli_names_a_bad_field(tmp_path, capsys):
    from orchestrator.cli import main

    cfg = json.loads(PUBLISHED.read_text())
    cfg["hidden_act"] = "gelu"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["analyze", str(tmp_path)]) == 2
    assert "hidden_act" in capsys.readouterr().err


# ------------------------------------------------------------------ every family, against transformers

CONFIGS = PUBLISHED.parent
# (config file, transformers config class, model class); the model is built on the meta device
FAMILIES = [
    ("kimi_linear_48b_a3b.json", "KimiLinearConfig", "KimiLinearForCausalLM"),
    ("deepseek_v3_671b.json", "DeepseekV3Config", "DeepseekV3ForCausalLM"),
    ("deepseek_v32_exp.json", "DeepseekV32Config", "DeepseekV32ForCausalLM"),
    ("kimi_k2_instruct.json", "DeepseekV3Config", "DeepseekV3ForCausalLM"),
    ("qwen3_next_80b_a3b.json", "Qwen3NextConfig", "Qwen3NextForCausalLM"),
    ("kimi_k25.json", "Kimi_K25Config", "Kimi_K25ForConditionalGeneration"),
]


def _hf_kwargs(cfg: dict) -> dict:
    """The published config as transformers' config class takes it: loader-only keys dropped (the
    quantizer would swap Linear modules), K2.5's MoonViT spellings as transformers names them."""
    from inference.config.multimodal import _normalise_vision

    out = {k: v for k, v in cfg.items() if k not in ("auto_map", "architectures", "quantization_config")}
    if "text_config" in out:
        out["text_config"] = {k: v for k, v in out["text_config"].items() if k != "quantization_config"}
        vision = _normalise_vision(out["vision_config"])
        keep = (
            "patch_size hidden_size intermediate_size num_attention_heads num_hidden_layers pos_emb_height "
        )
        out["vision_config"] = {
            k: vision[k] for k in (keep + "pos_emb_width pos_emb_time merge_kernel_size").split()
        }
        out["image_token_id"] = out.pop("media_placeholder_token_id")
        out["projection_hidden_size"] = vision["mm_hidden_size"]
        out["tie_word_embeddings"] = cfg["text_config"]["tie_word_embeddings"]
        for k in ("ignore_index", "use_unified_vision_chunk", "video_placeholder"):
            out.pop(k, None)
    return out


def _stored_numel(model) -> int:
    """Parameters + persistent buffers, tied tensors once: what a checkpoint of the model holds."""
    seen, n = set(), 0
    for t in model.state_dict().values():
        if id(t) not in seen:
            seen.add(id(t))
            n += t.numel()
    return n


@pytest.mark.parametrize(
    ("name", "config_cls", "model_cls"), FAMILIES, ids=[f[0].removesuffix(".json") for f in FAMILIES]
)
def test_family_totals_equal_transformers(name, config_cls, model_cls):
    import torch
    import transformers

    cfg = json.loads((CONFIGS / name).read_text())
    hc = getattr(transformers, config_cls)(**_hf_kwargs(cfg))
    with torch.device("meta"):
        hf = getattr(transformers, model_cls)(hc)
    head, comp = parameter_counts(load_config(CONFIGS / name))
    assert head["total"] == _stored_numel(hf)
    # active: transformers holds every routed expert of a layer in one fused tensor; take them out
    # and add back top_k of them per MoE layer, which is how `active` is defined
    routed = sum(p.numel() for n, p in hf.named_parameters() if ".experts." in n)
    assert routed == comp.get("routed_experts", 0)


PUBLISHED_FIGURES = [  # (config, headline total, headline active, tolerance): the model cards' names
    ("deepseek_v3_671b.json", 671e9, 37e9, 0.02),
    ("deepseek_v32_exp.json", 671e9, 37e9, 0.02),
    ("kimi_k2_instruct.json", 1.04e12, 32e9, 0.02),
    ("qwen3_next_80b_a3b.json", 80e9, 3.5e9, 0.02),
]


@pytest.mark.parametrize(
    ("name", "total", "active", "tol"), PUBLISHED_FIGURES, ids=[f[0] for f in PUBLISHED_FIGURES]
)
def test_family_headline_figures(name, total, active, tol):
    head, _ = parameter_counts(load_config(CONFIGS / name))
    assert abs(head["total"] / total - 1) < tol, head
    assert abs(head["active"] / active - 1) < 0.05, head


def test_family_cache_bytes():
    v3 = load_config(CONFIGS / "deepseek_v3_671b.json")
    assert cache_bytes(v3) == (61 * (512 + 64) * 2, 0)  # MLA latent only, no recurrent state
    v32 = load_config(CONFIGS / "deepseek_v32_exp.json")
    assert cache_bytes(v32) == (61 * (512 + 64 + 128) * 2, 0)  # + the indexer key
    qn = load_config(CONFIGS / "qwen3_next_80b_a3b.json")
    kv, state = cache_bytes(qn)
    assert kv == 12 * 2 * 2 * 256 * 2  # 12 GQA layers, K and V of 2 kv heads x 256, bf16
    assert state == 36 * (32 * 128 * 128 * 4 + (2 * 2048 + 4096) * 3 * 2)


def test_family_plans_take_the_fewest_gpus():
    v3 = load_config(CONFIGS / "deepseek_v3_671b.json")
    # fp8 GEMMs would keep the checkpoint's bytes: 8 GPUs
    a = analyze(v3, gpu_mem_gib=141.0, context=32768, weight_dtype="fp8")
    assert a.weight_dtype == "fp8" and a.plan.fits and a.plan.gpus == 8 and (a.plan.tp, a.plan.pp) == (8, 1)
    assert a.plan.weight_bytes_per_gpu + a.plan.kv_bytes_per_gpu <= 0.8 * 141 * 1024**3
    # this runtime dequantizes at load (the default plan): 1.25 TiB of bf16 needs 16
    served = analyze(v3, gpu_mem_gib=141.0, context=32768)
    assert served.weight_dtype == "bf16" and served.plan.fits and served.plan.gpus == 16
    bf16 = analyze(v3, gpu_mem_gib=141.0, context=32768, weight_dtype="bf16", gpus=8)
    assert not bf16.plan.fits  # 1.25 TiB of bf16 weights do not fit 8 x 112.8 GiB usable
    qn = analyze(load_config(CONFIGS / "qwen3_next_80b_a3b.json"), gpus=8, gpu_mem_gib=141.0)
    assert qn.plan.gpus == 2 and qn.plan.fits  # 148 GiB of bf16: two GPUs, not the eight offered


def test_gqa_split_rule():
    from inference.analyze.plan import _split_problem

    qn = load_config(CONFIGS / "qwen3_next_80b_a3b.json")
    assert _split_problem(qn, 4) == ""  # 2 kv heads replicated over 4 ranks
    assert "GDN key heads" in _split_problem(qn, 32)
    assert "not divisible" in _split_problem(load_config(CONFIGS / "kimi_k2_instruct.json"), 3)


def test_diff_lists_what_b_needs():
    from inference.analyze import diff

    kimi, v32 = load_config(PUBLISHED), load_config(CONFIGS / "deepseek_v32_exp.json")
    d = diff(kimi, v32, context=1000)
    new = {op.name for _, op in d.new_operators}
    assert {"DSA lightning indexer", "DSA top-k select + sparse MLA attention", "YaRN rope scaling"} <= new
    assert not any(name.startswith("KDA") for name in new)
    changed = {op.name: (old, op.shape) for _, op, old in d.new_shapes}
    assert changed["MLA rope on q_pe and the shared key"] == ("none (NoPE)", "interleaved, 64 dims")
    assert "MLA q projection" in changed  # q_lora 1536 replaces the direct projection
    assert {op.name for _, op in d.dropped_operators} >= {
        "KDA gated delta rule (chunk prefill / recurrent decode)"
    }
    kv = d.memory["kv_bytes_per_token"]
    assert (kv["a"], kv["b"], kv["delta"]) == (8064, 85888, 85888 - 8064)
    assert d.memory["state_bytes_per_sequence"]["b"] == 0
    on_disk = d.memory["weight_bytes_on_disk"]  # Kimi-Linear ships bf16, V3.2 fp8
    assert (
        on_disk["a"] == d.memory["weight_bytes_bf16"]["a"]
        and on_disk["b"] < 0.51 * d.memory["weight_bytes_bf16"]["b"]
    )
    assert d.memory["memory_per_sequence_at_1000"]["delta"] == (85888 - 8064) * 1000 - cache_bytes(kimi)[1]
    assert diff(v32, v32).new_operators == [] and diff(v32, v32).new_shapes == []

    qn = load_config(CONFIGS / "qwen3_next_80b_a3b.json")
    new = {op.name for _, op in diff(kimi, qn).new_operators}
    assert (
        "gated delta rule (chunk prefill / recurrent decode)" in new
        and "GQA causal attention (prefill + paged decode)" in new
    )
    assert "sigmoid output gate" in new and "MoE router (softmax)" in new


def test_cli_diff_text_and_json(capsys):
    from orchestrator.cli import main

    a, b = str(PUBLISHED), str(CONFIGS / "qwen3_next_80b_a3b.json")
    assert main(["analyze", "--diff", a, b]) == 0
    text = capsys.readouterr().out
    assert (
        "new operators in qwen3_next" in text
        and "+ [gdn] gated delta rule" in text
        and "kv_bytes_per_token" in text
    )
    assert main(["analyze", "--diff", a, b, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory"]["kv_bytes_per_token"]["b"] == 24576 and data["new_operators"]
    assert main(["analyze"]) == 2 and "either CONFIG or --diff" in capsys.readouterr().err
    assert main(["analyze", a, "--context", "0"]) == 2


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.json")))
def test_cli_on_every_bundled_config(name, capsys):
    from orchestrator.cli import main

    assert main(["analyze", str(CONFIGS / name), "--gpu-mem", "141", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (
        data["plan"]["fits"]
        and data["params"]["total"] == parameter_counts(load_config(CONFIGS / name))[0]["total"]
    )


def test_quantized_checkpoint_bytes_on_disk_and_in_memory():
    """The published formats' bytes: FP8 for every DeepSeek-V3 decoder linear but the routers (one
    fp32 scale per 128x128 tile), INT4 for the 60 x 384 routed experts of K2.5 (per row 4 bytes per
    8 values + a bf16 scale per 32 + the 2 x int64 shape); the rest bf16. Loaded: all bf16."""
    from inference.analyze import weight_bytes

    k25 = load_config(CONFIGS / "kimi_k25.json")
    b = weight_bytes(k25)
    experts = 60 * 384 * 3
    assert b.quantized_params == experts * 7168 * 2048  # lm_head, attention, shared, dense: ignored
    per_expert_matrix = {  # (rows, cols) of gate/up and of down
        (2048, 7168): 2048 * (4 * 7168 // 8 + 2 * 7168 // 32) + 16,
        (7168, 2048): 7168 * (4 * 2048 // 8 + 2 * 2048 // 32) + 16,
    }
    stored = 60 * 384 * (2 * per_expert_matrix[(2048, 7168)] + per_expert_matrix[(7168, 2048)])
    total = parameter_counts(k25)[0]["total"]
    assert b.disk == stored + (total - b.quantized_params) * 2
    assert b.memory == total * 2 and b.stored_as == "int4 + bfloat16"
    v3 = weight_bytes(load_config(CONFIGS / "deepseek_v3_671b.json"))
    assert 0.5 < v3.disk / v3.memory < 0.51  # fp8 + fp32 tile scales + bf16 embeddings / norms
    a = analyze(k25, gpu_mem_gib=141.0)
    assert any("int4 (groups of 32)" in n for n in a.notes)


# ------------------------------------------------------------------ vision-language: the driver's tower on GPU 0


def test_vision_tower_is_planned_whole_on_gpu0_and_sizes_the_pool():
    """Kimi-K2.5 at 8 GPUs: the tower and projector (0.47B, 0.94 GB bf16) are GPU 0's in full,
    not 1/8 of them on every GPU; GPU 0's free memory (less by the tower) sizes the pool: a GPU
    whose free bytes hold k sequences plus half the tower holds k without it and k - 1 with it."""
    from dataclasses import replace

    from inference.analyze import driver_params, rank_params

    k25 = load_config(CONFIGS / "kimi_k25.json")
    _, comp = parameter_counts(k25)
    tower = comp["vision_tower"] + comp["mm_projector"]
    assert driver_params(k25) == tower and abs(tower * 2 / 0.94e9 - 1) < 0.01
    (plan, *_) = plan_parallel(k25, 8, 141.0, 131072, "int4")
    assert plan.tp == 8 and plan.driver_weight_bytes == tower * 2  # bf16: no format quantizes it
    text = replace(k25, vision=None)
    assert driver_params(text) == 0
    assert plan.weight_bytes_per_gpu == rank_params(text, 8) * (0.5 + 2 / 32)  # no tower share
    kv, state = plan.kv_bytes_per_gpu, plan.state_bytes_per_gpu
    k = 3
    usable = plan.weight_bytes_per_gpu + k * (kv + state) + plan.driver_weight_bytes / 2
    gib = usable / (1 - 0.2) / 1024**3
    with_tower = {(p.tp, p.pp): p for p in plan_parallel(k25, 8, gib, 131072, "int4")}[(8, 1)]
    without = {(p.tp, p.pp): p for p in plan_parallel(text, 8, gib, 131072, "int4")}[(8, 1)]
    assert (without.max_sequences, with_tower.max_sequences) == (k, k - 1)
    assert without.driver_weight_bytes == 0


def test_report_names_the_driver_held_tower(capsys):
    from orchestrator.cli import main

    main(["analyze", str(CONFIGS / "kimi_k25.json"), "--gpus", "8", "--gpu-mem", "141", "--weights", "int4"])
    out = capsys.readouterr().out
    assert "vision tower + projector (471.144M, 0.88 GiB bf16) held whole by the driver on GPU 0" in out
    assert "+ 0.88 GiB on GPU 0 (driver's vision tower)" in out.split("\nplan: ")[1]
    main(["analyze", str(PUBLISHED), "--gpus", "2"])
    assert "GPU 0" not in capsys.readouterr().out  # a text model: every GPU alike


def test_ffn_widths_must_split_as_the_runtime_slices_them():
    """The runtime slices the dense FFN, each routed expert and the shared expert over TP, so a
    plan whose TP does not divide those widths is not offered, and counting its shard refuses."""
    from inference.analyze import rank_params
    from inference.analyze.plan import _split_problem
    from inference.config import parse_config

    cfg = json.loads((CONFIGS / "tiny_deepseek_v32.json").read_text())  # 4 MLA heads, 8 experts
    assert _split_problem(parse_config(cfg), 4) == ""
    for field, width in (("intermediate_size", 98), ("moe_intermediate_size", 34)):
        odd = parse_config({**cfg, field: width})
        assert _split_problem(odd, 2) == "" and f"{field} {width} not divisible by TP 4" in _split_problem(
            odd, 4
        )
        with pytest.raises(ValueError, match="choose a TP that divides it"):
            rank_params(odd, 4)
        assert all(p.tp != 4 for p in plan_parallel(odd, 4, 80.0, 1024))
