"""Start-up memory planning: pools sized from measured memory; impossible configurations fail at start."""

import subprocess
import sys

import pytest

from inference.embedded import EMBEDDED_ENGINE_CONFIG
from inference.engine.factory import build_engine
from inference.engine.memory_plan import GiB, MemoryPlanError, plan_memory

KV_PER_BLOCK = 64 * 1024 * 1024  # 64 MiB a block
STATE_PER_SLOT = 256 * 1024 * 1024  # 256 MiB a slot


def plan(**kw):
    args = dict(
        device_total=100 * GiB,
        in_use=10 * GiB,
        activations=5 * GiB,
        block_size=64,
        kv_bytes_per_block=KV_PER_BLOCK,
        state_bytes_per_slot=STATE_PER_SLOT,
        num_state_slots=8,
        max_model_len=32 * 1024,
    )
    args.update(kw)
    return plan_memory(**args)


def test_pools_take_what_weights_activations_and_headroom_leave():
    p = plan()
    # 100 GiB - 20 GiB headroom - 10 in use - 5 activations - 2 GiB of state = 63 GiB of KV
    assert p.headroom == 20 * GiB and p.state_bytes == 2 * GiB
    assert p.num_blocks == 63 * GiB // KV_PER_BLOCK == 1008
    assert p.max_cached_tokens == 1008 * 64
    assert "1008 blocks" in p.describe() and "headroom 20.00 GiB" in p.describe()
    assert plan(headroom_fraction=0.1).num_blocks == 73 * GiB // KV_PER_BLOCK


def test_a_too_long_max_model_len_fails_naming_the_numbers():
    with pytest.raises(
        MemoryPlanError, match=r"max_model_len 1048576 needs 16384 KV blocks .* pool has 1008"
    ):
        plan(max_model_len=1 << 20)


def test_too_many_state_slots_or_blocks_fail():
    with pytest.raises(MemoryPlanError, match=r"400 state slots need 100\.00 GiB"):
        plan(num_state_slots=400)
    with pytest.raises(MemoryPlanError, match="--num-blocks 5000 needs"):
        plan(num_blocks=5000)
    assert plan(num_blocks=1000).num_blocks == 1000
    with pytest.raises(MemoryPlanError, match="headroom"):
        plan(headroom_fraction=1.0)


def test_cpu_engine_checks_configured_pools_at_start():
    bad = EMBEDDED_ENGINE_CONFIG.evolve(num_blocks=64, max_model_len=4096)  # 64 x 16 = 1,024 tokens
    with pytest.raises(MemoryPlanError, match="max_model_len 4096 needs 256 KV blocks of 16 tokens"):
        build_engine(engine_config=bad)
    ok = build_engine(engine_config=bad.evolve(max_model_len=1024))
    assert ok.memory_plan.num_blocks == 64 and ok.memory_plan.max_cached_tokens == 1024


def test_infer_serve_refuses_to_start_with_an_impossible_plan():
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "infer", "serve", "--dummy", "--device", "cpu", "--port", "1",
         "--max-model-len", "1000000", "--num-blocks", "64", "--block-size", "16"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    assert "max_model_len 1000000 needs 62500 KV blocks of 16 tokens" in out.stderr


@pytest.mark.gpu
def test_cuda_plan_measures_the_device_and_leaves_the_headroom():
    import torch

    from inference.engine.engine import EngineConfig
    from inference.engine.request import SamplingParams

    cfg = EngineConfig.of(
        block_size=64, max_model_len=1 << 20, max_num_batched_tokens=8192, num_state_slots=64
    )
    eng = build_engine(engine_config=cfg, device="cuda", dtype="bfloat16", mem_fraction=0.8)
    plan = eng.memory_plan
    free, total = torch.cuda.mem_get_info()
    assert plan.device_total == total and plan.activations > 0 and plan.in_use > 0
    assert plan.max_cached_tokens >= 1 << 20 and eng.config.cache.num_blocks == plan.num_blocks
    assert free >= plan.headroom  # the pools took no more than the plan: the headroom is still free
    (req,) = eng.generate([[1, 2, 3] * 100], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(req.output_token_ids) == 4


def test_the_profiled_step_is_the_last_chunk_of_the_longest_sequence():
    """The start-up profile runs a chunk of `max_num_batched_tokens` ending at position
    max_model_len - 1 (attending to all earlier keys), not just the first chunk of a sequence:
    on the CPU the step runs and writes exactly the chunk's KV rows at the end of the context."""

    from inference.engine.engine import EngineConfig
    from inference.engine.memory_planner import longest_step

    L, n, B = 300, 64, 16
    cfg = EngineConfig.of(block_size=B, num_blocks=-(-L // B) + 1, max_model_len=L, enable_cuda_graphs=False)
    eng = build_engine(engine_config=cfg)
    longest_step(eng, n, L)
    (kv,) = eng.runner.cache.kv.values()
    written = kv.reshape(-1, kv.shape[-1]).abs().sum(-1) > 0
    assert written.nonzero().flatten().tolist() == list(range(L - 1 - n, L - 1))
    assert not eng.runner.tables  # nothing of the probe is left in the runner


@pytest.mark.gpu
def test_cuda_profile_covers_the_attention_workspace_at_the_longest_context():
    """The plan's activations grow with max_model_len (the last chunk's attention over all earlier
    keys), and the real engine's last chunk at max_model_len stays within them."""
    import torch

    from inference.engine.engine import EngineConfig
    from inference.engine.memory_planner import longest_step

    def engine(max_len):
        cfg = EngineConfig.of(
            block_size=64, num_blocks=max_len // 64 + 8, max_model_len=max_len,
            max_num_batched_tokens=4096, enable_cuda_graphs=False,
        )  # fmt: skip
        return build_engine(engine_config=cfg, device="cuda", dtype="bfloat16", fixed_blocks=True)

    short = engine(8192).memory_plan.activations
    torch.cuda.empty_cache()
    eng = engine(1 << 19)
    long = eng.memory_plan.activations
    assert long > short
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    longest_step(eng, 4096, 1 << 19)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before <= long * 1.05
