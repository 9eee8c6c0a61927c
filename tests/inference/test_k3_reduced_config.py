"""`inference/configs/kimi_k3_reduced.json`: K3's published widths in a model one GPU holds with a
1M-token prompt (the end-to-end DSA vs dense benchmark's model, `benchmarks/k3_reduced.py`)."""

from __future__ import annotations

import json
from pathlib import Path

from inference.analyze import analyze
from inference.config import KDA, MLA, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "inference" / "configs"
M = 1 << 20


def test_reduced_k3_keeps_the_published_layer_shapes():
    k3 = load_config(CONFIGS / "kimi_k3_shaped_2p8t.json")
    spec = load_config(CONFIGS / "kimi_k3_reduced.json")
    assert spec.hidden_size == k3.hidden_size == 7168
    m, d = spec.mla, spec.dsa
    assert (m.num_heads, m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim, m.q_lora_rank) == (
        128, 512, 64, 128, 128, 1536,
    )  # fmt: skip
    assert d is not None and (d.num_heads, d.head_dim, d.topk) == (64, 128, 2048)
    assert list(spec.layer_kinds) == [KDA, KDA, KDA, MLA] == list(k3.layer_kinds[:4])  # the published 3 : 1


def test_analyze_fits_one_h100_at_1m_tokens():
    spec = load_config(CONFIGS / "kimi_k3_reduced.json")
    a = analyze(spec, gpus=1, gpu_mem_gib=78.0, context=M)
    assert a.plan is not None and a.plan.fits and a.plan.gpus == 1
    # room past weights + the 1M prompt's KV for prefill activations (cuDNN pieces, MoE, indexer)
    left = a.plan.usable_bytes_per_gpu - a.plan.weight_bytes_per_gpu - a.plan.kv_bytes_per_gpu
    assert left > 30 * (1 << 30)


def test_cli_reports_it_fits(capsys):
    from orchestrator.cli import main

    cfg = str(CONFIGS / "kimi_k3_reduced.json")
    assert main(["analyze", cfg, "--gpus", "1", "--gpu-mem", "78", "--context", str(M), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["fits"] is True and data["layers"]["dsa"] == 1
