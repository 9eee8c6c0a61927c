"""`python -m benchmarks.k3_reduced`: the CPU smoke run (tiny dims, the same code path as the GPU
run) and, on the GPU, DSA with top-k >= context vs dense at the reduced K3 config's layer shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.k3_reduced import dense_spec, equivalence, indexers_off, model_config, plot

REPO = Path(__file__).resolve().parents[2]


def test_cpu_smoke_run(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "benchmarks.k3_reduced", "--quick"]
    env = dict(os.environ, OUT=str(tmp_path), OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    res = json.loads((tmp_path / "k3_reduced.json").read_text())
    assert res["quick"] is True and list(res["runs"]) == ["dense_96", "dsa_96", "dense_192", "dsa_192"]
    for row in res["runs"].values():
        assert row["ttft_s"] > 0 and row["decode_tok_per_s"] > 0, row
    eq = res["equivalence"]
    # fp32, top-k (64) >= every context (56 + 8): the sparse path selects every key
    assert eq["identical"] and eq["agreement"] == 1.0 and eq["first_divergence"] is None, eq
    assert eq["first_step_logits_max_abs_diff"] < 1e-4 * eq["first_step_logits_max_abs"], eq
    assert (tmp_path / "k3_reduced.png").stat().st_size > 0 or plot(res, str(tmp_path / "x.png")) is None


def test_plot_from_a_saved_run(tmp_path: Path) -> None:
    from benchmarks.k3_reduced import main

    saved = tmp_path / "run.json"
    rows = {"dense_131072": {"ttft_s": 3.0, "decode_tok_per_s": 300.0}, "dsa_131072": {"error": "OOM"}}
    saved.write_text(json.dumps({"device": "H100", "runs": rows}))
    main(["--plot-from", str(saved), "--plot", str(tmp_path / "k3.png")])
    pytest.importorskip("PIL")
    assert (tmp_path / "k3.png").stat().st_size > 0


def test_dense_variant_detaches_and_restores_the_indexers() -> None:
    from benchmarks.long_context import build

    cfg = model_config(quick=True)
    model, spec = build(cfg, torch.device("cpu"), torch.float32)
    assert spec.dsa is not None and dense_spec(cfg).dsa is None
    held = [m.indexer for m in model.modules() if getattr(m, "indexer", None) is not None]
    assert len(held) == 1
    with indexers_off(model):
        assert not any(getattr(m, "indexer", None) is not None for m in model.modules())
    assert [m.indexer for m in model.modules() if getattr(m, "indexer", None) is not None] == held


@pytest.mark.gpu
@torch.no_grad()
def test_gpu_dsa_topk_covering_context_equals_dense_at_k3_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reduced K3 config's attention shapes (hidden 7168; 128-head MLA, kv_lora_rank 512, rope
    64; indexer 64 x 128, top-2048; KDA 64 x 128) with few small experts and a short vocabulary
    (cheap to build), fp32 with the kernels on: a 2,032-token prompt and 16 greedy tokens, DSA
    (every key selected) vs dense: the same tokens, first-step logits within fp32 noise."""
    from benchmarks.long_context import build

    monkeypatch.setenv("DAYZERO_KERNELS", "fast")
    cfg = model_config(quick=False)
    cfg.update(vocab_size=4096, intermediate_size=2048, num_experts=4, num_experts_per_token=2,
               moe_intermediate_size=256)  # fmt: skip
    device = torch.device("cuda")
    model, spec = build(cfg, device, torch.float32)
    eq = equivalence(model, {"dsa": spec, "dense": dense_spec(cfg)}, cfg, torch.float32, device, 16)
    assert eq["prompt_tokens"] == 2032
    assert eq["identical"], eq
    assert eq["first_step_logits_max_abs_diff"] <= 1e-3 * eq["first_step_logits_max_abs"], eq
