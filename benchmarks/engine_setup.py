"""The engine benchmarks' model and engine helpers, shared by `benchmarks.engine`,
`benchmarks.decode_profile` and `benchmarks.long_context`: the ~2.8B benchmark config, an engine
over it, prompts, warm-up, timed steps, a first token's time, cProfile text, and transformers'
model on the same weights."""

from __future__ import annotations

import random
import time
from typing import Any

import torch

from inference.engine.engine import Engine, EngineConfig
from inference.engine.factory import small_model_config
from inference.engine.request import SamplingParams
from inference.model.cache_tensors import HybridCacheSpec
from inference.tokenizer import ByteTokenizer


def bench_config() -> dict[str, Any]:
    cfg = small_model_config()
    kda = [i for i in range(1, 17) if i % 4]
    cfg.update(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, num_experts=32, num_experts_per_token=4,
        moe_intermediate_size=768, num_shared_experts=1, num_expert_group=1, topk_group=1,
        first_k_dense_replace=1,
        linear_attn_config={"kda_layers": kda, "full_attn_layers": [4, 8, 12, 16], "num_heads": 16,
                            "head_dim": 128, "short_conv_kernel_size": 4},
    )  # fmt: skip
    return cfg


BATCHED_TOKENS = 8192  # make_engine's prefill chunk budget per step


def make_engine(model, spec, dtype, device, tokenizer: Any = None, **kw) -> Engine:
    cfg = EngineConfig.of(
        **{
            **dict(
                block_size=64,
                num_blocks=1024,
                num_state_slots=64,
                max_num_seqs=128,
                max_num_batched_tokens=BATCHED_TOKENS,
                max_model_len=40000,
                checkpoint_interval=2048,
            ),
            **kw,
        }
    )
    tok = tokenizer
    if tok is None:
        tok = ByteTokenizer()
        tok.vocab_size = spec.vocab_size  # sample over the model's whole vocabulary, as transformers does
    return Engine(
        model, tok, cfg, cache_spec=HybridCacheSpec.from_model_spec(spec, dtype), device=device, dtype=dtype
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def rand_prompts(n, length, seed, shared=0):
    rng = random.Random(seed)
    pre = [rng.randrange(256) for _ in range(shared)]
    return [pre + [rng.randrange(256) for _ in range(length - shared)] for _ in range(n)]


def _graph_state(eng: Engine) -> dict[str, Any]:
    g = eng.runner.graphs
    if g is None:
        return {"replays": 0, "captured": 0, "disabled": None, "capture_s": 0.0}
    return {"replays": g.num_replays, "captured": len(g.graphs), "disabled": g.disabled,
            "capture_s": round(g.capture_s, 3)}  # fmt: skip


def _timed_steps(eng: Engine, device, steps: int) -> dict[str, Any]:
    """Time `steps` engine steps; say what the decode graphs did meanwhile (replays, new captures,
    an eager fallback), so a slow figure can be told apart from a capture or a fallback in it."""
    before = _graph_state(eng)
    sync(device)
    t0 = time.perf_counter()
    n = 0
    for _ in range(steps):
        n += sum(len(o.new_token_ids) for o in eng.step())
    sync(device)
    dt = time.perf_counter() - t0
    after = _graph_state(eng)
    return {
        "tokens": n, "seconds": round(dt, 4), "tok_per_s": round(n / dt, 1),
        "ms_per_step": round(1000 * dt / steps, 3),
        "graph_replays": after["replays"],
        "replays_while_timed": after["replays"] - before["replays"],
        "captures_while_timed": after["captured"] - before["captured"],
        "capture_s_while_timed": round(after["capture_s"] - before["capture_s"], 3),
        "graphs_disabled": after["disabled"],
    }  # fmt: skip


def _warm(eng: Engine, extra_steps: int = 3) -> None:
    """Steps until every request has a token, then until a pure-decode graph has replayed (its
    capture is warm-up, not timed), then `extra_steps` more."""
    while any(r.num_output_tokens == 0 for r in eng.scheduler.requests.values()):
        eng.step()
    g = eng.runner.graphs
    for _ in range(8):
        if g is None or g.disabled or g.num_replays > 0:
            break
        eng.step()
    for _ in range(extra_steps):
        eng.step()


def _host_profile(eng: Engine, device, steps: int) -> str:
    """Where the host time of `steps` graph-mode decode steps goes (cProfile, by own time). A
    step's wall time over its GPU work is host time when the GPU waits: the sampled tokens' copy
    to the host (the step's one sync) shows how long the host waited for the GPU."""

    def run() -> None:
        for _ in range(steps):
            eng.step()

    return cprofile_text(run, device)


def cprofile_text(fn, device) -> str:
    """`fn()` under cProfile (synchronised before and after): the top functions by own time and
    by cumulative time, printed and returned."""
    import cProfile
    import io
    import pstats

    sync(device)
    prof = cProfile.Profile()
    prof.enable()
    fn()
    sync(device)
    prof.disable()
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(22)
    st.sort_stats("cumulative").print_stats(18)
    text = buf.getvalue()
    print(text, flush=True)
    return text


def hf_model(model, cfg, dtype, device):
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    from testing.kimi_hf_mapping import published_to_hf

    hc = KimiLinearConfig(**cfg, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    with torch.device(device):
        hf = KimiLinearForCausalLM(hc)
    hf = hf.to(dtype).eval()
    missing, unexpected = hf.load_state_dict(published_to_hf(model.state_dict()), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"weight mapping: missing {missing[:5]} unexpected {unexpected[:5]}")
    return hf


@torch.inference_mode()
def hf_decode(hf, device, batch: int, prompt_len: int, steps: int) -> dict[str, float]:
    ids = torch.tensor(rand_prompts(batch, prompt_len, 7), device=device)
    kw = dict(do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids))

    def timed(n):
        sync(device)
        t0 = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        sync(device)
        return time.perf_counter() - t0, out

    timed(2)  # warm-up
    t_pre, _ = timed(1)
    t_all, out = timed(steps + 1)
    dt = t_all - t_pre
    return {
        "batch": batch,
        "tokens": batch * steps,
        "seconds": round(dt, 4),
        "tok_per_s": round(batch * steps / dt, 1),
        "ms_per_step": round(1000 * dt / steps, 2),
        "first_tokens": out[0, prompt_len : prompt_len + 8].tolist(),
    }


def first_token(
    eng: Engine, prompt: list[int], sp: SamplingParams, device, steps: list[int] | None = None
) -> tuple[float, list[int], int]:
    """TTFT of one request on an otherwise idle engine; runs it to the end. Returns (ttft s,
    output ids, cached prompt tokens); `steps`, if given, receives the engine steps the prompt
    took (up to its first token: one means its uncached part was prefilled in one step)."""
    sync(device)
    t0 = time.perf_counter()
    step0 = eng.num_steps
    rid = eng.add_request(prompt, sp)
    ttft, out, cached = None, [], 0
    while eng.has_unfinished:
        for o in eng.step():
            if o.request_id == rid:
                if ttft is None and o.new_token_ids:
                    sync(device)
                    ttft = time.perf_counter() - t0
                    if steps is not None:
                        steps.append(eng.num_steps - step0)
                out += o.new_token_ids
                cached = o.num_cached_tokens
    return ttft, out, cached


def engine_decode(
    model,
    spec,
    dtype,
    device,
    batch: int,
    prompt_len: int,
    steps: int,
    host_profile: bool = False,
    grammar: str | None = None,
    **engine_kw,
) -> dict[str, Any]:
    # a request whose prompt is done decodes while the others still prefill (a token per step):
    # room for those steps too, so that no request finishes inside the timed steps (a smaller
    # batch there would time fewer rows and capture a graph of a smaller bucket)
    chunk = engine_kw.get("max_num_batched_tokens", BATCHED_TOKENS)
    max_tokens = steps + 40 + -(-batch * prompt_len // chunk)
    eng = make_engine(
        model,
        spec,
        dtype,
        device,
        num_state_slots=2 * batch + 8,
        num_blocks=batch * ((prompt_len + max_tokens + 80) // 64 + 2),
        **engine_kw,
    )
    # a constrained request gets room past the timed steps: its grammar's closing window (the last
    # eighth of max_tokens) would otherwise end answers inside them
    sp = SamplingParams(
        temperature=0, max_tokens=max_tokens * (8 if grammar else 1), ignore_eos=True, grammar=grammar
    )
    rids = [eng.add_request(p, sp) for p in rand_prompts(batch, prompt_len, 7)]
    first = eng.get_request(rids[0])
    _warm(eng)
    res = _timed_steps(eng, device, steps)
    out = {"batch": batch, "prompt_len": prompt_len, **res, "first_tokens": first.output_token_ids[:8]}
    if host_profile:
        out["host_profile"] = _host_profile(eng, device, min(steps, 16))  # within max_tokens
    return out
