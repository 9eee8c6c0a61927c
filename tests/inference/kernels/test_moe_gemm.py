"""The routed experts' decode-size grouped GEMMs (`inference/kernels/moe_gemm`): each Triton
kernel vs its PyTorch reference (CPU: Triton's interpreter, small shapes; `gpu`: the H200 at the
benchmark model's shapes, also against the `torch._grouped_mm` path it replaces), and the
references together vs the exact per-expert loop."""

from __future__ import annotations

import pytest
import torch

from inference.kernels.moe_dispatch.reference import combine_reference, sort_pairs_reference
from inference.kernels.moe_experts import moe_experts_reference
from inference.kernels.moe_gemm.fast import (
    CANDIDATE_TILES,
    DOWN_TILES,
    MAX_PAIRS,
    UP_TILES,
    moe_down_fast,
    moe_up_fast,
    pick_tile,
)
from inference.kernels.moe_gemm.reference import moe_down_reference, moe_up_reference
from tests.inference.kernels.helpers import TOL, assert_rel

DTYPES = [torch.float32, torch.bfloat16]
IDS = ["f32", "bf16"]


def _dev() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _problem(t: int, k: int, e: int, h: int, i: int, dtype: torch.dtype, seed: int, skew: bool = False):
    """Tokens, routing (every expert but the last two used when `skew`: empty groups), stacked
    weights, and the sorted pairs of `sort_pairs_reference`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    used = e - 2 if skew else e
    ids = torch.stack([torch.randperm(used, generator=g)[:k] for _ in range(t)])
    w13 = torch.randn(e, 2 * i, h, generator=g) / h**0.5
    w2 = torch.randn(e, h, i, generator=g) / i**0.5
    weights = torch.rand(t, k, generator=g)
    dev = _dev()
    x, w13, w2 = (v.to(dev, dtype) for v in (x, w13, w2))
    ids, weights = ids.to(dev), weights.to(dev)
    _, tok, place, ends = sort_pairs_reference(ids, e)
    return x, ids, weights, w13, w2, tok, place, ends


def test_references_compose_to_the_per_expert_loop():
    """up, down and the combine over the sorted pairs equal the exact loop of `moe_experts_reference`."""
    x, ids, weights, w13, w2, tok, place, ends = _problem(7, 3, 6, 40, 24, torch.float32, 0, skew=True)
    i = w13.shape[1] // 2
    y = moe_down_reference(moe_up_reference(x, tok, w13, ends), w2, ends)
    got = combine_reference(y, place, weights)
    want = moe_experts_reference(x, weights, ids, list(w13[:, :i]), list(w2), list(w13[:, i:]))
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


# (T, k, E, H, I): H and I past one tile and not multiples of it; a group of > 16 rows (two row
# tiles); empty groups
CASES = [(5, 3, 8, 200, 72, False), (40, 2, 3, 130, 40, False), (6, 2, 9, 64, 64, True)]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize(("t", "k", "e", "h", "i", "skew"), CASES)
def test_moe_up_and_down_match_reference(t, k, e, h, i, skew, dtype):
    x, _, _, w13, w2, tok, _, ends = _problem(t, k, e, h, i, dtype, t + e, skew)
    act = moe_up_fast(x, tok, w13, ends)
    assert_rel(act, moe_up_reference(x, tok, w13, ends), TOL[dtype], f"moe_up {t}x{h} E={e} I={i} {dtype}")
    y = moe_down_fast(act, w2, ends)
    assert_rel(y, moe_down_reference(act, w2, ends), TOL[dtype], f"moe_down {t}x{h} E={e} I={i} {dtype}")


TILES = sorted({t for _, t in UP_TILES + DOWN_TILES})
# on the GPU also the candidates `benchmarks/kernels.py --sections moe` times, so that a table
# re-picked from its figures holds only tiles checked here
GPU_TILES = sorted(set(TILES) | set(CANDIDATE_TILES))


@pytest.mark.parametrize("tile", TILES, ids=[f"n{t[0]}w{t[1]}s{t[2]}" for t in TILES])
def test_every_tile_matches_reference(tile):
    """Each tile of the pairs-keyed tables, whatever the pairs (fp32, past a tile in N and K)."""
    x, _, _, w13, w2, tok, _, ends = _problem(5, 3, 8, 200, 72, torch.float32, 3, skew=True)
    act = moe_up_fast(x, tok, w13, ends, tile=tile)
    assert_rel(act, moe_up_reference(x, tok, w13, ends), TOL[torch.float32], f"moe_up tile {tile}")
    y = moe_down_fast(act, w2, ends, tile=tile)
    assert_rel(y, moe_down_reference(act, w2, ends), TOL[torch.float32], f"moe_down tile {tile}")


def test_tiles_are_picked_by_pairs():
    for tiles in (UP_TILES, DOWN_TILES):
        bounds = [most for most, _ in tiles]
        assert bounds == sorted(bounds) and bounds[-1] == MAX_PAIRS
        assert [pick_tile(tiles, p) for p in (1, bounds[0], bounds[0] + 1)] == [
            tiles[0][1],
            tiles[0][1],
            tiles[1][1],
        ]


def test_too_many_pairs_and_bad_shapes_say_what_to_do():
    x, _, _, w13, w2, tok, _, ends = _problem(2, 2, 4, 16, 16, torch.float32, 1)
    big = torch.zeros(MAX_PAIRS + 1, dtype=torch.int64, device=x.device)
    with pytest.raises(ValueError, match="_grouped_mm"):
        moe_up_fast(x, big, w13, ends)
    with pytest.raises(ValueError, match="int32"):
        moe_down_fast(torch.zeros(4, 16, device=x.device), w2, ends.long())
    with pytest.raises(ValueError, match="need x"):
        moe_up_fast(x[:, :8], tok, w13, ends)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4, 32, 128])
def test_gpu_moe_gemm_at_model_shapes(t):
    """The benchmark config's experts (E 32, H 2048, I 768, top-4) in bf16: the kernels vs the
    reference, and the whole routed sum vs the `torch._grouped_mm` + SwiGLU path."""
    from inference.kernels.moe_dispatch.reference import silu_mul_reference

    x, _, weights, w13, w2, tok, place, ends = _problem(t, 4, 32, 2048, 768, torch.bfloat16, t)
    act = moe_up_fast(x, tok, w13, ends)
    assert_rel(act, moe_up_reference(x, tok, w13, ends), TOL[torch.bfloat16], f"gpu moe_up t={t}")
    y = moe_down_fast(act, w2, ends)
    assert_rel(y, moe_down_reference(act, w2, ends), TOL[torch.bfloat16], f"gpu moe_down t={t}")
    # every tile gives the same bits (one BLOCK_K: each output's K sum in one order), so a
    # sequence decoded alone and in a batch of another tile stay equal in fp32
    for tile in GPU_TILES:
        assert torch.equal(moe_up_fast(x, tok, w13, ends, tile=tile), act), f"moe_up tile {tile} t={t}"
        assert torch.equal(moe_down_fast(act, w2, ends, tile=tile), y), f"moe_down tile {tile} t={t}"
    h = torch._grouped_mm(x.index_select(0, tok), w13.transpose(1, 2), offs=ends)
    y_cutlass = torch._grouped_mm(silu_mul_reference(h), w2.transpose(1, 2), offs=ends)
    assert_rel(
        combine_reference(y, place, weights),
        combine_reference(y_cutlass, place, weights),
        TOL[torch.bfloat16],
        f"gpu moe routed sum vs grouped_mm t={t}",
    )
