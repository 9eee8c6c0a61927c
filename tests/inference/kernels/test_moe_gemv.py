"""The MoE block at a few tokens (`inference/kernels/moe_gemv`): the two GEMV kernels vs their fp32
reference (CPU: Triton's interpreter, small shapes with ragged tails; `gpu`: the benchmark model's
shapes with every candidate tile, and against the grouped path it replaces), and the reference vs
the per-expert loop plus the shared MLP."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.kernels.moe_experts import moe_experts_reference
from inference.kernels.moe_gemv.fast import CANDIDATE_TILES, moe_gemv_fast
from inference.kernels.moe_gemv.reference import moe_gemv_reference
from tests.inference.kernels.helpers import TOL, assert_rel


def _dev() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _problem(t: int, k: int, e: int, h: int, i: int, s: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    w13 = torch.randn(e, 2 * i, h, generator=g) / h**0.5
    w2 = torch.randn(e, h, i, generator=g) / i**0.5
    weights = torch.rand(t, k, generator=g)
    shared = (
        (torch.randn(2 * s, h, generator=g) / h**0.5, torch.randn(h, s, generator=g) / s**0.5) if s else None
    )
    dev = _dev()
    x, w13, w2 = (v.to(dev, dtype) for v in (x, w13, w2))
    shared = tuple(v.to(dev, dtype) for v in shared) if shared else None
    return x, weights.to(dev), ids.to(dev), w13, w2, shared


def test_reference_is_the_expert_loop_plus_the_shared_mlp():
    x, weights, ids, w13, w2, shared = _problem(3, 2, 5, 24, 16, 12, torch.float32, 0)
    x, weights, ids, w13, w2 = (v.cpu() for v in (x, weights, ids, w13, w2))
    shared = tuple(v.cpu() for v in shared)
    i = w13.shape[1] // 2
    routed = moe_experts_reference(x, weights, ids, list(w13[:, :i]), list(w2), list(w13[:, i:]))
    sh = F.silu(x @ shared[0][:12].T) * (x @ shared[0][12:].T) @ shared[1].T
    assert torch.allclose(moe_gemv_reference(x, weights, ids, w13, w2, shared), routed + sh, atol=1e-5)


# (T, k, E, H, I, S): tails past the tiles; shared wider, narrower, equal, absent
CASES = [(1, 4, 8, 200, 48, 48), (2, 3, 6, 136, 40, 72), (3, 2, 5, 64, 36, 20), (1, 1, 3, 96, 24, 0)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "t{}k{}e{}h{}i{}s{}".format(*c))
def test_interpreted_kernels_match_the_reference(case, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("the interpreter cases run on CPU; the gpu test covers CUDA")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x, weights, ids, w13, w2, shared = _problem(*case, torch.float32, 1)
    tile = (16, 64, 4, 2)  # tails in N and K at these shapes
    got = moe_gemv_fast(x, weights, ids, w13, w2, shared, up_tile=tile, down_tile=tile)
    assert_rel(got, moe_gemv_reference(x, weights, ids, w13, w2, shared), TOL[torch.float32], f"gemv {case}")


def test_bad_layouts_are_refused():
    x, weights, ids, w13, w2, shared = _problem(1, 2, 3, 32, 16, 16, torch.float32, 2)
    with pytest.raises(ValueError, match="moe_gemv"):
        moe_gemv_fast(x, weights, ids.int(), w13, w2, shared)
    with pytest.raises(ValueError, match="moe_gemv"):
        moe_gemv_fast(x, weights, ids, w13, w2.transpose(1, 2), shared)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_gpu_default_tiles_match_the_reference_at_model_shapes(t, dtype):
    """The benchmark model's MoE (E 32, top-4, H 2048, I 768, one shared expert), also against the
    grouped path it replaces, and a K3-shaped one (16 of its experts, top-8, H 7168, I 2048)."""
    from inference.kernels.moe_experts import moe_experts_grouped

    x, weights, ids, w13, w2, shared = _problem(t, 4, 32, 2048, 768, 768, dtype, 3)
    want = moe_gemv_reference(x, weights, ids, w13, w2, shared)
    assert_rel(moe_gemv_fast(x, weights, ids, w13, w2, shared), want, TOL[dtype], f"gemv t{t} {dtype}")
    if dtype == torch.bfloat16:  # the grouped path it replaces, to the same tolerance
        sh = F.linear(F.silu(x @ shared[0][:768].T) * (x @ shared[0][768:].T), shared[1])
        grouped = moe_experts_grouped(x, weights, ids, w13, w2, shared=sh)
        assert_rel(grouped, want, TOL[dtype], f"grouped t{t}")
    x, weights, ids, w13, w2, shared = _problem(t, 8, 16, 7168, 2048, 2048, dtype, 4)
    got = moe_gemv_fast(x, weights, ids, w13, w2, shared)
    assert_rel(got, moe_gemv_reference(x, weights, ids, w13, w2, shared), TOL[dtype], f"gemv k3 t{t} {dtype}")


@pytest.mark.gpu
def test_gpu_every_candidate_tile_matches_the_reference():
    """Every tile the benchmark sweeps, on the benchmark model's shapes at one token (bf16)."""
    x, weights, ids, w13, w2, shared = _problem(1, 4, 32, 2048, 768, 768, torch.bfloat16, 5)
    want = moe_gemv_reference(x, weights, ids, w13, w2, shared)
    for tile in CANDIDATE_TILES:
        got = moe_gemv_fast(x, weights, ids, w13, w2, shared, up_tile=tile, down_tile=tile)
        assert_rel(got, want, TOL[torch.bfloat16], f"gemv tile {tile}")
