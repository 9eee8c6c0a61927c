"""Engine benchmark (issue 4): exactness, decode throughput vs transformers `generate`, and
turn-10 TTFT with vs without the prefix cache at a 16K shared context (`ttft_warm`: the same on an
engine that captured its common graph shapes at start-up, with the start-up time; run it in its
own process beside `ttft` in another); `structured`: decode with every request grammar-constrained
vs none at batch 1 and 32.

Model: a Kimi-Linear-shaped random-weight config of about 2.7B total parameters (16 layers:
12 KDA + 4 MLA, 32 experts top-4 + a shared expert, dense first layer), bf16 on the GPU.

    python -m benchmarks.engine                  # CUDA + fla installed; prints JSON, writes $OUT/engine_bench.json
    python -m benchmarks.engine --quick          # CPU smoke run with the bundled small model

Figures worth keeping go to `docs/results/` as data; the design they informed is in
`docs/architecture.md`. Where a step's time goes: `benchmarks/decode_profile.py`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks.engine_profiles import profile_cached_turn, profile_decode, profile_prefill
from benchmarks.engine_setup import (
    _timed_steps,
    _warm,
    bench_config,
    engine_decode,
    first_token,
    hf_decode,
    hf_model,
    make_engine,
    rand_prompts,
    sync,
)
from benchmarks.engine_structured import structured_decode
from inference.config import parse_config
from inference.engine.engine import Engine
from inference.engine.factory import small_model_config
from inference.engine.request import SamplingParams
from inference.model.factory import build_model

RESULTS: dict[str, Any] = {}


def emit(out_dir: str | None) -> None:
    text = json.dumps(RESULTS, indent=2, default=str)
    if out_dir:
        Path(out_dir, "engine_bench.json").write_text(text)


def section(name: str, out_dir: str | None):
    def deco(fn):
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                RESULTS[name] = fn(*a, **kw)
            except Exception as exc:  # one failed section must not lose the others
                RESULTS[name] = {"error": repr(exc), "trace": traceback.format_exc()[-3000:]}
            RESULTS.setdefault("section_wall_s", {})[name] = round(time.perf_counter() - t0, 2)
            print(f"[{name}] {json.dumps(RESULTS[name], default=str)[:1500]}", flush=True)
            emit(out_dir)

        return run

    return deco


def _compare(ref: list, got: list) -> dict[str, Any]:
    """Greedy sequences (requests) vs the reference: identical count, first divergence, and the
    largest |logprob difference| of the chosen tokens before the first divergence."""
    same, first, lp_diff = 0, [], 0.0
    for r, g in zip(ref, got, strict=True):
        d = next(
            (
                i
                for i, (x, y) in enumerate(zip(r.output_token_ids, g.output_token_ids, strict=True))
                if x != y
            ),
            None,
        )
        same += d is None
        first.append(d)
        for lr, lg in list(zip(r.logprobs, g.logprobs, strict=True))[: d if d is not None else None]:
            lp_diff = max(lp_diff, abs(lr.logprob - lg.logprob))
    return {
        "identical_sequences": same,
        "of": len(ref),
        "first_divergence": first,
        "max_abs_logprob_diff_before_divergence": round(lp_diff, 5),
    }


def exactness(model, spec, dtype, device, n_tok: int) -> dict[str, Any]:
    """Greedy outputs of each request alone (no cache, no chunking) vs batched, chunked, and a
    second agent turn resumed from the prefix cache (in-block checkpoint + partial-block copy)."""
    prompts = rand_prompts(6, 300, 1, shared=200)
    sp = SamplingParams(temperature=0, max_tokens=n_tok, ignore_eos=True, logprobs=0)
    base = make_engine(model, spec, dtype, device, enable_prefix_caching=False, enable_chunked_prefill=False)
    alone = [base.generate([p], sp)[0] for p in prompts]
    res: dict[str, Any] = {"dtype": str(dtype), "tokens_each": n_tok}
    variants = {
        "batched": dict(enable_prefix_caching=False, enable_chunked_prefill=False),
        "batched_chunked_64": dict(
            enable_prefix_caching=False, enable_chunked_prefill=True, max_num_batched_tokens=64
        ),
    }
    for name, kw in variants.items():
        res[name] = _compare(alone, make_engine(model, spec, dtype, device, **kw).generate(prompts, sp))
    rng = random.Random(5)
    turn2 = [r.token_ids + [rng.randrange(256) for _ in range(20)] for r in alone]
    ref2 = [base.generate([p], sp)[0] for p in turn2]
    cached = make_engine(model, spec, dtype, device, enable_prefix_caching=True, checkpoint_interval=128)
    cached.generate(prompts, sp)
    got2 = cached.generate(turn2, sp)
    res["turn2_from_prefix_cache"] = {
        **_compare(ref2, got2),
        "cached_tokens": [r.num_cached_tokens for r in got2],
        "prompt_tokens": [len(p) for p in turn2],
    }
    return res


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


@torch.inference_mode()
def decode_paths(model, spec, dtype, device) -> dict[str, Any]:
    """The decode fast paths against their references on this GPU: fla's fused in-place KDA decode
    vs the PyTorch recurrence, the grouped-GEMM MoE vs the per-expert loop, and the engine with
    CUDA graphs vs eager (greedy tokens of 32 requests)."""
    from inference.kernels.kda import kda_decode, kda_decode_ref
    from inference.kernels.moe_experts import moe_experts_grouped, moe_experts_reference

    res: dict[str, Any] = {}
    g = torch.Generator(device=device).manual_seed(0)
    n, h, d = 32, spec.kda.num_heads, spec.kda.head_dim
    q, k, v, f = (torch.randn(n, h, d, generator=g, device=device, dtype=dtype) for _ in range(4))
    b = torch.randn(n, h, generator=g, device=device, dtype=dtype)
    layer = next(m for m in model.modules() if hasattr(m, "A_log"))
    pool = torch.randn(2 * n, h, d, d, generator=g, device=device) * 0.1
    slots = torch.randperm(2 * n, device=device)[:n]
    p_fast, p_ref = pool.clone(), pool.clone()
    o_fast = kda_decode(q, k, v, f, b, layer.A_log, layer.dt_bias, p_fast, slots, use_fla=True)
    o_ref = kda_decode_ref(q, k, v, f, b, layer.A_log, layer.dt_bias, p_ref, slots)
    res["kda_decode_fla_vs_ref"] = {"out_rel": _rel(o_fast, o_ref), "state_rel": _rel(p_fast, p_ref)}
    moe = next(m for m in model.modules() if hasattr(m, "_stacked"))
    for t in (1, 32, 128):
        x = torch.randn(t, spec.hidden_size, generator=g, device=device, dtype=dtype)
        w, ids = moe.gate(x)
        ref = moe_experts_reference(
            x, w, ids, [e.w1.weight for e in moe.experts], [e.w2.weight for e in moe.experts],
            [e.w3.weight for e in moe.experts],
        )  # fmt: skip
        res[f"moe_grouped_vs_loop_t{t}_rel"] = _rel(moe_experts_grouped(x, w, ids, *moe._stacked()), ref)
    prompts = rand_prompts(32, 96, 3)
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)
    runs = {}
    for name, graphs in (("eager", False), ("graphs", True)):
        eng = make_engine(model, spec, dtype, device, enable_cuda_graphs=graphs, num_state_slots=72)
        eng.generate(prompts[:2], sp)  # warm-up (and the first captures)
        sync(device)
        t0 = time.perf_counter()
        runs[name] = eng.generate(prompts, sp)
        sync(device)
        res[f"{name}_generate_s"] = round(time.perf_counter() - t0, 3)
        if eng.runner.graphs is not None:
            res["graphs"] = {
                "captured": sorted(eng.runner.graphs.graphs),
                "replays": eng.runner.graphs.num_replays,
                "capture_s": round(eng.runner.graphs.capture_s, 2),
            }
        else:
            res["graphs_note"] = res.get("graphs_note", "") + f"{name}: no graphs; "
    res["graphs_vs_eager"] = _compare(runs["eager"], runs["graphs"])
    return res


def ttft_turn10(
    model, spec, dtype, device, context: int, user_len: int, reply_len: int, warmup_s: float = 0.0
) -> dict[str, Any]:
    """One agent conversation: a `context`-token shared start, then 10 turns, each re-sending the
    whole transcript (previous prompt + reply) plus a new user message. `warmup_s`: the engine's
    start-up graph warm-up budget (`inference/engine/graph_warmup.py`; 0: none), its start-up
    time reported; compare runs in separate processes (kernels compile once per process)."""
    from inference.engine.graph_warmup import GraphWarmup

    rng = random.Random(11)
    transcript = [rng.randrange(256) for _ in range(context)]
    sp = SamplingParams(temperature=0, max_tokens=reply_len, ignore_eos=True)
    sync(device)
    t_start = time.perf_counter()
    cached = make_engine(
        model,
        spec,
        dtype,
        device,
        enable_prefix_caching=True,
        graph_warmup=GraphWarmup(time_budget_s=warmup_s),
    )
    sync(device)
    startup_s = time.perf_counter() - t_start
    warm = cached.graph_warmup.as_dict() if cached.graph_warmup is not None else None
    per_turn = []
    for turn in range(10):
        prompt = transcript + [rng.randrange(256) for _ in range(user_len)]
        steps: list[int] = []
        graphs = cached.runner.graphs
        capture0 = graphs.capture_s if graphs is not None else 0.0
        ttft, reply, hit = first_token(cached, prompt, sp, device, steps)
        per_turn.append(
            {
                "turn": turn + 1,
                "prompt_tokens": len(prompt),
                "cached_tokens": hit,
                "prefill_steps": steps[0],
                "ttft_ms": round(1000 * ttft, 2),
                # graph captures during the turn (its whole generation, first token and after)
                "capture_ms": round(1000 * ((graphs.capture_s if graphs is not None else 0.0) - capture0), 1),
            }
        )
        transcript = prompt + reply
    nocache = make_engine(model, spec, dtype, device, enable_prefix_caching=False)
    first_token(nocache, [rng.randrange(256) for _ in range(len(prompt))], sp, device)  # warm-up, same size
    t_nc, reply_nc, _ = first_token(nocache, prompt, sp, device)
    t_c = per_turn[-1]["ttft_ms"] / 1000
    return {
        "context": context,
        "engine_startup_s": round(startup_s, 3),
        "graph_warmup": warm,
        "turns": per_turn,
        "turn10_prompt_tokens": len(prompt),
        "turn10_ttft_ms_with_cache": round(1000 * t_c, 2),
        "turn10_ttft_ms_without_cache": round(1000 * t_nc, 2),
        "ratio": round(t_c / t_nc, 4),
        "turn10_reply_identical": reply_nc == reply,
    }


def _long_engine(model, spec, dtype, device, context: int, batch: int = 1, **kw) -> Engine:
    """An engine sized for `batch` sequences of `context` tokens, 16K-token prefill chunks (the
    chunk size benchmarks/kernels.py measured best for the MLA layers at 128K, and larger chunks
    amortise the per-chunk latent expansion)."""
    blocks = (context + 512) // 64 + 1
    args = dict(
        max_model_len=context + 512, num_blocks=batch * blocks + 64, num_state_slots=2 * batch + 16,
        max_num_batched_tokens=16384, checkpoint_interval=32768, max_num_seqs=max(batch, 8),
    )  # fmt: skip
    return make_engine(model, spec, dtype, device, **{**args, **kw})


def prefill_long(model, spec, dtype, device, lengths: tuple[int, ...]) -> dict[str, Any]:
    """TTFT of one sequence at each length (prefix cache off); a warm-up call (32K) first compiles
    and autotunes every kernel the chunks use (their shapes do not depend on the total length)."""
    rng = random.Random(13)
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    res: dict[str, Any] = {"chunk": 16384}
    eng = _long_engine(model, spec, dtype, device, max(lengths), enable_prefix_caching=False)
    first_token(eng, [rng.randrange(256) for _ in range(min(32768, lengths[0]))], sp, device)
    for n in lengths:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        ttft, _, _ = first_token(eng, [rng.randrange(256) for _ in range(n)], sp, device)
        row = {"ttft_s": round(ttft, 3), "tok_per_s": round(n / ttft, 1)}
        if device.type == "cuda":
            row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
        res[f"prefill_{n}"] = row
        print(f"[prefill_long] {n}: {row}", flush=True)
    return res


def decode_at_context(model, spec, dtype, device, batch: int, context: int, steps: int) -> dict[str, Any]:
    """Decode throughput of `batch` sequences at a `context`-token context (CUDA graphs on). With
    batch > 1 the sequences share their first `context - 64` tokens through the prefix cache (one
    long prefill instead of `batch`); the decode kernel still reads every sequence's whole
    context, though shared physical blocks may be served from L2 more often than distinct ones."""
    rng = random.Random(17)
    prefix = [rng.randrange(256) for _ in range(context - 64)]
    prompts = [prefix + [rng.randrange(256) for _ in range(64)] for _ in range(batch)]
    eng = _long_engine(
        model, spec, dtype, device, context + steps + 64, batch, enable_prefix_caching=batch > 1
    )
    sp = SamplingParams(temperature=0, max_tokens=steps + 40, ignore_eos=True)
    eng.add_request(prompts[0], sp)
    while all(r.num_output_tokens == 0 for r in eng.scheduler.requests.values()):
        eng.step()
    for p in prompts[1:]:
        eng.add_request(p, sp)
    _warm(eng)
    return {"batch": batch, "context": context, **_timed_steps(eng, device, steps)}


SECTIONS = (
    "decode_paths", "decode", "hf", "ttft", "exactness_bf16", "exactness_fp32", "decode_long",
    "prefill_long", "decode_128k", "structured", "ttft_warm",
)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="CPU smoke run with the bundled small model")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list, in run order: {SECTIONS}")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-fp32", action="store_true")
    ap.add_argument("--profile-ttft", action="store_true", help="torch.profiler table of one cached turn")
    ap.add_argument("--profile-decode", action="store_true", help="GPU kernels of eager decode steps")
    ap.add_argument("--profile-batch", type=int, default=32, help="batch of --profile-decode")
    ap.add_argument(
        "--profile-prefill", type=int, default=0, help="TTFT by chunk size and kernels of an N-token prefill"
    )
    ap.add_argument(
        "--profile-host", action="store_true", help="cProfile of graph decode steps (decode, decode_long)"
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)  # a failed decode-graph capture is logged, not raised
    want = {s for s in args.sections.split(",") if s}  # "" runs none (e.g. only --profile-ttft)
    if args.skip_hf:
        want.discard("hf")
    if args.skip_fp32:
        want.discard("exactness_fp32")
    if unknown := want - set(SECTIONS):
        ap.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    out_dir = os.environ.get("OUT")
    quick = args.quick or not torch.cuda.is_available()
    device = torch.device("cpu" if quick else "cuda")
    if quick:
        torch.set_num_threads(1)
    cfg = small_model_config() if quick else bench_config()
    spec = parse_config(cfg)
    dtype = torch.float32 if quick else torch.bfloat16
    t0 = time.perf_counter()
    # fp32 init then a cast (the decay parameters stay fp32), as the exactness_fp32 model is built
    model = build_model(spec, load_format="dummy", dtype=torch.float32, device=device, seed=0)
    # only the fp32 check: then the fp32 build is the model (no second build)
    only_fp32 = bool(want) and want <= {"exactness_fp32"}
    for name, p in model.named_parameters():
        if not only_fp32 and not name.endswith(("A_log", "dt_bias")):
            p.data = p.data.to(dtype)
    RESULTS["config"] = cfg
    RESULTS["params_total"] = sum(p.numel() for p in model.parameters())
    RESULTS["device"] = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    RESULTS["torch"] = torch.__version__
    RESULTS["build_s"] = round(time.perf_counter() - t0, 2)
    n_tok = 8 if quick else 16
    batches = (1, 4) if quick else (1, 32, 128)
    plen, steps = (32, 8) if quick else (128, 64)
    if "decode_paths" in want and not quick:
        section("decode_paths", out_dir)(decode_paths)(model, spec, dtype, device)
    if "decode" in want:
        for b in batches:
            section(f"engine_decode_b{b}", out_dir)(engine_decode)(
                model, spec, dtype, device, b, plen, steps, host_profile=args.profile_host
            )
    if "decode_long" in want:  # batch 32 at a 16K context: wide block tables in the decode graphs
        long_len = 512 if quick else 16384
        section("engine_decode_b32_ctx16k", out_dir)(engine_decode)(
            model, spec, dtype, device, 32, long_len, 32, host_profile=args.profile_host
        )
    if "decode" in want and not quick:  # batch 32 without CUDA graphs: what the graphs buy
        section("engine_decode_b32_eager", out_dir)(engine_decode)(
            model, spec, dtype, device, 32, plen, steps, enable_cuda_graphs=False
        )
    if "structured" in want:
        section("structured_decode", out_dir)(structured_decode)(
            model, spec, dtype, device, (1, 32), plen, steps
        )
    if args.profile_decode and not quick:
        section(f"decode_profile_b{args.profile_batch}", out_dir)(profile_decode)(
            model, spec, dtype, device, args.profile_batch
        )
    if args.profile_prefill:
        n = min(args.profile_prefill, 2048) if quick else args.profile_prefill
        chunks = (512, 1024) if quick else (8192, 16384, 32768)
        section(f"prefill_profile_{n}", out_dir)(profile_prefill)(model, spec, dtype, device, n, chunks)
    if "hf" in want:
        holder: dict[str, Any] = {}
        section("hf_build", out_dir)(
            lambda: holder.update(hf=hf_model(model, cfg, dtype, device)) or {"ok": True}
        )()
        if "hf" in holder:
            for b in batches:
                section(f"hf_decode_b{b}", out_dir)(hf_decode)(holder["hf"], device, b, plen, steps)
            del holder["hf"]
            if device.type == "cuda":
                torch.cuda.empty_cache()
    ctx = (256, 16, 4) if quick else (16384, 64, 32)
    if "ttft" in want:
        section("ttft", out_dir)(ttft_turn10)(model, spec, dtype, device, *ctx)
    if "ttft_warm" in want:  # the same conversation on an engine that warmed its graphs at start-up
        section("ttft_warm", out_dir)(ttft_turn10)(model, spec, dtype, device, *ctx, warmup_s=60.0)
    if args.profile_ttft:
        section("ttft_profile", out_dir)(profile_cached_turn)(model, spec, dtype, device, ctx[0])
    if "exactness_bf16" in want and not quick:
        section("exactness_bf16", out_dir)(exactness)(model, spec, dtype, device, n_tok)
    if "prefill_long" in want:
        lengths = (2048, 8192) if quick else (32768, 131072, 524288)
        section("prefill_long", out_dir)(prefill_long)(model, spec, dtype, device, lengths)
    if "decode_128k" in want:
        ctx_long = 4096 if quick else 131072
        for b in (1, 32):
            section(f"decode_ctx128k_b{b}", out_dir)(decode_at_context)(
                model, spec, dtype, device, b, ctx_long, 32
            )
    if "exactness_fp32" in want:
        if only_fp32:
            fp32 = model
        else:
            del model
            fp32 = build_model(spec, load_format="dummy", dtype=torch.float32, device=device, seed=0)
        section("exactness_fp32", out_dir)(exactness)(fp32, spec, torch.float32, device, n_tok)
    summary = {}
    for b in batches:
        e, h = RESULTS.get(f"engine_decode_b{b}", {}), RESULTS.get(f"hf_decode_b{b}", {})
        if "tok_per_s" in e and "tok_per_s" in h:
            summary[f"speedup_b{b}"] = round(e["tok_per_s"] / h["tok_per_s"], 2)
    RESULTS["summary"] = summary
    emit(out_dir)
    print(
        json.dumps(
            {"summary": summary, "ttft": {k: v for k, v in RESULTS.get("ttft", {}).items() if k != "turns"}},
            default=str,
        )
    )


if __name__ == "__main__":
    main()
