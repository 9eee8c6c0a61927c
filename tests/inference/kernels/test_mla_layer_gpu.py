"""The MLA layer with the kernels on (CUDA) vs the same layer on the CPU references, fp32: a
prefill, a mixed prefill + decode step and pure decodes, with and without DSA and the FP8 latent
cache; and the pure-decode path captured in a CUDA graph and replayed at other lengths."""

from __future__ import annotations

import copy

import pytest
import torch

from inference.config import parse_config
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, init_dummy_weights
from inference.model.mla import MLAttention
from testing.kimi_hf_mapping import tiny_kimi_linear_config
from tests.inference.kernels.helpers import TOL, assert_rel

BLOCK = 16
ALL_MLA = {"kda_layers": [], "full_attn_layers": [1, 2, 3, 4], "num_heads": 2, "head_dim": 16}


def _spec(dsa: bool):
    kw = dict(q_lora_rank=32, mla_use_nope=False, rope_theta=10000.0, index_topk=24, index_n_heads=8,
              index_head_dim=16) if dsa else {}  # fmt: skip
    # rope 16: latent rows of 32 + 16 are 16-byte aligned in fp8 too (the kernel's requirement)
    return parse_config(tiny_kimi_linear_config(linear_attn_config=ALL_MLA, qk_rope_head_dim=16, **kw))


def _steps():
    """(query_lens, context_lens) of successive steps of three sequences (tables fixed below)."""
    return [
        ([40, 25, 3], [0, 0, 0]),  # prefill chunks
        ([1, 30, 1], [40, 25, 3]),  # mixed: two decodes and a chunk
        ([1, 1, 1], [41, 55, 4]),  # pure decodes
        ([1, 1, 1], [42, 56, 5]),
    ]


def _run(layer, spec, device, fp8: bool, xs):
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, torch.float32, latent_fp8=fp8),
        24,
        BLOCK,
        3,
        device,
        torch.float32,
    )
    tables = [[3, 7, 1, 9], [0, 5, 11, 2, 8], [4, 6]]
    outs = []
    for (ql, cl), x in zip(_steps(), xs, strict=True):
        meta = ForwardMeta.for_sequences(ql, cl, tables, BLOCK, [0, 1, 2], device=device)
        outs.append(layer(x.to(device), meta, cache).cpu())
    return torch.cat(outs)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["f32-cache", "fp8-cache"])
@pytest.mark.parametrize("dsa", [False, True], ids=["mla", "mla+dsa"])
@torch.no_grad()
def test_gpu_layer_matches_cpu_reference(dsa, fp8):
    spec = _spec(dsa)
    cpu = MLAttention(spec, layer_idx=0)
    init_dummy_weights(cpu, seed=3)
    gpu = copy.deepcopy(cpu).cuda()
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(sum(ql), spec.hidden_size, generator=g) for ql, _ in _steps()]
    want = _run(cpu.eval(), spec, "cpu", fp8, xs)
    got = _run(gpu.eval(), spec, torch.device("cuda"), fp8, xs)
    # fp8 latents: the decode kernel computes in fp16 (q and the probabilities rounded to fp16), so
    # the fp8 case is held to the kernels' fp8 tolerance; fp32 caches to fp32 agreement
    tol = TOL[torch.float8_e4m3fn] if fp8 else 1e-4
    assert_rel(got, want, tol, f"MLA layer gpu kernels vs cpu reference dsa={dsa} fp8={fp8}")


@pytest.mark.gpu
@torch.no_grad()
def test_gpu_decode_is_graph_capturable():
    spec = _spec(dsa=True)
    layer = MLAttention(spec, layer_idx=0).cuda().eval()
    init_dummy_weights(layer, seed=4)
    dev = torch.device("cuda")
    cache = HybridCacheTensors.allocate(HybridCacheSpec.from_model_spec(spec, torch.float32), 64, BLOCK, 4, dev,
                                        torch.float32)  # fmt: skip
    pre = ForwardMeta.for_sequences(
        [200, 90], [0, 0], [list(range(13)), list(range(20, 26))], BLOCK, [0, 1], dev
    )
    layer(torch.randn(290, spec.hidden_size, device=dev), pre, cache)
    # static decode inputs, as cuda_graphs.DecodeInputs holds them (lengths only on the device)
    tables = torch.tensor([list(range(16)), list(range(20, 36))], dtype=torch.int64, device=dev)
    lens = torch.tensor([201, 91], dtype=torch.int64, device=dev)
    slots = torch.tensor([200, 20 * BLOCK + 90], dtype=torch.int64, device=dev)
    positions = torch.tensor([200, 90], dtype=torch.int64, device=dev)
    meta = ForwardMeta(positions=positions, cu_seqlens=torch.arange(3, dtype=torch.int32, device=dev),
                       seq_lens=lens, block_tables=tables, slot_mapping=slots,
                       state_slots=torch.arange(2, device=dev), query_lens_cpu=(1, 1),
                       seq_lens_cpu=(16 * BLOCK,) * 2)  # fmt: skip
    x = torch.randn(2, spec.hidden_size, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer(x, meta, cache)  # warm-up (autotuning) off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x, meta, cache)
    for step in range(3):  # replay at new lengths and positions, compare with an eager call
        lens += 1
        positions += 1
        slots += 1
        x.copy_(torch.randn(2, spec.hidden_size, device=dev))
        graph.replay()
        eager = layer(x, meta, cache)
        assert_rel(y, eager, 1e-5, f"graph replay {step} vs eager")
