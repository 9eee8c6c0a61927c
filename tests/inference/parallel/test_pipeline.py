"""Pipeline parallelism: the stage plan, the rank layout and micro-batch split (no processes), and
PP engines on gloo worker processes (alone, x TP, x EP) giving the single-process greedy tokens
(fp32, same random model) with chunked prefill and prefix hits."""

from __future__ import annotations

import pytest
import torch

from inference.analyze import analyze, rank_params
from inference.analyze.stages import layer_costs, plan_nodes, plan_stages
from inference.config import load_config, parse_config
from inference.engine.factory import build_engine, small_model_config
from inference.engine.request import SamplingParams
from inference.engine.scheduler import ScheduledRequest
from inference.model.cache_tensors import HybridCacheSpec
from inference.parallel import ParallelConfig, ParallelConfigError
from inference.parallel.pipeline import micro_batches, stage_cache_spec
from inference.parallel.weights import rank_weight_bytes
from orchestrator.cli import main

from .test_parallel_engine import CONFIG, _run

DSA = "inference/configs/tiny_deepseek_v32.json"
K3 = (
    "inference/configs/kimi_k3_shaped_2p8t.json"  # a Kimi-K3-shaped 2.8T config: KDA 3:1 MLA+DSA, 768 experts
)


def test_rank_layout_round_trips_and_keeps_a_stage_contiguous() -> None:
    c = ParallelConfig(tensor_parallel_size=2, expert_parallel_size=2, pipeline_parallel_size=3)
    assert c.world_size == 12 and c.stage_size == 4
    for rank in range(c.world_size):
        p, e, t = c.coords(rank)
        assert c.rank_of(p, e, t) == rank == (p * 2 + e) * 2 + t
    assert c.stage_ranks(1) == [4, 5, 6, 7]
    assert c.tp_group_ranks(1, 1) == [6, 7] and c.ep_group_ranks(2, 1) == [9, 11]
    assert c.stage_peer(5, 2) == 9  # same (ep, tp) coordinates, next-but-one stage
    assert c.sampler_rank == 8


def test_stage_plan_balances_contiguous_stages() -> None:
    spec = load_config("inference/configs/kimi_linear_48b_a3b.json")
    costs = layer_costs(spec)
    for pp in (1, 2, 4, 8):
        plan = plan_stages(spec, pp)
        assert plan.bounds[0] == 0 and plan.bounds[-1] == spec.num_layers
        assert all(len(plan.layers(p)) > 0 for p in range(pp))
        # no single cut moved by one layer lowers the most expensive stage
        worst = max(plan.costs)
        for p in range(1, pp):
            for d in (-1, 1):
                b = list(plan.bounds)
                b[p] += d
                if b[p - 1] < b[p] < b[p + 1]:
                    moved = [sum(costs[b[q] : b[q + 1]]) for q in range(pp)]
                    moved[-1] += spec.vocab_size * spec.hidden_size
                    assert max(moved) >= worst
    # measured costs are taken as given: an expensive last layer gets a stage of its own
    tiny = parse_config(small_model_config())
    assert plan_stages(tiny, 2, costs=[1, 1, 1, 10]).bounds == (0, 3, 4)
    with pytest.raises(ValueError, match="between 1 and the 4 layers"):
        plan_stages(tiny, 5)


def test_micro_batches_are_contiguous_balanced_and_non_empty() -> None:
    def req(i: int, n: int) -> ScheduledRequest:
        return ScheduledRequest(f"r{i}", tuple(range(n)), 0, (), i, True, True)

    decode = [req(i, 1) for i in range(7)]
    groups = micro_batches(decode, 3)
    assert [len(g) for g in groups] == [3, 2, 2]
    assert [s for g in groups for s in g] == decode
    assert [len(g) for g in micro_batches(decode[:3], 3)] == [1, 1, 1]
    mixed = [req(0, 20), req(1, 1), req(2, 1), req(3, 1)]
    groups = micro_batches(mixed, 2)
    assert [len(g) for g in groups] == [1, 3]
    assert micro_batches(mixed[:1], 4) == [mixed[:1]]
    assert micro_batches([], 2) == []


def test_stage_caches_partition_the_layers_and_weights() -> None:
    spec = parse_config(small_model_config())
    full = HybridCacheSpec.from_model_spec(spec, torch.float32)
    plan = plan_stages(spec, 2)
    parts = [stage_cache_spec(full, plan, p) for p in range(2)]
    assert sorted(parts[0].mla_layers + parts[1].mla_layers) == sorted(full.mla_layers)
    assert sorted(parts[0].kda_layers + parts[1].kda_layers) == sorted(full.kda_layers)
    assert sum(p.kv_bytes_per_token for p in parts) == full.kv_bytes_per_token
    assert sum(p.state_bytes_per_slot for p in parts) == full.state_bytes_per_slot
    # each stage's rank holds its layers only: the two stages' weights add up to the whole model
    pp2 = ParallelConfig(pipeline_parallel_size=2)
    whole = rank_weight_bytes(spec, ParallelConfig(), torch.float32)
    assert (
        rank_weight_bytes(spec, pp2, torch.float32, 0) + rank_weight_bytes(spec, pp2, torch.float32, 1)
        == whole
    )


@pytest.mark.parametrize("model", ["kimi", "dsa"])
@pytest.mark.parametrize("tp", [1, 2])
def test_analyze_stage_weights_equal_the_runtime_stage_shards(model: str, tp: int) -> None:
    """`dayzero analyze`'s per-stage weights per GPU are each stage rank's meta shard, exactly."""
    cfg = MODELS[model]()
    spec = load_config(cfg) if isinstance(cfg, str) else parse_config(cfg)
    stages = plan_stages(spec, 2)
    config = ParallelConfig(tensor_parallel_size=tp, pipeline_parallel_size=2)
    for p in range(2):
        runtime = rank_weight_bytes(spec, config, torch.float32, config.stage_ranks(p)[0]) // 4
        assert rank_params(spec, tp, 1, stages.layers(p), first=p == 0, last=p == 1) == runtime


def test_analyze_plans_the_k3_shaped_model_on_8_gpu_nodes(capsys) -> None:
    spec = load_config(K3)
    assert 2.8e12 < analyze(spec).params["total"] < 2.9e12
    fp8 = plan_nodes(spec, 8, 141.0, 131072, "fp8", sequences=8)
    assert (fp8.nodes, fp8.fits) == (4, True)  # FP8 weights on H200 hosts: PP=4 across 4 nodes
    fewer = plan_nodes(spec, 8, 141.0, 131072, "fp8", sequences=8, max_nodes=3)
    assert (fewer.nodes, fewer.fits) == (3, False)
    bf16 = plan_nodes(spec, 8, 80.0, 131072, "bf16", sequences=8)
    assert bf16.fits and bf16.nodes > fp8.nodes
    for plan in (fp8, bf16):  # the stages cover the layers once, each within a host's memory
        assert (
            plan.stages.bounds[-1]
            == spec.num_layers
            == sum(b - a for a, b in (m.layers for m in plan.memory))
        )
        assert all(m.max_sequences >= 8 for m in plan.memory)
    args = [K3, "--gpus-per-node", "8", "--gpu-mem", "141", "--weights", "fp8", "--sequences", "8"]
    assert main(["analyze", *args]) == 0
    out = capsys.readouterr().out
    assert "nodes: 4 x 8 GPUs = 32 GPUs, TP=8 EP=8 inside a node, PP=4 across nodes" in out
    assert "stage 3 (node 3): layers 64-83" in out


def test_more_stages_than_layers_is_refused() -> None:
    with pytest.raises(ParallelConfigError, match="pipeline-parallel-size 5"):
        build_engine(engine_config=CONFIG, pipeline_parallel_size=5)


MODELS = {
    "kimi": small_model_config,
    "dsa": lambda: DSA,
    "qwen3_next": lambda: "inference/configs/tiny_qwen3_next.json",
}


@pytest.fixture(scope="module")
def reference() -> dict[str, tuple]:
    return {name: _run(build_engine(config=cfg(), engine_config=CONFIG)) for name, cfg in MODELS.items()}


# (model, pp, tp, ep, micro-batches per step)
LAYOUTS = {
    "kimi-pp2": ("kimi", 2, 1, 1, 1),
    "kimi-pp2-mb3": ("kimi", 2, 1, 1, 3),
    "kimi-pp2xtp2": ("kimi", 2, 2, 1, 1),
    "kimi-pp2xep2": ("kimi", 2, 1, 2, 1),
    "deepseek_v32-pp2": ("dsa", 2, 1, 1, 1),
    "deepseek_v32-pp2xtp2": ("dsa", 2, 2, 1, 1),
    "deepseek_v32-pp2xep2": ("dsa", 2, 1, 2, 1),
    "qwen3_next-pp2xtp2": ("qwen3_next", 2, 2, 1, 1),  # GDN + GQA layers, residuals inside the layer
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_pipeline_greedy_matches_single_process(reference, layout: str) -> None:
    model, pp, tp, ep, micro = LAYOUTS[layout]
    engine = build_engine(
        config=MODELS[model](), engine_config=CONFIG, pipeline_parallel_size=pp, tensor_parallel_size=tp,
        expert_parallel_size=ep, micro_batches=micro,
    )  # fmt: skip
    try:
        tokens, cached = _run(engine)
        stats = engine.stats()
        traffic = engine.runner.traffic()  # every rank's counts since start-up
    finally:
        engine.runner.close()
    ref_tokens, ref_cached = reference[model]
    assert tokens == ref_tokens
    assert cached == ref_cached and all(c > 0 for c in cached)  # the second round hit the cache
    assert stats["prefix_hit_rate"] > 0
    # every activation a stage-0 rank sent, its stage-1 peer received: whole [tokens, hidden] fp32 rows
    config = ParallelConfig(tp, ep, pipeline_parallel_size=pp)
    cfg = MODELS[model]()
    hidden = (load_config(cfg) if isinstance(cfg, str) else parse_config(cfg)).hidden_size
    for rank in config.stage_ranks(0):
        sent, got = traffic[rank]["pp.send"], traffic[config.stage_peer(rank, 1)]["pp.recv"]
        assert sent == got and sent[1] > 0 and sent[1] % (hidden * 4) == 0
        assert "pp.recv" not in traffic[rank] and "pp.send" not in traffic[config.stage_peer(rank, 1)]


def test_scheduler_leaves_steps_in_flight_alone() -> None:
    """`schedule(busy=..., max_requests=...)`: requests of a step still in flight are neither
    scheduled nor preempted; a step takes at most its share."""
    from inference.cache.coordinator import CacheConfig
    from inference.engine.request import Request, SamplingParams
    from inference.engine.scheduler import Scheduler, SchedulerConfig

    sched = Scheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64),
        CacheConfig(block_size=4, num_blocks=5, num_state_slots=16, enable_prefix_caching=False),
    )
    for i in range(4):
        sched.add(Request(f"r{i}", [1 + i] * 4, SamplingParams(temperature=0.0, max_tokens=8)))
    first = sched.schedule(max_requests=2)
    assert [s.req_id for s in first.scheduled] == ["r0", "r1"]
    second = sched.schedule(busy=frozenset({"r0", "r1"}), max_requests=2)
    assert [s.req_id for s in second.scheduled] == ["r2", "r3"]
    sched.update(first, {"r0": 5, "r1": 6})
    # r0 and r1 each need a second block to decode; the pool (5 blocks) has one: r1 must yield,
    # and the victim is r1 itself, never r3 or r2 (the newest running, but in flight)
    third = sched.schedule(busy=frozenset({"r2", "r3"}))
    assert [s.req_id for s in third.scheduled] == ["r0"] and third.preempted == ["r1"]
    assert [r.request_id for r in sched.running] == ["r0", "r2", "r3"]


def test_steps_overlap_through_the_stages_in_steady_decode(reference) -> None:
    """PP=2, decode at batch 4: two steps in flight, each half the batch; the first stage starts
    step k + 1 before the last one has finished step k; tokens as the single-process engine's."""
    prompts = [[(7 * i + j) % 250 + 1 for j in range(8)] for i in range(4)]
    sp = SamplingParams(temperature=0.0, max_tokens=24)
    single = [r.output_token_ids for r in build_engine(engine_config=CONFIG).generate(prompts, sp)]
    engine = build_engine(engine_config=CONFIG, pipeline_parallel_size=2)
    try:
        got = [r.output_token_ids for r in engine.generate(prompts, sp)]
        spans = [{s: (a, b) for s, a, b, _ in engine.runner.spans[r]} for r in (0, 1)]
    finally:
        engine.runner.close()
    assert got == single
    assert engine.max_in_flight == 2
    steps = sorted(spans[0])
    overlapped = [k for k in steps if k + 1 in spans[0] and spans[0][k + 1][0] < spans[1][k][1]]
    assert len(overlapped) >= len(steps) // 2  # most steps: the pipeline stays full


def test_a_request_aborted_while_its_step_is_in_flight() -> None:
    """Its step still comes back (and its token is dropped); the others' tokens are unchanged."""
    prompts = [[(5 * i + j) % 250 + 1 for j in range(8)] for i in range(4)]
    sp = SamplingParams(temperature=0.0, max_tokens=12)
    single = [r.output_token_ids for r in build_engine(engine_config=CONFIG).generate(prompts, sp)]
    engine = build_engine(engine_config=CONFIG, pipeline_parallel_size=2)
    tokens: dict[str, list[int]] = {}
    try:
        rids = [engine.add_request(p, sp) for p in prompts]
        while not engine._flights or rids[3] not in engine._flights[-1].reached:
            for o in engine.step():
                tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        [aborted] = engine.abort([rids[3]])
        assert aborted.finished and aborted.finish_reason == "abort"
        while engine.has_unfinished:
            for o in engine.step():
                assert o.request_id != rids[3]
                tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    finally:
        engine.runner.close()
    assert [tokens[r] for r in rids[:3]] == single[:3]


def test_pipeline_with_offload_tiers_resumes_every_conversation(tmp_path) -> None:
    """PP=2 with host + disk tiers and GPU pools too small for the conversations: each stage moves
    its own layers' blocks and states at the locations the driver's one tier index chose; greedy
    tokens are the single-process engine's without offload and every returning conversation
    resumes whole from the tiers."""
    from tests.inference.cache.test_tier_engine import BASE
    from tests.inference.parallel.test_parallel_tiers import TIERS, run

    reference = run(build_engine(engine_config=BASE))
    engine = build_engine(
        engine_config=BASE.evolve(tiers=TIERS["host+disk"](tmp_path)), pipeline_parallel_size=2
    )
    try:
        outs1, outs2, cached, stats, ends = run(engine)
    finally:
        engine.runner.close()
    assert outs1 == reference[0] and outs2 == reference[1]
    assert cached == ends and sum(cached) > sum(reference[2])
    assert stats["promoted_blocks_disk"] > 0 and stats["promoted_ckpts_disk"] > 0
    for rank in range(2):  # each stage wrote its own layers' shard
        assert list((tmp_path / "kv" / f"rank{rank}").iterdir()), rank


class PoisonedEmbedding(RuntimeError):
    """What the first stage raises for a step holding the marker token."""


def _poison_first_stage(model: torch.nn.Module, rank: int, *, marker: int) -> None:
    """A rank hook (picklable through `functools.partial`): the first stage's embedding raises on
    a step whose ids hold `marker`; the later stage never sees the ids."""
    if model.model.embed_tokens is None or model.lm_head is not None:  # not the first stage
        return

    def fail(module: torch.nn.Module, args: tuple) -> None:
        if bool((args[0] == marker).any()):
            raise PoisonedEmbedding(f"marker token {marker} in the step (rank {rank})")

    model.model.embed_tokens.register_forward_pre_hook(fail)


def test_a_step_failing_on_the_first_stage_fails_its_request_alone() -> None:
    """The first stage raises mid-step (steps overlapping); it flags its activations,
    the last stage fails the same step, and the engine isolates the request as under TP: the
    poisoned request fails alone, the others' tokens are the single-process engine's."""
    import functools

    from inference.parallel import StepFailedError
    from inference.parallel.launch import build_parallel_engine
    from inference.tokenizer import ByteTokenizer

    from .test_parallel_engine import GREEDY, ROUND1

    single = [r.output_token_ids for r in build_engine(engine_config=CONFIG).generate(ROUND1, GREEDY)]
    used = {t for p in ROUND1 for t in p} | {t for o in single for t in o}
    marker = min(set(range(1, 256)) - used)
    spec = parse_config(small_model_config())
    engine = build_parallel_engine(
        spec, ByteTokenizer(), HybridCacheSpec.from_model_spec(spec, torch.float32), CONFIG,
        tensor_parallel_size=1, expert_parallel_size=1, pipeline_parallel_size=2, model_dir=None,
        device=torch.device("cpu"), dtype=torch.float32, seed=0,
        rank_hook=functools.partial(_poison_first_stage, marker=marker),
    )  # fmt: skip
    try:
        rids = [engine.add_request(p, GREEDY) for p in ROUND1]
        bad = engine.add_request([5, 6, marker, 7], GREEDY)
        tokens = {r: engine.scheduler.requests[r] for r in rids}
        failed, errors = [], []
        while engine.has_unfinished:
            try:
                engine.step()
            except StepFailedError as exc:
                errors.append(exc)
                failed += engine.recover_after_failed_step()
        assert failed == [bad] and errors and "PoisonedEmbedding" in errors[0].traceback
        assert [tokens[r].output_token_ids for r in rids] == single
        (again,) = engine.generate([ROUND1[0]], GREEDY)  # the ranks stayed up and in step
        assert again.output_token_ids == single[0]
    finally:
        engine.runner.close()
