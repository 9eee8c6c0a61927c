"""The "local" EP dispatch in one process: each rank's masked form (every pair in place, foreign
pairs on a local expert with weight 0: fixed shapes, no host sync) and its compacted form give the
same partial sums, and the ranks' partial sums add up to the unsharded experts' output. The
all-reduce that adds them is the engine's (`test_parallel_engine.py` runs it on gloo)."""

from __future__ import annotations

import pytest
import torch

from inference.config import parse_config
from inference.engine.factory import small_model_config
from inference.model.moe import SparseMoE
from inference.parallel import moe as pmoe
from inference.parallel.comm import MeshGroups
from inference.parallel.config import ParallelConfig
from inference.parallel.moe import ParallelSparseMoE


def _moe(num_experts: int, top_k: int, device: str = "cpu", dtype: torch.dtype = torch.float32) -> SparseMoE:
    cfg = {**small_model_config(), "num_experts": num_experts, "num_experts_per_token": top_k}
    moe = SparseMoE(64, parse_config(cfg).moe)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return moe.to(device=device, dtype=dtype)


def _ranks(moe: SparseMoE, ep: int) -> list[ParallelSparseMoE]:
    config = ParallelConfig(expert_parallel_size=ep)
    per = len(moe.experts) // ep
    experts = [{i: moe.experts[i] for i in range(r * per, (r + 1) * per)} for r in range(ep)]
    return [
        ParallelSparseMoE(moe, experts[r], None, False, MeshGroups.layout_only(config, r)) for r in range(ep)
    ]


def _route(moe: SparseMoE, t: int, seed: int, device: str = "cpu", dtype: torch.dtype = torch.float32):
    x = torch.randn(t, 64, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)
    weights, ids = moe.gate(x)
    return x, weights, ids


@pytest.mark.parametrize(("ep", "t"), [(2, 1), (2, 7), (4, 33)])
def test_masked_and_compacted_forms_agree_and_the_ranks_add_up_to_the_whole(ep: int, t: int) -> None:
    moe = _moe(num_experts=8, top_k=2)
    x, weights, ids = _route(moe, t, seed=t)
    whole = moe.routed(x, weights, ids)
    ranks = _ranks(moe, ep)
    total = torch.zeros_like(x)
    for rank in ranks:
        masked = rank._masked(x, weights, ids)
        torch.testing.assert_close(masked, _compacted(rank, x, weights, ids), rtol=1e-6, atol=1e-6)
        total += masked
    torch.testing.assert_close(total, whole, rtol=1e-5, atol=1e-6)


def _compacted(rank: ParallelSparseMoE, x, weights, ids):
    """The compacted form, forced: `_local` with the masked bound at 0 pairs."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pmoe, "MASKED_MAX_PAIRS", 0)
        return rank._local(x, weights, ids)


def test_the_pair_count_picks_the_form(monkeypatch) -> None:
    """Up to `MASKED_MAX_PAIRS` pairs: masked (no `nonzero`, so no host sync); above: compacted."""
    moe = _moe(num_experts=8, top_k=2)
    rank = _ranks(moe, 2)[1]
    x, weights, ids = _route(moe, 5, seed=1)  # 10 pairs
    calls: list[str] = []
    monkeypatch.setattr(rank, "_masked", lambda *a: calls.append("masked") or x)
    monkeypatch.setattr(pmoe, "MASKED_MAX_PAIRS", 10)
    rank._local(x, weights, ids)
    monkeypatch.setattr(pmoe, "MASKED_MAX_PAIRS", 9)
    rank._local(x, weights, ids)
    assert calls == ["masked"]


def test_foreign_pairs_add_exactly_nothing() -> None:
    """A rank none of whose experts was chosen returns exact zeros from the masked form."""
    moe = _moe(num_experts=8, top_k=2)
    x, weights, _ = _route(moe, 6, seed=3)
    ids = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2], [0, 2], [1, 3]])  # all on rank 0's experts
    out = _ranks(moe, 2)[1]._masked(x, weights, ids)
    assert torch.equal(out, torch.zeros_like(x))


@pytest.mark.gpu
def test_masked_form_is_captured_in_a_cuda_graph_and_replays_the_eager_sums() -> None:
    """On one GPU, bf16 (the grouped-GEMM path of decode): a rank's masked step is captured in a
    CUDA graph (it would fail on a host sync) and its replays on new routings equal eager runs."""
    moe = _moe(num_experts=32, top_k=4, device="cuda", dtype=torch.bfloat16)
    rank = _ranks(moe, 2)[1]
    x, weights, ids = _route(moe, 32, seed=0, device="cuda", dtype=torch.bfloat16)
    bufs = [x.clone(), weights.clone(), ids.clone()]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up: Triton compiles and the stacked weights are built outside the capture
            rank._masked(*bufs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rank._masked(*bufs)
    for seed in (1, 2, 3):
        new = _route(moe, 32, seed=seed, device="cuda", dtype=torch.bfloat16)
        for buf, value in zip(bufs, new, strict=True):
            buf.copy_(value)
        graph.replay()
        torch.testing.assert_close(out, rank._masked(*new), rtol=0, atol=0)
