"""GPU figures of the two Day-0 architectures (`deepseek_v32` with YaRN, `qwen3_next`) against
transformers: relative errors of our bf16 and fp32 runs vs transformers' fp32 on the same weights,
transformers' own bf16 error (the baseline a bf16 engine cannot beat), and greedy agreement.

Per architecture, on real head geometry at reduced depth and width (DeepSeek-V3.2: MLA 128+64 / 128
heads dims, q_lora 768, kv_lora 512, DSA indexer 16 x 128 with top-256 of a 1024-token prompt,
YaRN x40 as published; Qwen3-Next: gated DeltaNet 16 k / 32 v heads x 128, gated GQA 16 / 2 heads
x 256 with 64 rotary dims, softmax MoE + gated shared expert):

* teacher-forced logits of a `--prompt` prefill and `--decode` decode steps through the paged
  cache, compared with transformers' fp32 forward over the same tokens (`mean_rel` = mean |diff| /
  mean |ref|, `top1_agree` = argmax agreement per position);
* greedy: `--greedy` tokens generated from the prompt by ours and by transformers (fp32), and the
  number of leading tokens on which they agree.

The reference stays pure PyTorch (fla is hidden while transformers binds its kernels). Weights are
drawn once in fp32, rounded to bf16 values, and loaded everywhere, so the only difference is
the arithmetic. Writes `$OUT/day0_equivalence.json` and an SVG bar chart beside it.

    python -m benchmarks.day0_equivalence                         # CUDA (H200): the recorded figures
    python -m benchmarks.day0_equivalence --tiny --device cpu     # smoke run on the bundled tiny configs
    python -m benchmarks.day0_equivalence --plot RESULT.json      # redraw the chart from a saved run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

# the same error figures and the same fla hiding as the Kimi-Linear GPU check
from benchmarks.model_equivalence_gpu import HideFla, errors
from inference.config import parse_config
from inference.model import ForwardMeta, HybridCacheSpec, HybridCacheTensors, build_model
from testing.deepseek_hf_mapping import published_to_hf, tiny_deepseek_v32_config
from testing.qwen3_next_hf_mapping import tiny_qwen3_next_config

BLOCK = 64
ARCHS = ("deepseek_v32", "qwen3_next")


def real_shaped(arch: str) -> dict[str, Any]:
    """The published geometry of each head and latent, with fewer layers, experts and vocabulary."""
    ids = {"bos_token_id": 0, "eos_token_id": 1}  # inside the reduced vocabulary
    if arch == "deepseek_v32":
        return tiny_deepseek_v32_config(
            **ids,
            vocab_size=32000, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=512,
            num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=16,
            q_lora_rank=768, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
            index_topk=256, index_n_heads=16, index_head_dim=128,
            n_routed_experts=32, num_experts_per_tok=4, n_group=4, topk_group=2, first_k_dense_replace=1,
            max_position_embeddings=163840,
            rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                          "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        )  # fmt: skip
    return tiny_qwen3_next_config(
        **ids,
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
        full_attention_interval=4, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        partial_rotary_factor=0.25, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=16, linear_num_value_heads=32, mlp_only_layers=[],
        num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512, shared_expert_intermediate_size=512,
    )  # fmt: skip


def tiny(arch: str) -> dict[str, Any]:
    return tiny_deepseek_v32_config() if arch == "deepseek_v32" else tiny_qwen3_next_config()


def reference(arch: str, cfg: dict[str, Any], device: str):
    """transformers' model of `cfg` on `device` (eager attention, fp32, pure-PyTorch linear attention)."""
    blocker = HideFla()
    sys.meta_path.insert(0, blocker)
    loaded = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "fla" or k.startswith("fla.")}
    try:
        import transformers

        if arch == "qwen3_next":
            from transformers.models.qwen3_next import modeling_qwen3_next as mod

            config_cls, model_cls = transformers.Qwen3NextConfig, mod.Qwen3NextForCausalLM
        else:
            from transformers.models.deepseek_v32 import modeling_deepseek_v32 as mod

            config_cls, model_cls = transformers.DeepseekV32Config, mod.DeepseekV32ForCausalLM
    finally:
        sys.meta_path.remove(blocker)
        sys.modules.update(loaded)  # our model keeps the fla it already imported
    hc = config_cls(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})
    hc._attn_implementation = "eager"
    with torch.device(device):
        return model_cls(hc).eval()


class Ours:
    """Our model driven step by step through one sequence's paged cache."""

    def __init__(self, model, spec, dtype: torch.dtype, device: str, max_tokens: int) -> None:
        self.model, self.spec, self.device, self.dtype = model, spec, device, dtype
        blocks = max_tokens // BLOCK + 2
        self.cache = HybridCacheTensors.allocate(
            HybridCacheSpec.from_model_spec(spec, dtype), blocks + 1, BLOCK, 2, device, dtype
        )
        self.table = list(range(blocks, 0, -1))  # scattered (reversed) blocks, block 0 left unused
        self.done = 0

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.numel()
        meta = ForwardMeta.for_sequences([n], [self.done], [self.table], BLOCK, [1], self.device)
        out = self.model(ids.to(self.device), meta, self.cache).float().cpu()
        self.done += n
        return out


def teacher_forced(ours: Ours, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    outs = [ours.step(ids[:prompt])]
    outs += [ours.step(ids[p : p + 1]) for p in range(prompt, ids.numel())]
    return torch.cat(outs)


def greedy_ours(ours: Ours, prompt_ids: torch.Tensor, n: int) -> list[int]:
    tok = int(ours.step(prompt_ids)[-1].argmax())
    out = [tok]
    for _ in range(n - 1):
        tok = int(ours.step(torch.tensor([tok]))[-1].argmax())
        out.append(tok)
    return out


def greedy_ref(ref, prompt_ids: torch.Tensor, n: int, device: str) -> list[int]:
    ids = prompt_ids.to(device)[None]
    out = []
    for _ in range(n):  # the whole prefix each step: no cache semantics to trust
        tok = ref(ids, use_cache=False).logits[0, -1].argmax()
        out.append(int(tok))
        ids = torch.cat([ids, tok.view(1, 1)], dim=1)
    return out


def agreement(a: list[int], b: list[int]) -> dict[str, int]:
    lead = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
    return {
        "leading_equal": lead,
        "of": len(a),
        "equal_positions": sum(x == y for x, y in zip(a, b, strict=True)),
    }


def run_arch(arch: str, args, bar, task, res: dict[str, Any], save) -> None:
    """Fill `res` with the figures of `arch`, calling `save()` after each (a timeout keeps the rest)."""
    dev = args.device
    cfg = tiny(arch) if args.tiny else real_shaped(arch)
    spec = parse_config(cfg)
    master = build_model(spec, seed=0)
    with torch.no_grad():  # every run gets the same bf16-representable weights
        for p in master.parameters():
            p.copy_(p.bfloat16().float())
    res.update(params=sum(p.numel() for p in master.parameters()), prompt=args.prompt)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, spec.vocab_size, (args.prompt + args.decode,), generator=gen)
    ref = reference(arch, cfg, dev)
    ref.load_state_dict(published_to_hf(master.state_dict()), strict=True)
    t0 = time.perf_counter()
    want = ref(ids[None].to(dev), use_cache=False).logits[0].float().cpu()
    res["ref_fp32_forward_s"] = time.perf_counter() - t0
    bar.advance(task)

    def split(o: torch.Tensor, r: torch.Tensor) -> dict[str, Any]:
        return {
            "prefill": errors(o[: args.prompt], r[: args.prompt]),
            "decode": errors(o[args.prompt :], r[args.prompt :]),
        }

    def attempt(key: str, fn) -> Any:
        """Record a failure under `key` and go on: the other figures still count."""
        try:
            return fn()
        except Exception as exc:
            res[key] = f"failed: {exc!r}"
            return None
        finally:
            bar.advance(task)
            save()

    def ours(dtype: torch.dtype) -> Ours:
        model = build_model(spec, seed=0, dtype=dtype, device=dev)
        with torch.no_grad():
            for key, t in model.state_dict().items():
                t.copy_(master.state_dict()[key])
        return Ours(model, spec, dtype, dev, args.prompt + args.decode + 8)

    runs: dict[str, Ours] = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        key = f"ours_{name}_vs_ref_fp32"

        def one(name=name, dtype=dtype, key=key):
            runs[name] = ours(dtype)
            res[key] = split(teacher_forced(runs[name], ids, args.prompt), want)

        attempt(key, one)

    def greedy() -> None:
        ref_tokens = greedy_ref(ref, ids[: args.prompt], args.greedy, dev)
        for name, run in runs.items():  # a fresh cache each: the teacher-forced one holds other tokens
            again = Ours(run.model, spec, run.dtype, dev, args.prompt + args.greedy + 8)
            got = greedy_ours(again, ids[: args.prompt], args.greedy)
            res[f"greedy_ours_{name}_vs_ref_fp32"] = agreement(got, ref_tokens)

    attempt("greedy", greedy)

    def baseline() -> None:
        ref.to(torch.bfloat16)
        want_bf16 = ref(ids[None].to(dev), use_cache=False).logits[0].float().cpu()
        res["ref_bf16_vs_ref_fp32_baseline"] = split(want_bf16, want)

    attempt("ref_bf16_vs_ref_fp32_baseline", baseline)


def svg_chart(res: dict[str, Any]) -> str:
    """Grouped bars of mean relative logit error (log scale): ours bf16, transformers bf16, ours fp32."""
    import math

    series = [("ours bf16", "ours_bf16_vs_ref_fp32", "#d62728"), ("transformers bf16", "ref_bf16_vs_ref_fp32_baseline", "#7f7f7f"),
              ("ours fp32", "ours_fp32_vs_ref_fp32", "#1f77b4")]  # fmt: skip
    groups = [(a, phase) for a in ARCHS if isinstance(res.get(a), dict) for phase in ("prefill", "decode")]
    w, h, left, top, bottom = 120 * max(len(groups), 1) + 80, 320, 60, 30, 60
    lo, hi = -8.0, 0.0  # log10 of the relative error

    def y(v: float) -> float:
        lv = min(max(math.log10(max(v, 1e-12)), lo), hi)
        return top + (hi - lv) / (hi - lo) * (h - top - bottom)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="16">mean relative logit error vs transformers fp32 (log scale)</text>']  # fmt: skip
    for e in range(int(lo), int(hi) + 1, 2):
        parts.append(
            f'<line x1="{left}" x2="{w - 10}" y1="{y(10.0**e):.1f}" y2="{y(10.0**e):.1f}" stroke="#ddd"/>'
        )
        parts.append(f'<text x="8" y="{y(10.0**e) + 4:.1f}">1e{e}</text>')
    for gi, (arch, phase) in enumerate(groups):
        x0 = left + 10 + gi * 120
        for si, (_, key, color) in enumerate(series):
            v = (
                res[arch].get(key, {}).get(phase, {}).get("mean_rel")
                if isinstance(res[arch].get(key), dict)
                else None
            )
            if v is None:
                continue
            parts.append(
                f'<rect x="{x0 + si * 32}" y="{y(v):.1f}" width="28" height="{h - bottom - y(v):.1f}" fill="{color}"/>'
            )
        parts.append(
            f'<text x="{x0}" y="{h - bottom + 16}">{arch}</text><text x="{x0}" y="{h - bottom + 30}">{phase}</text>'
        )
    for si, (label, _, color) in enumerate(series):
        parts.append(f'<rect x="{left + si * 150}" y="{h - 18}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{left + si * 150 + 14}" y="{h - 9}">{label}</text>')  # fmt: skip
    return "\n".join([*parts, "</svg>"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the bundled tiny configs (CPU smoke run)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--greedy", type=int, default=32)
    ap.add_argument("--arch", choices=ARCHS, action="append", help="default: both")
    ap.add_argument("--plot", metavar="RESULT_JSON", help="only redraw the SVG chart of a saved run")
    args = ap.parse_args()
    out_dir = Path(os.environ.get("OUT", "."))
    if args.plot:
        path = Path(args.plot)
        path.with_suffix(".svg").write_text(svg_chart(json.loads(path.read_text())))
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on both sides
    torch.backends.cudnn.allow_tf32 = False
    res: dict[str, Any] = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                           "torch": torch.__version__, "tiny": args.tiny}  # fmt: skip
    archs = args.arch or list(ARCHS)
    from rich.progress import Progress

    t_start = time.perf_counter()

    def save() -> None:
        (out_dir / "day0_equivalence.json").write_text(json.dumps(res, indent=2))

    with Progress() as bar:
        task = bar.add_task("day-0 equivalence", total=5 * len(archs))
        for arch in archs:
            res[arch] = {}
            try:
                run_arch(arch, args, bar, task, res[arch], save)
            except Exception as exc:  # record and go on: the other architecture still counts
                res[arch]["failed"] = repr(exc)
            if args.device == "cuda":
                torch.cuda.empty_cache()  # the finished architecture's models are garbage now
            save()
    res["total_wall_s"] = time.perf_counter() - t_start
    text = json.dumps(res, indent=2)
    (out_dir / "day0_equivalence.json").write_text(text)
    (out_dir / "day0_equivalence.svg").write_text(svg_chart(res))
    print(text, flush=True)
    return 0 if not any("failed" in str(res[a]) for a in archs) else 1


if __name__ == "__main__":
    with torch.no_grad():
        sys.exit(main())
