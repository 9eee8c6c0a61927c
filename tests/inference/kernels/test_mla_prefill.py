"""Varlen causal MLA prefill: the Triton kernel and the cuDNN split vs the fp32 reference."""

from __future__ import annotations

import pytest
import torch

from inference.kernels.mla_prefill import CUDNN_MIN_KEYS, CUDNN_MIN_QUERIES, mla_prefill_varlen, pick_backend
from inference.kernels.mla_prefill.fast import merge_by_lse, prefix_pieces
from inference.kernels.mla_prefill.reference import mla_prefill_varlen_reference
from tests.inference.kernels.helpers import TOL, assert_rel


def _batch(pairs, heads, dn, dr, dv, dtype, device, seed=0):
    """`pairs` of (new tokens L, total keys S): q, kv, k_rope (a strided view, as the model has it)."""
    g = torch.Generator(device).manual_seed(seed)
    t, s = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    q = torch.randn(t, heads, dn + dr, generator=g, device=device).to(dtype)
    kv = torch.randn(s, heads, dn + dv, generator=g, device=device).to(dtype)
    lat = torch.randn(s, 32 + dr, generator=g, device=device).to(dtype)
    cu_q = torch.tensor(
        [0] + [sum(p[0] for p in pairs[: i + 1]) for i in range(len(pairs))], dtype=torch.int32
    )
    cu_k = torch.tensor(
        [0] + [sum(p[1] for p in pairs[: i + 1]) for i in range(len(pairs))], dtype=torch.int32
    )
    return q, kv, lat[:, 32:], cu_q.to(device), cu_k.to(device), max(p[0] for p in pairs)


def _naive(q, kv, k_rope, cu_q, cu_k, scale, dn):
    """Independent oracle: per sequence, expanded keys and SDPA with an explicit bool mask."""
    outs = []
    for n in range(cu_q.shape[0] - 1):
        q0, q1, k0, k1 = int(cu_q[n]), int(cu_q[n + 1]), int(cu_k[n]), int(cu_k[n + 1])
        h = q.shape[1]
        k = torch.cat([kv[k0:k1, :, :dn], k_rope[k0:k1, None].expand(-1, h, -1)], -1).float()
        v = kv[k0:k1, :, dn:].float()
        qpos = torch.arange(q1 - q0)[:, None] + (k1 - k0) - (q1 - q0)
        mask = torch.arange(k1 - k0)[None, :] <= qpos
        o = torch.nn.functional.scaled_dot_product_attention(
            q[q0:q1].float().transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            attn_mask=mask[None],
            scale=scale,
        )
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


PAIRS = [(5, 5), (1, 30), (40, 70), (16, 16), (33, 100)]


def test_reference_matches_sdpa_with_mask():
    q, kv, kr, cu_q, cu_k, max_q = _batch(PAIRS, 3, 16, 8, 16, torch.float32, "cpu")
    got = mla_prefill_varlen_reference(q, kv, kr, cu_q, cu_k, max_q=max_q, scale=0.2, nope_dim=16)
    assert_rel(got, _naive(q, kv, kr, cu_q, cu_k, 0.2, 16), 1e-5, "prefill reference vs SDPA+mask")


@pytest.mark.parametrize("dr", [8, 0], ids=["rope8", "norope"])
def test_kernel_matches_reference_varlen(fast, device, dr):
    q, kv, kr, cu_q, cu_k, max_q = _batch(PAIRS, 3, 16, dr, 16, torch.float32, device, seed=dr)
    kw = dict(max_q=max_q, scale=0.2, nope_dim=16)
    got = fast.mla_prefill.mla_prefill_varlen_triton(q, kv, kr, cu_q, cu_k, **kw)
    assert_rel(
        got, mla_prefill_varlen_reference(q, kv, kr, cu_q, cu_k, **kw), 2e-5, f"prefill varlen dr={dr}"
    )


def test_dispatch_rejects_bad_shapes():
    q, kv, kr, cu_q, cu_k, max_q = _batch(PAIRS, 3, 16, 8, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="head/key counts"):
        mla_prefill_varlen(q, kv[:, :2], kr, cu_q, cu_k, max_q=max_q, scale=1.0, nope_dim=16)
    with pytest.raises(ValueError, match="cu_q"):
        mla_prefill_varlen(q, kv, kr, cu_q[:-1], cu_k, max_q=max_q, scale=1.0, nope_dim=16)


def test_prefix_pieces_cut_at_fixed_multiples():
    assert prefix_pieces(0, 4) == []
    assert prefix_pieces(4, 4) == [(0, 4)]
    assert prefix_pieces(10, 4) == [(0, 4), (4, 8), (8, 10)]


def test_merge_by_lse_of_disjoint_key_sets_is_attention_over_their_union():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 7, 5, generator=g)  # [H, L, D]
    k, v = torch.randn(2, 19, 5, generator=g), torch.randn(2, 19, 4, generator=g)  # 19 keys

    def attend(a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = q @ k[:, a:b].transpose(-1, -2) * 0.3
        return torch.softmax(s, -1) @ v[:, a:b], torch.logsumexp(s, -1)

    whole = attend(0, 19)[0]
    parts = [attend(a, b) for a, b in [(0, 4), (4, 8), (8, 19)]]
    assert_rel(merge_by_lse([(o.bfloat16(), lse) for o, lse in parts]), whole, 1e-2, "merge bf16 parts")
    assert_rel(merge_by_lse(parts), whole, 1e-5, "merge fp32 parts")


def test_auto_backend_takes_cudnn_only_for_one_long_sequence_chunk():
    def shapes(t, s, seqs):
        return torch.empty(t, 1, 1), torch.empty(s, 1, 1), torch.empty(seqs + 1)

    assert pick_backend(*shapes(CUDNN_MIN_QUERIES, CUDNN_MIN_KEYS, 1)) == "cudnn"
    assert pick_backend(*shapes(CUDNN_MIN_QUERIES, CUDNN_MIN_KEYS, 2)) == "triton"
    assert pick_backend(*shapes(CUDNN_MIN_QUERIES - 1, CUDNN_MIN_KEYS, 1)) == "triton"
    assert pick_backend(*shapes(CUDNN_MIN_QUERIES, CUDNN_MIN_KEYS - 1, 1)) == "triton"


GPU_CASES = [
    ([(4096, 4096)], "oneshot-4k"),
    ([(2048, 32768)], "chunk2k-over-32k"),
    ([(1024, 131072)], "chunk1k-over-128k"),
    ([(2, 2), (300, 300), (17, 5000), (1024, 9000), (129, 129), (1, 64)], "varlen6"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cudnn", "cudnn-piece1000"])
@pytest.mark.parametrize("pairs", [c[0] for c in GPU_CASES], ids=[c[1] for c in GPU_CASES])
def test_gpu_prefill_matches_reference(fast, pairs, backend):
    """`cudnn-piece1000`: the prefix in pieces of 1,000 keys (several, the last one partial)."""
    dev = torch.device("cuda")
    q, kv, kr, cu_q, cu_k, max_q = _batch(pairs, 16, 128, 64, 128, torch.bfloat16, dev, seed=len(pairs))
    kw = dict(max_q=max_q, scale=192**-0.5, nope_dim=128)
    if backend == "triton":
        got = fast.mla_prefill.mla_prefill_varlen_triton(q, kv, kr, cu_q, cu_k, **kw)
    else:
        piece = {"cudnn": fast.mla_prefill.CUDNN_PIECE, "cudnn-piece1000": 1000}[backend]
        got = fast.mla_prefill.mla_prefill_varlen_cudnn(q, kv, kr, cu_q, cu_k, **kw, piece=piece)
    want = mla_prefill_varlen_reference(q, kv, kr, cu_q, cu_k, **kw)
    assert_rel(got, want, TOL[torch.bfloat16], f"gpu prefill {backend} {pairs[:2]}")


@pytest.mark.gpu
def test_gpu_prefill_fp32_exact_dots(fast):
    dev = torch.device("cuda")
    q, kv, kr, cu_q, cu_k, max_q = _batch([*PAIRS, (700, 3000)], 16, 128, 64, 128, torch.float32, dev)
    kw = dict(max_q=max_q, scale=192**-0.5, nope_dim=128)
    got = fast.mla_prefill.mla_prefill_varlen_triton(q, kv, kr, cu_q, cu_k, **kw)
    want = mla_prefill_varlen_reference(q, kv, kr, cu_q, cu_k, **kw)
    assert_rel(got, want, TOL[torch.float32], "gpu prefill fp32")


@pytest.mark.parametrize("dr", [8, 0], ids=["rope8", "norope"])
@pytest.mark.parametrize(
    "pair", [(5, 5), (16, 70), (1, 30)], ids=["no-prefix", "chunk-over-prefix", "one-query"]
)
def test_prefill_in_pieces_matches_the_whole_expansion(dr, pair):
    """The piecewise path (keys expanded `piece` at a time, merged by LSE) equals the reference
    over all keys expanded at once; `expand` is asked only for ranges of at most `piece` keys
    besides the causal diagonal."""
    from inference.kernels.mla_prefill import mla_prefill_pieces

    q, kv, kr, cu_q, cu_k, max_q = _batch([pair], 3, 16, dr, 16, torch.float32, "cpu", seed=dr)
    asked: list[tuple[int, int]] = []

    def expand(a: int, b: int) -> torch.Tensor:
        asked.append((a, b))
        return kv[a:b]

    got = mla_prefill_pieces(q, expand, kr, scale=0.2, nope_dim=16, piece=8)
    want = mla_prefill_varlen_reference(q, kv, kr, cu_q, cu_k, max_q=max_q, scale=0.2, nope_dim=16)
    assert_rel(got, want, 1e-5, f"prefill in pieces {pair} dr={dr}")
    ctx = pair[1] - pair[0]
    assert asked == [(ctx, pair[1]), *prefix_pieces(ctx, 8)]


def test_prefill_in_pieces_rejects_more_queries_than_keys():
    from inference.kernels.mla_prefill import mla_prefill_pieces

    q, kv, kr, *_ = _batch([(6, 6)], 2, 16, 8, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="at least as many keys"):
        mla_prefill_pieces(q, lambda a, b: kv[a:b], kr[:4], scale=0.2, nope_dim=16)
