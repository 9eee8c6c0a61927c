"""Attention kernel microbenchmarks (issue 12) on one GPU: paged MLA decode vs copy bandwidth,
MLA prefill (our Triton kernel vs cuDNN split vs SDPA lower-right causal), DSA indexer + top-k
+ sparse decode. Every figure follows a warm-up call of the same shapes (autotuning included).

    python -m benchmarks.kernels                 # CUDA; prints JSON lines, writes $OUT/kernels_bench.json
    python -m benchmarks.kernels --sections decode,prefill
    python -m benchmarks.kernels --sections dsa_v32   # DeepSeek-V3.2 shapes: benchmarks/dsa_v32.py

Shapes are the benchmark config's MLA (16 heads, latent 512 + rope 64, nope 128, v 128) and a
DeepSeek-V3.2-shaped indexer (64 heads x 128).

Figures worth keeping go to `docs/results/` as data (`docs/figures/kernels_h200.json` holds
long-context kernel figures); the tile tables they chose live in each kernel's `fast.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks import kernels_setup as setup
from benchmarks.kernels_dsa import dsa, dsa_prefill
from benchmarks.kernels_moe import dense_gemv, moe_gemv, moe_tiles
from benchmarks.kernels_setup import (
    DN,
    DV,
    H,
    P,
    R,
    _pool,
    bench,
    bench_graph,
    copy_bandwidth,
)
from inference.kernels.mla_decode.fast import default_num_splits, mla_decode_paged_fast, pick_tile
from inference.kernels.mla_decode.reference import mla_decode_paged_reference
from inference.kernels.mla_prefill.fast import (
    _tuned_prefill_kernel,
    mla_prefill_varlen_cudnn,
    mla_prefill_varlen_triton,
)

RESULTS: dict[str, Any] = {}


def record(name: str, fn, *args) -> None:
    t0 = time.perf_counter()
    try:
        RESULTS[name] = fn(*args)
    except Exception as exc:  # one failed section must not lose the others
        RESULTS[name] = {"error": repr(exc), "trace": traceback.format_exc()[-2000:]}
    RESULTS.setdefault("section_wall_s", {})[name] = round(time.perf_counter() - t0, 1)
    print(f"[{name}] {json.dumps(RESULTS[name], default=str)[:3000]}", flush=True)
    if (out := os.environ.get("OUT")) and not setup.WARM_ONLY:
        Path(out, "kernels_bench.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def _latent_bytes(batch: int, ctx: int, fp8: bool) -> int:
    return batch * ctx * ((R + P) * (1 if fp8 else 2) + (4 if fp8 else 0))


def decode(copy_gbps: float) -> list[dict[str, Any]]:
    rows = []
    shapes = [(1, 8192, 64), (1, 131072, 64), (32, 8192, 64), (32, 16384, 64),
              (32, 131072, 64), (64, 8192, 64), (128, 8192, 64), (256, 8192, 64), (32, 8192, 16)]  # fmt: skip
    for batch, ctx, page in shapes:
        for fp8 in (False, True):
            q_lat, q_rope, pool, scales, tables, lens = _pool(batch, ctx, page, fp8)
            kw = dict(kv_lora_rank=R, scale=192**-0.5, kv_scales=scales)
            fn = lambda: mla_decode_paged_fast(q_lat, q_rope, pool, tables, lens, **kw)  # noqa: B023, E731
            t = bench_graph(fn)
            t_read = bench_graph(fn, flush="read")
            latent_bytes = _latent_bytes(batch, ctx, fp8)
            splits = default_num_splits(batch, tables.shape[1] * page, pool.device)
            row = {
                "batch": batch, "ctx": ctx, "page": page, "cache": "fp8" if fp8 else "bf16",
                "splits": splits, "tile": pick_tile(pool, batch * splits),
                "us": round(t * 1e6, 1), "latent_GBps": round(latent_bytes / t / 1e9, 1),
                "pct_of_copy_bw": round(100 * latent_bytes / t / 1e9 / copy_gbps, 1),
                "us_read_flush": round(t_read * 1e6, 1),
                "pct_of_copy_bw_read_flush": round(100 * latent_bytes / t_read / 1e9 / copy_gbps, 1),
            }  # fmt: skip
            if batch == 32 and ctx == 16384 and page == 64:  # the PyTorch seam it replaces
                t_ref = bench(lambda: mla_decode_paged_reference(q_lat, q_rope, pool, tables, lens, **kw), 5)  # noqa: B023
                row["reference_us"] = round(t_ref * 1e6, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def _timed_tile(
    row: dict[str, Any], fn, latent_bytes: int, copy_gbps: float, flush: str = "write"
) -> dict[str, Any]:
    """One tile/split choice timed by graph replay, as a share of the copy bandwidth (or the error
    of a tile that does not fit shared memory)."""
    try:
        t = bench_graph(fn, 10, flush)
    except Exception as exc:  # a tile that does not fit shared memory
        return {**row, "error": repr(exc)[:200]}
    row = {
        **row,
        "us": round(t * 1e6, 1),
        "pct_of_copy_bw": round(100 * latent_bytes / t / 1e9 / copy_gbps, 1),
    }
    print(json.dumps(row), flush=True)
    return row


def decode_sweep(copy_gbps: float) -> list[dict[str, Any]]:
    """The decode kernel's split count and tile (BLOCK_N, warps, stages) at the shapes that miss
    80% of copy bandwidth, under both L2 flushes (`bench_graph`), plus the split-merge kernel
    alone: what `default_num_splits` / `TILES` should pick."""
    from inference.kernels.mla_decode.fast import _merge_kernel, _pad

    rows = []
    tiles = [(64, 4, 3), (64, 8, 3), (32, 4, 3), (64, 4, 4)]
    cases = [
        (32, 8192, (4, 6, 8, 12)),
        (32, 16384, (8, 12, 16)),
        (64, 8192, (2, 4, 6)),
        (48, 8192, (4, 5, 8)),
    ]
    for batch, ctx, split_opts in cases:
        q_lat, q_rope, pool, _, tables, lens = _pool(batch, ctx, 64, False)
        default = default_num_splits(batch, tables.shape[1] * 64, pool.device)
        for tile in tiles:
            for sp in split_opts:
                for flush in ("write", "read"):
                    kw = dict(kv_lora_rank=R, scale=192**-0.5, num_splits=sp, tile=tile)
                    row = {"batch": batch, "ctx": ctx, "tile": tile, "splits": sp, "flush": flush,
                           "default_splits": default}  # fmt: skip
                    fn = lambda: mla_decode_paged_fast(q_lat, q_rope, pool, tables, lens, **kw)  # noqa: B023, E731
                    rows.append(_timed_tile(row, fn, _latent_bytes(batch, ctx, False), copy_gbps, flush))
        for sp in split_opts:  # the merge kernel's share
            if sp == 1:
                continue
            o_part = torch.randn(batch, sp, H, R, device="cuda")
            lse = torch.randn(batch, sp, H, device="cuda")
            out = torch.empty(batch, H, R, device="cuda")

            def merge(o_part=o_part, lse=lse, out=out, sp=sp, batch=batch):
                _merge_kernel[(batch, H)](
                    o_part, lse, out, sp, o_part.stride(0), o_part.stride(1), o_part.stride(2),
                    lse.stride(0), lse.stride(1), out.stride(0), out.stride(1),
                    R=R, R_PAD=_pad(R), S_PAD=_pad(sp, 2), S_BLOCK=min(8, _pad(sp, 2)),
                )  # fmt: skip

            rows.append({"batch": batch, "ctx": ctx, "merge_only_splits": sp,
                         "us": round(1e6 * bench_graph(merge, 10, "read"), 1)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    return rows


def decode_long_b1(copy_gbps: float) -> list[dict[str, Any]]:
    """Batch 1 at 128K-1M keys: split counts past `_MAX_SPLITS` (one or two programs per SM, a
    second wave) and the two tile classes, under the read flush (a decode step's weights sit in L2)."""
    rows = []
    for ctx in (131072, 1048576):
        q_lat, q_rope, pool, _, tables, lens = _pool(1, ctx, 64, False)
        default = default_num_splits(1, tables.shape[1] * 64, pool.device)
        for tile in ((64, 8, 5), (64, 4, 3), (64, 8, 3), (32, 4, 3)):
            for sp in (64, 128, 132, 256, 264, 512):
                kw = dict(kv_lora_rank=R, scale=192**-0.5, num_splits=sp, tile=tile)
                row = {"batch": 1, "ctx": ctx, "tile": tile, "splits": sp, "default_splits": default}
                fn = lambda: mla_decode_paged_fast(q_lat, q_rope, pool, tables, lens, **kw)  # noqa: B023, E731
                rows.append(_timed_tile(row, fn, _latent_bytes(1, ctx, False), copy_gbps, "read"))
        torch.cuda.empty_cache()
    return rows


def decode_deep(copy_gbps: float) -> list[dict[str, Any]]:
    """Deeper pipelines at the default splits: Triton single-buffers the latent tile at 2-4 stages
    (~94 KB of shared memory, `benchmarks/kernels_compile_check.py`); 5 stages double-buffer it
    (64 rows: 169 KB, one program per SM; 32 rows: 94 KB, two). Baseline: the `TILES` pick."""
    rows = []
    for batch, ctx in ((32, 8192), (32, 16384), (128, 8192), (32, 131072), (1, 131072)):
        q_lat, q_rope, pool, _, tables, lens = _pool(batch, ctx, 64, False)
        splits = default_num_splits(batch, tables.shape[1] * 64, pool.device)
        base = pick_tile(pool, batch * splits)
        for tile in (base, (64, 4, 5), (64, 8, 5), (32, 4, 5), (32, 8, 5)):
            kw = dict(kv_lora_rank=R, scale=192**-0.5, num_splits=splits, tile=tile)
            row = {"batch": batch, "ctx": ctx, "tile": tile, "splits": splits, "baseline": tile == base}
            fn = lambda: mla_decode_paged_fast(q_lat, q_rope, pool, tables, lens, **kw)  # noqa: B023, E731
            rows.append(_timed_tile(row, fn, _latent_bytes(batch, ctx, False), copy_gbps))
        torch.cuda.empty_cache()
    return rows


def _prefill_inputs(q_len: int, s_len: int, seed: int = 0):
    g = torch.Generator("cuda").manual_seed(seed)
    q = torch.randn(q_len, H, DN + P, generator=g, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(s_len, H, DN + DV, generator=g, device="cuda", dtype=torch.bfloat16)
    lat = torch.randn(s_len, R + P, generator=g, device="cuda", dtype=torch.bfloat16)
    cu_q = torch.tensor([0, q_len], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, s_len], dtype=torch.int32, device="cuda")
    return q, kv, lat[:, R:], cu_q, cu_k


def _sdpa_lower_right(q, kv, kr, cu_q, cu_k, *, max_q, scale, nope_dim):
    """SDPA with a `causal_lower_right` bias (no mask in HBM; PyTorch routes it to mem-efficient)."""
    from torch.nn.attention.bias import causal_lower_right

    s = kv.shape[0]
    k = torch.cat([kv[:, :, :nope_dim], kr[:, None].expand(s, H, P)], -1).transpose(0, 1)[None]
    v = kv[:, :, nope_dim:].transpose(0, 1)[None]
    qq = q.transpose(0, 1)[None]
    bias = causal_lower_right(q.shape[0], s)
    return torch.nn.functional.scaled_dot_product_attention(qq, k, v, attn_mask=bias, scale=scale)


def prefill() -> list[dict[str, Any]]:
    rows = []
    shapes = [(32768, 32768), (8192, 32768), (8192, 131072), (8192, 524288), (16384, 131072),
              (4096, 131072), (2048, 131072)]  # fmt: skip
    for q_len, s_len in shapes:
        q, kv, kr, cu_q, cu_k = _prefill_inputs(q_len, s_len)
        ctx = s_len - q_len
        # causal FLOPs: the visible (query, key) pairs times 2 * (Dqk + Dv) per head
        pairs = q_len * ctx + q_len * (q_len + 1) / 2
        flops = 2 * H * (DN + P + DV) * pairs
        kw = dict(max_q=q_len, scale=192**-0.5, nope_dim=DN)
        row: dict[str, Any] = {"q_len": q_len, "keys": s_len}
        for name, fn in (("triton", mla_prefill_varlen_triton), ("cudnn_split", mla_prefill_varlen_cudnn),
                         ("sdpa_lower_right", _sdpa_lower_right)):  # fmt: skip
            try:
                t = bench(lambda: fn(q, kv, kr, cu_q, cu_k, **kw), reps=5)  # noqa: B023
                row[f"{name}_ms"] = round(t * 1e3, 2)
                row[f"{name}_TFLOPs"] = round(flops / t / 1e12, 1)
            except Exception as exc:  # a backend without a kernel for this shape
                row[f"{name}_error"] = repr(exc)[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    RESULTS["prefill_best_config"] = str(getattr(_tuned_prefill_kernel, "best_config", None))
    return rows


def prefill_chunking(total: int = 131072) -> list[dict[str, Any]]:
    """One MLA layer's whole prefill of `total` tokens in chunks of C: per chunk the latents of the
    prefix are expanded (`kv_b_proj` GEMM) and attended. Picks the chunk size by measurement."""
    rows = []
    w = torch.randn(H * (DN + DV), R, device="cuda", dtype=torch.bfloat16) * R**-0.5
    lat_all = torch.randn(total, R + P, device="cuda", dtype=torch.bfloat16)
    for chunk in (2048, 4096, 8192, 16384, 32768):
        for backend, fn in (("triton", mla_prefill_varlen_triton), ("cudnn_split", mla_prefill_varlen_cudnn)):

            def run(chunk=chunk, fn=fn):
                for start in range(0, total, chunk):
                    s = start + chunk
                    lat = lat_all[:s]
                    kv = (lat[:, :R] @ w.T).view(s, H, DN + DV)
                    q = torch.empty(chunk, H, DN + P, device="cuda", dtype=torch.bfloat16).normal_()
                    cu_q = torch.tensor([0, chunk], dtype=torch.int32, device="cuda")
                    cu_k = torch.tensor([0, s], dtype=torch.int32, device="cuda")
                    fn(q, kv, lat[:, R:], cu_q, cu_k, max_q=chunk, scale=192**-0.5, nope_dim=DN)

            t = bench(run, reps=2)
            rows.append(
                {"total": total, "chunk": chunk, "backend": backend, "layer_prefill_ms": round(t * 1e3, 1)}
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def layer_prefill(lengths: tuple[int, ...] = (131072, 524288), chunk: int = 16384) -> list[dict[str, Any]]:
    """One MLA layer of the benchmark config (bf16, the model's own code path: latent write, paged
    gather, kv_b_proj expansion, the chosen prefill backend) prefilling one sequence in `chunk`-token
    chunks: the shapes that ran out of memory before (a materialised [L, S] mask)."""
    from inference.config import parse_config
    from inference.engine.factory import small_model_config
    from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, init_dummy_weights
    from inference.model.mla import MLAttention

    cfg = small_model_config()
    cfg.update(num_hidden_layers=1, hidden_size=2048, num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=R,
               qk_nope_head_dim=DN, qk_rope_head_dim=P, v_head_dim=DV,
               linear_attn_config={"kda_layers": [], "full_attn_layers": [1], "num_heads": 16, "head_dim": 128,
                                   "short_conv_kernel_size": 4})  # fmt: skip
    spec = parse_config(cfg)
    layer = MLAttention(spec, layer_idx=0)
    init_dummy_weights(layer, seed=0)
    layer = layer.to("cuda", torch.bfloat16).eval()
    import inference.kernels.mla_prefill as prefill_ops

    rows = []
    default = prefill_ops.PREFILL_BACKEND
    for backend in ("triton", "cudnn", "auto"):
        prefill_ops.PREFILL_BACKEND = backend
        for n in lengths:
            blocks = n // 64 + 1
            spec_c = HybridCacheSpec.from_model_spec(spec)
            cache = HybridCacheTensors.allocate(spec_c, blocks, 64, 1, "cuda", torch.bfloat16)
            table = list(range(blocks))
            x = torch.randn(chunk, 2048, device="cuda", dtype=torch.bfloat16)
            # host-side batch metadata built before the clock starts (the engine's runner does its own)
            metas = [
                ForwardMeta.for_sequences([chunk], [s], [table], 64, [0], device="cuda")
                for s in range(0, n, chunk)
            ]

            def run(metas=metas, cache=cache, x=x):
                for meta in metas:
                    layer(x, meta, cache)

            with torch.inference_mode():
                run(metas[:2])  # warm-up: compiles; later chunks are new (L, S) shapes, as in serving
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                run()
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
            flops = 2 * H * (DN + P + DV) * n * (n + 1) / 2
            rows.append({"backend": backend, "tokens": n, "chunk": chunk, "seconds": round(dt, 3),
                         "attention_TFLOPs_equiv": round(flops / dt / 1e12, 1),
                         "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            del cache, metas
            torch.cuda.empty_cache()
    prefill_ops.PREFILL_BACKEND = default
    return rows


def dsa_v32() -> dict[str, Any]:
    """DSA vs dense on DeepSeek-V3.2-shaped attention (128 heads; `benchmarks/dsa_v32.py`, where
    the shapes and what each path runs are described): prefill chunk and decode b1 / b32 at 32K
    to 1M keys, after the two prefill paths' agreement check."""
    from benchmarks.dsa_v32 import CONTEXTS, run

    res: dict[str, Any] = {}
    run(["agreement", "prefill", "decode"], list(CONTEXTS), res, lambda: None)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--sections",
        default="copy,decode,sweep,deep,long_b1,prefill,chunking,layer_prefill,dsa,dsa_prefill,moe,moe_gemv,dense_gemv,dsa_v32",
    )
    ap.add_argument("--warm-only", action="store_true", help="compile every variant, time nothing")
    args = ap.parse_args()
    want = args.sections.split(",")
    setup.WARM_ONLY = args.warm_only
    RESULTS["device"] = torch.cuda.get_device_name()
    RESULTS["torch"] = torch.__version__
    import triton

    RESULTS["triton"] = triton.__version__
    record("copy_bandwidth", copy_bandwidth)
    gbps = RESULTS["copy_bandwidth"].get("GBps", 4000.0)
    sections = {
        "decode": lambda: record("decode", decode, gbps),
        "sweep": lambda: record("decode_sweep", decode_sweep, gbps),
        "deep": lambda: record("decode_deep", decode_deep, gbps),
        "long_b1": lambda: record("decode_long_b1", decode_long_b1, gbps),
        "prefill": lambda: record("prefill", prefill),
        "chunking": lambda: record("prefill_chunking", prefill_chunking),
        "layer_prefill": lambda: record("layer_prefill", layer_prefill),
        "dsa": lambda: record("dsa", dsa),
        "dsa_prefill": lambda: record("dsa_prefill", dsa_prefill),
        "moe": lambda: record("moe", moe_tiles, gbps),
        "moe_gemv": lambda: record("moe_gemv", moe_gemv, gbps),
        "dense_gemv": lambda: record("dense_gemv", dense_gemv, gbps),
        "dsa_v32": lambda: record("dsa_v32", dsa_v32),
    }
    for name in want:  # in the order given (a time limit then cuts the last ones)
        if name in sections:
            sections[name]()


if __name__ == "__main__":
    main()
