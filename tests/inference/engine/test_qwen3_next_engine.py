"""Qwen3-Next in the engine: the bundled tiny `qwen3_next` config (gated DeltaNet + gated GQA +
softmax MoE) generates greedily what transformers' `Qwen3NextForCausalLM` generates on the same
random weights (CPU, fp32), batched, chunked and with a prefix hit under the checkpoint rule (its
GDN states are real: a hit must resume from a state checkpoint, not just from cached blocks)."""

import json

import torch
import transformers

from inference.engine.engine import EngineConfig
from inference.engine.factory import build_engine
from inference.engine.request import SamplingParams
from testing.qwen3_next_hf_mapping import TINY, hf_config, published_to_hf


def test_greedy_equals_transformers_generate():
    cfg = json.loads(TINY.read_text())
    eng = build_engine(
        config=TINY,
        engine_config=EngineConfig.of(block_size=8, num_blocks=256, num_state_slots=32, max_num_batched_tokens=48,
                                   checkpoint_interval=16, max_model_len=2048),
    )  # fmt: skip
    assert eng.runner.cache.spec.kda_layers == (0, 2) and eng.runner.cache.spec.state_bytes_per_slot > 0
    hf = transformers.Qwen3NextForCausalLM(hf_config(cfg)).eval()
    hf.load_state_dict(published_to_hf(eng.runner.model.state_dict()), strict=True)
    prompts = [list(range(3, 3 + n)) for n in (37, 52)] + [[*range(3, 40), 200, 201]]
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    eng.runner.vocab_size = None  # compare over the model's whole vocabulary, as generate does
    eng.tokenizer.vocab_size = cfg["vocab_size"]
    ours = [r.output_token_ids for r in eng.generate(prompts[:2], sp)]  # batched, chunked
    ours += [r.output_token_ids for r in eng.generate(prompts[2:], sp)]
    assert eng.scheduler.cached_tokens_admitted == 37  # resumed from the first prompt's end checkpoint
    for p, got in zip(prompts, ours, strict=True):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([p]), max_new_tokens=10, do_sample=False, use_cache=False, pad_token_id=0
            )
        assert got == ref[0, len(p) :].tolist()
