"""`benchmarks.kernels`'s DSA sections on the benchmark config's shapes: the decode indexer, top-k
and sparse attention against dense decode (`dsa`), and the prefill indexer's scoring and selection
by rows per key-tile read (`dsa_prefill`)."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.kernels_setup import FP8_PEAK_TFLOPS, R, _pool, bench, bench_graph
from inference.kernels.dsa import PREFILL_ROWS
from inference.kernels.dsa.fast import dsa_scores_fast, dsa_topk_paged_fast
from inference.kernels.dsa.reference import SCORE_BUDGET
from inference.kernels.mla_decode.fast import mla_decode_paged_fast
from inference.kernels.topk.fast import select_rows
from inference.model.cache_tensors import quantize_rows_fp8


def _fp8_index_pool(ipool: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 index keys `[blocks, page, D]` in the FP8 cache's per-block layout (e4m3 keys, then
    their fp32 scales): the strided views the indexer reads."""
    nb, page, d = ipool.shape
    q, scale = quantize_rows_fp8(ipool.reshape(-1, d))
    raw = torch.empty(nb, page * (d + 4), dtype=torch.uint8, device=ipool.device)
    raw[:, : page * d] = q.view(torch.uint8).view(nb, page * d)
    raw[:, page * d :] = scale.view(nb, page).view(torch.uint8).view(nb, page * 4)
    keys = raw[:, : page * d].view(torch.float8_e4m3fn).view(nb, page, d)
    return keys, raw[:, page * d :].view(torch.float32)


def dsa() -> dict[str, Any]:
    """Decode step of one layer at batch 32, 128K context, top-2048: indexer (bf16 or FP8 keys) +
    the radix top-k + sparse attention, vs dense paged decode over all keys; the parts alone; the
    FP8 selection's recall of the bf16 one; the prefill-side scoring throughput."""
    res: dict[str, Any] = {}
    batch, ctx, page, hi, d, k = 32, 131072, 64, 64, 128, 2048
    q_lat, q_rope, pool, _, tables, lens = _pool(batch, ctx, page, False)
    g = torch.Generator("cuda").manual_seed(1)
    ipool = torch.randn(pool.shape[0], page, d, generator=g, device="cuda", dtype=torch.bfloat16)
    keys8, scales8 = _fp8_index_pool(ipool)
    iq = torch.randn(batch, hi, d, generator=g, device="cuda", dtype=torch.bfloat16)
    iw = torch.randn(batch, hi, generator=g, device="cuda") * hi**-0.5
    kw = dict(kv_lora_rank=R, scale=192**-0.5)
    scores = torch.empty(batch, ctx, device="cuda")
    res["index_key_bytes_bf16"] = batch * ctx * d * 2
    res["index_key_bytes_fp8"] = batch * ctx * (d + 4)
    for name, pool_i, sc in (("bf16", ipool, None), ("fp8", keys8, scales8)):
        fn = lambda pool_i=pool_i, sc=sc: dsa_scores_fast(  # noqa: E731
            iq, iw, pool_i, tables, lens, scores, 0, index_scales=sc
        )
        t = bench_graph(fn, flush="read")
        res[f"scoring_{name}_us"] = round(1e6 * t, 1)
        res[f"scoring_{name}_GBps"] = round(res[f"index_key_bytes_{name}"] / t / 1e9, 1)
    sweep = []
    for tile in ((128, 4, 3), (128, 8, 3), (64, 4, 3), (128, 4, 4), (256, 8, 3), (64, 4, 5)):
        try:
            fn = lambda tile=tile: dsa_scores_fast(iq, iw, keys8, tables, lens, scores, 0, index_scales=scales8,  # noqa: E731
                                                   score_tile=tile)  # fmt: skip
            t = bench_graph(fn, 10, "read")
            sweep.append({"tile": tile, "us": round(1e6 * t, 1),
                          "GBps": round(res["index_key_bytes_fp8"] / t / 1e9, 1)})  # fmt: skip
        except Exception as exc:  # a tile that does not fit
            sweep.append({"tile": tile, "error": repr(exc)[:200]})
    res["fp8_scoring_tiles"] = sweep
    dsa_scores_fast(iq, iw, keys8, tables, lens, scores, 0, index_scales=scales8)
    out = torch.empty(batch, k, dtype=torch.long, device="cuda")
    res["radix_topk_us"] = round(
        1e6 * bench_graph(lambda: select_rows(scores, lens, out, 0), flush="read"), 1
    )
    res["torch_topk_us"] = round(1e6 * bench_graph(lambda: scores.topk(k, dim=-1), flush="read"), 1)
    for name, pool_i, sc in (("bf16", ipool, None), ("fp8", keys8, scales8)):
        fn = lambda pool_i=pool_i, sc=sc: dsa_topk_paged_fast(  # noqa: E731
            iq, iw, pool_i, tables, lens, topk=k, index_scales=sc
        )
        res[f"indexer_topk_{name}_us"] = round(1e6 * bench_graph(fn, flush="read"), 1)
    idx = dsa_topk_paged_fast(iq, iw, keys8, tables, lens, topk=k, index_scales=scales8)
    idx_bf16 = dsa_topk_paged_fast(iq, iw, ipool, tables, lens, topk=k)
    res["fp8_recall_of_bf16_top2048"] = round(
        sum(torch.isin(idx[n], idx_bf16[n]).float().mean().item() for n in range(batch)) / batch, 4
    )
    sparse = lambda: mla_decode_paged_fast(q_lat, q_rope, pool, tables, lens, indices=idx, **kw)  # noqa: E731
    res["sparse_attention_us"] = round(1e6 * bench_graph(sparse, flush="read"), 1)

    def step(pool_i=keys8, sc=scales8):
        sel = dsa_topk_paged_fast(iq, iw, pool_i, tables, lens, topk=k, index_scales=sc)
        return mla_decode_paged_fast(q_lat, q_rope, pool, tables, lens, indices=sel, **kw)

    dense = lambda: mla_decode_paged_fast(q_lat, q_rope, pool, tables, lens, **kw)  # noqa: E731
    for flush in ("read", "write"):
        res[f"dsa_step_fp8_us_{flush}_flush"] = round(1e6 * bench_graph(step, flush=flush), 1)
        res[f"dsa_step_bf16_us_{flush}_flush"] = round(
            1e6 * bench_graph(lambda: step(ipool, None), flush=flush), 1
        )
        res[f"dense_decode_us_{flush}_flush"] = round(1e6 * bench_graph(dense, flush=flush), 1)
        res[f"speedup_fp8_vs_dense_{flush}_flush"] = round(
            res[f"dense_decode_us_{flush}_flush"] / res[f"dsa_step_fp8_us_{flush}_flush"], 2
        )
    return res


def dsa_prefill() -> dict[str, Any]:
    """Prefill indexer: an 8K-query chunk of one sequence over 128K keys (rows at positions
    120K-128K, in the row blocks the indexer uses): scoring TFLOP/s for bf16 and FP8 keys by rows
    per key-tile read (1 = the single-row kernel) and tile, the top-2048 selection alone by path
    (`select_rows` method), then scoring + selection."""
    res: dict[str, Any] = {"fp8_peak_tflops": FP8_PEAK_TFLOPS}
    ctx, page, hi, d, k, lq = 131072, 64, 64, 128, 2048, 8192
    _, _, pool, _, tables, _ = _pool(1, ctx, page, False)
    g = torch.Generator("cuda").manual_seed(1)
    ipool = torch.randn(pool.shape[0], page, d, generator=g, device="cuda", dtype=torch.bfloat16)
    keys8, scales8 = _fp8_index_pool(ipool)
    rows_t = torch.zeros(lq, dtype=torch.long, device="cuda")
    piq = torch.randn(lq, hi, d, generator=g, device="cuda", dtype=torch.bfloat16)
    piw = torch.randn(lq, hi, generator=g, device="cuda") * hi**-0.5
    plens = torch.arange(ctx - lq, ctx, device="cuda", dtype=torch.int32) + 1
    step_rows = SCORE_BUDGET // ctx
    pscores = torch.empty(step_rows, ctx, device="cuda")
    score_flops = 2 * lq * (ctx - lq / 2) * hi * d
    sweep = []
    for name, pool_i, sc in (("bf16", ipool, None), ("fp8", keys8, scales8)):
        for group, tile in (
            (1, None),
            (2, None),
            (4, None),
            (4, (64, 4, 3)),
            (4, (128, 8, 3)),
            (2, (128, 8, 3)),
        ):

            def prefill_scores(pool_i=pool_i, sc=sc, group=group, tile=tile):
                for r0 in range(0, lq, step_rows):
                    dsa_scores_fast(piq, piw, pool_i, tables, plens, pscores, r0, index_scales=sc,
                                    table_rows=rows_t, score_tile=tile, rows_per_program=group)  # fmt: skip

            try:
                t = bench(prefill_scores, reps=3)
            except Exception as exc:  # a tile that does not fit
                sweep.append({"keys": name, "rows": group, "tile": tile, "error": repr(exc)[:200]})
                continue
            row = {"keys": name, "rows": group, "tile": tile, "ms": round(1e3 * t, 2),
                   "TFLOPs": round(score_flops / t / 1e12, 1)}  # fmt: skip
            if name == "fp8":
                row["pct_fp8_peak"] = round(100 * score_flops / t / 1e12 / FP8_PEAK_TFLOPS, 1)
            sweep.append(row)
            print(f"[dsa_prefill] {row}", flush=True)
    res["scoring_8k_over_128k"] = sweep
    # the selection alone over the same row blocks (the last block's scores stand for all): as
    # dispatched (the compact path) and each path forced
    out = torch.empty(lq, k, dtype=torch.long, device="cuda")
    for method in ("auto", "radix", "compact"):

        def select(method=method):
            for r0 in range(0, lq, step_rows):
                select_rows(pscores[: min(step_rows, lq - r0)], plens, out, r0, method=method)

        res[f"select_8k_over_128k_{method}_ms"] = round(1e3 * bench(select, reps=3), 2)
    for name, pool_i, sc in (("bf16", ipool, None), ("fp8", keys8, scales8)):
        for group in (1, PREFILL_ROWS[name]):
            fn = lambda pool_i=pool_i, sc=sc, group=group: dsa_topk_paged_fast(  # noqa: E731
                piq, piw, pool_i, tables, plens, topk=k, table_rows=rows_t, index_scales=sc,
                rows_per_program=group,
            )  # fmt: skip
            res[f"indexer_topk_8k_over_128k_{name}_rows{group}_ms"] = round(1e3 * bench(fn, reps=3), 2)
    return res
