"""What `benchmarks.kernels` measures with: the timing (the median of CUDA-event-timed calls after
a warm-up call, or of CUDA-graph replays with L2 flushed before each; `WARM_ONLY`, `--warm-only`,
calls each variant once and times nothing), the device's copy bandwidth, and the benchmark
config's MLA shapes with a random paged latent pool over them."""

from __future__ import annotations

import torch

from inference.model.cache_tensors import quantize_rows_fp8

# --warm-only: call every variant once and time nothing (fills the Triton cache, e.g. in a process
# beside the GPU tests, so that the timed run that follows compiles nothing)
WARM_ONLY = False


def bench(fn, reps: int = 20) -> float:
    """Median seconds of `fn()` after one warm-up call, CUDA events around each call."""
    fn()
    torch.cuda.synchronize()
    if WARM_ONLY:
        return 1.0
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000)
    times.sort()
    return times[len(times) // 2]


def bench_graph(fn, reps: int = 20, flush: str = "write") -> float:
    """Median GPU seconds of `fn` replayed from a CUDA graph (no host launch cost, as the engine's
    decode graphs run it), with L2 flushed before each replay: `write` zeroes 256 MiB (L2 is then
    full of dirty lines, whose write-back the timed kernel pays: ~50 MB at the start of the
    replay), `read` sums 256 MiB (L2 full of clean lines, as after the weight reads of a real
    decode step)."""
    fn()  # compile + autotune outside the capture
    torch.cuda.synchronize()
    if WARM_ONLY:
        return 1.0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    buf = torch.empty(1 << 26, dtype=torch.int32, device="cuda")
    pairs = []
    for _ in range(reps):
        if flush == "write":
            buf.zero_()
        else:
            buf.sum()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        pairs.append((a, b))
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) / 1000 for a, b in pairs)
    return times[len(times) // 2]


def copy_bandwidth() -> dict[str, float]:
    """Device-to-device copy of 4 GiB: (read + write bytes) / time, the ceiling decode is held to."""
    src = torch.empty(1 << 31, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src), reps=10)
    return {"bytes": 2 * src.numel() * 2, "seconds": t, "GBps": round(2 * src.numel() * 2 / t / 1e9, 1)}


# the benchmark config's MLA layer: heads, latent, rope, nope and value dims
H, R, P, DN, DV = 16, 512, 64, 128, 128


def _pool(batch: int, ctx: int, page: int, fp8: bool, seed: int = 0):
    g = torch.Generator("cuda").manual_seed(seed)
    blocks = batch * (-(-ctx // page))
    rows = torch.randn(blocks * page, R + P, generator=g, device="cuda")
    if fp8:
        q, s = quantize_rows_fp8(rows)
        pool, scales = q.view(blocks, page, R + P), s.view(blocks, page)
    else:
        pool, scales = rows.to(torch.bfloat16).view(blocks, page, R + P), None
    tables = torch.randperm(blocks, device="cuda", generator=g).int().view(batch, -1)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q_lat = torch.randn(batch, H, R, generator=g, device="cuda")
    q_rope = torch.randn(batch, H, P, generator=g, device="cuda")
    return q_lat, q_rope, pool, scales, tables, lens


FP8_PEAK_TFLOPS = 1979.0  # H200 SXM dense FP8 tensor-core peak (datasheet); bf16 989.5
