"""The second architecture in the engine: the bundled tiny `deepseek_v32` config (MLA + DSA +
grouped-routed MoE, no KDA layers) generates greedily what transformers' `DeepseekV32ForCausalLM`
generates on the same random weights (CPU, fp32), batched, chunked and with a prefix hit."""

import json

import pytest
import torch
import transformers

from inference.engine.engine import EngineConfig
from inference.engine.factory import build_engine
from inference.engine.request import SamplingParams
from testing.deepseek_hf_mapping import TINY, hf_config, published_to_hf


def test_greedy_equals_transformers_generate():
    cfg = json.loads(TINY.read_text())
    eng = build_engine(
        config=TINY,
        engine_config=EngineConfig.of(block_size=8, num_blocks=256, num_state_slots=32, max_num_batched_tokens=48,
                                   checkpoint_interval=16, max_model_len=2048),
    )  # fmt: skip
    assert eng.runner.cache.spec.kda_layers == () and eng.runner.cache.spec.state_bytes_per_slot == 0
    hf = transformers.DeepseekV32ForCausalLM(hf_config(cfg)).eval()
    hf.load_state_dict(published_to_hf(eng.runner.model.state_dict()), strict=True)
    # 52 > index_topk = 16 tokens: the indexer drops keys in every layer
    prompts = [list(range(3, 3 + n)) for n in (37, 52)] + [[*range(3, 40), 200, 201]]
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    eng.runner.vocab_size = None  # compare over the model's whole vocabulary, as generate does
    eng.tokenizer.vocab_size = cfg["vocab_size"]
    ours = [r.output_token_ids for r in eng.generate(prompts[:2], sp)]  # batched, chunked
    ours += [r.output_token_ids for r in eng.generate(prompts[2:], sp)]
    # the checkpoint rule holds unchanged with no recurrent state: the third prompt resumes at the
    # end of the first one's prompt, where that request left a (zero-byte) state checkpoint
    assert eng.scheduler.cached_tokens_admitted == 37
    for p, got in zip(prompts, ours, strict=True):
        with torch.no_grad():  # no KV cache on the reference side: every step a full causal forward
            ref = hf.generate(
                torch.tensor([p]), max_new_tokens=10, do_sample=False, use_cache=False, pad_token_id=0
            )
        assert got == ref[0, len(p) :].tolist()


def _tiny_v3() -> dict:
    """The tiny config without its indexer: DeepSeek-V3 / Kimi-K2 layout (decode-graph capable)."""
    cfg = {k: v for k, v in json.loads(TINY.read_text()).items() if not k.startswith("index_")}
    return dict(cfg, model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"])


@pytest.mark.parametrize("variant", ["deepseek_v3", "deepseek_v32_dsa"])
def test_decode_graph_path_and_prefix_cache_keep_outputs_identical(variant: str):
    """The runner's decode-graph path (buckets, padded rows into the scratch block) with the
    forward run eagerly on the padded inputs, and the prefix cache on: the same greedy tokens as
    each prompt alone, no cache, no padding. With DSA the padded rows and the width bucket's
    extra keys must not change what the indexer selects (top-16 of these prompts: it selects)."""
    from tests.inference.engine.graph_fakes import EagerGraphs
    from tests.inference.engine.test_engine_exactness import BASE, GREEDY, prompts

    config = _tiny_v3() if variant == "deepseek_v3" else TINY
    ref_eng = build_engine(config=config, engine_config=BASE)
    assert ref_eng.runner.model.supports_decode_graphs(torch.bfloat16)
    ps = prompts()[:6]
    want = [ref_eng.generate([p], GREEDY)[0].output_token_ids for p in ps]
    eng = build_engine(config=config, engine_config=BASE.evolve(enable_prefix_caching=True))
    runner = eng.runner
    kv = next(iter(runner.cache.kv.values()))
    scratch_block = kv.shape[0] - 1
    runner.graphs = EagerGraphs(
        runner.model, runner.cache, device=runner.device, block_size=BASE.cache.block_size,
        scratch_block=scratch_block, scratch_slot=runner.cache.num_slots - 1, batch_buckets=(1, 2, 4, 8, 16),
    )  # fmt: skip
    for _wave in range(2):  # the second wave starts from prefix hits
        assert [r.output_token_ids for r in eng.generate(ps, GREEDY)] == want
    assert runner.graphs.num_replays > 0 and eng.scheduler.cached_tokens_admitted > 0
    assert kv[scratch_block].abs().sum() > 0  # the padding rows wrote into the spare block only
    eng.scheduler.cache.check_invariants()
