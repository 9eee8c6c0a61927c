"""The engine's greedy generations equal transformers' `generate` on the same random weights
(the bundled small model; CPU, fp32), for prompts batched with chunked prefill and prefix hits."""

import torch
import transformers

from inference.engine.engine import EngineConfig
from inference.engine.factory import build_engine, small_model_config
from inference.engine.request import SamplingParams
from testing import kimi_hf_mapping as mapping


def test_greedy_equals_transformers_generate():
    cfg = small_model_config()
    eng = build_engine(
        engine_config=EngineConfig.of(block_size=8, num_blocks=256, num_state_slots=32, max_num_batched_tokens=48,
                                   checkpoint_interval=16, max_model_len=2048)
    )  # fmt: skip
    model = eng.runner.model
    hf = transformers.KimiLinearForCausalLM(
        transformers.KimiLinearConfig(**cfg, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    ).eval()
    missing, unexpected = hf.load_state_dict(mapping.published_to_hf(model.state_dict()), strict=False)
    assert not missing and not unexpected
    prompts = [list(range(3, 3 + n)) for n in (37, 52)] + [[*range(3, 40), 200, 201]]
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    eng.runner.vocab_size = None  # compare over the model's whole vocabulary, as generate does
    eng.tokenizer.vocab_size = cfg["vocab_size"]
    ours = [r.output_token_ids for r in eng.generate(prompts[:2], sp)]  # batched, chunked
    ours += [r.output_token_ids for r in eng.generate(prompts[2:], sp)]
    assert eng.scheduler.cached_tokens_admitted == 37  # the third resumed at the end of the first prompt
    for p, got in zip(prompts, ours, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, pad_token_id=0)
        assert got == ref[0, len(p) :].tolist()
