"""The MoE and dense-GEMV sections of `benchmarks.kernels` (decode sizes, one GPU): the grouped
expert GEMMs per tile, the MoE block as GEMVs vs the grouped path, cuBLAS vs a Triton GEMV on the
dense decode projections. Timing and bandwidth as in `kernels_setup`."""

from __future__ import annotations

import functools
import json
from typing import Any

import torch

from benchmarks.kernels_setup import bench_graph

# the benchmark config's routed experts: E 32, H 2048, I 768, top-4
MOE_E, MOE_H, MOE_I, MOE_K = 32, 2048, 768, 4


def _time_tiles(fn, res: dict[str, Any]) -> dict[tuple[int, int, int], float]:
    """Graph-replay seconds of `fn(tile=...)` for every candidate; one that fails is noted in
    `res` and timed as infinite."""
    from inference.kernels.moe_gemm.fast import CANDIDATE_TILES

    times = {}
    for tile in CANDIDATE_TILES:
        try:
            times[tile] = bench_graph(functools.partial(fn, tile=tile), flush="read")
        except Exception as exc:  # e.g. a tile past the shared memory
            times[tile] = float("inf")
            res.setdefault("failed", []).append([list(tile), repr(exc)[:120]])
    return times


def moe_tiles(gbps: float) -> dict[str, Any]:
    """The decode MoE GEMMs (`inference/kernels/moe_gemm`) per tile at batch 1 / 4 / 32 / 128
    (4 / 16 / 128 / 512 pairs), CUDA-graph replay, L2 flushed by reads; % of copy bandwidth on the
    routed experts' weight bytes (the experts that got a token; the activations are noise)."""
    from inference.kernels.moe_dispatch.reference import sort_pairs_reference
    from inference.kernels.moe_gemm import fast as mg

    rows: dict[str, Any] = {"picked_up": list(mg.UP_TILES), "picked_down": list(mg.DOWN_TILES)}
    g = torch.Generator("cuda").manual_seed(0)
    w13 = torch.randn(MOE_E, 2 * MOE_I, MOE_H, generator=g, device="cuda").to(torch.bfloat16)
    w2 = torch.randn(MOE_E, MOE_H, MOE_I, generator=g, device="cuda").to(torch.bfloat16)
    for t in (1, 4, 32, 128):
        x = torch.randn(t, MOE_H, generator=g, device="cuda").to(torch.bfloat16)
        ids = torch.stack([torch.randperm(MOE_E, generator=g, device="cuda")[:MOE_K] for _ in range(t)])
        _, tok, _, ends = sort_pairs_reference(ids, MOE_E)
        act = mg.moe_up_fast(x, tok, w13, ends)
        experts = int(ids.unique().numel())
        up_bytes = experts * 2 * MOE_I * MOE_H * 2
        down_bytes = experts * MOE_H * MOE_I * 2
        res: dict[str, Any] = {"pairs": t * MOE_K, "experts": experts}
        up = functools.partial(mg.moe_up_fast, x, tok, w13, ends)
        down = functools.partial(mg.moe_down_fast, act, w2, ends)
        for name, nbytes, fn, tiles in (
            ("up", up_bytes, up, mg.UP_TILES), ("down", down_bytes, down, mg.DOWN_TILES),
        ):  # fmt: skip
            times = _time_tiles(fn, res)
            picked, best = mg.pick_tile(tiles, t * MOE_K), min(times, key=times.get)
            res[name] = {
                "picked": list(picked), "picked_us": round(1e6 * times[picked], 2),
                "picked_pct_copy_bw": round(100 * nbytes / times[picked] / 1e9 / gbps, 1),
                "best": list(best), "best_us": round(1e6 * times[best], 2),
                "best_pct_copy_bw": round(100 * nbytes / times[best] / 1e9 / gbps, 1),
                "all_us": {f"{a}/{b}/{c}": round(1e6 * v, 2) for (a, b, c), v in sorted(times.items())},
            }  # fmt: skip
        rows[f"b{t}"] = res
        print(f"[moe] b{t}: {json.dumps(res)[:900]}", flush=True)
    return rows


def moe_gemv(gbps: float) -> dict[str, Any]:
    """The decode MoE block, routed + one shared expert (`inference/kernels/moe_gemv`'s two GEMVs vs
    the grouped path: pair sort, `moe_gemm` up and down, combine, and the shared MLP's two GEMMs and
    SwiGLU) at 1 / 2 / 4 / 8 tokens, graph replay, L2 flushed by reads; % of copy bandwidth on the
    weight bytes read (the distinct routed experts chosen + the shared expert). At one token, each
    candidate tile of the up kernel (the down kernel at its default) and of the down kernel."""
    import torch.nn.functional as F

    from inference.kernels.moe_dispatch import silu_mul
    from inference.kernels.moe_experts import moe_experts_grouped
    from inference.kernels.moe_gemv import fast as mv

    g = torch.Generator("cuda").manual_seed(0)
    w13 = torch.randn(MOE_E, 2 * MOE_I, MOE_H, generator=g, device="cuda").to(torch.bfloat16)
    w2 = torch.randn(MOE_E, MOE_H, MOE_I, generator=g, device="cuda").to(torch.bfloat16)
    sw13 = torch.randn(2 * MOE_I, MOE_H, generator=g, device="cuda").to(torch.bfloat16)
    sw2 = torch.randn(MOE_H, MOE_I, generator=g, device="cuda").to(torch.bfloat16)
    rows: dict[str, Any] = {
        "up_tile": list(mv.UP_TILE),
        "down_tile": list(mv.DOWN_TILE),
        "max_tokens": mv.MAX_TOKENS,
    }
    for t in (1, 2, 4, 8):
        x = torch.randn(t, MOE_H, generator=g, device="cuda").to(torch.bfloat16)
        ids = torch.stack([torch.randperm(MOE_E, generator=g, device="cuda")[:MOE_K] for _ in range(t)])
        weights = torch.rand(t, MOE_K, generator=g, device="cuda")
        nbytes = (int(ids.unique().numel()) + 1) * 3 * MOE_H * MOE_I * 2

        def grouped(x=x, ids=ids, weights=weights):
            shared = F.linear(silu_mul(F.linear(x, sw13)), sw2)
            return moe_experts_grouped(x, weights, ids, w13, w2, shared=shared)

        def gemv(x=x, ids=ids, weights=weights, **tiles):
            return mv.moe_gemv_fast(x, weights, ids, w13, w2, (sw13, sw2), **tiles)

        res: dict[str, Any] = {}
        for name, fn in (("grouped", grouped), ("gemv", gemv)):
            sec = bench_graph(fn, flush="read")
            res[name] = {"us": round(1e6 * sec, 2), "pct_copy_bw": round(100 * nbytes / sec / 1e9 / gbps, 1)}
        if t == 1:
            for which in ("up_tile", "down_tile"):
                times = {}
                for tile in mv.CANDIDATE_TILES:
                    try:
                        times[tile] = bench_graph(functools.partial(gemv, **{which: tile}), flush="read")
                    except Exception as exc:  # e.g. a tile past the registers
                        res.setdefault("failed", []).append([which, list(tile), repr(exc)[:120]])
                best = min(times, key=times.get)
                res[which + "_best"] = {"tile": list(best), "us": round(1e6 * times[best], 2)}
                res[which + "_all_us"] = {
                    "/".join(map(str, k)): round(1e6 * v, 2) for k, v in sorted(times.items())
                }
        rows[f"t{t}"] = res
        print(f"[moe_gemv] t{t}: {json.dumps(res)[:900]}", flush=True)
    return rows


# the benchmark config's dense decode GEMVs (N x K): KDA's fused input projection, o_proj, MLA's q
# projection, the dense layer's gate|up and down, the LM head
DENSE_GEMVS = ((6272, 2048), (2048, 2048), (3072, 2048), (11264, 2048), (2048, 5632), (32000, 2048))


def dense_gemv(gbps: float) -> dict[str, Any]:
    """Whether a Triton GEMV would beat cuBLAS on the decode step's dense projections at one token:
    `F.linear` vs `moe_gemv`'s down kernel run as a plain GEMV (one "expert", weight 1) for a few
    tiles; graph replay, L2 flushed by reads, % of copy bandwidth on the weight bytes."""
    import torch.nn.functional as F
    import triton

    from inference.kernels.moe_gemv import fast as mv

    g = torch.Generator("cuda").manual_seed(0)
    tiles = ((16, 256, 4, 3), (32, 256, 4, 3), (8, 512, 4, 3), (16, 512, 8, 3), (32, 128, 4, 4))
    rows: dict[str, Any] = {}
    for n, k in DENSE_GEMVS:
        w = torch.randn(n, k, generator=g, device="cuda").to(torch.bfloat16)
        x = torch.randn(1, k, generator=g, device="cuda").to(torch.bfloat16)
        ids = torch.zeros(1, 1, dtype=torch.long, device="cuda")
        one = torch.ones(1, 1, device="cuda")
        out = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")

        def triton_gemv(tile, w=w, x=x, ids=ids, one=one, out=out, n=n, k=k):
            bn, bk, warps, stages = tile
            mv._down_kernel[(1, triton.cdiv(n, bn))](
                x, ids, one, w[None], w, out, x.stride(0), 0, w.stride(0), w.stride(0), out.stride(0),
                n, k, 0, 1, TOP_K=1, HAS_SHARED=False, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages, num_warps=warps,
            )  # fmt: skip
            return out

        want = F.linear(x, w)
        res: dict[str, Any] = {}
        sec = bench_graph(lambda x=x, w=w: F.linear(x, w), flush="read")
        res["cublas_us"] = round(1e6 * sec, 2)
        res["cublas_pct_copy_bw"] = round(100 * n * k * 2 / sec / 1e9 / gbps, 1)
        for tile in tiles:
            key = "/".join(map(str, tile))
            try:
                got = triton_gemv(tile)
                err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
                sec = bench_graph(functools.partial(triton_gemv, tile), flush="read")
                res[key] = {"us": round(1e6 * sec, 2), "pct_copy_bw": round(100 * n * k * 2 / sec / 1e9 / gbps, 1),
                            "rel_err": round(err, 5)}  # fmt: skip
            except Exception as exc:
                res[key] = {"error": repr(exc)[:160]}
        rows[f"{n}x{k}"] = res
        print(f"[dense_gemv] {n}x{k}: {json.dumps(res)}", flush=True)
    return rows
