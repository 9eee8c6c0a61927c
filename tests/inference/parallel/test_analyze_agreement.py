"""`dayzero analyze`'s per-GPU weights are what the runtime holds: each rank's language-model
shard (replicated norms, routers, latent and low-rank projections included) and, on GPU 0, the
vision tower and projector the driver holds whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from inference.analyze import WEIGHT_BYTES, driver_params, plan_parallel, rank_params
from inference.config import ModelSpec, load_config, parse_config
from inference.engine.factory import build_engine, small_model_config, small_vl_model_config
from inference.parallel.config import ParallelConfig
from inference.parallel.weights import rank_weight_bytes
from tests.inference.parallel.test_parallel_engine import CONFIG

CONFIGS = Path("inference/configs")


def _tiny(name: str) -> ModelSpec:
    if name == "small_vl":
        return parse_config(small_vl_model_config())
    if name == "odd_vocab":  # the last rank's vocab rows are padding
        return parse_config(small_model_config(vocab_size=321))
    if name == "qwen3_next_kv1":  # one KV head: a copy on every TP rank
        cfg = json.loads((CONFIGS / "tiny_qwen3_next.json").read_text())
        return parse_config({**cfg, "num_key_value_heads": 1})
    return load_config(CONFIGS / f"{name}.json")


@pytest.mark.parametrize(
    ("name", "tp"),
    [
        ("small_vl", 2),
        ("odd_vocab", 2),
        ("tiny_hybrid_vl", 2),
        ("tiny_deepseek_v32", 2),
        ("tiny_deepseek_v32", 4),
        ("tiny_qwen3_next", 2),
        ("qwen3_next_kv1", 2),
    ],
)
def test_rank_params_equal_the_meta_shard(name: str, tp: int) -> None:
    """Exact: analyze's count of one rank's shard is the parameters the runtime's shard holds (in
    fp32 every tensor has 4 bytes, so bytes / 4 is the parameter count)."""
    spec = _tiny(name)
    assert rank_params(spec, tp) == rank_weight_bytes(spec, ParallelConfig(tp, 1), torch.float32) // 4


def test_kimi_k25_at_8_gpus_gpu0_holds_the_shard_and_the_tower() -> None:
    """Kimi-K2.5 bf16 at TP=8: GPU 0 = the runtime's rank-0 shard + the driver's whole tower
    (0.94 GB, not analyze's former 1/8 of it); the other GPUs hold the shard only."""
    from inference.model.multimodal import VisionEncoder

    spec = load_config(CONFIGS / "kimi_k25.json")
    (plan,) = [p for p in plan_parallel(spec, 8, 141.0, 131072) if p.pp == 1]
    shard = rank_weight_bytes(spec, ParallelConfig(8, 1), torch.bfloat16)
    with torch.device("meta"):
        tower = VisionEncoder(spec).to(torch.bfloat16)
    driver = sum(t.numel() * t.element_size() for t in [*tower.parameters(), *tower.buffers()])
    assert plan.driver_weight_bytes == driver and driver_params(spec) * 2 == driver
    runtime_gpu0 = shard + driver
    planned_gpu0 = plan.weight_bytes_per_gpu + plan.driver_weight_bytes
    assert planned_gpu0 <= runtime_gpu0 <= planned_gpu0 * 1.01
    assert plan.weight_bytes_per_gpu <= shard <= plan.weight_bytes_per_gpu * 1.01


def test_vision_model_tp2_per_rank_weights_equal_analyze() -> None:
    """gloo, the small random vision-language model at TP=2: what each rank reports holding
    (`rank_memory`) plus, on rank 0, the driver's tower and projector (`engine.runner.model`)
    equals analyze's GPU 0 and GPU 1 weights (analyze counts bf16: compared per parameter)."""
    spec = parse_config(small_vl_model_config())
    (plan,) = [p for p in plan_parallel(spec, 2, 80.0, CONFIG.scheduler.max_model_len) if p.tp == 2]
    wb = WEIGHT_BYTES["bf16"]
    planned = [(plan.weight_bytes_per_gpu + plan.driver_weight_bytes) / wb, plan.weight_bytes_per_gpu / wb]
    engine = build_engine(config=small_vl_model_config(), engine_config=CONFIG, tensor_parallel_size=2)
    try:
        ranks = engine.runner.memory()
        tower = [*engine.runner.model.parameters(), *engine.runner.model.buffers()]
    finally:
        engine.runner.close()
    size = tower[0].element_size()  # the engine's dtype (fp32 on CPU)
    driver = sum(t.numel() for t in tower)
    assert driver == driver_params(spec) > 0
    runtime = [(ranks[0]["weight_bytes"] / size + driver), ranks[1]["weight_bytes"] / size]
    for got, want in zip(runtime, planned, strict=True):
        assert want <= got <= want * 1.01, (runtime, planned)
    # the former even split (tower and replicated parts spread evenly) misses both by > 1%
    even = (rank_params(spec, 1) + driver) / 2
    assert not all(even <= got <= even * 1.01 for got in runtime)
