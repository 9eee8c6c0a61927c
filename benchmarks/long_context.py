"""Long-context benchmark (issue 13): prefill / decode at 32K-1M, turn-10 TTFT with and without the
prefix cache, a returning conversation after eviction to the host and disk tiers vs recompute,
promotion bandwidth vs pinned host-to-device bandwidth, FP8 KV memory, speed and accuracy.

Model: the Kimi-Linear-shaped ~2.8B benchmark config of `benchmarks/engine.py` (16 layers, 12 KDA
+ 4 MLA), bf16, random weights; `dsa` adds the DeepSeek-V3.2 indexer (top-2048, 64 heads x 128)
to the MLA layers. The FP8 accuracy study uses the trained demo model (`inference/demo_model`)
on the CPU (real float8_e4m3 storage, dequantised by the reference attention path there).

    python -m benchmarks.long_context                     # H200: every section; JSON to $OUT or --out
    python -m benchmarks.long_context --quick             # CPU smoke run, small model, short contexts
    python -m benchmarks.long_context --sections fp8_accuracy --plot lc.png
    python -m benchmarks.long_context --plot-from result.json --plot lc.png   # PNG from a saved run

Sections: prefill_decode (TTFT and batch-1 decode tok/s at each length, dense and DSA, transformers
at the lengths where it fits), turn10, returning, promotion, fp8, fp8_accuracy.

Merge a run into the figures file (rows tagged with who measured them) and redraw it:

    python -m benchmarks.long_context --plot-from run.json --merge-into docs/figures/long_context_h200.json \
        --session "H200, <commit>" --plot docs/figures/long_context_h200.png

Measured figures: `docs/figures/long_context_h200.{json,png}`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from benchmarks.engine_setup import free, sync
from benchmarks.long_context_figures import merge, plot
from benchmarks.long_context_fp8 import fp8_accuracy
from benchmarks.long_context_promotion import promotion
from inference.cache.tiers import TierConfig
from inference.config import parse_config
from inference.engine.engine import Engine, EngineConfig
from inference.engine.factory import small_model_config
from inference.engine.request import SamplingParams
from inference.model.cache_tensors import HybridCacheSpec
from inference.model.factory import build_model
from inference.tokenizer import ByteTokenizer

RESULTS: dict[str, Any] = {}
GiB = 1 << 30
SECTIONS = ("prefill_decode", "turn10", "returning", "promotion", "fp8", "fp8_accuracy")
# DeepSeek-V3.2's indexer; it reads the query latent, so the DSA variant also gets a q_lora_rank
DSA = {"index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128, "q_lora_rank": 768}


# -- set-up ---------------------------------------------------------------------------------
def model_config(quick: bool, dsa: bool) -> dict[str, Any]:
    if quick:
        cfg = small_model_config()
        if dsa:
            cfg.update(index_topk=64, index_n_heads=2, index_head_dim=16, q_lora_rank=32)
        return cfg
    from benchmarks.engine_setup import (
        bench_config,  # the same config as the engine benchmark
    )

    cfg = bench_config()
    if dsa:
        cfg.update(DSA)
    return cfg


def build(cfg: dict[str, Any], device: torch.device, dtype: torch.dtype):
    spec = parse_config(cfg)
    # fp32 init then a cast (the decay parameters stay fp32), as benchmarks/engine.py builds it
    model = build_model(spec, load_format="dummy", dtype=torch.float32, device=device, seed=0)
    for name, p in model.named_parameters():
        if not name.endswith(("A_log", "dt_bias")):
            p.data = p.data.to(dtype)
    return model, spec


ENGINE_OVERRIDES: dict[str, Any] = {}  # engine settings given on the command line (all sections)


def make_engine(model, spec, dtype, device, *, kv: str = "auto", **settings) -> Engine:
    base = dict(
        block_size=64, num_state_slots=8, max_num_seqs=4, max_num_batched_tokens=16384,
        checkpoint_interval=32768, enable_prefix_caching=False,
    )  # fmt: skip
    cfg = EngineConfig.of(**{**base, **settings, **ENGINE_OVERRIDES, "kv_cache_dtype": kv})
    tok = ByteTokenizer()
    tok.vocab_size = spec.vocab_size
    cache_spec = HybridCacheSpec.from_model_spec(spec, dtype, latent_fp8=kv == "fp8")
    return Engine(model, tok, cfg, cache_spec=cache_spec, device=device, dtype=dtype)


def sized(n: int, extra: int = 1024, block: int = 64, copies: int = 1) -> dict[str, int]:
    """Settings for `copies` sequences of n (+extra) tokens."""
    return dict(max_model_len=n + extra, num_blocks=copies * ((n + extra) // block + 2) + 16)


def rand(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def first_token(
    eng: Engine, prompt: list[int], sp: SamplingParams, device, steps: list[int] | None = None
) -> tuple[float, list[int], int]:
    """(TTFT s, output ids, cached tokens): benchmarks/engine.py's measurement, one definition."""
    from benchmarks.engine_setup import first_token as measure

    return measure(eng, prompt, sp, device, steps)


# -- sections ---------------------------------------------------------------------------------
def prefill_decode(model, spec, dtype, device, n: int, steps: int, kv: str = "auto") -> dict[str, Any]:
    """TTFT of one n-token prompt (prefix cache off, 16K chunks), then batch-1 decode at that
    context: `steps` timed steps after 4 untimed ones (graph capture at the new table width)."""
    eng = make_engine(model, spec, dtype, device, kv=kv, **sized(n, steps + 64))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    t0 = time.perf_counter()
    eng.add_request(rand(n, n), SamplingParams(temperature=0, max_tokens=steps + 5, ignore_eos=True))
    tokens: list[int] = []
    while not tokens:
        tokens += [t for o in eng.step() for t in o.new_token_ids]
    sync(device)
    ttft = time.perf_counter() - t0
    for _ in range(4):
        tokens += [t for o in eng.step() for t in o.new_token_ids]
    sync(device)
    t1 = time.perf_counter()
    timed = [t for _ in range(steps) for o in eng.step() for t in o.new_token_ids]
    sync(device)
    dt = time.perf_counter() - t1
    got = len(timed)
    tokens += timed
    row = {"tokens": n, "ttft_s": round(ttft, 3), "prefill_tok_per_s": round(n / ttft, 1),
           "decode_tok_per_s": round(got / dt, 1), "decode_ms_per_step": round(1000 * dt / steps, 3),
           "kv_cache_dtype": kv, "output_ids": tokens}  # fmt: skip
    if device.type == "cuda":
        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / GiB, 2)
    del eng
    free(device)
    return row


def hf_prefill(cfg, model, dtype, device, n: int) -> dict[str, Any]:
    """transformers' KimiLinear on the same weights: one forward of n tokens (its prefill), after
    a warm-up forward of the same shape (its decode at that context is not measured)."""
    from benchmarks.engine_setup import hf_model

    hf = hf_model(model, cfg, dtype, device)
    ids = torch.tensor([rand(n, n)], device=device)
    try:
        with torch.inference_mode():
            hf(ids, use_cache=True, logits_to_keep=1)  # warm-up of the same shape
            sync(device)
            t0 = time.perf_counter()
            hf(ids, use_cache=True, logits_to_keep=1)
            sync(device)
        dt = time.perf_counter() - t0
        return {"tokens": n, "ttft_s": round(dt, 3), "prefill_tok_per_s": round(n / dt, 1)}
    finally:
        del hf
        free(device)


def turn10(
    model, spec, dtype, device, context: int, user_len: int = 64, reply_len: int = 32
) -> dict[str, Any]:
    """A `context`-token start, then 10 turns each re-sending the transcript + a new user message:
    the 10th turn's TTFT with the prefix cache vs the same prompt on a cache-less engine."""
    rng = random.Random(11)
    transcript = rand(context, 11)
    sp = SamplingParams(temperature=0, max_tokens=reply_len, ignore_eos=True)
    size = sized(context, 11 * (user_len + reply_len) + 512)
    eng = make_engine(model, spec, dtype, device, enable_prefix_caching=True, **size)
    turns = []
    for turn in range(10):
        prompt = transcript + [rng.randrange(256) for _ in range(user_len)]
        steps: list[int] = []
        ttft, reply, hit = first_token(eng, prompt, sp, device, steps)
        turns.append({"turn": turn + 1, "prompt_tokens": len(prompt), "cached_tokens": hit,
                      "prefill_steps": steps[0], "ttft_ms": round(1000 * ttft, 2)})  # fmt: skip
        transcript = prompt + reply
    graphs = eng.runner.graphs
    short_replays = None if graphs is None else graphs.num_short_replays
    del eng
    free(device)
    plain = make_engine(model, spec, dtype, device, enable_prefix_caching=False, **size)
    first_token(plain, rand(len(prompt), 5), sp, device)  # warm-up of the same size
    t_nc, reply_nc, _ = first_token(plain, prompt, sp, device)
    del plain
    free(device)
    t_c = turns[-1]["ttft_ms"] / 1000
    return {
        "context": context, "turns": turns, "ttft_ms_with_cache": round(1000 * t_c, 2),
        "ttft_ms_without_cache": round(1000 * t_nc, 2), "ratio": round(t_c / t_nc, 4),
        "reply_identical": reply_nc == reply, "short_step_graph_replays": short_replays,
        "short_graph_tokens": ENGINE_OVERRIDES.get("short_graph_tokens", EngineConfig().short_graph_tokens),
        "short_graph_row_keys": ENGINE_OVERRIDES.get("short_graph_row_keys", EngineConfig().short_graph_row_keys),
    }  # fmt: skip


def returning(
    model, spec, dtype, device, context: int, mode: str, disk_dir: str, profile: bool = False
) -> dict[str, Any]:
    """A conversation of `context` tokens, then another as long (the GPU pool holds one: the first
    is evicted, to the tier of `mode` or nowhere), then the first returns with 64 new tokens.
    `profile`: the return under cProfile (the engine thread's time by function, its waits
    included), in the row as `profile`."""
    cache_spec = HybridCacheSpec.from_model_spec(spec, dtype)
    conv = (context + 1024) * cache_spec.kv_bytes_per_token + 16 * cache_spec.state_bytes_per_slot
    tiers = {
        "host": TierConfig(host_bytes=3 * conv),
        "disk": TierConfig(disk_bytes=3 * conv, disk_url=disk_dir),
        "recompute": TierConfig(),
    }[mode]
    pool = dict(max_model_len=context + 160, num_blocks=(context + 160) // 64 + 4)  # one conversation
    eng = make_engine(
        model, spec, dtype, device, enable_prefix_caching=True, tiers=tiers, checkpoint_interval=65536, **pool
    )
    sp = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    first = rand(context, 21)
    _, reply, _ = first_token(eng, first, sp, device)
    first_token(eng, rand(context, 22), SamplingParams(temperature=0, max_tokens=1), device)  # evicts it
    back = first + reply + rand(64, 23)
    from benchmarks.engine_setup import cprofile_text

    got: dict[str, Any] = {}
    text = (
        cprofile_text(lambda e=eng: got.update(r=first_token(e, back, sp, device)), device)
        if profile
        else None
    )
    ttft, _, cached = got["r"] if profile else first_token(eng, back, sp, device)
    st = eng.stats()
    store = eng.runner.tier_store
    row = {"mode": mode, "context": context, "prompt_tokens": len(back), "cached_tokens": cached,
           "ttft_ms": round(1000 * ttft, 2),
           **{k: v for k, v in st.items() if k.startswith(("promoted_", "tier_"))}}  # fmt: skip
    if text is not None:
        row["profile"] = text
    if store is not None:
        row["bytes_loaded"] = dict(store.bytes_loaded)
        if store.transfer_times:  # the return's promotion, start to landed, inside the engine
            nb, dt = max(store.transfer_times)
            row["promotion_bytes"], row["promotion_ms"] = nb, round(1000 * dt, 2)
            row["promotion_gb_per_s"] = round(nb / dt / 1e9, 2)
        store.close()
    del eng
    free(device)
    return row


def fp8_memory(spec, dtype, context: int) -> dict[str, Any]:
    bf = HybridCacheSpec.from_model_spec(spec, dtype).kv_bytes_per_token
    f8 = HybridCacheSpec.from_model_spec(spec, dtype, latent_fp8=True).kv_bytes_per_token
    return {"kv_bytes_per_token_bf16": bf, "kv_bytes_per_token_fp8": f8, "saved_fraction": round(1 - f8 / bf, 4),
            f"kv_gib_at_{context}_bf16": round(bf * context / GiB, 3),
            f"kv_gib_at_{context}_fp8": round(f8 * context / GiB, 3)}  # fmt: skip


# -- main -------------------------------------------------------------------------------------
def run_section(name: str, fn, *a, **kw) -> Any:
    t0 = time.perf_counter()
    try:
        out = fn(*a, **kw)
    except Exception as exc:  # one failed section must not lose the others
        out = {"error": repr(exc), "trace": traceback.format_exc()[-2000:]}
    RESULTS.setdefault("section_wall_s", {})[name] = round(time.perf_counter() - t0, 2)
    print(f"[{name}] {json.dumps(out, default=str)[:600]}", flush=True)
    return out


def save(out: str | None) -> None:
    if out:
        Path(out).write_text(json.dumps(RESULTS, indent=2, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: small model, short contexts")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument(
        "--lengths", default=None, help="comma list of prefill lengths (default 32K,128K,512K,1M)"
    )
    ap.add_argument(
        "--hf-lengths", default=None, help="lengths for transformers (default: --lengths up to --hf-max)"
    )
    ap.add_argument("--dsa-lengths", default=None, help="lengths for the DSA variant (default: --lengths)")
    ap.add_argument(
        "--hf-max", type=int, default=32768, help="longest prompt given to transformers (0: none)"
    )
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--turn-contexts", default=None, help="comma list of turn10 contexts (default 16K,128K)")
    ap.add_argument(
        "--set", action="append", default=[], metavar="NAME=INT",
        help="an EngineConfig setting for every engine, e.g. short_graph_tokens=0, max_num_batched_tokens=32768",
    )  # fmt: skip
    ap.add_argument("--profile-returning", action="store_true", help="cProfile of each return (returning)")
    ap.add_argument("--accuracy-tokens", type=int, default=48, help="greedy tokens per prompt (fp8_accuracy)")
    ap.add_argument("--out", default=None, help="JSON path (default $OUT/long_context.json)")
    ap.add_argument("--plot", default=None, help="PNG path (default beside the JSON)")
    ap.add_argument("--plot-from", default=None, help="only draw the PNG of a saved JSON")
    ap.add_argument(
        "--merge-into", default=None, help="with --plot-from: merge that run into this figures JSON"
    )
    ap.add_argument("--session", default="new", help="what the merged run measured, e.g. 'H200, <commit>'")
    ap.add_argument("--old-session", default="earlier", help="who measured the untagged rows already there")
    args = ap.parse_args()
    if args.plot_from:
        res = json.loads(Path(args.plot_from).read_text())
        if args.merge_into:
            res = merge(json.loads(Path(args.merge_into).read_text()), res, args.session, args.old_session)
            Path(args.merge_into).write_text(json.dumps(res, indent=2, default=str))
        print(plot(res, args.plot or "long_context.png"))
        return
    want = [s for s in args.sections.split(",") if s]
    if unknown := set(want) - set(SECTIONS):
        ap.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    quick = args.quick or not torch.cuda.is_available()
    device = torch.device("cpu" if quick else "cuda")
    dtype = torch.float32 if quick else torch.bfloat16
    if quick:
        torch.set_num_threads(1)
    out = args.out or (str(Path(os.environ["OUT"]) / "long_context.json") if os.environ.get("OUT") else None)
    png = args.plot or (str(Path(out).with_suffix(".png")) if out else None)
    K = 1024
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else ([1 * K, 2 * K] if quick else [32 * K, 128 * K, 512 * K, 1024 * K])  # fmt: skip
    dsa_lengths = (
        [int(x) for x in args.dsa_lengths.split(",") if x] if args.dsa_lengths is not None else lengths
    )
    steps = 8 if quick else args.decode_steps
    turn_ctx = (256, 1024) if quick else (16 * K, 128 * K)
    if args.turn_contexts:
        turn_ctx = tuple(int(x) for x in args.turn_contexts.split(","))
    for item in args.set:
        name, _, value = item.partition("=")
        EngineConfig.of(**{name: int(value)})  # an unknown name fails here, before any work
        ENGINE_OVERRIDES[name] = int(value)
    RESULTS["engine_overrides"] = ENGINE_OVERRIDES
    ret_ctx = 1024 if quick else 128 * K
    RESULTS.update(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
                   quick=quick, config=model_config(quick, False))  # fmt: skip
    plan = []  # in the order of --sections (the most wanted first: a time limit cuts the tail)
    for s in want:
        if s == "prefill_decode":
            hf = [int(x) for x in args.hf_lengths.split(",") if x] if args.hf_lengths is not None else lengths
            plan += [("dense", n) for n in lengths] + [("hf", n) for n in hf if n <= args.hf_max]
            plan += [("dsa", n) for n in dsa_lengths]
        else:
            plan.append((s, None))
    models: dict[bool, Any] = {}

    def get(dsa: bool):
        if dsa not in models:
            models.clear()
            free(device)
            models[dsa] = build(model_config(quick, dsa), device, dtype)
            m, spec = models[dsa]  # warm-up: compile and autotune every kernel the chunks use
            prefill_decode(m, spec, dtype, device, min(lengths[0], 16 * K if not quick else 512), 4)
        return models[dsa]

    # the bar on stderr; results printed to stdout as each section ends (never held by the bar)
    bar_console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=bar_console, redirect_stdout=False, redirect_stderr=False) as bar:  # fmt: skip
        task = bar.add_task("long context", total=len(plan))
        for kind, n in plan:
            bar.update(task, description=f"{kind} {n or ''}".strip())
            if kind in ("dense", "dsa"):
                RESULTS.setdefault("prefill_decode", {})[f"{kind}_{n}"] = run_section(
                    f"{kind}_{n}",
                    lambda k=kind, n=n: prefill_decode(*get(k == "dsa"), dtype, device, n, steps),
                )
            elif kind == "hf":
                m, spec = get(False)
                RESULTS.setdefault("prefill_decode", {})[f"transformers_{n}"] = run_section(
                    f"hf_{n}", hf_prefill, model_config(quick, False), m, dtype, device, n
                )
            elif kind == "turn10":
                m, spec = get(False)
                for c in turn_ctx:
                    RESULTS.setdefault("turn10", {})[str(c)] = run_section(
                        f"turn10_{c}", turn10, m, spec, dtype, device, c
                    )
            elif kind == "returning":
                m, spec = get(False)
                with tempfile.TemporaryDirectory(prefix="lc-disk-") as disk:
                    for mode in ("recompute", "host", "disk"):
                        RESULTS.setdefault("returning", {})[mode] = run_section(
                            f"returning_{mode}",
                            returning,
                            m,
                            spec,
                            dtype,
                            device,
                            ret_ctx,
                            mode,
                            disk,
                            args.profile_returning,
                        )
                r = RESULTS["returning"]
                if all("ttft_ms" in r[k] for k in r):
                    for mode in ("host", "disk"):
                        r[f"{mode}_vs_recompute"] = round(r[mode]["ttft_ms"] / r["recompute"]["ttft_ms"], 4)
            elif kind == "promotion":
                spec = parse_config(model_config(quick, False))
                RESULTS["promotion"] = run_section("promotion", promotion, spec, dtype, device, ret_ctx)
            elif kind == "fp8":
                m, spec = get(False)
                c = ret_ctx
                RESULTS["fp8"] = {"memory": fp8_memory(spec, dtype, c)}
                for kv in ("auto", "fp8"):
                    RESULTS["fp8"][f"decode_{kv}"] = run_section(
                        f"fp8_{kv}", prefill_decode, m, spec, dtype, device, c, steps, kv=kv
                    )
                a, b = (RESULTS["fp8"][f"decode_{kv}"].get("output_ids") for kv in ("auto", "fp8"))
                if a and b:  # greedy agreement of the same prompt with bf16 vs FP8 latents
                    same = next(
                        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
                    )
                    RESULTS["fp8"]["greedy_common_prefix"] = f"{same}/{min(len(a), len(b))}"
                    RESULTS["fp8"]["decode_speed_fp8_vs_bf16"] = round(
                        RESULTS["fp8"]["decode_fp8"]["decode_tok_per_s"]
                        / RESULTS["fp8"]["decode_auto"]["decode_tok_per_s"],
                        3,
                    )
            elif kind == "fp8_accuracy":
                RESULTS["fp8_accuracy"] = run_section(
                    "fp8_accuracy", fp8_accuracy, torch.device("cpu"), args.accuracy_tokens
                )
            save(out)
            bar.advance(task)
    save(out)
    if png:
        print("plot:", plot(RESULTS, png))
    print(json.dumps({k: v for k, v in RESULTS.items() if k != "config"}, default=str)[:4000])


if __name__ == "__main__":
    main()
