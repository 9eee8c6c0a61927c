"""`benchmarks.long_context`'s FP8 accuracy study: the trained demo model's greedy outputs and logits
with FP8 latents vs bf16 latents (and bf16 vs fp32, the noise floor), on the CPU."""

from __future__ import annotations

from typing import Any

from benchmarks.long_context_figures import META, ROW_SECTIONS, merge, plot  # noqa: F401
from inference.engine.engine import EngineConfig
from inference.engine.request import SamplingParams


class _LogitRecorder:
    """Wraps the runner's sampler and keeps every sampled row's logits (fp32, CPU) per request."""

    def __init__(self, inner) -> None:
        self.inner, self.rows = inner, {}

    def __call__(self, logits, params, req_ids, allowed=None):
        for rid, row in zip(req_ids, logits.float().cpu(), strict=True):
            self.rows.setdefault(rid, []).append(row)
        return self.inner(logits, params, req_ids, allowed)

    def __getattr__(self, name):
        return getattr(self.inner, name)


ACCURACY_PROMPTS = (
    "What is 17 times 23?", "List the files in the workspace.", "Search the documents for the 2023 budget.",
    "What is the square root of 1764?", "Crop the image to its left half.", "Summarise the report in one line.",
    "Fetch https://example.com/status and tell me if it is up.", "How many days are there in a leap year?",
    "Write a Python function that reverses a list.", "Which tool would you use to add 2 and 2?",
    "Describe the attached image.", "Compute 2 to the power of 20.", "Find mentions of 'latency' in the docs.",
    "Create a file notes.txt with the word hello.", "What is 1000 divided by 8?", "Translate 'good morning' to French.",
)  # fmt: skip


def fp8_accuracy(device, max_tokens: int) -> dict[str, Any]:
    """The trained demo model, bf16 weights: greedy generation of a fixed prompt set with the MLA
    latent cache in bf16 vs FP8 (e4m3, one scale per row); logit errors over the steps before the
    first divergence (same context on both sides) and greedy agreement. A bf16-vs-fp32 KV row
    (same weights) gives the noise floor."""
    from inference.chat import engine_frontend
    from inference.demo_model.spec import DEMO_DIR
    from inference.engine.factory import build_engine

    runs = {}
    for name, dtype, kv in (
        ("fp32", "float32", "auto"),
        ("bf16", "bfloat16", "auto"),
        ("fp8", "bfloat16", "fp8"),
    ):
        cfg = EngineConfig.of(num_blocks=512, max_model_len=4096, kv_cache_dtype=kv, enable_cuda_graphs=False)
        eng = build_engine(model_dir=DEMO_DIR, engine_config=cfg, device=device, dtype=dtype)
        tmpl = engine_frontend(eng).renderer
        prompts = [tmpl.render([{"role": "user", "content": p}]).token_ids for p in ACCURACY_PROMPTS]
        rec = _LogitRecorder(eng.runner.sampler)
        eng.runner.sampler = rec
        reqs = eng.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        runs[name] = [(r.output_token_ids, rec.rows[r.request_id]) for r in reqs]

    def compare(ref, got):
        same, prefix, max_err, mean_err, rel = 0, [], 0.0, [], []
        for (rt, rl), (gt, gl) in zip(ref, got, strict=True):
            d = next((i for i, (a, b) in enumerate(zip(rt, gt, strict=True)) if a != b), len(rt))
            same += d == len(rt)
            prefix.append(d / len(rt))
            for i in range(min(d + 1, len(rl))):  # step d still has the same context
                e = (gl[i] - rl[i]).abs()
                max_err = max(max_err, e.max().item())
                mean_err.append(e.mean().item())
                rel.append((e.norm() / rl[i].norm()).item())
        return {
            "sequences_identical": f"{same}/{len(ref)}",
            "mean_common_prefix_fraction": round(sum(prefix) / len(prefix), 4),
            "logit_max_abs_err": round(max_err, 4),
            "logit_mean_abs_err": round(sum(mean_err) / len(mean_err), 5),
            "logit_rel_err": round(sum(rel) / len(rel), 5),
        }

    return {
        "model": "inference/demo_model/weights", "device": str(device), "prompts": len(ACCURACY_PROMPTS),
        "max_tokens": max_tokens, "fp8_vs_bf16": compare(runs["bf16"], runs["fp8"]),
        "bf16_vs_fp32_noise_floor": compare(runs["fp32"], runs["bf16"]),
    }  # fmt: skip
