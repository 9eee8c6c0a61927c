"""DSA vs dense MLA on DeepSeek-V3.2-shaped attention, one layer on one GPU, our kernels.

Shapes (inference/configs/deepseek_v32_exp.json): 128 query heads, kv_lora_rank 512, rope 64,
nope 128, v 128; indexer 64 heads x 128 with FP8 (e4m3, per-key scale) keys, top-2048; page 64.

- prefill: one 8K-query chunk at the end of a context of 32K / 128K / 512K / 1M keys.
  Dense: the model's dense path (`MLAttention._prefill_dense`): latents expanded by `kv_b_proj`
  to `[S, 128, 256]`, then the cuDNN prefix-pieces + causal-diagonal split merged by LSE
  (`mla_prefill.fast`). The expanded keys of 1M tokens are 64 GiB, so both the expansion and the
  attention run a 64K-key piece at a time (the cuDNN path's own piece), a piece's expanded keys
  freed before the next: the same FLOPs, bounded memory. DSA: the indexer's prefill scorer + the
  radix top-2048 (`dsa_topk_paged_fast`, `PREFILL_ROWS` rows per key-tile read), the query
  absorption into latent space, sparse absorbed attention over the selected keys
  (`mla_decode_paged_fast` with indices) and the value projection.
- decode: batch 1 and 32, every row at the full context, CUDA-graph replay with L2 flushed by
  reads. Dense: absorbed paged decode over all keys; DSA: indexer + top-k + sparse decode.
- prefill_split: the DSA prefill chunk's parts timed alone (scorer, top-k selection, query
  absorption, sparse attention, value projection); the selection as dispatched (`select_ms`) and
  forced to each path (`select_radix_ms`, `select_compact_ms`), and the share of rows the compact
  path selected without its radix fallback.
- headblocks: that chunk's sparse attention alone by heads per program and tile
  (`benchmarks/dsa_v32_headblocks.py`).
- scorer: the prefill scorer alone (8K queries over 128K keys, FP8 and bf16 keys) by rows per
  program, for the scorer module given (`scorer_rows(module)`: compare two builds of
  `inference.kernels.dsa.fast` in one process).

Memory, computed for a 78 GiB H100 (not yet measured): the largest case is decode b32 x 1M (bf16
latents 36 GiB + FP8 index keys 4 GiB, ~52 GiB at the peak of building them), so no case is
scaled down; dense prefill at 1M holds one 64K-key piece expanded (~7 GiB) and the pieces'
partial outputs (16 x 256 MiB).

    python -m benchmarks.dsa_v32                      # all parts; JSON to stdout and $OUT/dsa_v32.json
    python -m benchmarks.dsa_v32 --parts decode --contexts 32768,131072
    python -m benchmarks.dsa_v32 --parts headblocks --contexts 131072,1048576
    python -m benchmarks.dsa_v32 --plot docs/results/dsa_v32.json   # the figure, beside the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from benchmarks.kernels_setup import bench, bench_graph

H, R, P, DN, DV = 128, 512, 64, 128, 128
HI, DI, TOPK, PAGE = 64, 128, 2048, 64
CHUNK = 8192
PIECE = 65536
SCALE = (DN + P) ** -0.5
CONTEXTS = (32768, 131072, 524288, 1048576)
PARTS = ("agreement", "decode", "prefill", "prefill_split", "headblocks", "scorer")
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: Triton's interpreter, tiny shapes


def _randn(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Normal noise straight in `dtype` (no fp32 copy of a 36 GiB pool)."""
    g = torch.Generator(DEV).manual_seed(seed)
    return torch.empty(shape, dtype=dtype, device=DEV).normal_(generator=g)


class Layer:
    """One sequence's (or batch's) paged caches and the layer weights the two paths use."""

    def __init__(self, batch: int, ctx: int, seed: int = 0) -> None:
        from inference.model.cache_tensors import quantize_rows_fp8

        blocks = batch * (-(-ctx // PAGE))
        self.pool = _randn((blocks, PAGE, R + P), torch.bfloat16, seed)
        keys = _randn((blocks * PAGE, DI), torch.bfloat16, seed + 1)
        k8, s8 = [], []
        for a in range(0, keys.shape[0], 1 << 22):  # quantised in slices (no fp32 copy of all keys)
            q, s = quantize_rows_fp8(keys[a : a + (1 << 22)].float())
            k8.append(q)
            s8.append(s)
        del keys
        self.ikeys = torch.cat(k8).view(blocks, PAGE, DI)
        self.iscales = torch.cat(s8).view(blocks, PAGE)
        g = torch.Generator(DEV).manual_seed(seed + 2)
        self.tables = torch.randperm(blocks, generator=g, device=DEV).int().view(batch, -1)
        self.w_kv = _randn((H * (DN + DV), R), torch.bfloat16, seed + 3) * R**-0.5
        w = self.w_kv.view(H, DN + DV, R)
        self.w_uk, self.w_uv = w[:, :DN], w[:, DN:]
        self.ctx = ctx

    def latents(self, a: int, b: int) -> torch.Tensor:
        """Latents of positions `[a, b)` of sequence 0, gathered through its block table."""
        pos = torch.arange(a, b, device=DEV)
        rows = self.tables[0].long()[pos // PAGE] * PAGE + pos % PAGE
        return self.pool.view(-1, R + P)[rows]


def dense_prefill(layer: Layer, q: torch.Tensor) -> torch.Tensor:
    """The dense path for the last `len(q)` queries (`q` `[L, H, DN + P]`), a key piece at a time."""
    from inference.kernels.mla_prefill.fast import _cudnn, merge_by_lse

    ctx = layer.ctx
    qq = q.transpose(0, 1)[None]

    def part(a: int, b: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        lat = layer.latents(a, b)
        kv = (lat[:, :R] @ layer.w_kv.T).view(b - a, H, DN + DV)
        kr = lat[:, None, R:].expand(b - a, H, P)
        k = torch.cat([kv[..., :DN], kr], dim=-1).transpose(0, 1)[None]
        return _cudnn(qq, k, kv[..., DN:].transpose(0, 1)[None], causal, SCALE)

    start = ctx - q.shape[0]
    parts = [part(start, ctx, True)]
    parts += [part(a, min(a + PIECE, start), False) for a in range(0, start, PIECE)]
    return merge_by_lse(parts)[0].transpose(0, 1)


def dsa_prefill(
    layer: Layer, q: torch.Tensor, iq: torch.Tensor, iw: torch.Tensor, topk: int = TOPK
) -> torch.Tensor:
    """The DSA path for the last `len(q)` queries: indexer top-k, absorbed sparse attention."""
    from inference.kernels.dsa import PREFILL_ROWS
    from inference.kernels.dsa.fast import dsa_topk_paged_fast
    from inference.kernels.mla_decode.fast import mla_decode_paged_fast

    n = q.shape[0]
    lens = torch.arange(layer.ctx - n, layer.ctx, device=DEV, dtype=torch.int32) + 1
    rows = torch.zeros(n, dtype=torch.long, device=DEV)
    idx = dsa_topk_paged_fast(
        iq, iw, layer.ikeys, layer.tables, lens, topk=topk, table_rows=rows,
        index_scales=layer.iscales, rows_per_program=PREFILL_ROWS["fp8"],
    )  # fmt: skip
    q_lat = torch.einsum("nhd,hdr->nhr", q[..., :DN], layer.w_uk)
    o = mla_decode_paged_fast(
        q_lat, q[..., DN:], layer.pool, layer.tables, lens, kv_lora_rank=R, scale=SCALE,
        indices=idx, table_rows=rows,
    )  # fmt: skip
    return torch.einsum("nhr,hvr->nhv", o.to(torch.bfloat16), layer.w_uv)


def agreement(ctx: int = 1536, chunk: int = 512) -> dict[str, Any]:
    """Both prefill paths on one small case where top-2048 keeps every key (`ctx <= 2048`): DSA's
    sparse attention must then equal the dense path (the timed paths compute the same thing)."""
    layer = Layer(1, ctx)
    q = _randn((chunk, H, DN + P), torch.bfloat16, 7)
    iq = _randn((chunk, HI, DI), torch.bfloat16, 8)
    iw = _randn((chunk, HI), torch.float32, 9) * HI**-0.5
    dense = dense_prefill(layer, q).float()
    sparse = dsa_prefill(layer, q, iq, iw).float()
    return {
        "ctx": ctx,
        "queries": chunk,
        "max_rel_diff": float((dense - sparse).abs().max() / dense.abs().max()),
    }


def prefill(ctx: int) -> dict[str, Any]:
    layer = Layer(1, ctx)
    q = _randn((CHUNK, H, DN + P), torch.bfloat16, 7)
    iq = _randn((CHUNK, HI, DI), torch.bfloat16, 8)
    iw = _randn((CHUNK, HI), torch.float32, 9) * HI**-0.5
    reps = 3 if ctx <= 131072 else 2
    t_dense = bench(lambda: dense_prefill(layer, q), reps)
    t_dsa = bench(lambda: dsa_prefill(layer, q, iq, iw), reps)
    torch.cuda.reset_peak_memory_stats()
    dsa_prefill(layer, q, iq, iw)
    peak = torch.cuda.max_memory_allocated() / 2**30
    flops = 2 * CHUNK * (ctx - CHUNK / 2) * H * (DN + P + DV)
    return {
        "ctx": ctx, "queries": CHUNK, "dense_ms": round(1e3 * t_dense, 2),
        "dense_attention_TFLOPs": round(flops / t_dense / 1e12, 1), "dsa_ms": round(1e3 * t_dsa, 2),
        "speedup": round(t_dense / t_dsa, 2), "dsa_peak_gib": round(peak, 2),
    }  # fmt: skip


def prefill_chunk(ctx: int) -> SimpleNamespace:
    """The DSA prefill chunk (8K queries at the end of `ctx` keys, one table row): its layer,
    queries, indexer inputs, key lengths, top-k selection (`idx`) and absorbed queries (`q_lat`);
    `prefill_split` and the head-block sweep time the same chunk."""
    from inference.kernels.dsa import PREFILL_ROWS
    from inference.kernels.dsa.fast import dsa_topk_paged_fast

    layer = Layer(1, ctx)
    q = _randn((CHUNK, H, DN + P), torch.bfloat16, 7)
    iq = _randn((CHUNK, HI, DI), torch.bfloat16, 8)
    iw = _randn((CHUNK, HI), torch.float32, 9) * HI**-0.5
    lens = torch.arange(ctx - CHUNK, ctx, device=DEV, dtype=torch.int32) + 1
    trows = torch.zeros(CHUNK, dtype=torch.long, device=DEV)
    idx = dsa_topk_paged_fast(iq, iw, layer.ikeys, layer.tables, lens, topk=TOPK, table_rows=trows,
                              index_scales=layer.iscales, rows_per_program=PREFILL_ROWS["fp8"])  # fmt: skip
    q_lat = torch.einsum("nhd,hdr->nhr", q[..., :DN], layer.w_uk)
    return SimpleNamespace(layer=layer, q=q, iq=iq, iw=iw, lens=lens, trows=trows, idx=idx, q_lat=q_lat)


def compact_rows_pct(scores: torch.Tensor, lens: torch.Tensor, idx: torch.Tensor, step: int) -> float:
    """Percent of the chunk's rows (each block over the last block's scores, as `select` times them)
    that the compact top-k path selects itself, without its radix fallback."""
    from inference.kernels.topk.fast import compact_rows

    done = 0
    for r0 in range(0, CHUNK, step):
        done += int(compact_rows(scores[: min(step, CHUNK - r0)], lens, idx, r0).sum().item())
    return round(100 * done / CHUNK, 2)


def prefill_split(ctx: int) -> dict[str, Any]:
    """The DSA prefill chunk's parts timed alone (8K queries at the end of `ctx` keys): the
    indexer's scorer, the top-k selection over its scores, the query absorption, the sparse
    attention over the selected keys and the value projection (where a missed target goes)."""
    from inference.kernels.dsa import PREFILL_ROWS
    from inference.kernels.dsa.fast import dsa_scores_fast
    from inference.kernels.dsa.reference import SCORE_BUDGET
    from inference.kernels.mla_decode.fast import mla_decode_paged_fast
    from inference.kernels.topk.fast import select_rows

    c = prefill_chunk(ctx)
    layer, q, iq, iw, lens, trows, idx, q_lat = c.layer, c.q, c.iq, c.iw, c.lens, c.trows, c.idx, c.q_lat
    max_keys = layer.tables.shape[1] * PAGE
    step = max(1, min(CHUNK, SCORE_BUDGET // max_keys))
    scores = torch.empty(step, max_keys, device=DEV)

    def score() -> None:
        for r0 in range(0, CHUNK, step):
            dsa_scores_fast(iq, iw, layer.ikeys, layer.tables, lens, scores[: min(step, CHUNK - r0)], r0,
                            index_scales=layer.iscales, table_rows=trows,
                            rows_per_program=PREFILL_ROWS["fp8"])  # fmt: skip

    def select(method: str = "auto") -> None:  # the same blocks; the last block's scores stand for all
        for r0 in range(0, CHUNK, step):
            select_rows(scores[: min(step, CHUNK - r0)], lens, idx, r0, method=method)

    def absorb():
        return torch.einsum("nhd,hdr->nhr", q[..., :DN], layer.w_uk)

    def sparse():
        return mla_decode_paged_fast(q_lat, q[..., DN:], layer.pool, layer.tables, lens, kv_lora_rank=R,
                                     scale=SCALE, indices=idx, table_rows=trows)  # fmt: skip

    o = sparse().to(torch.bfloat16)

    def value():
        return torch.einsum("nhr,hvr->nhv", o, layer.w_uv)

    parts = {"score": score, "select": select, "select_radix": lambda: select("radix"),
             "select_compact": lambda: select("compact"), "absorb": absorb,
             "sparse_attention": sparse, "value": value}  # fmt: skip
    row: dict[str, Any] = {"ctx": ctx, "queries": CHUNK, "score_rows_per_block": step}
    for name, fn in parts.items():
        row[f"{name}_ms"] = round(1e3 * bench(fn, 3), 2)
    row["select_compact_rows_pct"] = compact_rows_pct(scores, lens, idx, step)
    sparse_flops = 2 * CHUNK * H * min(TOPK, ctx) * (R + P + R)
    row["sparse_attention_TFLOPs"] = round(sparse_flops / (row["sparse_attention_ms"] / 1e3) / 1e12, 1)
    score_flops = 2 * CHUNK * (ctx - CHUNK / 2) * HI * DI
    row["score_TFLOPs"] = round(score_flops / (row["score_ms"] / 1e3) / 1e12, 1)
    return row


def decode(batch: int, ctx: int) -> dict[str, Any]:
    from inference.kernels.dsa.fast import dsa_topk_paged_fast
    from inference.kernels.mla_decode.fast import mla_decode_paged_fast

    layer = Layer(batch, ctx)
    q_lat = _randn((batch, H, R), torch.bfloat16, 7)
    q_rope = _randn((batch, H, P), torch.bfloat16, 8)
    iq = _randn((batch, HI, DI), torch.bfloat16, 9)
    iw = _randn((batch, HI), torch.float32, 10) * HI**-0.5
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    kw = dict(kv_lora_rank=R, scale=SCALE)

    def dense():
        return mla_decode_paged_fast(q_lat, q_rope, layer.pool, layer.tables, lens, **kw)

    def select():
        return dsa_topk_paged_fast(iq, iw, layer.ikeys, layer.tables, lens, topk=TOPK,
                                   index_scales=layer.iscales)  # fmt: skip

    idx = select()

    def sparse():
        return mla_decode_paged_fast(q_lat, q_rope, layer.pool, layer.tables, lens, indices=idx, **kw)

    def step():
        sel = select()
        return mla_decode_paged_fast(q_lat, q_rope, layer.pool, layer.tables, lens, indices=sel, **kw)

    t_dense, t_step = bench_graph(dense, flush="read"), bench_graph(step, flush="read")
    latent_bytes = batch * ctx * (R + P) * 2
    return {
        "batch": batch, "ctx": ctx, "dense_us": round(1e6 * t_dense, 1),
        "dense_latent_GBps": round(latent_bytes / t_dense / 1e9, 1),
        "dsa_step_us": round(1e6 * t_step, 1), "indexer_topk_us": round(1e6 * bench_graph(select, flush="read"), 1),
        "sparse_attention_us": round(1e6 * bench_graph(sparse, flush="read"), 1),
        "dsa_over_dense": round(t_step / t_dense, 3),
    }  # fmt: skip


def scorer_rows(
    mod: ModuleType, ctx: int = 131072, rows: tuple[int, ...] = (1, 2, 4, 8)
) -> list[dict[str, Any]]:
    """The prefill scorer of `mod` (a build of `inference.kernels.dsa.fast`) alone: 8K queries
    over `ctx` keys by rows per program (a row count `mod` rejects is noted, not timed)."""
    from inference.kernels.dsa.reference import SCORE_BUDGET

    layer = Layer(1, ctx)
    keys_bf16 = _randn(tuple(layer.ikeys.shape), torch.bfloat16, 11)
    iq = _randn((CHUNK, HI, DI), torch.bfloat16, 8)
    iw = _randn((CHUNK, HI), torch.float32, 9) * HI**-0.5
    lens = torch.arange(ctx - CHUNK, ctx, device=DEV, dtype=torch.int32) + 1
    trows = torch.zeros(CHUNK, dtype=torch.long, device=DEV)
    step = SCORE_BUDGET // ctx
    scores = torch.empty(step, ctx, device=DEV)
    flops = 2 * CHUNK * (ctx - CHUNK / 2) * HI * DI
    out = []
    for name, keys, sc in (("fp8", layer.ikeys, layer.iscales), ("bf16", keys_bf16, None)):
        for r in rows:

            def run(keys=keys, sc=sc, r=r):
                for r0 in range(0, CHUNK, step):
                    mod.dsa_scores_fast(iq, iw, keys, layer.tables, lens, scores, r0, index_scales=sc,
                                        table_rows=trows, rows_per_program=r)  # fmt: skip

            try:
                t = bench(run, 3)
            except Exception as exc:  # e.g. a row count this build does not have
                out.append({"keys": name, "rows": r, "error": repr(exc)[:160]})
                continue
            out.append(
                {"keys": name, "rows": r, "ms": round(1e3 * t, 2), "TFLOPs": round(flops / t / 1e12, 1)}
            )
            print(json.dumps(out[-1]), flush=True)
    return out


def run(parts: list[str], contexts: list[int], results: dict[str, Any], save) -> None:
    """The parts in order, each case's row saved as it comes (a time limit keeps what ran)."""
    from benchmarks.dsa_v32_headblocks import headblocks

    for part in parts:
        cases = {
            "decode": [(decode, (b, c)) for c in contexts for b in (1, 32)],
            "prefill": [(prefill, (c,)) for c in contexts],
            "prefill_split": [(prefill_split, (c,)) for c in contexts],
            "headblocks": [(headblocks, (c,)) for c in contexts],
            "agreement": [(agreement, ())],
        }.get(part, [])
        for fn, args in cases:
            t0 = time.perf_counter()
            try:
                row = fn(*args)
            except Exception as exc:  # one case (e.g. out of memory) must not lose the others
                row = {"args": list(args), "error": repr(exc)[:300]}
            row["wall_s"] = round(time.perf_counter() - t0, 1)
            results.setdefault(part, []).append(row)
            print(f"[dsa_v32 {part}] {json.dumps(row)}", flush=True)
            torch.cuda.empty_cache()
            save()


def plot(path: Path) -> Path:
    """DSA vs dense time by context (prefill chunk, decode b1 / b32) from a results JSON, as a PNG
    beside it (matplotlib, imported here: the timing runs do not need it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.loads(path.read_text())
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    panels = [
        ("prefill: 8K-query chunk", [r for r in res.get("prefill", []) if "dsa_ms" in r], "dense_ms", "dsa_ms", "ms"),
        *[
            (f"decode step, batch {b}", [r for r in res.get("decode", []) if r.get("batch") == b and "dsa_step_us" in r],
             "dense_us", "dsa_step_us", "us")
            for b in (1, 32)
        ],
    ]  # fmt: skip
    for ax, (title, rows, dense, dsa, unit) in zip(axes, panels, strict=True):
        if not rows:  # a part this run did not measure
            ax.set_axis_off()
            ax.set_title(f"{title}: not in this run")
            continue
        ctx = [r["ctx"] // 1024 for r in rows]
        ax.plot(ctx, [r[dense] for r in rows], "o-", label="dense MLA")
        ax.plot(ctx, [r[dsa] for r in rows], "s-", label="DSA (FP8 indexer, top-2048)")
        for x, r in zip(ctx, rows, strict=True):
            ax.annotate(f"{r[dense] / r[dsa]:.1f}x", (x, r[dsa]), textcoords="offset points", xytext=(0, -14),
                        ha="center", fontsize=8)  # fmt: skip
        ax.set(xscale="log", yscale="log", title=title, xlabel="context (K tokens)", ylabel=unit)
        ax.set_xticks(ctx, [str(c) for c in ctx])
        ax.legend(fontsize=8)
    fig.suptitle(
        f"DeepSeek-V3.2-shaped attention, one layer, {res.get('device', '')}: DSA vs dense (speedup)"
    )
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="agreement,decode,prefill,scorer")
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--plot", type=Path, help="only draw the PNG of a results JSON (needs matplotlib)")
    args = ap.parse_args()
    if args.plot:
        print(plot(args.plot))
        return
    if unknown := set(args.parts.split(",")) - set(PARTS):
        ap.error(f"unknown parts {sorted(unknown)}; the parts are {', '.join(PARTS)}")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.dsa_v32: the timed parts need a CUDA device and torch sees none")
    import triton

    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "triton": triton.__version__}  # fmt: skip

    def save() -> None:
        if out := os.environ.get("OUT"):
            Path(out, "dsa_v32.json").write_text(json.dumps(res, indent=1))

    run(args.parts.split(","), [int(c) for c in args.contexts.split(",")], res, save)
    if "scorer" in args.parts.split(","):
        from inference.kernels.dsa import fast

        res["scorer"] = scorer_rows(fast)
        save()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
