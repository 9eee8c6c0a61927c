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
    from tests.inference.model.kimi_hf_mapping import tiny_kimi_linear_config

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
