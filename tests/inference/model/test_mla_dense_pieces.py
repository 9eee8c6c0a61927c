"""The MLA layer's dense prefill with its keys expanded a piece at a time (the long-prompt path of
many-head layers) equals the whole expansion at once."""

from __future__ import annotations

import pytest
import torch

import inference.kernels.mla_prefill as mla_prefill
from inference.config import parse_config
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, init_dummy_weights
from inference.model.mla import MLAttention
from testing.kimi_hf_mapping import FP32_REL_TOL, assert_close_rel, tiny_kimi_linear_config

BLOCK = 8


def _chunks(layer: MLAttention, spec, x: torch.Tensor, chunk: int) -> torch.Tensor:
    """A prompt prefilled `chunk` tokens a step, then one decode, on a fresh paged cache."""
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, torch.float32), 16, BLOCK, 1, "cpu", torch.float32
    )
    table = [[7, 3, 11, 0, 5, 9, 2, 14, 1, 4]]
    outs = []
    for a in range(0, x.shape[0], chunk):
        n = min(chunk, x.shape[0] - a)
        meta = ForwardMeta.for_sequences([n], [a], table, BLOCK, [0])
        outs.append(layer(x[a : a + n], meta, cache))
    return torch.cat(outs)


@torch.no_grad()
def test_dense_prefill_in_pieces_equals_whole_expansion(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tiny_kimi_linear_config(
        q_lora_rank=32,
        linear_attn_config={
            "kda_layers": [],
            "full_attn_layers": [1, 2, 3, 4],
            "num_heads": 2,
            "head_dim": 16,
        },
    )
    spec = parse_config(cfg)
    layer = MLAttention(spec, layer_idx=0).eval()
    init_dummy_weights(layer, seed=2)
    x = torch.randn(72, spec.hidden_size, generator=torch.Generator().manual_seed(1))
    whole = _chunks(layer, spec, x, 24)
    calls: list[int] = []
    real = mla_prefill.mla_prefill_pieces

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw, piece=16)

    monkeypatch.setattr(mla_prefill, "EXPAND_LIMIT_BYTES", 0)
    monkeypatch.setattr("inference.model.mla.mla_prefill_pieces", counted)
    pieces = _chunks(layer, spec, x, 24)
    assert len(calls) == 3  # every chunk took the piecewise path
    assert_close_rel(pieces, whole, FP32_REL_TOL, "MLA dense prefill, keys expanded in pieces of 16")
