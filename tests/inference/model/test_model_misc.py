"""Bundled configs, DSA inside the full model (batched == alone), batch metadata checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference.config import load_config
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, build_model
from testing.kimi_hf_mapping import FP32_REL_TOL, assert_close_rel

CONFIGS = Path(__file__).resolve().parents[3] / "inference" / "configs"


@pytest.fixture(scope="module")
def tiny():
    spec = load_config(CONFIGS / "tiny_hybrid_vl.json")
    return spec, build_model(spec, seed=0)


def _cache(spec, slots: int = 4) -> HybridCacheTensors:
    cs = HybridCacheSpec.from_model_spec(spec, torch.float32)
    return HybridCacheTensors.allocate(cs, 32, 16, slots, "cpu", torch.float32)


def test_bundled_configs_parse():
    assert load_config(CONFIGS / "kimi_linear_48b_a3b.json").num_layers == 27
    spec = load_config(CONFIGS / "tiny_hybrid_vl.json")
    assert spec.dsa is not None and spec.vision is not None and spec.image_token_id == 163605


@torch.no_grad()
def test_dsa_model_batched_and_chunked_equals_alone(tiny):
    """The indexer picks from each sequence's own keys, also when sequences share a step."""
    spec, model = tiny
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, 1000, (90,), generator=gen), torch.randint(0, 1000, (75,), generator=gen)
    tables = [[0, 1, 2, 3, 4, 5], [10, 11, 12, 13, 14]]

    def alone(ids, table):
        meta = ForwardMeta.for_sequences([ids.shape[0]], [0], [table], 16, [0])
        return model(ids, meta, _cache(spec))

    cache = _cache(spec)
    m1 = ForwardMeta.for_sequences([70, 40], [0, 0], tables, 16, [1, 2])
    o1 = model(torch.cat([a[:70], b[:40]]), m1, cache)
    m2 = ForwardMeta.for_sequences([20, 35], [70, 40], tables, 16, [1, 2])
    o2 = model(torch.cat([a[70:], b[40:]]), m2, cache)
    assert_close_rel(torch.cat([o1[:70], o2[:20]]), alone(a, tables[0]), FP32_REL_TOL, "DSA sequence a")
    assert_close_rel(torch.cat([o1[70:], o2[20:]]), alone(b, tables[1]), FP32_REL_TOL, "DSA sequence b")


def test_meta_validation(tiny):
    spec, model = tiny
    meta = ForwardMeta.for_sequences([2, 1], [0, 5], [[0], [1]], 16, [0, 1])
    bad = ForwardMeta(**{**meta.__dict__, "state_slots": meta.state_slots[:1]})
    with pytest.raises(ValueError, match="state_slots"):
        model(torch.arange(3), bad, _cache(spec))
    bad = ForwardMeta(**{**meta.__dict__, "query_lens_cpu": (2, 0), "seq_lens_cpu": (2, 5)})
    with pytest.raises(ValueError, match="new token"):
        bad.validate()
    assert meta.context_lens_cpu == (0, 5) and not meta.is_pure_decode


def test_cache_allocation_checks(tiny):
    spec, _ = tiny
    cs = HybridCacheSpec.from_model_spec(spec, torch.bfloat16)
    with pytest.raises(ValueError, match="2-byte"):
        HybridCacheTensors.allocate(cs, 4, 16, 1, "cpu", torch.float32)
    with pytest.raises(ValueError, match="positive"):
        HybridCacheTensors.allocate(cs, 0, 16, 1, "cpu", torch.bfloat16)
    cache = HybridCacheTensors.allocate(cs, 4, 16, 3, "cpu", torch.bfloat16)
    assert cache.num_slots == 3 and set(cache.index_k) == set(spec.mla_layers)
