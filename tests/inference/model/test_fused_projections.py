"""KDA's and MLA's fused projection GEMMs against the unfused math (one `F.linear` per published
weight), and the fused buffers after weights are loaded or replaced following a first forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference.config import parse_config
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, init_dummy_weights
from inference.model.kda import KimiDeltaAttention
from inference.model.mla import MLAttention
from testing.kimi_hf_mapping import FP32_REL_TOL, assert_close_rel, tiny_kimi_linear_config

BLOCK = 8
ALL_MLA = {"kda_layers": [], "full_attn_layers": [1, 2, 3, 4], "num_heads": 2, "head_dim": 16}
MLA_CONFIGS = {
    "kimi-nope": {},  # q_proj, no rope (Kimi-Linear)
    "q-lora-rope": dict(q_lora_rank=32, mla_use_nope=False, rope_theta=10000.0, linear_attn_config=ALL_MLA),
    "q-lora-dsa": dict(q_lora_rank=32, mla_use_nope=False, rope_theta=10000.0, index_topk=8, index_n_heads=4,
                       index_head_dim=16, linear_attn_config=ALL_MLA),
}  # fmt: skip


def _layer(kind: str, seed: int) -> tuple[nn.Module, object]:
    """A KDA layer (layer 0 of the tiny Kimi-Linear config) or an MLA layer of `MLA_CONFIGS[kind]`."""
    if kind == "kda":
        spec = parse_config(tiny_kimi_linear_config())
        layer: nn.Module = KimiDeltaAttention(spec, layer_idx=0)
    else:
        spec = parse_config(tiny_kimi_linear_config(**MLA_CONFIGS[kind]))
        layer = MLAttention(spec, layer_idx=spec.mla_layers[0])
    init_dummy_weights(layer, seed=seed)
    return layer.eval(), spec


def _run(layer: nn.Module, spec, xs: list[Tensor], dtype: torch.dtype = torch.float32) -> Tensor:
    """Two sequences on a fresh cache: prefill chunks of 11 and 6 tokens, then three pure decodes."""
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, dtype), 16, BLOCK, 2, "cpu", dtype
    )
    tables = [[3, 7, 1, 9], [0, 5, 11, 2]]
    outs, ctx = [], [0, 0]
    for x in xs:
        lens = [11, 6] if ctx == [0, 0] else [1, 1]
        meta = ForwardMeta.for_sequences(lens, ctx, tables, BLOCK, [0, 1])
        outs.append(layer(x.to(dtype), meta, cache))
        ctx = [c + n for c, n in zip(ctx, lens, strict=True)]
    return torch.cat(outs)


def _inputs(hidden: int, seed: int = 1) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, hidden, generator=g) for n in (17, 2, 2, 2)]


def _gates_unfused(layer: KimiDeltaAttention, fg_a: Tensor, t: int) -> tuple[Tensor, Tensor]:
    f_a, g_a = fg_a.split(layer.head_dim, -1)
    shape = (t, layer.num_heads, layer.head_dim)
    return F.linear(f_a, layer.f_b_proj.weight).view(shape), F.linear(g_a, layer.g_b_proj.weight).view(shape)


def _projections_unfused(layer: MLAttention, x: Tensor):
    """`MLAttention._projections` as one GEMM per published weight."""
    m, ix = layer.m, layer.indexer
    index = None
    if m.q_lora_rank is None:
        q = F.linear(x, layer.q_proj.weight)
    else:
        q_latent = layer.q_a_layernorm(F.linear(x, layer.q_a_proj.weight))
        q = F.linear(q_latent, layer.q_b_proj.weight)
        if ix is not None:
            index = tuple(
                F.linear(a, w.weight) for a, w in ((q_latent, ix.wq_b), (x, ix.wk), (x, ix.weights_proj))
            )
    return q.view(x.shape[0], m.num_heads, m.qk_head_dim), F.linear(x, layer.kv_a_proj_with_mqa.weight), index


@torch.no_grad()
@pytest.mark.parametrize("t", [1, 5])
def test_kda_gates_are_the_two_low_rank_gemms(t):
    layer, _ = _layer("kda", seed=3)
    d = layer.head_dim
    wide = torch.randn(t, 7 * d)
    fg_a = wide[:, 3 * d : 5 * d]  # a column slice, as the input GEMM's output gives it
    got, want = layer._gates(fg_a, t), _gates_unfused(layer, fg_a, t)
    for a, b, name in zip(got, want, ("f", "gate"), strict=True):
        assert_close_rel(a, b, 1e-6, f"KDA {name} via one bmm, T={t}")
    # the two published weights live in the batched GEMM's buffer (no second copy)
    assert layer.f_b_proj.weight.data_ptr() == layer._fg_b.data_ptr()


@torch.no_grad()
@pytest.mark.parametrize("kind", list(MLA_CONFIGS))
@pytest.mark.parametrize("t", [1, 5])
def test_mla_projections_are_the_separate_gemms(kind, t):
    layer, spec = _layer(kind, seed=3)
    x = torch.randn(t, spec.hidden_size)
    q, ckv, index = layer._projections(x)
    q_ref, ckv_ref, index_ref = _projections_unfused(layer, x)
    assert_close_rel(q, q_ref, 1e-6, f"{kind} q")
    assert_close_rel(ckv, ckv_ref, 1e-6, f"{kind} latent | rope key")
    assert (index is None) == (index_ref is None) == (layer.indexer is None)
    if index is not None and index_ref is not None:
        for a, b, name in zip(index, index_ref, ("wq_b", "wk", "weights_proj"), strict=True):
            assert_close_rel(a, b, 1e-6, f"{kind} indexer {name}")
    assert (
        layer.kv_a_proj_with_mqa.weight.untyped_storage().data_ptr()
        == layer._x_w.untyped_storage().data_ptr()
    )


@torch.no_grad()
@pytest.mark.parametrize("kind", ["kda", *MLA_CONFIGS])
def test_layer_equals_the_unfused_layer(kind, monkeypatch):
    """Prefill and decode steps with the fused GEMMs == the same layer with one GEMM per weight."""
    layer, spec = _layer(kind, seed=5)
    xs = _inputs(spec.hidden_size)
    fused = _run(layer, spec, xs)
    if kind == "kda":
        monkeypatch.setattr(KimiDeltaAttention, "_gates", _gates_unfused)
    else:
        monkeypatch.setattr(MLAttention, "_projections", _projections_unfused)
    assert_close_rel(fused, _run(layer, spec, xs), FP32_REL_TOL, f"{kind}: fused vs unfused projections")


@torch.no_grad()
@pytest.mark.parametrize("kind", ["kda", *MLA_CONFIGS])
def test_weights_loaded_or_replaced_after_a_forward(kind):
    """The fused buffers follow the published parameters: a `load_state_dict` after the first
    forward (in-place copies) and a dtype change (new tensors: the buffers are rebuilt)."""
    layer, spec = _layer(kind, seed=5)
    other, _ = _layer(kind, seed=6)
    names = set(layer.state_dict())
    xs = _inputs(spec.hidden_size)
    first = _run(layer, spec, xs)
    layer.load_state_dict(other.state_dict())
    assert set(layer.state_dict()) == names  # the buffers are no parameters or state
    want = _run(other, spec, xs)
    got = _run(layer, spec, xs)
    assert not torch.allclose(first, want)
    assert_close_rel(got, want, 1e-6, f"{kind}: after load_state_dict")
    layer.double()
    other.double()
    assert_close_rel(
        _run(layer, spec, xs, torch.float64), _run(other, spec, xs, torch.float64), 1e-12, f"{kind}: fp64"
    )


@pytest.mark.gpu
@torch.no_grad()
def test_gpu_kda_gates_one_kernel_and_capturable():
    """On CUDA the strided `[2, T, hd]` view goes to cuBLAS as it is (no copy kernel), and the
    batched GEMM replays in a CUDA graph."""
    from torch.profiler import ProfilerActivity, profile

    layer, _ = _layer("kda", seed=3)
    layer = layer.cuda().to(torch.bfloat16)
    d = layer.head_dim
    wide = torch.randn(1, 7 * d, device="cuda", dtype=torch.bfloat16)
    fg_a = wide[:, 3 * d : 5 * d]
    layer._gates(fg_a, 1)  # builds the buffer off the capture
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        layer._gates(fg_a, 1)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert kernels and not any("copy" in k.lower() or "elementwise" in k.lower() for k in kernels), kernels
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        f, gate = layer._gates(fg_a, 1)
    wide.copy_(torch.randn_like(wide))
    graph.replay()
    want = _gates_unfused(layer, fg_a, 1)
    assert_close_rel(f.float(), want[0].float(), 2e-2, "graph replay f")
    assert_close_rel(gate.float(), want[1].float(), 2e-2, "graph replay gate")
