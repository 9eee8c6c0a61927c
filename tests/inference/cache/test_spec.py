"""The cache spec: torch-free, and the one byte arithmetic the pools, the planner and `analyze` use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference.analyze import cache_bytes
from inference.cache.spec import HybridCacheSpec, dtype_bytes
from inference.config import parse_config
from inference.engine.factory import small_model_config, small_vl_model_config
from inference.model.cache_tensors import HybridCacheTensors

REPO = Path(__file__).resolve().parents[3]
CONFIGS = Path(__file__).resolve().parents[3] / "inference" / "configs"


def test_the_spec_imports_without_torch():
    code = "import sys, inference.cache.spec, inference.analyze; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_dtype_bytes_takes_torch_dtypes_and_counts():
    assert [dtype_bytes(d) for d in (torch.float32, torch.bfloat16, torch.float8_e4m3fn, 2)] == [4, 2, 1, 2]


def test_bytes_by_hand():
    spec = HybridCacheSpec(
        mla_layers=(1, 3), kda_layers=(0, 2, 4), latent_dim=40, index_head_dim=16,
        kda_num_heads=2, kda_head_dim=8, conv_channels=48, conv_window=3, kv_dtype_bytes=2,
    )  # fmt: skip
    assert spec.kv_bytes_per_token == 2 * (40 + 16) * 2
    assert spec.state_bytes_per_slot == 3 * (2 * 8 * 8 * 4 + 48 * 3 * 2)
    fp8 = HybridCacheSpec(**{**{f: getattr(spec, f) for f in spec.__slots__}, "latent_fp8": True})
    assert fp8.kv_bytes_per_token == 2 * ((40 + 4) + (16 + 4))  # e4m3 rows and their fp32 scales


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.json")))
def test_analyze_reports_the_spec_bytes(name):
    import json

    model = parse_config(json.loads((CONFIGS / name).read_text()))
    spec = HybridCacheSpec.from_model_spec(model, torch.bfloat16)
    assert cache_bytes(model) == (spec.kv_bytes_per_token, spec.state_bytes_per_slot)


@pytest.mark.parametrize("config", [small_model_config(), small_vl_model_config()], ids=["text", "vl"])
def test_the_pools_allocate_what_the_spec_counts(config):
    spec = HybridCacheSpec.from_model_spec(parse_config(config), torch.float32)
    cache = HybridCacheTensors.allocate(
        spec, num_blocks=3, block_size=4, num_slots=2, device="cpu", dtype=torch.float32
    )
    kv = sum(t.nbytes for d in (cache.kv, cache.kv_scale, cache.index_k) for t in d.values())
    state = sum(t.nbytes for d in (cache.state, cache.conv) for t in d.values())
    assert kv == 3 * 4 * spec.kv_bytes_per_token
    assert state == 2 * spec.state_bytes_per_slot
