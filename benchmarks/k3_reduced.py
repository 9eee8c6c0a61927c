"""K3-shaped reduced model end to end, DSA vs dense (issue 43, section 1).

Model: `inference/configs/kimi_k3_reduced.json` — Kimi-Linear layout at K3's published widths
(hidden 7168, 3 KDA : 1 MLA, 64 KDA heads x 128), one 128-head MLA layer (kv_lora_rank 512, rope
64, nope 128, v 128, q_lora_rank 1536) carrying the DeepSeek-V3.2 indexer (64 heads x 128,
top-2048), 4 layers and 32 experts (top-8) so that one GPU holds it with a 1M-token prompt:
~15 GiB of bf16 weights (`dayzero analyze`), random, built once. "dense" is the same model, the
same weights, with its indexers detached (`indexers_off`): the MLA layer then attends every key.

Measured, for each length of `--lengths` (shortest first, dense then DSA at each), with
`benchmarks.long_context.prefill_decode`: TTFT of one prompt (prefix cache off, `--chunk` tokens
a step, 16K) and batch-1 decode tok/s after it (`--decode-steps` timed steps after 4 untimed).
Each variant first runs a 16K prompt untimed (kernel compilation and autotuning). Before them
(the shortest run first) the greedy-equivalence check: a prompt of `index_topk - tokens` tokens,
so the top-k covers every key through the last generated token, decoded greedily with DSA and
dense; token agreement, the first divergence and the first step's logits max abs difference
(random bf16 weights can diverge late from near-ties).

Expected on one H100, from `docs/results/dsa_v32_h100.json` (not measured end to end): the 1M
prompt's MLA layer ~82 s dense / ~63 s DSA plus ~15 s of KDA, MoE and projections; with the
build (~1 min: the random weights are drawn on the host), warm-ups, 128K and 512K, ~6 minutes.
Memory: weights ~15 GiB, the 1M prompt's KV 1.4 GiB, a dense chunk over 1M keys one 64K-key
piece expanded at a time (`mla_prefill.EXPAND_LIMIT_BYTES`); the peak of each row is in its JSON.

The JSON is written after every row (`$OUT/k3_reduced.json` or `--out`): a time limit keeps what
ran.

    python -m benchmarks.k3_reduced                          # GPU: equivalence, then 128K, 512K, 1M
    python -m benchmarks.k3_reduced --lengths 131072 --decode-steps 16
    python -m benchmarks.k3_reduced --quick                  # CPU smoke run: tiny dims, short lengths
    python -m benchmarks.k3_reduced --plot-from k3_reduced.json --plot k3_reduced.png   # PNG (Pillow)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.engine_setup import free
from benchmarks.long_context import (
    ENGINE_OVERRIDES,
    build,
    first_token,
    make_engine,
    prefill_decode,
    rand,
    sized,
)
from benchmarks.long_context_figures import bar_panels
from inference.config import parse_config
from inference.config.common import DSA_KEYS
from inference.engine.request import SamplingParams

CONFIG = Path(__file__).resolve().parents[1] / "inference" / "configs" / "kimi_k3_reduced.json"
K = 1024
LENGTHS = (128 * K, 512 * K, 1024 * K)
WARM_TOKENS = 16 * K  # the untimed prompt each variant runs first
# --quick: the same layout (3 KDA : 1 MLA+DSA, dense first MLP, MoE) at CPU widths
TINY = dict(
    vocab_size=320, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, q_lora_rank=32,
    num_experts=8, num_experts_per_token=2, moe_intermediate_size=32, index_topk=64, index_n_heads=2,
    index_head_dim=16,
)  # fmt: skip


def model_config(quick: bool) -> dict[str, Any]:
    """The reduced K3 config (at CPU widths with `quick`)."""
    cfg = json.loads(CONFIG.read_text())
    if quick:
        cfg.update(TINY)
        cfg["linear_attn_config"] = {**cfg["linear_attn_config"], "num_heads": 2, "head_dim": 16}
    return cfg


def dense_spec(cfg: dict[str, Any]):
    """The spec of the same model without the indexer (no indexer key cache)."""
    return parse_config({k: v for k, v in cfg.items() if k not in DSA_KEYS})


@contextlib.contextmanager
def indexers_off(model: torch.nn.Module) -> Iterator[None]:
    """The model as its dense variant: every MLA layer's indexer detached (the layer then attends
    all keys), put back on exit. Same weights, no second copy."""
    held = [(m, m.indexer) for m in model.modules() if getattr(m, "indexer", None) is not None]
    try:
        for m, _ in held:
            m.indexer = None
        yield
    finally:
        for m, ix in held:
            m.indexer = ix


def variant(model, kind: str):
    """`indexers_off` for "dense", nothing for "dsa"."""
    return indexers_off(model) if kind == "dense" else contextlib.nullcontext()


def greedy(model, spec, dtype, device, prompt: list[int], tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy `tokens` ids after `prompt` on a fresh engine, and the logits of the first (the
    prompt's last row: the LM head's first call)."""
    eng = make_engine(model, spec, dtype, device, **sized(len(prompt), tokens + 64))
    first: list[torch.Tensor] = []

    def keep(_mod, _inp, out: torch.Tensor) -> None:
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if not first and not capturing:  # the prefill step runs eagerly; a graph capture may follow
            first.append(out[-1].float().cpu())

    hook = model.lm_head.register_forward_hook(keep)
    try:
        _, out, _ = first_token(
            eng, prompt, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True), device
        )
    finally:
        hook.remove()
        del eng
        free(device)
    return out, first[0]


def equivalence(model, specs, cfg, dtype, device, tokens: int) -> dict[str, Any]:
    """DSA with top-k >= context vs dense: the same prompt, greedy, token by token."""
    n = cfg["index_topk"] - tokens  # context <= index_topk through the last generated token
    prompt = rand(n, 3)
    got = {}
    for kind in ("dsa", "dense"):
        with variant(model, kind):
            got[kind] = greedy(model, specs[kind], dtype, device, prompt, tokens)
    (a, la), (b, lb) = got["dsa"], got["dense"]
    diverge = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
    return {
        "prompt_tokens": n, "index_topk": cfg["index_topk"], "greedy_tokens": tokens,
        "agreement": round(sum(x == y for x, y in zip(a, b, strict=True)) / tokens, 4),
        "first_divergence": diverge, "identical": diverge is None,
        "first_step_logits_max_abs_diff": float(f"{float((la - lb).abs().max()):.3g}"),
        "first_step_logits_max_abs": round(float(lb.abs().max()), 3),
        "first_step_same_argmax": int(la.argmax()) == int(lb.argmax()),
        "dsa_ids": a, "dense_ids": b,
    }  # fmt: skip


def plot(results: dict[str, Any], path: str) -> str | None:
    """TTFT and decode tok/s, dense vs DSA by length, as bar panels (Pillow)."""
    rows = [(k, v) for k, v in results.get("runs", {}).items() if isinstance(v, dict) and "ttft_s" in v]
    dev = results.get("device", "")
    return bar_panels(
        [
            (f"TTFT (s), {dev}", [(k, v["ttft_s"]) for k, v in rows]),
            (f"decode batch 1 (tok/s), {dev}", [(k, v["decode_tok_per_s"]) for k, v in rows]),
        ],
        path,
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: tiny dims, short lengths")
    ap.add_argument("--lengths", default=None, help="comma list of prompt lengths (default 128K,512K,1M)")
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=16384, help="prefill tokens per engine step (default 16K)")
    ap.add_argument("--greedy-tokens", type=int, default=32, help="tokens of the equivalence check (0: none)")
    ap.add_argument("--variants", default="dense,dsa", help="which of dense, dsa run at each length")
    ap.add_argument("--out", default=None, help="JSON path (default $OUT/k3_reduced.json)")
    ap.add_argument("--plot", default=None, help="PNG path (default beside the JSON)")
    ap.add_argument("--plot-from", default=None, help="only draw the PNG of a saved JSON")
    args = ap.parse_args(argv)
    if args.plot_from:
        res = json.loads(Path(args.plot_from).read_text())
        print(plot(res, args.plot or str(Path(args.plot_from).with_suffix(".png"))))
        return res
    quick = args.quick or not torch.cuda.is_available()
    device = torch.device("cpu" if quick else "cuda")
    dtype = torch.float32 if quick else torch.bfloat16
    if quick:
        torch.set_num_threads(1)
    out = args.out or (str(Path(os.environ["OUT"]) / "k3_reduced.json") if os.environ.get("OUT") else None)
    lengths = sorted(int(x) for x in args.lengths.split(",")) if args.lengths else ([96, 192] if quick else list(LENGTHS))  # fmt: skip
    steps = 4 if quick else args.decode_steps
    tokens = min(args.greedy_tokens, 8) if quick else args.greedy_tokens
    cfg = model_config(quick)
    ENGINE_OVERRIDES["max_num_batched_tokens"] = args.chunk
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "quick": quick, "config": CONFIG.name, "chunk": args.chunk, "decode_steps": steps, "runs": {}, "wall_s": {},
    }  # fmt: skip

    def save() -> None:
        if out:
            Path(out).write_text(json.dumps(res, indent=2, default=str))

    def timed(name: str, fn) -> Any:
        t0 = time.perf_counter()
        try:
            row = fn()
        except Exception as exc:  # one failed row must not lose the others
            row = {"error": repr(exc), "trace": traceback.format_exc()[-2000:]}
        res["wall_s"][name] = round(time.perf_counter() - t0, 2)
        print(f"[k3_reduced {name}] {json.dumps(row, default=str)[:600]}", flush=True)
        save()
        return row

    t0 = time.perf_counter()
    model, dsa = build(cfg, device, dtype)
    specs = {"dsa": dsa, "dense": dense_spec(cfg)}
    res["wall_s"]["build"] = round(time.perf_counter() - t0, 2)
    print(f"[k3_reduced build] {res['wall_s']['build']} s", flush=True)
    if tokens:  # the shortest run first: a time limit cuts the longest
        res["equivalence"] = timed(
            "equivalence", lambda: equivalence(model, specs, cfg, dtype, device, tokens)
        )
    warm = min(lengths[0], 128 if quick else WARM_TOKENS)
    kinds = [k for k in ("dense", "dsa") if k in args.variants.split(",")]
    for kind in kinds:  # compile and autotune every kernel the chunks and decode use
        with variant(model, kind):
            timed(f"warm_{kind}", lambda k=kind: prefill_decode(model, specs[k], dtype, device, warm, 4))
    for n in lengths:
        for kind in kinds:
            with variant(model, kind):
                row = timed(
                    f"{kind}_{n}",
                    lambda k=kind, n=n: prefill_decode(model, specs[k], dtype, device, n, steps),
                )
            row.pop("output_ids", None)
            res["runs"][f"{kind}_{n}"] = row
            save()
        d, s = res["runs"].get(f"dense_{n}", {}), res["runs"].get(f"dsa_{n}", {})
        if "ttft_s" in d and "ttft_s" in s:
            res["runs"][f"dsa_{n}"]["ttft_dense_over_dsa"] = round(d["ttft_s"] / s["ttft_s"], 3)
            res["runs"][f"dsa_{n}"]["decode_dsa_over_dense"] = round(
                s["decode_tok_per_s"] / d["decode_tok_per_s"], 3
            )
    save()
    png = args.plot or (str(Path(out).with_suffix(".png")) if out else None)
    if png:
        print("plot:", plot(res, png))
    return res


if __name__ == "__main__":
    main()
