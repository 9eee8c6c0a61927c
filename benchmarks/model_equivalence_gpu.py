"""GPU equivalence of our hybrid model (bf16, fla KDA kernels) against transformers' KimiLinear.

Builds a larger random model (hidden 2048, 8 layers: 6 KDA + 2 MLA, 32 experts), loads the same
weights into `transformers.KimiLinearForCausalLM` (fp32, pure-PyTorch reference path) and compares
logits of a long prefill plus 20 decode steps; also the reference's own bf16 error (baseline), a
chunked + batched run of ours, and step timings. Prints JSON and writes it to `$OUT` if set.

    python -m benchmarks.model_equivalence_gpu            # on a CUDA machine with fla installed
    python -m benchmarks.model_equivalence_gpu --tiny --device cpu   # smoke run of the script

Recorded run (2026-11-30, H200, torch 2.11, fla 0.6.0, 1,027,669,856 params, prompt 1024 + 20
decodes, 366 s): ours bf16 vs the fp32 reference (same bf16-rounded weights): prefill max_abs 1.374
mean_abs 0.0273 (mean rel 0.0328, top-1 93.4%), decode max_abs 0.422 mean_abs 0.0156 (mean rel
0.0188, top-1 95%); the reference's own bf16 run vs its fp32 run: prefill max_abs 1.426 mean_abs
0.0302 (top-1 91.5%), decode max_abs 0.445 mean_abs 0.0183 (top-1 100%). Chunked + batched (ours)
vs ours alone: mean rel 0.0153. DSA + vision smoke (bf16 GPU vs fp32 CPU): image embeds mean rel
0.0082, logits mean rel 0.0187 (top-1 95.4%). Warm bf16 prefill 16.7k tok/s at batch 1.
"""

from __future__ import annotations

import argparse
import importlib.abc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from inference.config import parse_config
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, build_model
from testing.kimi_hf_mapping import published_to_hf, tiny_kimi_linear_config


class HideFla(importlib.abc.MetaPathFinder):
    """Hide `fla` while transformers' KimiLinear module binds its kernels: the reference stays torch."""

    def find_spec(self, name, path, target=None):
        if name == "fla" or name.startswith("fla."):
            raise ImportError("hidden from the reference")
        return None


def reference_class():
    blocker = HideFla()
    sys.meta_path.insert(0, blocker)
    try:
        from transformers.models.kimi_linear import modeling_kimi_linear
    finally:
        sys.meta_path.remove(blocker)
    return modeling_kimi_linear.KimiLinearForCausalLM


def large_config() -> dict[str, Any]:
    return tiny_kimi_linear_config(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=16,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        num_experts=32,
        num_experts_per_token=4,
        moe_intermediate_size=512,
        num_expert_group=1,
        topk_group=1,
        linear_attn_config={
            "kda_layers": [1, 2, 3, 5, 6, 7],
            "full_attn_layers": [4, 8],
            "num_heads": 16,
            "head_dim": 128,
            "short_conv_kernel_size": 4,
        },
    )


def errors(ours: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    d = (ours.double() - ref.double()).abs()
    scale = ref.double().abs()
    return {
        "max_abs": float(d.max()),
        "mean_abs": float(d.mean()),
        "max_rel": float(d.max() / scale.max()),  # max error relative to the largest logit
        "mean_rel": float(d.mean() / scale.mean()),
        "top1_agree": float((ours.argmax(-1) == ref.argmax(-1)).double().mean()),
    }


def run_ours(model, ids_list, chunks, decode_steps, device, dtype, block_size=64):
    """Run sequences with per-step chunk sizes; returns per-sequence logits [len, V] (fp32, host)."""
    spec = model.spec if hasattr(model, "spec") else model.language_model.spec
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, dtype), num_blocks=256, block_size=block_size,
        num_slots=8, device=device, dtype=dtype,
    )  # fmt: skip
    n = len(ids_list)
    tables = [list(range(1 + 40 * i, 1 + 40 * (i + 1)))[::-1] for i in range(n)]
    done = [0] * n
    outs: list[list[torch.Tensor]] = [[] for _ in range(n)]
    for step in chunks + [[1] * n] * decode_steps:
        q_lens, ctx, toks, seqs = [], [], [], []
        for i, q in enumerate(step):
            if q:
                q_lens.append(q), ctx.append(done[i]), seqs.append(i)
                toks.append(ids_list[i][done[i] : done[i] + q])
        meta = ForwardMeta.for_sequences(
            q_lens, ctx, [tables[i] for i in seqs], block_size, [i + 3 for i in seqs], device
        )
        logits = model(torch.cat(toks).to(device), meta, cache).float()
        start = 0
        for i, q in zip(seqs, q_lens, strict=True):
            outs[i].append(logits[start : start + q].cpu())
            done[i] += q
            start += q
    return [torch.cat(o) for o in outs]


def run_reference(ref, ids, prompt_len, decode_steps, device):
    with torch.no_grad():
        out = ref(ids[None, :prompt_len].to(device), use_cache=True)
        logits, pkv = [out.logits[0].float().cpu()], out.past_key_values
        for i in range(decode_steps):
            o = ref(
                ids[None, prompt_len + i : prompt_len + i + 1].to(device), past_key_values=pkv, use_cache=True
            )
            pkv = o.past_key_values
            logits.append(o.logits[0].float().cpu())
    return torch.cat(logits)


def timed(fn, device):
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def _timing(res, ours, spec, ids, args, dev) -> None:
    """Eager batch-1 prefill and decode latency of ours in bf16 (no CUDA graphs)."""
    if dev != "cuda":
        return
    cache = HybridCacheTensors.allocate(
        HybridCacheSpec.from_model_spec(spec, torch.bfloat16), 256, 64, 8, dev, torch.bfloat16
    )
    table = list(range(64))
    meta = ForwardMeta.for_sequences(
        [args.prompt], [0], [table], 64, [0], dev, logits_indices=[args.prompt - 1]
    )
    x = ids[: args.prompt].to(dev)
    _, t_pre = timed(lambda: ours(x, meta, cache), dev)
    step = ForwardMeta.for_sequences([1], [args.prompt], [table], 64, [0], dev)
    y = ids[args.prompt : args.prompt + 1].to(dev)
    _, t_dec = timed(lambda: [ours(y, step, cache) for _ in range(10)], dev)
    res["timing_bf16_batch1"] = {
        "prefill_s": t_pre,
        "prefill_tok_per_s": args.prompt / t_pre,
        "decode_step_ms_eager": 1000 * t_dec / 10,
    }


def _smoke_dsa_vision(res, dev) -> None:
    """The bundled tiny DSA + vision model on `dev` in bf16 vs the same weights in fp32 on the CPU."""
    from inference.config import load_config

    spec = load_config(Path(__file__).resolve().parents[1] / "inference" / "configs" / "tiny_hybrid_vl.json")
    cpu = build_model(spec, seed=0)
    gpu = build_model(spec, seed=0, dtype=torch.bfloat16, device=dev)
    grid = torch.tensor([[1, 8, 12], [1, 4, 4]])
    pixels = torch.randn(int(grid.prod(-1).sum()), 3, 14, 14, generator=torch.Generator().manual_seed(0))
    e_cpu = cpu.encode_images(pixels, grid)
    e_gpu = gpu.encode_images(pixels.to(dev), grid.to(dev)).float().cpu()
    ids = torch.randint(0, 1000, (120,), generator=torch.Generator().manual_seed(1))
    outs = []
    for model, d, dt in ((cpu, "cpu", torch.float32), (gpu, dev, torch.bfloat16)):
        a, b = run_ours(model, [ids[:100], ids[100:]], [[80, 12]], 8, d, dt, block_size=16)
        outs.append(torch.cat([a, b]))
    res["smoke_dsa_vision_bf16_vs_cpu_fp32"] = {
        "image_embeds": errors(e_gpu, e_cpu),
        "logits": errors(outs[1], outs[0]),
    }


def _load(spec, master, dtype, dev):
    """Our model with `master`'s exact weights in `dtype` (KDA decay parameters stay fp32)."""
    model = build_model(spec, seed=0, dtype=dtype, device=dev)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            p.copy_(master.state_dict()[name])
    return model


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=420.0)
    args = ap.parse_args()
    t_start = time.perf_counter()
    dev = args.device
    cfg = tiny_kimi_linear_config() if args.tiny else large_config()
    spec = parse_config(cfg)
    res: dict[str, Any] = {"config": {k: cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_experts",
                                                          "num_experts_per_token", "vocab_size")},
                           "linear_attn_config": cfg["linear_attn_config"], "prompt": args.prompt,
                           "decode_steps": args.decode}  # fmt: skip
    if dev == "cuda":
        res["device"] = torch.cuda.get_device_name()
        try:
            import fla

            res["fla_version"] = getattr(fla, "__version__", "?")
        except ImportError as exc:
            res["fla_version"] = f"missing: {exc}"
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg["vocab_size"], (args.prompt + args.decode,), generator=gen)
    ids_b = torch.randint(0, cfg["vocab_size"], (300 + args.decode,), generator=gen)
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 comparisons are real fp32
    torch.backends.cudnn.allow_tf32 = False

    def save():
        text = json.dumps(res, indent=2)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "gpu_equivalence.json").write_text(text)
        return text

    try:
        _smoke_dsa_vision(res, dev)
    except Exception as exc:
        res["smoke_dsa_vision_bf16_vs_cpu_fp32"] = f"failed: {exc!r}"
    print(save(), flush=True)

    master = build_model(spec, seed=0, dtype=torch.float32, device="cpu")
    with torch.no_grad():  # identical weights everywhere: the fp32 reference gets the bf16-rounded values
        for p in master.parameters():
            p.copy_(p.bfloat16().float())
    res["params"] = sum(p.numel() for p in master.parameters())
    ref_cls = reference_class()
    from transformers import KimiLinearConfig

    hcfg = KimiLinearConfig(**cfg)
    hcfg._attn_implementation = "eager"
    with torch.device(dev):
        ref = ref_cls(hcfg).eval()
    ref.load_state_dict(published_to_hf(master.state_dict()), strict=True)
    ref_fp32, res["ref_fp32_s"] = timed(lambda: run_reference(ref, ids, args.prompt, args.decode, dev), dev)
    print(save(), flush=True)
    p_len = args.prompt

    def split(o, r):
        return {"prefill": errors(o[:p_len], r[:p_len]), "decode": errors(o[p_len:], r[p_len:])}

    ours = _load(spec, master, torch.bfloat16, dev)
    single = [[p_len]]
    (o,), t_cold = timed(lambda: run_ours(ours, [ids], single, args.decode, dev, torch.bfloat16), dev)
    (o,), t_warm = timed(lambda: run_ours(ours, [ids], single, args.decode, dev, torch.bfloat16), dev)
    res["ours_bf16_vs_ref_fp32"] = split(o, ref_fp32)
    res["ours_bf16_wall_s"] = {"cold_incl_autotune": t_cold, "warm_prefill_plus_decodes": t_warm}
    print(save(), flush=True)

    half = p_len // 2
    (ob_single,) = run_ours(ours, [ids_b], [[300]], args.decode, dev, torch.bfloat16)
    oa, ob = run_ours(
        ours, [ids, ids_b], [[half, 200], [p_len - half, 100]], args.decode, dev, torch.bfloat16
    )
    res["ours_bf16_chunked_batched"] = {
        "seq_a_vs_ref_fp32": split(oa, ref_fp32),
        "seq_a_vs_ours_single": errors(oa, o),
        "seq_b_vs_ours_single": errors(ob, ob_single),
    }
    try:
        _timing(res, ours, spec, ids, args, dev)
    except Exception as exc:  # record and go on: the remaining checks still matter
        res["timing_bf16_batch1"] = f"failed: {exc!r}"
    print(save(), flush=True)

    if time.perf_counter() - t_start < args.budget_s * 0.6:
        try:
            ours32 = _load(spec, master, torch.float32, dev)
            (o32,) = run_ours(ours32, [ids], single, args.decode, dev, torch.float32)
            res["ours_fp32_vs_ref_fp32"] = split(o32, ref_fp32)
        except Exception as exc:
            res["ours_fp32_vs_ref_fp32"] = f"failed: {exc!r}"
    else:
        res["ours_fp32_vs_ref_fp32"] = "skipped: time budget"
    print(save(), flush=True)

    if time.perf_counter() - t_start < args.budget_s * 0.85:
        ref.to(torch.bfloat16)
        ref_bf16 = run_reference(ref, ids, p_len, args.decode, dev)
        res["ref_bf16_vs_ref_fp32_baseline"] = split(ref_bf16, ref_fp32)
    else:
        res["ref_bf16_vs_ref_fp32_baseline"] = "skipped: time budget"
    res["total_wall_s"] = time.perf_counter() - t_start
    print(save(), flush=True)
    return 0


if __name__ == "__main__":
    with torch.no_grad():
        sys.exit(main())
