"""Paged MLA decode: the split-KV Triton kernel vs the fp32 reference (CPU: interpreter, small)."""

from __future__ import annotations

import pytest
import torch

from inference.kernels.mla_decode import mla_decode_paged
from inference.kernels.mla_decode.reference import mla_decode_paged_reference
from tests.inference.kernels.helpers import TOL, assert_rel, paged_pool

R, P = 32, 16  # CPU shapes (rows of 48 latents: 16-byte aligned in fp8 too); GPU cases use 512 + 64


def _case(lens, page, dtype, device, *, heads=4, r=R, p=P, seed=0, extra_width=1):
    width = max(-(-n // page) for n in lens) + extra_width
    pool, scales, tables = paged_pool(lens, page, width, r + p, dtype, device, seed)
    g = torch.Generator().manual_seed(seed + 1)
    q_lat = torch.randn(len(lens), heads, r, generator=g).to(device)
    q_rope = torch.randn(len(lens), heads, p, generator=g).to(device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return q_lat, q_rope, pool, scales, tables, seq_lens


def _naive(q_lat, q_rope, pool, scales, tables, seq_lens, r, scale, indices=None):
    """Independent oracle: one row at a time, plain softmax over the listed keys."""
    page = pool.shape[1]
    outs = []
    for n in range(q_lat.shape[0]):
        length = int(seq_lens[n])
        pos = torch.arange(length) if indices is None else indices[n].cpu()
        pos = pos[(pos >= 0) & (pos < length)]
        if pos.numel() == 0:
            outs.append(torch.zeros(q_lat.shape[1], r))
            continue
        rows = tables[n].cpu().long()[pos // page] * page + pos % page
        lat = pool.view(-1, pool.shape[-1]).cpu()[rows].float()
        if scales is not None:
            lat = lat * scales.reshape(-1).cpu()[rows][:, None]
        s = q_lat[n].cpu().float() @ lat[:, :r].T + q_rope[n].cpu().float() @ lat[:, r:].T
        outs.append(torch.softmax(s * scale, -1) @ lat[:, :r])
    return torch.stack(outs)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn], ids=["f32", "bf16", "fp8"]
)
def test_reference_matches_naive_rows(dtype):
    args = _case([1, 17, 40, 5], 16, dtype, "cpu")
    ref = mla_decode_paged_reference(
        *args[:3], args[4], args[5], kv_lora_rank=R, scale=0.3, kv_scales=args[3]
    )
    want = _naive(*args, R, 0.3)
    assert_rel(ref, want, 1e-5, f"reference vs naive ({dtype})")


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn], ids=["f32", "bf16", "fp8"]
)
@pytest.mark.parametrize("page", [16, 64], ids=["page16", "page64"])
# 1: the split kernel writes the output (no merge); 3; 20: more splits than the merge loads at once,
# most of them empty (lengths <= 100 over 32-key tiles)
@pytest.mark.parametrize("splits", [1, 3, 20], ids=["1split", "3splits", "20splits"])
def test_kernel_matches_reference_ragged(fast, device, dtype, page, splits):
    q_lat, q_rope, pool, scales, tables, lens = _case([1, 33, 100, 64], page, dtype, device, seed=page)
    kw = dict(kv_lora_rank=R, scale=0.25, kv_scales=scales, num_splits=splits)
    got = fast.mla_decode.mla_decode_paged_fast(q_lat, q_rope, pool, tables, lens, **kw)
    want = mla_decode_paged_reference(q_lat, q_rope, pool, tables, lens, **kw)
    tol = 2e-5 if device.type == "cpu" else TOL[dtype]  # the interpreter computes in fp32
    assert_rel(got, want, tol, f"decode ragged page={page} splits={splits} {dtype}")


def test_kernel_with_indices_and_table_rows(fast, device):
    q_lat, q_rope, pool, _scales, tables, _lens = _case([50, 70], 16, torch.float32, device, seed=3)
    # three query rows over two sequences: rows 0 and 2 read sequence 1, row 1 sequence 0
    table_rows = torch.tensor([1, 0, 1], device=device)
    rows_lens = torch.tensor([70, 50, 12], dtype=torch.int32, device=device)
    q3 = torch.cat([q_lat, q_lat[:1]]).contiguous()
    r3 = torch.cat([q_rope, q_rope[:1]]).contiguous()
    idx = torch.tensor([[69, 0, 5, -1, 33, 2], [49, 48, 1, 2, 3, -1], [11, 20, 69, 0, -1, -1]], device=device)
    kw = dict(kv_lora_rank=R, scale=0.2, indices=idx, table_rows=table_rows)
    got = fast.mla_decode.mla_decode_paged_fast(q3, r3, pool, tables, rows_lens, **kw)
    want = mla_decode_paged_reference(q3, r3, pool, tables, rows_lens, **kw)
    assert_rel(got, want, 2e-5, "decode with indices + table rows")
    naive = _naive(q3, r3, pool, None, tables[table_rows], rows_lens, R, 0.2, idx)
    assert_rel(want, naive.to(want.device), 1e-5, "reference with indices vs naive")


def test_indices_covering_the_context_equal_dense(fast, device):
    q_lat, q_rope, pool, _scales, tables, lens = _case([40, 9], 16, torch.float32, device, seed=4)
    dense = fast.mla_decode.mla_decode_paged_fast(
        q_lat, q_rope, pool, tables, lens, kv_lora_rank=R, scale=0.2
    )
    idx = torch.stack([torch.randperm(48), torch.cat([torch.randperm(9), torch.full((39,), -1)])]).to(device)
    sparse = fast.mla_decode.mla_decode_paged_fast(
        q_lat, q_rope, pool, tables, lens, kv_lora_rank=R, scale=0.2, indices=idx
    )
    assert_rel(sparse, dense, 2e-5, "indices >= context vs dense")


def test_dispatch_rejects_bad_shapes():
    q_lat, q_rope, pool, _, tables, lens = _case([5], 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="q_latent"):
        mla_decode_paged(q_lat, q_rope, pool, tables, lens, kv_lora_rank=R + 1, scale=1.0)
    with pytest.raises(ValueError, match="seq_lens"):
        mla_decode_paged(q_lat, q_rope, pool, tables, lens[:0], kv_lora_rank=R, scale=1.0)


@pytest.mark.gpu
def test_gpu_unaligned_fp8_rows_fall_back_to_the_reference(fast):
    q_lat, q_rope, pool, scales, tables, lens = _case([30, 5], 16, torch.float8_e4m3fn, "cuda", p=8)
    kw = dict(kv_lora_rank=R, scale=0.2, kv_scales=scales)
    with pytest.raises(ValueError, match="16-byte aligned"):
        fast.mla_decode.mla_decode_paged_fast(q_lat, q_rope, pool, tables, lens, **kw)
    got = mla_decode_paged(q_lat, q_rope, pool, tables, lens, **kw)
    assert_rel(got, mla_decode_paged_reference(q_lat, q_rope, pool, tables, lens, **kw), 0.0, "fp8 fallback")


GPU_CASES = [
    # (lens, page, id)
    ([1], 64, "b1-ctx1"),
    ([131072], 64, "b1-ctx128k"),
    ([131072], 16, "b1-ctx128k-page16"),
    ([8192] * 32, 64, "b32-ctx8k"),
    ([16384] * 32, 64, "b32-ctx16k"),
    ([1, 7, 300, 4096, 65536, 131071, 2, 1000], 64, "b8-ragged-to128k"),
    (
        [int(x) for x in torch.randint(1, 2048, (256,), generator=torch.Generator().manual_seed(9))],
        16,
        "b256-ragged",
    ),
    ([2048] * 256, 64, "b256-ctx2k"),
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32], ids=["bf16", "fp8", "f32"]
)
@pytest.mark.parametrize(("lens", "page"), [c[:2] for c in GPU_CASES], ids=[c[2] for c in GPU_CASES])
def test_gpu_kernel_matches_reference(fast, lens, page, dtype):
    if dtype == torch.float32 and sum(lens) > 1 << 20:
        pytest.skip("fp32 pools are checked on the smaller cases (the fp32 reference is the cost)")
    dev = torch.device("cuda")
    q_lat, q_rope, pool, scales, tables, seq_lens = _case(
        lens, page, dtype, dev, heads=16, r=512, p=64, seed=len(lens)
    )
    kw = dict(kv_lora_rank=512, scale=192**-0.5, kv_scales=scales)
    got = fast.mla_decode.mla_decode_paged_fast(q_lat, q_rope, pool, tables, seq_lens, **kw)
    want = torch.cat([
        mla_decode_paged_reference(q_lat[i : i + 8], q_rope[i : i + 8], pool, tables[i : i + 8], seq_lens[i : i + 8], **kw)
        for i in range(0, len(lens), 8)
    ])  # fmt: skip
    assert_rel(got, want, TOL[dtype], f"gpu decode {len(lens)}x{max(lens)} page={page} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2048, 200000], ids=["k2048", "k>=ctx"])
def test_gpu_sparse_decode_matches_reference(fast, k):
    dev = torch.device("cuda")
    lens = [131072, 3000, 1500, 70000]
    q_lat, q_rope, pool, _scales, tables, seq_lens = _case(
        lens, 64, torch.bfloat16, dev, heads=16, r=512, p=64, seed=2
    )
    g = torch.Generator(device=dev).manual_seed(0)
    kk = min(k, max(lens))
    idx = torch.stack([torch.randperm(max(lens), generator=g, device=dev)[:kk] for _ in lens])
    kw = dict(kv_lora_rank=512, scale=192**-0.5, indices=idx)
    got = fast.mla_decode.mla_decode_paged_fast(q_lat, q_rope, pool, tables, seq_lens, **kw)
    want = mla_decode_paged_reference(q_lat, q_rope, pool, tables, seq_lens, **kw)
    assert_rel(got, want, TOL[torch.bfloat16], f"gpu sparse decode k={kk}")


# heads past `MAX_HEAD_BLOCK` run in head blocks (the last one partial at 40 heads)
@pytest.mark.parametrize("heads", [40], ids=["40heads"])
@pytest.mark.parametrize("splits", [1, 3], ids=["1split", "3splits"])
def test_kernel_head_blocks_match_reference(fast, device, heads, splits):
    q_lat, q_rope, pool, _scales, tables, lens = _case(
        [1, 33, 70], 16, torch.float32, device, heads=heads, seed=5
    )
    kw = dict(kv_lora_rank=R, scale=0.25, num_splits=splits)
    got = fast.mla_decode.mla_decode_paged_fast(q_lat, q_rope, pool, tables, lens, **kw)
    want = mla_decode_paged_reference(q_lat, q_rope, pool, tables, lens, **kw)
    assert_rel(got, want, 2e-5, f"decode {heads} heads splits={splits}")


@pytest.mark.gpu
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "top2048"])
def test_gpu_128_heads_match_reference(fast, sparse):
    """DeepSeek-V3.2's MLA layer shape: 128 heads, latent 512 + rope 64, in head blocks."""
    dev = torch.device("cuda")
    lens = [20000, 4096, 1]
    q_lat, q_rope, pool, _scales, tables, seq_lens = _case(
        lens, 64, torch.bfloat16, dev, heads=128, r=512, p=64, seed=7
    )
    g = torch.Generator(device=dev).manual_seed(1)
    idx = (
        torch.stack([torch.randperm(max(lens), generator=g, device=dev)[:2048] for _ in lens])
        if sparse
        else None
    )
    kw = dict(kv_lora_rank=512, scale=192**-0.5, indices=idx)
    got = fast.mla_decode.mla_decode_paged_fast(q_lat, q_rope, pool, tables, seq_lens, **kw)
    want = mla_decode_paged_reference(q_lat, q_rope, pool, tables, seq_lens, **kw)
    assert_rel(got, want, TOL[torch.bfloat16], f"gpu decode 128 heads sparse={sparse}")


def _sparse_rows(row_lens: list[int], k: int, seed: int) -> torch.Tensor:
    """`[N, k]` key positions per row: a random part of its keys, padded with -1 and with positions
    at or past its length (one inside the table's poison block, one past the table's width)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for length in row_lens:
        keep = torch.randperm(length, generator=g)[: k - 4]
        pad = torch.tensor([-1, length, 90, 500] + [-1] * (k - 4 - len(keep)))
        rows.append(torch.cat([keep, pad])[torch.randperm(k, generator=g)])
    return torch.stack(rows)


# `heads_per_program` past `MAX_HEAD_BLOCK` (the head-block sweep's 32 and 64 of 128 heads): keys
# dense or listed, each query row on its own table row or three rows on two sequences' tables
HPP_MODES = [
    # (id, indices, table_rows, splits, tile)
    ("dense", False, False, 1, None),
    ("dense-trows", False, True, 3, (64, 8, 2)),
    ("sparse", True, False, 3, None),
    ("sparse-trows", True, True, 2, (32, 4, 2)),
]


@pytest.mark.parametrize("hpp", [32, 64], ids=["hpp32", "hpp64"])
@pytest.mark.parametrize(
    ("sparse", "trows", "splits", "tile"), [m[1:] for m in HPP_MODES], ids=[m[0] for m in HPP_MODES]
)
def test_kernel_heads_per_program_match_reference(fast, device, hpp, sparse, trows, splits, tile):
    q_lat, q_rope, pool, _scales, tables, lens = _case([50, 70], 16, torch.float32, device, heads=128, seed=6)
    if trows:  # rows 0 and 2 read sequence 1, row 1 sequence 0
        table_rows = torch.tensor([1, 0, 1], device=device)
        lens = torch.tensor([70, 50, 12], dtype=torch.int32, device=device)
        q_lat, q_rope = torch.cat([q_lat, q_lat[:1]]), torch.cat([q_rope, q_rope[:1]])
    else:
        table_rows = None
    idx = _sparse_rows(lens.tolist(), 40, seed=hpp).to(device) if sparse else None
    kw = dict(kv_lora_rank=R, scale=0.25, indices=idx, table_rows=table_rows, num_splits=splits)
    got = fast.mla_decode.mla_decode_paged_fast(
        q_lat, q_rope, pool, tables, lens, **kw, tile=tile, heads_per_program=hpp
    )
    want = mla_decode_paged_reference(q_lat, q_rope, pool, tables, lens, **kw)
    assert_rel(got, want, 2e-5, f"decode 128 heads heads_per_program={hpp} sparse={sparse} trows={trows}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
@pytest.mark.parametrize("hpp", [32, 64], ids=["hpp32", "hpp64"])
def test_kernel_heads_per_program_low_precision_pools(fast, device, hpp, dtype):
    q_lat, q_rope, pool, scales, tables, lens = _case([33, 100], 16, dtype, device, heads=128, seed=8)
    idx = _sparse_rows(lens.tolist(), 40, seed=1).to(device)
    kw = dict(kv_lora_rank=R, scale=0.25, kv_scales=scales, indices=idx, num_splits=2)
    got = fast.mla_decode.mla_decode_paged_fast(
        q_lat, q_rope, pool, tables, lens, **kw, heads_per_program=hpp
    )
    want = mla_decode_paged_reference(q_lat, q_rope, pool, tables, lens, **kw)
    tol = 2e-5 if device.type == "cpu" else TOL[dtype]  # the interpreter computes in fp32
    assert_rel(got, want, tol, f"decode 128 heads heads_per_program={hpp} {dtype}")


@pytest.mark.parametrize("hpp", [8, 24, 0, 32.0], ids=["8", "24", "0", "float"])
def test_heads_per_program_rejects_bad_values(fast, hpp):
    q_lat, q_rope, pool, _, tables, lens = _case([5], 16, torch.float32, "cpu", heads=32)
    with pytest.raises(ValueError, match="heads_per_program must be a power of two >= 16"):
        fast.mla_decode.mla_decode_paged_fast(
            q_lat, q_rope, pool, tables, lens, kv_lora_rank=R, scale=1.0, heads_per_program=hpp
        )


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [None, (64, 8, 2), (32, 4, 2)], ids=["tile-default", "64-8-2", "32-4-2"])
@pytest.mark.parametrize("hpp", [16, 32, 64], ids=["hpp16", "hpp32", "hpp64"])
def test_gpu_heads_per_program_v32_prefill_rows(fast, hpp, tile):
    """DeepSeek-V3.2's sparse prefill shape: 64 query rows at the end of one sequence (one table
    row), 128 heads, latent 512 + rope 64, bf16, top-2048 positions each (some padding -1 or past
    the row's length). A tile that does not fit the GPU (shared memory) is skipped, visibly."""
    from triton.runtime.errors import OutOfResources

    dev = torch.device("cuda")
    ctx, rows = 6000, 64
    _, _, pool, _, tables, _ = _case([ctx], 64, torch.bfloat16, dev, r=512, p=64, seed=11)
    g = torch.Generator().manual_seed(12)
    q_lat = torch.randn(rows, 128, 512, generator=g).to(dev)
    q_rope = torch.randn(rows, 128, 64, generator=g).to(dev)
    lens = torch.arange(ctx - rows, ctx, dtype=torch.int32, device=dev) + 1
    trows = torch.zeros(rows, dtype=torch.long, device=dev)
    idx = _sparse_rows(lens.tolist(), 2048, seed=14).to(dev)
    kw = dict(kv_lora_rank=512, scale=192**-0.5, indices=idx, table_rows=trows)
    fast_kw = dict(kw, tile=tile, heads_per_program=hpp)
    try:
        got = fast.mla_decode.mla_decode_paged_fast(q_lat, q_rope, pool, tables, lens, **fast_kw)
    except OutOfResources as exc:
        pytest.skip(f"tile {tile} with {hpp} heads per program does not fit: {exc}")
    want = mla_decode_paged_reference(q_lat, q_rope, pool, tables, lens, **kw)
    assert_rel(got, want, TOL[torch.bfloat16], f"gpu prefill rows 128 heads, {hpp} per program, tile {tile}")


def test_sparse_rows_rule_takes_wide_head_blocks_only_for_many_rows_of_many_heads():
    """DSA prefill rows of a 128-head layer in a 16-bit pool take 64-head blocks; decode batches
    (fewer rows than SMs), fewer heads and fp32 pools keep the default rule."""
    from inference.kernels.mla_decode.fast import sparse_rows_rule

    bf16 = torch.empty(1, 16, 8, dtype=torch.bfloat16)
    assert sparse_rows_rule(128, 8192, bf16)
    assert not sparse_rows_rule(128, 2, bf16)  # the CPU counts 4 SMs
    assert not sparse_rows_rule(16, 8192, bf16)
    assert not sparse_rows_rule(128, 8192, bf16.float())
